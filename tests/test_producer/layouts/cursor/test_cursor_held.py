"""``haltKey`` on ``outboxLayout: cursor`` on the fixtures' Postgres: producer/layouts/cursor/held.py's statements (the
fenced copy of a halted or held key's rows by the page read, the release in held order, a held row
dead-lettered again), then the relay's store running them (producer/layouts/cursor/database.py with ``halt_keys``) in both
modes, driven as the modes drive it: every row either sent once in its key's order or held, none lost."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from harvest_outbox.producer.db import TxnCommit
from harvest_outbox.producer.db.fence import DeadRow
from harvest_outbox.producer.errors import DatabaseError, FenceError, SchemaError
from harvest_outbox.producer.layouts.cursor.database import CursorDatabase, cursor_backlog
from harvest_outbox.producer.layouts.cursor.held import (
    dead_letter_held_sql,
    drop_held_sql,
    held_read_sql,
    held_table,
    released_sql,
)
from harvest_outbox.producer.layouts.cursor.schema import ORIGIN_TEXT
from harvest_outbox.producer.layouts.cursor.views import CursorViews
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db

pytestmark = pytest.mark.integration

TOPIC = "t"


@pytest.fixture
def box(pg_dsn: str, pg_schema: str) -> Iterator[tuple[psycopg.Connection[Any], OutboxNames]]:
    names = init_db(pg_dsn, f"{pg_schema}.outbox", layout="cursor", partition_ids=1000)  # _held included
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for statement in held_table(names, "varchar"):  # idempotent
            conn.execute(statement)
        yield conn, names


def write(conn: psycopg.Connection[Any], names: OutboxNames, *keys: str) -> list[int]:
    q = sql.SQL(
        "INSERT INTO {} (kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values) "
        "VALUES (%s, %s, %s, '{{}}', '{{}}') RETURNING id"
    ).format(names.outbox)
    return [int(conn.execute(q, (TOPIC, k, f"v-{k}-{i}")).fetchone()[0]) for i, k in enumerate(keys)]  # type: ignore[index]


def dead_letter(conn: psycopg.Connection[Any], names: OutboxNames, rid: int, key: str) -> None:
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, "
            "kafka_header_values, error, attempts) VALUES (%s, now(), %s, %s, 'x', '{{}}', '{{}}', 'poison', 1)"
        ).format(names.dead_letters),
        (rid, TOPIC, key),
    )


def epoch(conn: psycopg.Connection[Any], names: OutboxNames) -> int:
    return int(conn.execute(sql.SQL("SELECT epoch FROM {} WHERE shard = 0").format(names.cursor)).fetchone()[0])  # type: ignore[index]


def read(
    conn: psycopg.Connection[Any], names: OutboxNames, view_epoch: int, n: int = 100, start: int = 0
) -> list[tuple[Any, ...]]:
    """One page of everything committed so far from id ``start`` (the batch from the origin to now)."""
    hi = conn.execute("SELECT pg_current_snapshot()::text").fetchone()[0]  # type: ignore[index]
    params = {"from": start, "hi": hi, "lo": ORIGIN_TEXT, "n": n, "shard": 0, "epoch": view_epoch}
    return [tuple(r) for r in conn.execute(held_read_sql(names), params).fetchall()]


def passed(conn: psycopg.Connection[Any], names: OutboxNames) -> None:
    """The committed cursor passes every row committed so far."""
    conn.execute(
        sql.SQL("UPDATE {} SET lo = pg_current_snapshot(), hi = NULL, pos = 0 WHERE shard = 0").format(names.cursor)
    )


def held(conn: psycopg.Connection[Any], names: OutboxNames) -> list[tuple[int, str]]:
    q = sql.SQL("SELECT id, kafka_key FROM {} ORDER BY held_seq, id").format(names.held)
    return [(int(i), k) for i, k in conn.execute(q).fetchall()]


def released(conn: psycopg.Connection[Any], names: OutboxNames, serving: tuple[int, ...] = ()) -> list[int]:
    params = {"shards": [0], "serving": list(serving), "n": 100}
    rows = conn.execute(released_sql(names), params).fetchall()
    return [int(r[1]) for r in rows]


def test_a_halted_or_held_keys_rows_are_copied_once_and_flagged(
    box: tuple[psycopg.Connection[Any], OutboxNames],
) -> None:
    conn, names = box
    a0, p0, b0, p1, a1, p2 = write(conn, names, "a", "p", "b", "p", "a", "p")
    dead_letter(conn, names, p0, "p")  # p0 failed: p is halted
    e = epoch(conn, names)
    page = read(conn, names, e)
    assert [(r[0], r[3], r[4]) for r in page] == [
        (a0, False, False),
        (p0, True, False),  # the dead letter's own outbox row: passed by the cursor, neither sent nor held
        (b0, False, False),
        (p1, True, False),
        (a1, False, False),
        (p2, True, False),
    ]
    assert held(conn, names) == [(p1, "p"), (p2, "p")]
    assert read(conn, names, e) == page  # read again (a remark): nothing copied twice, same flags
    assert held(conn, names) == [(p1, "p"), (p2, "p")]
    # the dead letter discarded (once the cursor passed it): p is no longer halted but still held, so its
    # new row queues behind
    conn.execute(sql.SQL("DELETE FROM {}").format(names.dead_letters))
    (p3,) = write(conn, names, "p")
    assert [(r[0], r[3]) for r in read(conn, names, e, start=p2 + 1)] == [(p3, True)]
    assert [i for i, _ in held(conn, names)] == [p1, p2, p3]


def test_a_read_at_an_old_epoch_copies_nothing_and_says_so(box: tuple[psycopg.Connection[Any], OutboxNames]) -> None:
    conn, names = box
    (p0, p1) = write(conn, names, "p", "p")
    dead_letter(conn, names, p0, "p")
    e = epoch(conn, names)
    conn.execute(sql.SQL("UPDATE {} SET epoch = epoch + 1 WHERE shard = 0").format(names.cursor))  # a new view
    page = read(conn, names, e)
    assert [r[4] for r in page] == [True, True]  # fenced: the view must end
    assert held(conn, names) == []
    assert [r[4] for r in read(conn, names, e + 1)] == [False, False]
    assert [i for i, _ in held(conn, names)] == [p1]


def test_released_rows_in_held_order_and_a_failure_halts_the_key_again(
    box: tuple[psycopg.Connection[Any], OutboxNames],
) -> None:
    conn, names = box
    p0, q0, p1, q1, p2 = write(conn, names, "p", "q", "p", "q", "p")
    dead_letter(conn, names, p0, "p")
    dead_letter(conn, names, q0, "q")
    read(conn, names, epoch(conn, names))
    assert released(conn, names) == []  # both keys halted
    conn.execute(sql.SQL("DELETE FROM {} WHERE kafka_key = 'p'").format(names.dead_letters))  # p released
    assert released(conn, names) == []  # not before the committed cursor passed their outbox rows
    passed(conn, names)
    assert released(conn, names) == [p1, p2]
    assert released(conn, names, (p1,)) == [p2]  # p1 served, in flight: not again
    conn.execute(drop_held_sql(names), ([p1],))  # p1 delivered
    (p3,) = write(conn, names, "p")
    read(conn, names, epoch(conn, names), start=p3)  # p3 queues behind p2
    passed(conn, names)
    conn.execute(dead_letter_held_sql(names), ([p2], ["failed again"], [3]))  # p2 poisoned: p halts again
    assert released(conn, names) == []
    assert [i for i, _ in held(conn, names)] == [q1, p3]
    row = conn.execute(
        sql.SQL("SELECT kafka_key, kafka_value, error, attempts FROM {} WHERE id = %s").format(names.dead_letters),
        (p2,),
    ).fetchone()
    assert row == ("p", "v-p-4", "failed again", 3)


def ids_of(rows: list[Any]) -> list[int]:
    return [int(r[0]) for r in rows]


def discard_all(conn: psycopg.Connection[Any], names: OutboxNames) -> None:
    conn.execute(sql.SQL("DELETE FROM {}").format(names.dead_letters))


def test_the_at_least_once_store_holds_a_halted_keys_rows_and_serves_them_in_order_once_released(
    pg_dsn: str, box: tuple[psycopg.Connection[Any], OutboxNames]
) -> None:
    conn, names = box
    db = CursorDatabase(pg_dsn, names, CursorViews(False), halt_keys=True)
    try:
        _a0, p0, _b0, p1, a1 = write(conn, names, "a", "p", "b", "p", "a")
        view = uuid.uuid4()
        assert ids_of(db.mark_with_attempts(view, 10)[0]) == [1, 2, 3, 4, 5]  # nothing halted yet
        db.purge([1])
        db.dead_letter([DeadRow(p0, "poison", 1)])
        db.purge([3, a1])  # p1 dropped by the mode (KeyHalt: read before the dead letter was written)
        assert cursor_backlog(conn, names) == 2  # the delivered prefix stops before p1
        view = uuid.uuid4()  # the remark's new view reads from the committed cursor
        assert ids_of(db.mark_with_attempts(view, 10)[0]) == [a1]  # p1 held by the read, a1 sent again
        db.purge([a1])
        assert cursor_backlog(conn, names) == 0 and held(conn, names) == [(p1, "p")]
        p2, a2 = write(conn, names, "p", "a")
        assert ids_of(db.mark_with_attempts(view, 10)[0]) == [a2]
        db.purge([a2])
        assert ids_of(db.mark_with_attempts(view, 10)[0]) == []  # p still halted: nothing served
        discard_all(conn, names)  # the key released
        (p3,) = write(conn, names, "p")
        assert ids_of(db.mark_with_attempts(view, 10)[0]) == [p1, p2]  # held order; p3 queues behind them
        assert [i for i, _ in held(conn, names)] == [p1, p2, p3]
        db.purge([p1, p2])  # delivered: they leave _held; the cursor passes p3's outbox row
        assert [i for i, _ in held(conn, names)] == [p3] and cursor_backlog(conn, names) == 0
        assert ids_of(db.mark_with_attempts(view, 10)[0]) == [p3]
        db.purge([p3])
        (p4,) = write(conn, names, "p")
        assert ids_of(db.mark_with_attempts(view, 10)[0]) == [p4]  # _held empty: p flows from the outbox again
        assert held(conn, names) == []
    finally:
        db.close()


def test_the_sequenced_store_passes_held_rows_and_moves_served_ones_in_the_fenced_commit(
    pg_dsn: str, box: tuple[psycopg.Connection[Any], OutboxNames]
) -> None:
    conn, names = box
    db = CursorDatabase(pg_dsn, names, CursorViews(True), halt_keys=True)
    try:
        p0, a0, p1 = write(conn, names, "p", "a", "p")
        la = uuid.uuid4()
        epoch = db.start_view_with_floor(la, "a")[0]
        assert ids_of(db.mark_with_attempts(la, 10)[0]) == [p0, a0, p1]
        db.commit_txns(epoch, la, [TxnCommit([a0], [DeadRow(p0, "poison", 1)], b"p" * 16, 1, [("t", 0)])])
        lb = uuid.uuid4()  # p1 was dropped in view a (KeyHalt): the next view holds it
        epoch = db.start_view_with_floor(lb, "b")[0]
        assert ids_of(db.mark_with_attempts(lb, 10)[0]) == []  # held; the idle commit passes it
        assert cursor_backlog(conn, names) == 0 and held(conn, names) == [(p1, "p")]
        (p2,) = write(conn, names, "p")
        assert ids_of(db.mark_with_attempts(lb, 10)[0]) == []
        discard_all(conn, names)
        assert ids_of(db.mark_with_attempts(lb, 10)[0]) == [p1]  # p2's outbox row is not passed yet
        db.commit_txns(epoch, lb, [TxnCommit([p1], [], b"q" * 16, 2, [("t", 0)])])  # passes p2 too
        assert [i for i, _ in held(conn, names)] == [p2] and cursor_backlog(conn, names) == 0
        assert ids_of(db.mark_with_attempts(lb, 10)[0]) == [p2]
        db.commit_txns(epoch, lb, [TxnCommit([], [DeadRow(p2, "poison again", 2)], b"r" * 16, 3, [("t", 0)])])
        assert held(conn, names) == []
        dead = conn.execute(sql.SQL("SELECT id, error FROM {}").format(names.dead_letters)).fetchall()
        assert dead == [(p2, "poison again")]
        (p3,) = write(conn, names, "p")
        assert ids_of(db.mark_with_attempts(lb, 10)[0]) == []  # halted again: held
        assert held(conn, names) == [(p3, "p")]
    finally:
        db.close()


def test_the_sequenced_commit_holds_the_rows_its_view_dropped_for_a_halted_key(
    pg_dsn: str, box: tuple[psycopg.Connection[Any], OutboxNames]
) -> None:
    """A row read before its key's dead letter was decided, dropped unsent, followed by another key's
    delivered row: the commit must pass it (a cursor cannot skip it), so it holds it (TxnCommit.held)."""
    conn, names = box
    db = CursorDatabase(pg_dsn, names, CursorViews(True), halt_keys=True)
    try:
        p0, p1, a0 = write(conn, names, "p", "p", "a")
        view = uuid.uuid4()
        epoch = db.start_view_with_floor(view, "a")[0]
        assert ids_of(db.mark_with_attempts(view, 10)[0]) == [p0, p1, a0]
        with pytest.raises(FenceError, match="next read rows"):
            db.commit_txns(epoch, view, [TxnCommit([a0], [DeadRow(p0, "poison", 1)], b"p" * 16, 1, [("t", 0)])])
        view = uuid.uuid4()  # the refused commit ended the view: the next reads them again
        epoch = db.start_view_with_floor(view, "b")[0]
        assert ids_of(db.mark_with_attempts(view, 10)[0]) == [p0, p1, a0]
        db.commit_txns(epoch, view, [TxnCommit([a0], [DeadRow(p0, "poison", 1)], b"q" * 16, 2, [("t", 0)], held=[p1])])
        assert cursor_backlog(conn, names) == 0
        assert held(conn, names) == [(p1, "p")]
    finally:
        db.close()


def test_halt_key_refuses_a_cursor_outbox_without_its_held_table(
    pg_dsn: str, box: tuple[psycopg.Connection[Any], OutboxNames]
) -> None:
    """An outbox made before ``_held`` existed: the relay says to run init-db, which adds it."""
    conn, names = box
    conn.execute(sql.SQL("DROP TABLE {}").format(names.held))
    db = CursorDatabase(pg_dsn, names, CursorViews(False), halt_keys=True)
    try:
        with pytest.raises(SchemaError, match=r"needs its held-rows table .*run `harvest init-db`"):
            db.prepare_mark()
        init_db(pg_dsn, names.display, layout="cursor", partition_ids=1000)
        db.close()
        db.prepare_mark()  # now it connects
    finally:
        db.close()


def test_harvest_check_reports_the_held_rows_under_halt_key(
    pg_dsn: str, box: tuple[psycopg.Connection[Any], OutboxNames]
) -> None:
    from harvest_outbox.producer.config import HarvestConfig
    from harvest_outbox.producer.ops._check import check_outbox

    conn, names = box
    (p0, _p1) = write(conn, names, "p", "p")
    dead_letter(conn, names, p0, "p")
    read(conn, names, epoch(conn, names))
    cfg = HarvestConfig(
        data_source=pg_dsn, outbox_table=names.display, outbox_layout="cursor", dead_letter_policy="haltKey"
    )
    found = {f.subject: f for f in check_outbox(conn, cfg)}
    assert found["held rows"].level == "OK" and found["held rows"].message.startswith(
        "1 row(s) of 1 halted or held key(s)"
    )
    conn.execute(sql.SQL("DROP TABLE {}").format(names.held))
    found = {f.subject: f for f in check_outbox(conn, cfg)}
    assert found["held rows"].level == "FAIL" and "harvest init-db" in found["held rows"].fix
    skip = {f.subject for f in check_outbox(conn, cfg.replace(dead_letter_policy="skip"))}
    assert "held rows" not in skip


def test_the_at_least_once_store_holds_the_rows_its_view_dropped(
    pg_dsn: str, box: tuple[psycopg.Connection[Any], OutboxNames]
) -> None:
    """The at-least-once mode hands the store the rows it dropped for a key its view halted: held and passed,
    so the rows delivered after them are not read (and sent) again by the next view."""
    conn, names = box
    db = CursorDatabase(pg_dsn, names, CursorViews(False), halt_keys=True)
    try:
        p0, p1, a0 = write(conn, names, "p", "p", "a")
        view = uuid.uuid4()
        assert ids_of(db.mark_with_attempts(view, 10)[0]) == [p0, p1, a0]
        db.dead_letter([DeadRow(p0, "poison", 1)])
        db.purge([a0])
        assert cursor_backlog(conn, names) == 2  # p1 (dropped) blocks the delivered prefix
        assert db.hold([p1]) == 1
        assert cursor_backlog(conn, names) == 0 and held(conn, names) == [(p1, "p")]
        conn.execute(sql.SQL("UPDATE {} SET epoch = epoch + 1").format(names.cursor))  # another view took over
        with pytest.raises(DatabaseError, match="not current"):
            db.hold([p1])
    finally:
        db.close()


def test_a_key_released_later_is_served_from_its_first_held_row(
    pg_dsn: str, box: tuple[psycopg.Connection[Any], OutboxNames]
) -> None:
    """Serving is not a position: q's held rows (held first) are served after p's, which were released
    earlier, and a requeued dead letter is served ahead of its key's rows (both skipped by a position)."""
    conn, names = box
    db = CursorDatabase(pg_dsn, names, CursorViews(False), halt_keys=True)
    try:
        q0, q1, p0, p1, q2, p2 = write(conn, names, "q", "q", "p", "p", "q", "p")
        dead_letter(conn, names, q0, "q")
        dead_letter(conn, names, p0, "p")
        view = uuid.uuid4()
        assert ids_of(db.mark_with_attempts(view, 10)[0]) == []  # all waiting: passed, held
        assert [i for i, _ in held(conn, names)] == [q1, p1, q2, p2]
        conn.execute(sql.SQL("DELETE FROM {} WHERE kafka_key = 'p'").format(names.dead_letters))
        assert ids_of(db.mark_with_attempts(view, 10)[0]) == [p1, p2]
        conn.execute(sql.SQL("DELETE FROM {} WHERE kafka_key = 'q'").format(names.dead_letters))
        assert ids_of(db.mark_with_attempts(view, 10)[0]) == [q1, q2]  # below p's, served all the same
        db.purge([p1, p2, q1, q2])
        assert held(conn, names) == []
    finally:
        db.close()
