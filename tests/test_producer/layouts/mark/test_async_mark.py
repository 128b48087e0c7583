"""The mark commits asynchronously (``RelayCore.open``: ``synchronous_commit = off`` on the mark
connection only). A database crash can then lose a mark that no synchronous commit has followed.

Invariants:
- only the mark connection commits asynchronously; the write connection (purges, resets, dead
  letters, fenced commits, view starts) and the LISTEN connection commit synchronously;
- a mark lost in a crash only un-claims its rows: they are marked again and delivered, exactly once
  with ``--uuid-sequencing`` (as after a leader crash before its commit), at least once without.

The crash tests SIGKILL a private Postgres (every process, nothing flushed) right after the relay's
first mark returns, with the WAL writer slowed to 10 s, so the mark is lost for certain; the test
checks that it was (the rows are unclaimed after recovery) before the relay goes on.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql
from relaylib import consume_all, relay_config
from seqcheck import Expected, check_exactly_once, count_rows, read_intents, wait_for, write_traffic

from harvest_outbox.harvest_local.postgres import EmbeddedPostgres
from harvest_outbox.producer.db import MarkedAttempts, MarkedRow
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.layouts.mark.database import MarkDatabase
from harvest_outbox.producer.schema.ddl import init_db

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def slow_wal_postgres() -> Iterator[EmbeddedPostgres]:
    """A private server (crashed by the tests) whose WAL writer flushes asynchronous commits only
    every 10 s, and with no autovacuum writing WAL meanwhile."""
    pg = EmbeddedPostgres().start()
    try:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
            conn.execute("ALTER SYSTEM SET autovacuum = off")
            conn.execute("SELECT pg_reload_conf()")
        yield pg
    finally:
        pg.destroy()


def test_only_the_mark_connection_commits_asynchronously(
    pg_dsn: str, kafka_bootstrap: str, pg_schema: str, unique_name: Callable[[str], str]
) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    relay = Harvest(relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")))
    core = relay.core
    core.open()
    try:
        assert core.db is not None and core.mark_db is not None and core.listener is not None
        setting = "SHOW synchronous_commit"
        assert core.mark_db.conn.execute(setting).fetchone() == ("off",)
        assert core.db.conn.execute(setting).fetchone() == ("on",)
        assert core.listener._ensure().execute(setting).fetchone() == ("on",)
    finally:
        core.close()


@pytest.mark.parametrize("sequenced", [True, False], ids=["sequenced", "at-least-once"])
def test_a_mark_lost_in_a_database_crash_only_unclaims_its_rows(
    sequenced: bool,
    slow_wal_postgres: EmbeddedPostgres,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pg = slow_wal_postgres
    schema = f"s_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    table = f"{schema}.outbox"
    init_db(pg.dsn, table)
    topic = topic_factory(partitions=4)
    exp = Expected()
    write_traffic(pg.dsn, table, topic, exp, 0, 10, max_batch=5, rollback_rate=0.0)  # committed, durable
    seen: dict[str, int] = {}
    real_mark = MarkDatabase.mark_with_attempts

    def mark_then_crash(self: MarkDatabase, leader_id: uuid.UUID, n: int) -> tuple[list[MarkedRow], MarkedAttempts]:
        rows, persisted = real_mark(self, leader_id, n)
        if rows and not seen:
            pg.kill()  # before any synchronous commit could flush the mark
            pg.start()
            with psycopg.connect(pg.dsn) as conn:
                seen["marked"] = len(rows)
                seen["claimed_after_crash"] = conn.execute(
                    sql.SQL("SELECT count(*) FROM {} WHERE leader_id = %s").format(sql.Identifier(schema, "outbox")),
                    (leader_id,),
                ).fetchone()[0]
        return rows, persisted

    monkeypatch.setattr(MarkDatabase, "mark_with_attempts", mark_then_crash)
    cfg = relay_config(pg.dsn, kafka_bootstrap, table, unique_name("g"), io_error_backoff=0.2)
    relay = Harvest(cfg.replace(uuid_sequencing=sequenced)).start()

    def drained() -> bool:
        try:  # the server is down for a moment
            return count_rows(pg.dsn, table) == 0 and not (sequenced and read_intents(pg.dsn, table))
        except psycopg.OperationalError:
            return False

    try:
        wait_for(drained, 60, "the outbox drained (and ACK intents confirmed) after the crash")
    finally:
        relay.stop()
        relay.wait(30)
    assert seen["marked"] > 0 and seen["claimed_after_crash"] == 0, seen  # the crash lost the mark
    if sequenced:
        res = check_exactly_once(kafka_bootstrap, topic, 4, exp)
        assert res.committed == exp.total
    else:
        want = {v for values in exp.by_key.values() for v in values}
        got = consume_all(kafka_bootstrap, topic, lambda recs: want <= {r.value for r in recs})
        assert want <= {r.value for r in got}
