"""Delivery-attempt counts live in Postgres (``<outbox>_delivery_attempts``), not in one process.

The crash loop: a row whose every delivery fails, in a relay process that dies (SIGKILL) the
moment it produces that row a second time — i.e. each process gets exactly ONE failed attempt in
before it crashes, as a relay would that a row crashes on retry. With counts in memory the loop
never ends; with counts in the database the third process finds 2 stored attempts at mark time,
fails the row a third time and parks it (``maxDeliveryAttempts: 3``); every other row flows (exactly
once in ``--uuid-sequencing`` mode, every row in per-key order in at-least-once mode), and the
stored counts are gone once the rows are delivered or dead-lettered.

Also: a relay on an outbox whose ``init-db`` predates the attempts table refuses to start, saying
to re-run ``harvest init-db``; re-running it (idempotent) fixes it.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from relaylib import assert_per_key_order, consume_all, relay_config
from seqcheck import Expected, check_exactly_once, count_rows

from harvest_outbox.harvest_local.relays import RelayProcess, wait_for, write_config
from harvest_outbox.producer.errors import HarvestError, SchemaError
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

pytestmark = pytest.mark.integration


def _attempts(dsn: str, table: str) -> dict[int, int]:
    names = OutboxNames.parse(table)
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute(sql.SQL("SELECT id, attempts FROM {}").format(names.delivery_attempts)).fetchall())


def _dead(dsn: str, table: str) -> list[tuple[int, str, int]]:
    names = OutboxNames.parse(table)
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql.SQL("SELECT id, error, attempts FROM {}").format(names.dead_letters)).fetchall()


@pytest.mark.parametrize("sequenced", [False, True], ids=["at-least-once", "uuid-sequencing"])
def test_crash_loop_on_a_row_ends_with_it_parked(
    sequenced: bool,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    tmp_path: Path,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic = topic_factory(partitions=2)
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    exp = Expected()
    st = Stasher(table)
    recs = [OutboxRecord(topic, f"k{i % 5}", f"a{i}") for i in range(30)]
    with psycopg.connect(pg_dsn) as conn:
        st.stash_many(conn, recs[:15])
        poison_id = st.stash(conn, OutboxRecord(topic, "poison", "never-delivered"))
        st.stash_many(conn, recs[15:])
    for r in recs:
        exp.by_key.setdefault(r.key, []).append(r.value.encode())  # type: ignore[union-attr]
        exp.headers[r.value.encode()] = []  # type: ignore[union-attr]
    cfg = write_config(
        tmp_path / "harvest.yaml",
        dsn=pg_dsn,
        bootstrap=kafka_bootstrap,
        outbox_table=table,
        group=unique_name("g"),
        uuid_sequencing=sequenced,
        leader_election="postgres",
        leader_lock_check_interval="300ms",
        extra_limits={"maxDeliveryAttempts": "3", "ioErrorBackoff": "100ms"},
    )
    killed = 0
    relays: list[RelayProcess] = []
    try:
        for n in range(1, 4):
            relay = RelayProcess(cfg, f"r{n}", tmp_path, faults="failkey=poison,killat=2").start()
            relays.append(relay)
            # Either it dies on the poison row's second produce, or (third process) parks the row.
            wait_for(
                lambda relay=relay: not relay.alive or bool(_dead(pg_dsn, table)), 60, f"relay r{n} crashes or parks"
            )
            if not relay.alive:
                assert relay.proc is not None and relay.proc.returncode == -signal.SIGKILL, relay.text()[-2000:]
                killed += 1
                assert _attempts(pg_dsn, table).get(poison_id) == n, (n, _attempts(pg_dsn, table))
            else:
                break
        assert killed == 2, f"{killed} crashes before the row was parked (expected 2 with maxDeliveryAttempts 3)"
        last = relays[-1]
        wait_for(lambda: count_rows(pg_dsn, table) == 0, 60, "the rest drains")
        dead = _dead(pg_dsn, table)
        assert [(i, a) for i, _e, a in dead] == [(poison_id, 3)], dead
        assert "injected delivery failure" in dead[0][1]
        assert _attempts(pg_dsn, table) == {}, "stored counts must go with delivered / dead-lettered rows"
        assert last.stop() == 0, last.text()[-3000:]
        if sequenced:
            check_exactly_once(kafka_bootstrap, topic, 2, exp)
        else:
            got = consume_all(
                kafka_bootstrap,
                topic,
                lambda g: {x.value for x in g} >= {r.value.encode() for r in recs},  # type: ignore[union-attr]
                timeout=30,
            )
            got = [g for g in got if g.key != "poison"]  # (its record may be in the log: only its report failed)
            assert_per_key_order(got, exp.by_key, allow_dups=True)  # type: ignore[arg-type]
    finally:
        for r in relays:
            r.kill()


def test_outbox_initialised_by_an_older_harvest_needs_init_db_again(
    pg_dsn: str, kafka_bootstrap: str, pg_schema: str, unique_name: Callable[[str], str]
) -> None:
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table)
    with psycopg.connect(pg_dsn) as conn:  # as left by a version without the attempts table
        conn.execute(sql.SQL("DROP TABLE {}").format(names.delivery_attempts))
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g"))
    with pytest.raises(SchemaError, match=r"delivery_attempts.*run `harvest init-db` again"):
        Harvest(cfg).start()
    init_db(pg_dsn, table)  # idempotent: adds only what is missing
    with psycopg.connect(pg_dsn) as conn:  # a state table from before the UUID clock floor
        conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN last_clock").format(names.state))
    with pytest.raises(SchemaError, match=r"lacks column last_clock.*run `harvest init-db` again"):
        Harvest(cfg).start()
    init_db(pg_dsn, table)
    relay = Harvest(cfg).start()
    relay.stop()
    try:
        relay.wait(30)
    except HarvestError as exc:  # pragma: no cover - reported with its cause
        raise AssertionError(f"relay failed after init-db: {exc}") from exc
