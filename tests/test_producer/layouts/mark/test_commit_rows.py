"""The fenced commit deletes exactly its transactions' rows (producer/db/__init__.py: ``id_range``).

A harvest transaction's ids are named to Postgres as a range minus its holes when that is short,
else one by one; either way the commit deletes exactly those rows, and only while this view owns
each of them (the row count check)."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql

from harvest_outbox.producer.db import MAX_RANGE_HOLES, id_range
from harvest_outbox.producer.db.fence import DeadRow
from harvest_outbox.producer.errors import FenceError
from harvest_outbox.producer.layouts.mark.database import MarkDatabase
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        pytest.param([], None, id="empty"),
        pytest.param([7], (7, 7, []), id="one"),
        pytest.param([3, 4, 5, 6], (3, 6, []), id="one-run"),
        pytest.param([6, 3, 5, 4], (3, 6, []), id="one-run-any-order"),
        pytest.param([10, 12, 15], (10, 15, [11, 13, 14]), id="holes"),
        pytest.param(
            [1, 2 + MAX_RANGE_HOLES], (1, 2 + MAX_RANGE_HOLES, list(range(2, 2 + MAX_RANGE_HOLES))), id="most-holes"
        ),
        pytest.param([1, 3 + MAX_RANGE_HOLES], None, id="too-many-holes"),
        pytest.param([3, 4, 4, 5], None, id="repeated-id"),
        pytest.param([3, 4, 4, 6], None, id="repeated-id-hiding-a-hole"),
    ],
)
def test_id_range(ids: list[int], expected: tuple[int, int, list[int]] | None) -> None:
    assert id_range(ids) == expected
    if expected is not None:
        lo, hi, holes = expected
        assert sorted(ids) == [i for i in range(lo, hi + 1) if i not in holes]


def _outbox(pg_dsn: str, pg_schema: str, rows: int) -> tuple[MarkDatabase, uuid.UUID, int, list[int]]:
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table)
    with psycopg.connect(pg_dsn) as conn:
        Stasher(table).stash_many(conn, [OutboxRecord("t", f"k{i}", f"v{i}") for i in range(rows)])
    db = MarkDatabase(pg_dsn, names)
    leader = uuid.uuid4()
    epoch, _intents = db.start_view(leader, "test")
    ids = [r[0] for r in db.mark(leader, rows)]
    assert len(ids) == rows
    return db, leader, epoch, ids


def _left(pg_dsn: str, db: MarkDatabase) -> dict[int, uuid.UUID | None]:
    with psycopg.connect(pg_dsn) as conn:
        return dict(conn.execute(sql.SQL("SELECT id, leader_id FROM {}").format(db.names.outbox)).fetchall())


@pytest.mark.integration
@pytest.mark.parametrize("held", [1, MAX_RANGE_HOLES + 5], ids=["few-holes", "many-holes"])
def test_a_commit_deletes_its_rows_and_not_the_views_other_rows_between_them(
    pg_dsn: str, pg_schema: str, held: int
) -> None:
    """Rows this view owns but the transaction does not (held back, or in a later transaction) and a
    row it dead-letters sit between its rows: they are holes of its range, and survive (the dead
    one in the dead letters)."""
    db, leader, epoch, ids = _outbox(pg_dsn, pg_schema, 300)
    try:
        kept = set(ids[100 : 100 + held])
        dead = ids[50]
        txn = [i for i in ids if i not in kept and i != dead]
        db.commit_txn(epoch, leader, txn, [DeadRow(dead, "poison", 1)], b"P1", 7, [("t", 0)])
        assert _left(pg_dsn, db) == {i: leader for i in kept}
        with psycopg.connect(pg_dsn) as conn:
            assert conn.execute(sql.SQL("SELECT id FROM {}").format(db.names.dead_letters)).fetchall() == [(dead,)]
    finally:
        db.close()


@pytest.mark.integration
def test_a_commit_with_a_row_another_view_took_is_refused_and_deletes_nothing(pg_dsn: str, pg_schema: str) -> None:
    """A row in the middle of the range was re-marked by another leader (its leader_id changed): the
    range form deletes one row fewer, the count check refuses the commit and it is rolled back."""
    db, leader, epoch, ids = _outbox(pg_dsn, pg_schema, 50)
    try:
        stolen = ids[20]
        with psycopg.connect(pg_dsn) as conn:
            conn.execute(
                sql.SQL("UPDATE {} SET leader_id = %s WHERE id = %s").format(db.names.outbox), (uuid.uuid4(), stolen)
            )
        with pytest.raises(FenceError, match=r"1 of 50 row\(s\) are no longer owned"):
            db.commit_txn(epoch, leader, ids, [], b"P1", 7, [("t", 0)])
        left = _left(pg_dsn, db)
        assert sorted(left) == sorted(ids) and sum(1 for v in left.values() if v != leader) == 1
    finally:
        db.close()
