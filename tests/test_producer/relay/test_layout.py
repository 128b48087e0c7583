"""The outbox's relay layout (producer/relay/admission.py): relays of another ``shards`` / ``leaderElection`` (or
NELI group) are refused while relays of one layout run, on real Postgres and Kafka; the documented
change (stop every relay, start with the new settings) is admitted; a killed relay's layout goes
with its session; a relay whose session was lost while another layout got in stops."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from psycopg import sql
from relaylib import relay_config, wait_drained

from harvest_outbox.harvest_local.relays import RelayProcess, wait_for, write_config
from harvest_outbox.producer.config import HarvestConfig
from harvest_outbox.producer.errors import HarvestError, SchemaError
from harvest_outbox.producer.harvest import Harvest, State
from harvest_outbox.producer.relay.admission import Layout, LayoutError, admit, live_relays, recorded_layout
from harvest_outbox.producer.relay.sharded import relay_for
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

FIX = "Fix: to change the layout, stop every running relay first"


# ---------------------------------------------------------------------------------------------- pure logic
@pytest.mark.parametrize(
    "settings, text",
    [
        ({}, "shards: 1, leaderElection: neli (leaderGroupID: g, leaderTopic: g.neli)"),
        ({"shards": 4}, "shards: 4, leaderElection: neli (leaderGroupID: g, leaderTopic: g.neli.shards4)"),
        ({"leader_topic": "mine"}, "shards: 1, leaderElection: neli (leaderGroupID: g, leaderTopic: mine)"),
        ({"leader_election": "postgres"}, "shards: 1, leaderElection: postgres"),
        ({"leader_election": "postgres", "shards": 8}, "shards: 8, leaderElection: postgres"),
    ],
)
def test_a_layout_names_what_decides_leadership(settings: dict[str, Any], text: str) -> None:
    assert str(Layout.of(HarvestConfig(leader_group_id="g", **settings))) == text


def test_layouts_that_split_leadership_have_different_lock_keys() -> None:
    configs = [
        HarvestConfig(),
        HarvestConfig(shards=2),
        HarvestConfig(leader_group_id="other"),
        HarvestConfig(leader_topic="other"),
        HarvestConfig(leader_election="postgres"),
        HarvestConfig(leader_election="postgres", shards=2),
    ]
    keys = [Layout.of(c).key for c in configs]
    assert len(set(keys)) == len(keys) and all(0 <= k < 2**31 for k in keys)
    # what does not split leadership does not change the layout
    assert Layout.of(HarvestConfig(uuid_sequencing=True, name="x")) == Layout.of(HarvestConfig())
    assert Layout.of(HarvestConfig(leader_election="postgres", leader_group_id="a")) == Layout(1, "postgres")


# ---------------------------------------------------------------------------------------------- helpers
def _stash(dsn: str, table: str, topic: str, n: int, start: int = 0) -> None:
    with psycopg.connect(dsn) as conn:
        Stasher(table).stash_many(
            conn, [OutboxRecord(topic, f"key-{i % 50}", f"v{i}") for i in range(start, start + n)]
        )


def _records(bootstrap: str, topic: str) -> int:
    """How many records the topic holds (the sum of its partitions' end offsets)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "layout-count"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts)
    finally:
        c.close()


def _refusal(table: str, theirs: HarvestConfig, names: str, mine: HarvestConfig) -> str:
    return (
        rf"outbox {re.escape(table)} is being relayed by \d relay\(s\) with {re.escape(str(Layout.of(theirs)))} "
        rf"\({names}\); this relay has {re.escape(str(Layout.of(mine)))}\. .*{FIX}"
    )


# ---------------------------------------------------------------------------------------------- on real services
@pytest.mark.integration
@pytest.mark.parametrize(
    "running, starting",
    [
        pytest.param({"shards": 4}, {}, id="neli-shards-4-then-1"),
        pytest.param({}, {"leader_election": "postgres"}, id="neli-then-postgres"),
        pytest.param({"shards": 2, "leader_election": "postgres"}, {"shards": 2}, id="postgres-then-neli-shards-2"),
        pytest.param({}, {"leader_group_id": "other-group"}, id="neli-group-change"),
    ],
)
def test_a_relay_of_another_layout_is_refused_and_no_row_is_duplicated(
    running: dict[str, Any],
    starting: dict[str, Any],
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    table, topic, n = f"{pg_schema}.outbox", topic_factory(partitions=2), 2000
    for shards in {running.get("shards", 1), starting.get("shards", 1)}:
        init_db(pg_dsn, table, shards=shards)
    base = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(
        uuid_sequencing=False, leader_lock_check_interval=0.2
    )
    first_cfg = base.replace(name="first", **running)
    second_cfg = base.replace(name="second", **starting)
    first, second = relay_for(first_cfg), relay_for(second_cfg)
    refused: HarvestError | None = None
    first.start()
    try:
        try:
            second.start()
        except LayoutError as exc:
            refused = exc
        wait_for(lambda: first.is_leader and (refused is not None or second.is_leader), 60, "the relays' elections")
        _stash(pg_dsn, table, topic, n)
        wait_drained(pg_dsn, table, 60)
        time.sleep(1)  # a second leader's sends of rows the first already purged land late
        assert _records(kafka_bootstrap, topic) == n, "rows published twice: two layouts both led"
    finally:
        for relay in (second, first):
            relay.stop()
            relay.wait(60)
    assert refused is not None, "the relay of another layout was not refused"
    assert re.search(_refusal(table, first_cfg, "first", second_cfg), str(refused)), str(refused)
    assert second.state is State.STOPPED and not second.is_leader


@pytest.mark.integration
def test_the_documented_shards_change_is_admitted_and_recorded(
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    table, topic = f"{pg_schema}.outbox", topic_factory(partitions=2)
    names = init_db(pg_dsn, table)
    base = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(
        uuid_sequencing=False, leader_election="postgres", leader_lock_check_interval=0.2
    )
    with psycopg.connect(pg_dsn) as conn:
        assert recorded_layout(conn, names) is None  # nothing recorded before the first relay
    with relay_for(base.replace(name="one")):
        _stash(pg_dsn, table, topic, 300)
        wait_drained(pg_dsn, table, 60)
    with psycopg.connect(pg_dsn) as conn:
        assert recorded_layout(conn, names) == Layout(1, "postgres")
    # docs/sharding.md: stop every relay, change shards, run init-db, start the relays
    init_db(pg_dsn, table, shards=4)
    four = base.replace(shards=4)
    with relay_for(four.replace(name="four-a")), relay_for(four.replace(name="four-b")):
        with psycopg.connect(pg_dsn) as conn:
            assert recorded_layout(conn, names) == Layout(4, "postgres")
            live = live_relays(conn, table)
            assert list(live) == [Layout(4, "postgres").key] and sorted(live[Layout(4, "postgres").key]) == [
                "four-a",
                "four-b",
            ]
        with pytest.raises(LayoutError, match=_refusal(table, four, "four-a, four-b", base)):
            relay_for(base.replace(name="late")).start()
        _stash(pg_dsn, table, topic, 300, start=300)
        wait_drained(pg_dsn, table, 60)
    with psycopg.connect(pg_dsn) as conn:
        assert recorded_layout(conn, names) == Layout(4, "postgres")  # the record outlives its relays
        assert live_relays(conn, table) == {}
    with relay_for(base.replace(name="back-to-one")):  # and back, the same way
        pass
    assert _records(kafka_bootstrap, topic) == 600


@pytest.mark.integration
def test_a_refused_relay_process_exits_non_zero_and_a_killed_one_does_not_block_the_next_layout(
    pg_dsn: str, kafka_bootstrap: str, pg_schema: str, tmp_path: Path, topic_factory: Callable[..., str]
) -> None:
    table, topic = f"{pg_schema}.outbox", topic_factory(partitions=2)
    init_db(pg_dsn, table)
    init_db(pg_dsn, table, shards=2)
    common: dict[str, Any] = dict(
        dsn=pg_dsn,
        bootstrap=kafka_bootstrap,
        outbox_table=table,
        uuid_sequencing=False,
        leader_election="postgres",
        leader_lock_check_interval="200ms",
    )
    old = RelayProcess(write_config(tmp_path / "old.yaml", **common), "old", tmp_path).start()
    new = RelayProcess(write_config(tmp_path / "new.yaml", shards=2, **common), "new", tmp_path)
    try:
        wait_for(lambda: old.elections() >= 1, 60, "the old layout's relay leads")
        new.start()
        assert new.proc is not None and new.proc.wait(60) == 1, new.text()
        assert re.search(
            rf"harvest: error: outbox {re.escape(table)} is being relayed by 1 relay\(s\) with shards: 1, "
            rf"leaderElection: postgres \(old\); this relay has shards: 2, leaderElection: postgres\. .*"
            rf"{FIX}",
            new.text(),
        ), new.text()[-2000:]
        assert new.elections() == 0
        old.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        old.proc.wait()  # type: ignore[union-attr]
        # Postgres ends the killed relay's session, and its layout lock with it, at once (loopback EOF)
        took = wait_for(lambda: not _live(pg_dsn, table), 10, "the killed relay's layout lock to go")
        print(f"\nlayout lock released {took:.2f}s after kill -9")
        _stash(pg_dsn, table, topic, 300)
        new.start()
        wait_for(lambda: new.elections() >= 1, 60, "the new layout's relay leads")
        wait_drained(pg_dsn, table, 60)
        assert "relay layout of" in new.text() and "is now shards: 2, leaderElection: postgres" in new.text()
    finally:
        old.kill()
        new.stop()


def _live(dsn: str, table: str) -> dict[int, list[str]]:
    with psycopg.connect(dsn) as conn:
        return live_relays(conn, table)


@pytest.mark.integration
def test_a_relay_whose_layout_session_was_lost_to_another_layout_stops(
    pg_dsn: str, kafka_bootstrap: str, pg_schema: str, unique_name: Callable[[str], str]
) -> None:
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table)
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(
        uuid_sequencing=False, leader_election="postgres", leader_lock_check_interval=0.2, name="old"
    )
    relay = Harvest(cfg).start()
    try:
        wait_for(lambda: relay.is_leader, 30, "the relay leads")
        with psycopg.connect(pg_dsn, autocommit=True, application_name="harvest-layout:intruder") as conn:
            with conn.transaction():
                recorded_layout(conn, names, for_update=True)  # the relay's re-admission waits for this transaction
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                    ("harvest-layout:old",),
                )
                wait_for(lambda: not live_relays(conn, table), 10, "the relay's layout session to end")
                admit(conn, table, Layout(2, "postgres"), "intruder")  # another layout gets in meanwhile
            wait_for(lambda: relay.state is State.STOPPED, 30, "the relay to stop")
            with pytest.raises(HarvestError) as failed:
                relay.wait(0)
            assert isinstance(failed.value.__cause__, LayoutError), failed.value
            assert re.search(
                rf"with shards: 2, leaderElection: postgres \(intruder\); this relay has shards: 1, "
                rf"leaderElection: postgres\. .*{FIX}",
                str(failed.value),
            ), failed.value
            assert not relay.is_leader
    finally:
        relay.stop()
        try:
            relay.wait(30)
        except HarvestError:
            pass


@pytest.mark.integration
def test_an_outbox_initialised_by_an_older_harvest_needs_init_db_for_the_layout(
    pg_dsn: str, kafka_bootstrap: str, pg_schema: str, unique_name: Callable[[str], str]
) -> None:
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table)
    with psycopg.connect(pg_dsn) as conn:  # as left by a version without the layout record
        conn.execute(sql.SQL("DROP TABLE {}").format(names.layout))
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(leader_election="postgres")
    with pytest.raises(SchemaError, match=r"_harvest_layout.*does not exist.*run `harvest init-db` again"):
        Harvest(cfg).start()
    init_db(pg_dsn, table)  # idempotent: adds only what is missing
    with psycopg.connect(pg_dsn) as conn:  # a record row deleted by hand: admission recreates it
        conn.execute(sql.SQL("DELETE FROM {}").format(names.layout))
    relay = Harvest(cfg).start()
    relay.stop()
    relay.wait(30)
    with psycopg.connect(pg_dsn) as conn:
        assert recorded_layout(conn, OutboxNames.parse(table)) == Layout(1, "postgres")
