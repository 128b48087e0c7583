"""``outboxLayout: cursor`` (the cursor layout) on real Postgres and Kafka, in process: ``init-db``'s
partitioned outbox (the Stasher writes to it unchanged), both delivery modes publishing it -- every
committed row (exactly once and in per-key order with ``--uuid-sequencing``; at least once, in per-key
order, without), a late commit (a writer holding a low id commits after higher ids were relayed),
rolled-back rows never -- the outbox's rows never updated or deleted by the relay, and delivered
partitions retired (truncated, dropped) and new ones created ahead while it runs. The cursor store's
bookkeeping (:class:`~producer.layouts.cursor.views.ViewRead`) is checked on its own at the end.

A zombie view of either mode is fenced (its commit refused, its rows committed once by the next view)
on the cursor store itself; leader kill -9, takeover and a paused leader with the whole pipeline:
tests/test_e2e/test_faults.py's cursor plan. Also: ``harvest check`` on the layout, the A1 check, ids that
reached the DEFAULT partition (skipped over, then retired), the log naming a transaction that holds ``low``
back, and ``init-db --migrate`` from goharvest's table (every row, in order, attempt counts following).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql
from relaylib import assert_per_key_order, consume_all, covers, relay_config
from seqcheck import Expected, check_exactly_once, read_intents, wait_for, write_traffic

from harvest_outbox.producer.config import HarvestConfig
from harvest_outbox.producer.db import TxnCommit
from harvest_outbox.producer.db.fence import DeadRow
from harvest_outbox.producer.errors import ConfigError, DatabaseError, FenceError, SchemaError
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.layouts.cursor import partitions as cursor_partitions
from harvest_outbox.producer.layouts.cursor._watermark import Cursor, Snapshot, start_batch
from harvest_outbox.producer.layouts.cursor.database import CursorDatabase, cursor_backlog
from harvest_outbox.producer.layouts.cursor.schema import range_partitions
from harvest_outbox.producer.layouts.cursor.views import CursorViews, NotNextRows, Segment, ViewRead
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

PARTITION_IDS = 100  # a few hundred rows span several partitions


# ---------------------------------------------------------------------------- config (no services)
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"outbox_layout": "marks"}, "outboxLayout: 'marks' is not a layout; use mark"),
        (
            {"outbox_layout": "cursor", "missing_topic_policy": "hold"},
            "outboxLayout: cursor does not support missingTopicPolicy: hold yet",
        ),
    ],
    ids=["unknown", "hold"],
)
def test_the_layout_is_validated(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        HarvestConfig(**changes)  # type: ignore[arg-type]


def test_halt_key_is_accepted_on_the_cursor_layout() -> None:
    """Its held rows live in ``<outbox>_held`` (producer/layouts/cursor/held.py; test_halt_key.py runs it)."""
    assert HarvestConfig(outbox_layout="cursor", dead_letter_policy="haltKey").dead_letter_policy == "haltKey"


def test_the_layout_is_read_from_yaml() -> None:
    assert HarvestConfig.from_mapping({"outboxLayout": "cursor"}).outbox_layout == "cursor"
    assert HarvestConfig.from_mapping({}).outbox_layout is None  # unset: the table's (test_online_migration.py)
    with pytest.raises(ConfigError, match=r"harvest\.outboxLayout: 'Cursor' is not a layout"):
        HarvestConfig.from_mapping({"outboxLayout": "Cursor"})


# ---------------------------------------------------------------------------- init-db
@pytest.mark.integration
def test_init_db_makes_the_partitioned_outbox_and_refuses_the_other_layout(pg_dsn: str, pg_schema: str) -> None:
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, layout="cursor", partition_ids=PARTITION_IDS)
    init_db(pg_dsn, table, layout="cursor", partition_ids=PARTITION_IDS)  # idempotent
    with psycopg.connect(pg_dsn) as conn:
        parts = range_partitions(conn, names)
        assert [(a, b) for a, b, _n in parts] == [(0, 100), (100, 200)]
        with conn.transaction():
            Stasher(table).stash(conn, OutboxRecord("t", "k", "v", [("h", "1")]))
            Stasher(table).stash_many(conn, [OutboxRecord("t", f"k{i}", f"v{i}") for i in range(3)])
            xid = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
        rows = conn.execute(
            sql.SQL("SELECT id, txid::text, leader_id FROM {} ORDER BY id").format(names.outbox)
        ).fetchall()
        assert (
            [r[0] for r in rows] == [1, 2, 3, 4] and {r[1] for r in rows} == {xid[0]} and {r[2] for r in rows} == {None}
        )
        # a savepoint's rows carry the top-level xid (the snapshot lists only those)
        with conn.transaction():
            with conn.transaction():
                Stasher(table).stash(conn, OutboxRecord("t", "k", "in a savepoint"))
            top = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
        assert conn.execute(sql.SQL("SELECT txid::text FROM {} WHERE id = 5").format(names.outbox)).fetchone() == top
    with pytest.raises(SchemaError, match=r"is the cursor layout's partitioned table.*set outboxLayout: cursor"):
        init_db(pg_dsn, table)
    init_db(pg_dsn, f"{pg_schema}.goharvest")
    with pytest.raises(SchemaError, match=r"is goharvest's table.*harvest init-db --migrate"):
        init_db(pg_dsn, f"{pg_schema}.goharvest", layout="cursor")


@pytest.mark.integration
def test_the_relay_refuses_an_outbox_that_breaks_a1(pg_dsn: str, pg_schema: str) -> None:
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, layout="cursor", partition_ids=PARTITION_IDS)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER TABLE {} ALTER COLUMN id SET DEFAULT nextval({})").format(
                names.outbox, sql.Literal(names.id_sequence.as_string(conn))
            )
        )
    relay = Harvest(_cfg(pg_dsn, "localhost:1", table, "g", sequenced=True), lambda e: None)
    with pytest.raises(SchemaError, match="does not take the writer's transaction id before the id"):
        relay.core.open()


# ---------------------------------------------------------------------------- both modes, end to end
def _cfg(pg_dsn: str, bootstrap: str, table: str, group: str, sequenced: bool) -> HarvestConfig:
    base = dict(mark_query_records=300, txn_max_records=100, txn_max_duration=0.02, producer_ring=4)
    return (
        relay_config(pg_dsn, bootstrap, table, group, **base)  # type: ignore[arg-type]
        .replace(uuid_sequencing=sequenced, leader_election="postgres", leader_lock_check_interval=0.2)
        .replace(outbox_layout="cursor")
    )


def _untouched(pg_dsn: str, names: OutboxNames) -> tuple[int, int]:
    """(updated or deleted row versions of the outbox's partitions, rows marked): the relay writes neither."""
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(
            """SELECT coalesce(sum(n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables s
               JOIN pg_inherits i ON i.inhrelid = s.relid WHERE i.inhparent = to_regclass(%s)""",
            (names.outbox.as_string(conn),),
        ).fetchone()
        marked = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE leader_id IS NOT NULL").format(names.outbox)
        ).fetchone()
    return int(row[0]), int(marked[0])  # type: ignore[index]


@pytest.mark.integration
@pytest.mark.parametrize("sequenced", [True, False], ids=["sequenced", "at-least-once"])
def test_every_committed_row_once_late_commits_and_partitions_retired(
    sequenced: bool,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cursor_partitions, "MAINTENANCE_INTERVAL", 0.2)
    topic = topic_factory(partitions=4)
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, layout="cursor", partition_ids=PARTITION_IDS)
    exp = Expected()
    relay = Harvest(_cfg(pg_dsn, kafka_bootstrap, table, unique_name("g"), sequenced), lambda e: None)
    relay.start()
    late = psycopg.connect(pg_dsn)
    try:
        # the late writer draws the lowest ids and holds them open while everything else is relayed
        Stasher(table).stash_many(late, [OutboxRecord(topic, "late-k", f"late-{i}") for i in range(3)])
        failed: list[BaseException] = []

        def write(w: int) -> None:
            try:
                write_traffic(pg_dsn, table, topic, exp, w, 25, pause=0.005)
            except BaseException as exc:  # a writer's failure (say, a partition attached under it) fails the test
                failed.append(exc)

        writers = [threading.Thread(target=write, args=(w,)) for w in range(3)]
        for t in writers:
            t.start()
        for t in writers:
            t.join()
        assert not failed, f"a writer failed: {failed[0]!r}"
        # autocommit: a reader's open transaction would hold the partitions
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            wait_for(lambda: cursor_backlog(conn, names) == 0, 60, "the others' rows relayed")
            # the open writer holds low below its ids: no partition past it is retired yet
            assert range_partitions(conn, names)[0][0] == 0
        late.commit()  # ids 1..3, committed after hundreds of higher ids went out
        exp.by_key["late-k"] = [f"late-{i}".encode() for i in range(3)]
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            wait_for(lambda: cursor_backlog(conn, names) == 0, 60, "the late commit relayed")
            if sequenced:
                wait_for(lambda: not read_intents(pg_dsn, table), 60, "ACK intents confirmed")
            # further writes move the probe past the late ids, then maintenance retires their partitions
            for _ in range(4):
                with conn.transaction():
                    Stasher(table).stash(conn, OutboxRecord(topic, "late-k", f"after-{_}"))
                exp.by_key["late-k"].append(f"after-{_}".encode())
                time.sleep(0.3)
            wait_for(lambda: cursor_backlog(conn, names) == 0, 60, "the last rows relayed")
            wait_for(lambda: range_partitions(conn, names)[0][0] > 0, 30, "a delivered partition retired")
            head = conn.execute(sql.SQL("SELECT last_value FROM {}").format(names.id_sequence)).fetchone()[0]  # type: ignore[index]
            assert range_partitions(conn, names)[-1][1] > head + PARTITION_IDS  # created ahead
    finally:
        late.close()
        relay.stop()
        relay.wait(30)
    assert _untouched(pg_dsn, names) == (0, 0)
    total = sum(len(v) for v in exp.by_key.values())
    assert len(exp.rolled_back) > 0 and total > 300
    if sequenced:
        res = check_exactly_once(kafka_bootstrap, topic, 4, exp)
        assert res.committed == total and res.continues == total
    else:
        got = consume_all(kafka_bootstrap, topic, covers(exp.by_key))
        values = {g.value for g in got}
        assert not values & exp.rolled_back
        assert_per_key_order(got, dict(exp.by_key), allow_dups=True)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- ViewRead (no services)
def _view() -> ViewRead:
    """Three pages: ids 1-3 (full), 5-6 (end of batch 1), an empty page, then 9 (batch 2, short)."""
    b1 = start_batch(Cursor(), Snapshot(10, 10), 10, 6)
    v = ViewRead(uuid.uuid4(), 1, b1)
    v.add(Segment(b1, [1, 2, 3], Cursor(b1.lo, b1.hi, 3, b1.low, b1.probe)))
    end1 = Cursor(b1.hi, None, 0, b1.low, b1.probe)  # type: ignore[arg-type]
    v.add(Segment(Cursor(b1.lo, b1.hi, 3, b1.low, b1.probe), [5, 6], end1))
    b2 = start_batch(end1, Snapshot(12, 12), None, 9)
    v.add(Segment(b2, [], Cursor(b2.hi, None, 0, b2.low, b2.probe)))  # type: ignore[arg-type]
    b3 = start_batch(Cursor(b2.hi, None, 0, b2.low, b2.probe), Snapshot(13, 13), None, 9)  # type: ignore[arg-type]
    v.add(Segment(b3, [9], Cursor(b3.hi, None, 0, b3.low, b3.probe)))  # type: ignore[arg-type]
    return v


def test_a_commit_passes_the_next_read_rows_in_order_only() -> None:
    v = _view()
    with pytest.raises(NotNextRows):
        v.plan_exact([1, 3])  # skips 2
    cur, finished, done = v.plan_exact([2, 1])
    assert cur is not None and cur.pos == 2 and cur.hi is not None and (finished, done) == (0, 2)
    v.apply(finished, done)
    cur, finished, done = v.plan_exact([3, 5, 6])
    # the end of batch 1, then the empty page right behind it: its snapshot is lo
    assert cur is not None and cur.hi is None and cur.lo == Snapshot(12, 12) and finished == 3
    v.apply(finished, done)
    with pytest.raises(NotNextRows):
        v.plan_exact([9, 10])  # 10 was never read


def test_at_least_once_commits_the_delivered_prefix() -> None:
    v = _view()
    assert v.plan_delivered([2, 5, 6])[0] is None  # 1 is not delivered: nothing moves
    cur, finished, done = v.plan_delivered([1])
    assert cur is not None and cur.pos == 2 and (finished, done) == (0, 2)
    v.apply(finished, done)
    cur, finished, done = v.plan_delivered([3, 9])
    assert cur is not None and cur.lo == Snapshot(13, 13) and v.pending_rows() == 4
    v.apply(finished, done)
    assert v.pending_rows() == 0 and not v.delivered


# ---------------------------------------------------------------------------- zombies, on Postgres (no Kafka)
def _rows(pg_dsn: str, table: str, n: int) -> None:
    with psycopg.connect(pg_dsn) as conn:
        Stasher(table).stash_many(conn, [OutboxRecord("t", f"k{i % 3}", f"v{i}") for i in range(n)])


@pytest.mark.integration
def test_a_zombie_sequenced_view_is_fenced_and_its_rows_committed_once_by_the_next(pg_dsn: str, pg_schema: str) -> None:
    """View A reads rows; view B starts (another relay took over); A's fenced commit is refused and moves
    nothing; B reads the same rows from the committed cursor and commits them; a commit that skips a read
    row is refused too (a cursor cannot represent it)."""
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, layout="cursor", partition_ids=PARTITION_IDS)
    _rows(pg_dsn, table, 5)
    a, b = CursorDatabase(pg_dsn, names, CursorViews(True)), CursorDatabase(pg_dsn, names, CursorViews(True))
    la, lb = uuid.uuid4(), uuid.uuid4()
    try:
        epoch_a = a.start_view_with_floor(la, "a")[0]
        read_a = [r[0] for r in a.mark_with_attempts(la, 10)[0]]
        epoch_b = b.start_view_with_floor(lb, "b")[0]
        assert read_a == [1, 2, 3, 4, 5] and epoch_b > epoch_a
        with pytest.raises(FenceError, match="epoch"):
            a.commit_txns(epoch_a, la, [TxnCommit(read_a, [], b"p" * 16, 1, [("t", 0)])])
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            assert cursor_backlog(conn, names) == 5
        read_b = [r[0] for r in b.mark_with_attempts(lb, 10)[0]]
        assert read_b == read_a
        with pytest.raises(FenceError, match="not the view's next read rows"):
            b.commit_txns(epoch_b, lb, [TxnCommit([1, 3], [], b"q" * 16, 2, [("t", 0)])])
        b.commit_txns(epoch_b, lb, [TxnCommit([1, 2], [], b"q" * 16, 2, [("t", 0)])])
        b.commit_txns(epoch_b, lb, [TxnCommit([3, 4], [DeadRow(5, "poison", 3)], b"r" * 16, 3, [("t", 1)])])
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            assert cursor_backlog(conn, names) == 0
            dead = conn.execute(sql.SQL("SELECT id, error FROM {}").format(names.dead_letters)).fetchall()
            assert dead == [(5, "poison")]
            assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(names.outbox)).fetchone() == (5,)
    finally:
        a.close()
        b.close()


@pytest.mark.integration
def test_an_at_least_once_zombie_cannot_move_the_cursor(pg_dsn: str, pg_schema: str) -> None:
    """At-least-once: the cursor moves past the delivered prefix only; a view whose epoch another view
    raised is refused (a DatabaseError: the relay remarks) and the rows after the cursor go out again."""
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, layout="cursor", partition_ids=PARTITION_IDS)
    _rows(pg_dsn, table, 4)
    a, b = CursorDatabase(pg_dsn, names, CursorViews(False)), CursorDatabase(pg_dsn, names, CursorViews(False))
    la, lb = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        try:
            assert [r[0] for r in a.mark_with_attempts(la, 10)[0]] == [1, 2, 3, 4]
            a.purge([2, 3])  # 1 is not delivered yet: nothing moves
            assert cursor_backlog(conn, names) == 4
            a.purge([1])
            assert cursor_backlog(conn, names) == 1
            assert [r[0] for r in b.mark_with_attempts(lb, 10)[0]] == [4]  # a new view: from the committed cursor
            with pytest.raises(DatabaseError, match="another view raised the cursor's epoch"):
                a.purge([4])
            b.purge([4])
            assert cursor_backlog(conn, names) == 0
            # a dead letter is copied (the row stays for its partition's retirement) and passed like a delivery
            _rows(pg_dsn, table, 2)
            assert [r[0] for r in b.mark_with_attempts(lb, 10)[0]] == [5, 6]
            assert b.dead_letter([(5, "poison", 2)]) == 1
            assert cursor_backlog(conn, names) == 1
            b.purge([6])
            assert cursor_backlog(conn, names) == 0
            dead = conn.execute(sql.SQL("SELECT id, error, attempts FROM {}").format(names.dead_letters)).fetchall()
            assert dead == [(5, "poison", 2)]
        finally:
            a.close()
            b.close()


@pytest.mark.integration
def test_harvest_check_reads_the_cursor_layout(pg_dsn: str, pg_schema: str) -> None:
    """``harvest check``: the partitions and the cursor's backlog on the cursor layout; the other
    layout's config on the same table is a FAIL naming the fix."""
    from harvest_outbox.producer.ops._check import check_outbox

    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table, layout="cursor", partition_ids=PARTITION_IDS)
    _rows(pg_dsn, table, 3)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        found = {
            f.subject: f
            for f in check_outbox(conn, HarvestConfig(data_source=pg_dsn, outbox_table=table, outbox_layout="cursor"))
        }
        assert "cursor layout, 2 id-range partition(s), ids [0, 200)" in found["table"].message
        assert found["backlog"].message.startswith("3 row(s) the committed cursor has not passed")
        assert all(f.level == "OK" for f in found.values()), found
        unset = check_outbox(conn, HarvestConfig(data_source=pg_dsn, outbox_table=table))  # follows the table
        assert [(f.level, f.subject) for f in unset] == [(f.level, f.subject) for f in found.values()]
        wrong = check_outbox(conn, HarvestConfig(data_source=pg_dsn, outbox_table=table, outbox_layout="mark"))
        assert [(f.level, f.subject) for f in wrong] == [("FAIL", "layout")] and "set outboxLayout: cursor" in wrong[
            0
        ].message


def test_an_idle_view_commits_the_cursor_after_its_empty_pages_only() -> None:
    v = _view()
    assert v.idle_cursor() is None  # rows read and not committed
    v.apply(*v.plan_exact([1, 2, 3, 5, 6, 9])[1:], None)
    b4 = start_batch(v.cursor, Snapshot(14, 14), None, 9)
    v.add(Segment(b4, [], Cursor(b4.hi, None, 0, b4.low, b4.probe)))  # type: ignore[arg-type]
    cur = v.idle_cursor()
    assert cur is not None and cur.lo == Snapshot(14, 14)
    v.idle_committed(cur)
    assert v.idle_cursor() is None and not v.segments  # committed: nothing more until the cursor moves
    # the next empty batch moves lo / hi alone (the idle commit took an xid): passed, not written
    b5 = start_batch(cur, Snapshot(15, 15), None, 9)
    v.add(Segment(b5, [], Cursor(b5.hi, None, cur.pos, b5.low, b5.probe)))  # type: ignore[arg-type]
    nxt = v.idle_cursor()
    assert nxt is not None and nxt.lo == Snapshot(15, 15) and v.only_snapshots_moved(nxt)
    v.idle_committed(nxt, written=False)
    assert not v.segments and v.committed == cur and v.idle_cursor() is None  # no growth, nothing to write
    # low moving (a probe resolved) is written: the delivered partitions below it may retire
    b6 = start_batch(cur, Snapshot(16, 16), None, 9)
    v.add(Segment(b6, [], Cursor(b6.hi, None, cur.pos, cur.low + 5, b6.probe)))  # type: ignore[arg-type]
    moved = v.idle_cursor()
    assert moved is not None and not v.only_snapshots_moved(moved)


@pytest.mark.integration
def test_a_transaction_holding_low_back_is_logged_with_its_pid(
    pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An open transaction with an xid (anywhere in the cluster) keeps the probe from resolving: rows still
    flow, and the relay names the oldest such transaction once the probe has waited HELD_LOW_SECONDS."""
    import logging

    from harvest_outbox.producer.layouts.cursor import database as db_cursor

    monkeypatch.setattr(db_cursor, "HELD_LOW_SECONDS", 0.3)
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, layout="cursor", partition_ids=PARTITION_IDS)
    holder = psycopg.connect(pg_dsn, application_name="the-long-one")
    db = CursorDatabase(pg_dsn, names, CursorViews(False))
    lid = uuid.uuid4()
    try:
        holder.execute("SELECT pg_current_xact_id()")  # an xid, nothing written to the outbox
        pid = holder.info.backend_pid
        with caplog.at_level(logging.WARNING, logger="harvest_outbox.producer.layouts.cursor.database"):
            for n in range(1, 5):
                _rows(pg_dsn, table, 3)
                got = [r[0] for r in db.mark_with_attempts(lid, 100)[0]]
                assert len(got) == 3, f"round {n}: rows are not delayed by the open transaction"
                db.purge(got)
                db.mark_with_attempts(lid, 100)  # completes the batch; the next round starts one
                time.sleep(0.2)
        held = [r.getMessage() for r in caplog.records if "holds the cursor's low back" in r.getMessage()]
        assert held and f"pid {pid} (the-long-one" in held[0], held
    finally:
        holder.close()
        db.close()


@pytest.mark.integration
def test_ids_that_reached_the_default_partition_are_skipped_then_retired(pg_dsn: str, pg_schema: str) -> None:
    """Maintenance behind the writers (here: not run while 250 ids were written into 2 partitions of 100):
    ids 200-250 go to the DEFAULT partition; the next partition starts above them (300), and once the
    committed cursor's low has passed them the DEFAULT partition is truncated (never dropped)."""
    from harvest_outbox.producer.layouts.cursor.partitions import PartitionKeeper

    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, layout="cursor", partition_ids=PARTITION_IDS)
    _rows(pg_dsn, table, 250)
    keeper = PartitionKeeper(names, interval=0)
    db = CursorDatabase(pg_dsn, names, CursorViews(False))
    lid = uuid.uuid4()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        try:
            done = keeper.run(conn)
            assert done.created[:1] == [names.partition_name(300)], done
            assert [(a, b) for a, b, _n in range_partitions(conn, names)][:3] == [(0, 100), (100, 200), (300, 400)]
            for _ in range(5):  # read and deliver everything, then idle batches move low past the head
                rows = [r[0] for r in db.mark_with_attempts(lid, 1000)[0]]
                if rows:
                    db.purge(rows)
                time.sleep(0.05)
            db._next_idle_commit = 0.0
            db.mark_with_attempts(lid, 1000)
            assert cursor_backlog(conn, names) == 0
            done = keeper.run(conn)
            assert "outbox_rest" in done.truncated and names.partition_name(0) in done.dropped, done
            rest = sql.SQL("SELECT count(*) FROM {}").format(names.qualified("outbox_rest"))
            assert conn.execute(rest).fetchone() == (0,)
        finally:
            db.close()


@pytest.mark.integration
def test_init_db_migrate_keeps_every_undelivered_row_in_order(pg_dsn: str, pg_schema: str) -> None:
    """goharvest's table with rows (one marked by a stopped relay), an attempt count and a dead letter whose
    id is above every row's: ``--migrate`` renames it away and copies its rows, in id order, with new ids
    above every old id (no new row can overwrite the old dead letter), their attempt counts following;
    the cursor relay's store then reads them first, in that order, and writers go on with the Stasher."""
    from harvest_outbox.producer.layouts.cursor.migrate import migrate_to_cursor

    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        with conn.transaction():
            Stasher(table).stash_many(
                conn, [OutboxRecord("t", f"k{i % 2}", f"old-{i}", [("h", str(i))]) for i in range(5)]
            )
        conn.execute(sql.SQL("DELETE FROM {} WHERE id = 1").format(names.outbox))  # delivered before the migration
        conn.execute(sql.SQL("UPDATE {} SET leader_id = gen_random_uuid() WHERE id = 2").format(names.outbox))
        conn.execute(sql.SQL("INSERT INTO {} (id, attempts) VALUES (3, 2)").format(names.delivery_attempts))
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (id, kafka_topic, kafka_key, error, attempts) VALUES (40, 't', 'k', 'bad', 1)"
            ).format(names.dead_letters)
        )
        done = migrate_to_cursor(conn, table, partition_ids=PARTITION_IDS)
        assert (done.copied, done.first_id) == (4, 41)
        rows = conn.execute(
            sql.SQL("SELECT id, kafka_value, kafka_header_values, leader_id FROM {} ORDER BY id").format(names.outbox)
        ).fetchall()
        assert rows == [
            (41, "old-1", ["1"], None),
            (42, "old-2", ["2"], None),
            (43, "old-3", ["3"], None),
            (44, "old-4", ["4"], None),
        ]
        assert conn.execute(sql.SQL("SELECT id, attempts FROM {}").format(names.delivery_attempts)).fetchall() == [
            (42, 2)
        ]
        assert conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(names.qualified("outbox_goharvest"))
        ).fetchone() == (4,)
        Stasher(table).stash(conn, OutboxRecord("t", "k0", "new-0"))
        with pytest.raises(SchemaError, match="already in the cursor layout"):
            migrate_to_cursor(conn, table)
    db = CursorDatabase(pg_dsn, names, CursorViews(False))
    try:
        got = db.mark_with_attempts(uuid.uuid4(), 100)[0]
        assert [(r[0], r[3]) for r in got] == [
            (41, b"old-1"),
            (42, b"old-2"),
            (43, b"old-3"),
            (44, b"old-4"),
            (45, b"new-0"),
        ]
        assert got[1][7] == 2  # the attempt count followed its row
    finally:
        db.close()


@pytest.mark.integration
def test_the_cli_migrates_only_to_a_configured_cursor_layout(
    pg_dsn: str, pg_schema: str, tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    from pathlib import Path

    from harvest_outbox.producer.ops.cli import main

    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    base = f'harvest:\n  dataSource: "{pg_dsn}"\n  outboxTable: {table}\n'
    mark, cursor = Path(str(tmp_path)) / "mark.yaml", Path(str(tmp_path)) / "cursor.yaml"
    mark.write_text(base + "  outboxLayout: mark\n")
    cursor.write_text(base + "  outboxLayout: cursor\n")
    assert main(["init-db", "--migrate", "-f", str(mark)]) == 2
    assert "set outboxLayout: cursor" in capsys.readouterr().err
    assert main(["init-db", "-f", str(cursor)]) == 1
    assert "harvest init-db --migrate" in capsys.readouterr().err
    assert main(["init-db", "--migrate", "-f", str(cursor)]) == 0
    assert "migrated to the cursor layout: 0 row(s) copied" in capsys.readouterr().out
    assert main(["init-db", "-f", str(cursor)]) == 0  # idempotent on the new layout


@pytest.mark.integration
def test_a_batchs_first_page_comes_with_its_start_and_is_read_again_where_the_guard_moves_it(
    pg_dsn: str, pg_schema: str
) -> None:
    """A new batch's start and its first page go in one round trip (one REPEATABLE READ transaction: the page
    is read in the batch's own snapshot). Step by step: the first page skips an open writer's row and
    later pages go on after it, the late commit arrives in the next batch; then the sequence restarts below
    the cursor's ``low`` (the guard rescans from id 0): the page read with the batch start, taken from
    ``low``, is thrown away and read again from id 0, or the new row below ``low`` would be passed."""
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, layout="cursor", partition_ids=PARTITION_IDS)
    db = CursorDatabase(pg_dsn, names, CursorViews(False))
    rereads: list[int] = []
    read_rows = db._read_rows

    def counted(*args: object, **kwargs: object) -> object:
        rereads.append(1)
        return read_rows(*args, **kwargs)  # type: ignore[arg-type]

    db._read_rows = counted  # type: ignore[method-assign]
    lid = uuid.uuid4()

    def page(limit: int) -> tuple[list[int], int]:
        before = len(rereads)
        got = [int(r[0]) for r in db.mark_with_attempts(lid, limit)[0]]
        return got, len(rereads) - before

    writer = psycopg.connect(pg_dsn)
    try:
        _rows(pg_dsn, table, 3)  # ids 1-3
        Stasher(table).stash(writer, OutboxRecord("t", "late", "late"))  # id 4, not committed yet
        _rows(pg_dsn, table, 2)  # ids 5-6
        assert page(2) == ([1, 2], 0)  # the batch's start and its first page: one round trip
        assert page(2) == ([3, 5], 1)  # the batch's next pages are read on their own
        assert page(2) == ([6], 1)
        writer.commit()
        assert page(10) == ([4], 0)  # the late commit, in the batch after it committed
        Stasher(table).stash_many(writer, [OutboxRecord("t", "k", "gone")] * 3)
        writer.rollback()  # ids 7-9 drawn, never committed
        _rows(pg_dsn, table, 2)  # ids 10-11
        assert page(10) == ([10, 11], 0)
        db.purge([1, 2, 3, 4, 5, 6, 10, 11])
        for _ in range(50):  # batches until the probe resolves: low passes every delivered id
            page(10)
            view = db.views.view
            if view is not None and view.reads[0].cursor.low > 11:
                break
            time.sleep(0.02)
        assert view is not None and view.reads[0].cursor.low == 12
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER SEQUENCE {} RESTART WITH 7").format(names.id_sequence))
        _rows(pg_dsn, table, 1)  # id 7, below low
        assert page(10) == ([7], 1)  # the page from low (empty) thrown away, read again from id 0
        assert page(10) == ([], 0)
    finally:
        writer.close()
        db.close()
