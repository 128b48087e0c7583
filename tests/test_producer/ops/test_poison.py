"""Rows no broker will take never stall the outbox, in either mode (producer/ops/preflight.py).

The scenario a new user tries: 100 good rows, then rows for a topic that does not exist (the
broker's auto-creation is off), a value larger than its topic's ``max.message.bytes`` (but below the
producer's ``message.max.bytes``, so only the broker would refuse it), Kafka's internal
``__consumer_offsets``, an illegal topic name, a NULL header name and mismatched header arrays, then
100 more good rows. Every good row arrives (exactly once and in per-key order with
``--uuid-sequencing``), every poison row is dead-lettered with its reason, in seconds — no 30 s
metadata wait, no abandoned view, no fatal producer error — and the relay keeps running. After the
missing topic is created, requeueing its row delivers it. The first scenario also runs on
``outboxLayout: cursor`` (issue #37), where "drained" means the committed cursor passed every row.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql
from relaylib import consume_all, relay_config, wait_drained
from seqcheck import Expected, check_exactly_once, read_intents, wait_for

from harvest_outbox.harvest_local.kafka import create_topic
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.layouts.cursor.database import cursor_backlog
from harvest_outbox.producer.ops._deadletters import list_dead_letters, requeue
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher


@pytest.mark.integration
def _drained(pg_dsn: str, table: str, layout: str, timeout: float) -> float:
    """Seconds until every row is relayed: the outbox empty (mark), the committed cursor past every row (cursor)."""
    if layout == "mark":
        return wait_drained(pg_dsn, table, timeout)
    start, names = time.monotonic(), OutboxNames.parse(table)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        while (left := cursor_backlog(conn, names)) > 0:
            assert time.monotonic() - start < timeout, f"outbox {table}: {left} row(s) not passed in {timeout}s"
            time.sleep(0.1)
    return time.monotonic() - start


@pytest.mark.parametrize(
    ("sequenced", "layout"),
    [(False, "mark"), (True, "mark"), (False, "cursor"), (True, "cursor")],
    ids=["at-least-once", "uuid-sequencing", "at-least-once-cursor", "uuid-sequencing-cursor"],
)
def test_poison_rows_are_parked_in_seconds_and_the_rest_flows(
    sequenced: bool,
    layout: str,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic = topic_factory(partitions=2, config={"max.message.bytes": "20000"})
    missing = unique_name("missing")
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, layout=layout)
    st = Stasher(table)
    exp = Expected()
    ins = sql.SQL(
        "INSERT INTO {} (kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values) "
        "VALUES (%s, %s, %s, %s, %s) RETURNING id"
    ).format(names.outbox)

    def good(start: int) -> list[OutboxRecord]:
        recs = [OutboxRecord(topic, f"k{i % 7}", f"g{i}") for i in range(start, start + 100)]
        for r in recs:
            exp.by_key.setdefault(r.key, []).append(r.value.encode())  # type: ignore[union-attr]
            exp.headers[r.value.encode()] = []  # type: ignore[union-attr]
        return recs

    with psycopg.connect(pg_dsn) as conn:
        st.stash_many(conn, good(0))
        poison = {
            "missing": st.stash(conn, OutboxRecord(missing, "k1", "to-a-missing-topic")),
            "oversize": st.stash(conn, OutboxRecord(topic, "k2", "x" * 30_000)),
            "internal": st.stash(conn, OutboxRecord("__consumer_offsets", "k3", "internal")),
            # (the stasher refuses this name; another writer, e.g. goharvest's, would not)
            "illegal": conn.execute(ins, ("no spaces allowed!", "k4", "illegal", [], [])).fetchone()[0],
            "null_header": conn.execute(ins, (topic, "k5", "nh", ["a", None], ["1", "2"])).fetchone()[0],
            "mismatched": conn.execute(ins, (topic, "k6", "mm", ["a", "b"], ["1"])).fetchone()[0],
        }
        st.stash_many(conn, good(100))
    # The producer's message.max.bytes stays at its default (1 MB): only the topic refuses 30 kB.
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(
        uuid_sequencing=sequenced, producer_kafka_config={"linger.ms": 5}, outbox_layout=layout
    )
    relay = Harvest(cfg).start()
    try:
        took = _drained(pg_dsn, table, layout, 60)
        assert relay.state.value == "running", "the relay stopped"
        if sequenced:
            assert relay.mode.views_started == 1, "a poison row abandoned a leader view"  # type: ignore[attr-defined]
        assert relay.metrics.delivery_failures == 0
        with psycopg.connect(pg_dsn) as conn:
            dead = {d.id: d.error for d in list_dead_letters(conn, table)}
        assert set(dead) == set(poison.values()), dead
        reasons = {name: dead[i] for name, i in poison.items()}
        assert f"topic {missing!r} does not exist" in reasons["missing"]
        assert "exceeds what its topic accepts" in reasons["oversize"]
        assert "internal topics" in reasons["internal"]
        assert "not a legal Kafka topic name" in reasons["illegal"]
        assert "kafka_header_keys contains NULL" in reasons["null_header"]
        assert "header arrays differ in length" in reasons["mismatched"]
        # parked in seconds: no metadata propagation wait (30 s by default) behind the missing topic
        assert took < 15, f"drain took {took:.1f}s"
        if sequenced:
            # drained means passed, not yet ACKed: the last transaction's ACK follows its commit
            wait_for(lambda: not read_intents(pg_dsn, table), 30, "ACK intents confirmed")
            check_exactly_once(kafka_bootstrap, topic, 2, exp)
        else:
            got = consume_all(kafka_bootstrap, topic, lambda g: len(g) >= 200, 30)
            by_key: dict[str, list[bytes]] = {}
            for g in got:
                by_key.setdefault(g.key, []).append(g.value)  # type: ignore[arg-type]
            assert by_key == exp.by_key
        # The topic is created; requeue delivers the parked row while the relay runs.
        create_topic(kafka_bootstrap, missing, 1)
        time.sleep(2.5)  # past the guard's memory of the missing topic (2 s)
        with psycopg.connect(pg_dsn) as conn:
            assert requeue(conn, table, [poison["missing"]]) == 1
        _drained(pg_dsn, table, layout, 30)
        got_missing = consume_all(
            kafka_bootstrap, missing, lambda g: any(x.value == b"to-a-missing-topic" for x in g), 20
        )
        assert [g.value for g in got_missing if g.value] == [b"to-a-missing-topic"]
        with psycopg.connect(pg_dsn) as conn:
            assert poison["missing"] not in {d.id for d in list_dead_letters(conn, table)}
    finally:
        relay.stop()
        relay.wait(30)
    print(f"{'sequenced' if sequenced else 'at-least-once'}: 200 good rows + 6 poison drained in {took:.2f}s")


@pytest.mark.integration
@pytest.mark.parametrize("sequenced", [False, True], ids=["at-least-once", "uuid-sequencing"])
def test_a_record_only_the_broker_refuses_never_stops_the_relay(
    sequenced: bool,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    """With compression on, the preflight cannot size records up front, so a record larger than its
    topic's max.message.bytes reaches the broker, which refuses its whole batch. With
    ``--uuid-sequencing`` that is a *fatal* producer error (gap-less guarantee): it used to stop the
    relay, and again after every restart. Now the relay replaces the producer, checks that topic's
    records at their uncompressed size from then on, dead-letters the culprit alone and delivers its
    batch-mates (exactly once with --uuid-sequencing): at most one abandoned view, no dead innocents."""
    import os

    topic = topic_factory(partitions=2, config={"max.message.bytes": "20000"})
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    st = Stasher(table)
    exp = Expected()
    recs = [OutboxRecord(topic, f"k{i % 7}", f"g{i}") for i in range(100)]
    for r in recs:
        exp.by_key.setdefault(r.key, []).append(r.value.encode())  # type: ignore[union-attr]
        exp.headers[r.value.encode()] = []  # type: ignore[union-attr]
    with psycopg.connect(pg_dsn) as conn:
        st.stash_many(conn, recs[:50])
        big = st.stash(conn, OutboxRecord(topic, "kbig", os.urandom(15_000).hex()))  # 30 kB, lz4 cannot save it
        st.stash_many(conn, recs[50:])
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(
        uuid_sequencing=sequenced, producer_kafka_config={"linger.ms": 5, "compression.type": "lz4"}
    )
    relay = Harvest(cfg).start()
    try:
        wait_drained(pg_dsn, table, 60)
        assert relay.state.value == "running", "the relay stopped"
        if sequenced:
            assert relay.mode.views_started <= 2  # type: ignore[attr-defined]
        with psycopg.connect(pg_dsn) as conn:
            dead = {d.id: d for d in list_dead_letters(conn, table)}
        assert set(dead) == {big} and "exceeds what its topic accepts" in dead[big].error
    finally:
        relay.stop()
        relay.wait(30)
    if sequenced:
        check_exactly_once(kafka_bootstrap, topic, 2, exp)
    else:
        got = consume_all(kafka_bootstrap, topic, lambda g: len({x.value for x in g}) >= 100, 30)
        by_key: dict[str, list[bytes]] = {}
        for g in got:
            if g.value not in by_key.get(g.key, []):
                by_key.setdefault(g.key, []).append(g.value)  # type: ignore[arg-type]
        assert by_key == exp.by_key  # at-least-once: every row, per-key order (duplicates aside)


@pytest.mark.integration
@pytest.mark.parametrize("sequenced", [False, True], ids=["at-least-once", "uuid-sequencing"])
def test_hold_policy_keeps_a_missing_topics_rows_while_the_others_flow(
    sequenced: bool,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    # missingTopicPolicy: hold — rows of a topic that does not exist wait (in id order) until it is
    # created; nothing is dead-lettered, no view is abandoned, every other topic's rows flow.
    topic = topic_factory(partitions=2)
    missing = unique_name("later")
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    st = Stasher(table)
    exp, exp_missing = Expected(), Expected()

    def stash(t: str, e: Expected, values: list[str], key: str | None = None) -> None:
        recs = [OutboxRecord(t, key or f"k{i % 3}", v) for i, v in enumerate(values)]
        with psycopg.connect(pg_dsn) as conn:
            st.stash_many(conn, recs)
        for r in recs:
            e.by_key.setdefault(r.key, []).append(r.value.encode())  # type: ignore[union-attr]
            e.headers[r.value.encode()] = []  # type: ignore[union-attr]

    stash(topic, exp, [f"a{i}" for i in range(50)])
    stash(missing, exp_missing, ["m0", "m1", "m2"], key="mk")
    stash(topic, exp, [f"b{i}" for i in range(50)])
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(
        uuid_sequencing=sequenced, missing_topic_policy="hold"
    )
    relay = Harvest(cfg).start()
    try:
        deadline = time.monotonic() + 30
        while outbox_rows(pg_dsn, table) != 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert outbox_rows(pg_dsn, table) == 3, "the other topic's rows did not flow past the held ones"
        stash(topic, exp, [f"c{i}" for i in range(20)])  # still flowing while the topic is missing
        stash(missing, exp_missing, ["m3"], key="mk")
        deadline = time.monotonic() + 30
        while outbox_rows(pg_dsn, table) != 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert outbox_rows(pg_dsn, table) == 4
        with psycopg.connect(pg_dsn) as conn:
            assert list_dead_letters(conn, table) == []
        create_topic(kafka_bootstrap, missing, 1)
        wait_drained(pg_dsn, table, 30)
        assert relay.state.value == "running"
        if sequenced:
            assert relay.mode.views_started == 1, "holding abandoned a view"  # type: ignore[attr-defined]
            wait_for(lambda: not read_intents(pg_dsn, table), 30, "ACK intents confirmed")
            check_exactly_once(kafka_bootstrap, topic, 2, exp)
            check_exactly_once(kafka_bootstrap, missing, 1, exp_missing)
        else:
            got = consume_all(kafka_bootstrap, missing, lambda g: len(g) >= 4, 20)
            assert [g.value for g in got] == [b"m0", b"m1", b"m2", b"m3"]
    finally:
        relay.stop()
        relay.wait(30)


def outbox_rows(dsn: str, table: str) -> int:
    from relaylib import outbox_count

    return outbox_count(dsn, table)
