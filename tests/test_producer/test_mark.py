"""The mark statement on the real database (producer/db.py)."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql

from harvest_outbox.producer.db import OutboxDatabase
from harvest_outbox.producer.schema import init_db
from harvest_outbox.producer.stasher import OutboxRecord, Stasher


@pytest.mark.integration
def test_mark_stays_fast_on_statistics_of_an_empty_outbox(pg_dsn: str, pg_schema: str) -> None:
    # Found by the demo's backlog phase: statistics gathered while the outbox was nearly empty,
    # then a bulk commit. goharvest's `id IN (SELECT id … LIMIT n)` then planned a nested-loop
    # semi-join that re-ran the subquery per outbox row: one 5,000-row mark took 334 s. The relay's
    # mark (ctid = ANY(ARRAY(SELECT ctid …))) evaluates its subquery once, whatever the statistics.
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table)
    st = Stasher(table)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        with conn.transaction():
            st.stash_many(conn, [OutboxRecord("t", f"k{i % 100}", "x") for i in range(20_000)])
        conn.execute(sql.SQL("DELETE FROM {}").format(names.outbox))
        conn.execute(sql.SQL("ANALYZE {}").format(names.outbox))
        with conn.transaction():
            st.stash_many(conn, [OutboxRecord("t", f"k{i % 100}", f"v{i}") for i in range(100_000)])
    db = OutboxDatabase(pg_dsn, names)
    try:
        db.conn.execute("SET statement_timeout = '20s'")  # the old plan runs for minutes: fail, not hang
        leader = uuid.uuid4()
        rows = db.mark(leader, 5000)
        assert len(rows) == 5000 and [r[0] for r in rows] == sorted(r[0] for r in rows)
        assert rows[0][3] == b"v0" and rows[0][4] == () and rows[0][5] == ()  # header arrays as tuples
        again = db.mark(leader, 5000)  # rows this view owns are not marked twice
        assert len(again) == 5000 and {r[0] for r in again}.isdisjoint(r[0] for r in rows)
    finally:
        db.close()


@pytest.mark.integration
@pytest.mark.parametrize("shards", [1, 8])
def test_an_idle_relays_marks_never_run_on_a_generic_plan(pg_dsn: str, pg_schema: str, shards: int) -> None:
    # Found by the sharded-relays benchmark: an idle relay marks an empty outbox over and over;
    # psycopg prepares the statement after 5 runs and Postgres then settled on a generic plan made for
    # an empty table, which sorted the whole outbox on every mark once a burst of 200k rows arrived
    # (2,600 rows/s instead of ~60,000). The relay never prepares its mark: Postgres plans it anew.
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, shards=shards)
    def generic_plans(db: OutboxDatabase) -> list[tuple[int, int]]:
        return db.conn.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                               "WHERE statement LIKE '%%UPDATE%%leader_id%%RETURNING%%'").fetchall()

    dbs = [OutboxDatabase(pg_dsn, names, shards) for _ in range(2)]
    if shards > 1:
        for d in dbs:
            d.set_shards(frozenset(range(shards)))
    db, hazard = dbs
    try:
        _ = hazard.conn  # builds its mark statement
        leader = uuid.uuid4()
        for _ in range(12):  # idle: empty marks, past psycopg's prepare threshold and Postgres' 5 custom plans
            assert db.mark(leader, 100) == []
            # what the relay avoids: the same statement, prepared as psycopg does by default
            assert hazard._run("mark", hazard._mark_sql, {"leader": leader, "n": 100}).fetchall() == []  # type: ignore[arg-type]
        assert any(generic > 0 for generic, _custom in generic_plans(hazard))
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            with conn.transaction():
                Stasher(table).stash_many(conn, [OutboxRecord("t", f"k{i % 100}", "x") for i in range(2000)])
        assert len(db.mark(leader, 1000)) == 1000
        assert generic_plans(db) == []  # the relay's mark is never a prepared statement
    finally:
        for d in dbs:
            d.close()
