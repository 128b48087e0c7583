"""The cursor layout's SQL sketch (docs/design.md §11) on the real Postgres
the fixtures start, driven by producer/layouts/cursor/_watermark.py's decisions: a transaction that commits late (a
lower id than rows already relayed) is caught by the snapshot interval, with two writer connections
and a relay connection; the read query's WHERE agrees with the module's ``Cursor.pending``; a
partition holding an open writer's row is not truncated (the module does not offer it, and a forced
``LOCK`` times out under ``lock_timeout``), and once delivered it is. Nothing is marked: the outbox
rows are never updated or deleted one by one.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from harvest_outbox.producer.errors import FenceError
from harvest_outbox.producer.layouts.cursor._watermark import read_page, retirable
from harvest_outbox.producer.layouts.cursor._watermark_sql import WatermarkSession, ddl, text_of

PARTITION = 4  # ids per partition: a handful of rows spans several


class SqlRelay:
    """A relay loop on :class:`WatermarkSession` (one autocommit connection); every page is also read
    unfiltered and decided by :func:`read_page`, which must pick the same rows as the SQL WHERE."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.db = WatermarkSession(self.conn, schema)
        self.epoch, self.cursor = self.db.new_view()
        self.published: list[tuple[int, bytes]] = []
        self.truncated: set[str] = set()

    def begin_batch(self) -> None:
        self.cursor = self.db.begin_batch(self.cursor)

    def batch(self, limit: int = 100) -> list[int]:
        """One batch, page by page, each page's cursor committed (fenced) once it is "delivered"."""
        if self.cursor.hi is None:
            self.begin_batch()
        out: list[int] = []
        while True:
            page = read_page(self.cursor, self.db.read(self.cursor, limit), limit)
            same = read_page(self.cursor, self.db.read_unfiltered(self.cursor), limit)
            assert page.rows == same.rows, "the read query's WHERE and Cursor.pending disagree"
            self.published.extend((i, k) for i, _t, k, _v in page.rows)
            out.extend(i for i, *_ in page.rows)
            self.db.commit(self.epoch, page.after)
            self.cursor = page.after
            if page.complete:
                return out

    def truncate(self, name: str) -> str:
        return self.db.truncate(name)

    def retire(self) -> list[str]:
        parts = self.db.partitions()
        ok = set(retirable([(a, b) for a, b, _n in parts], self.db.load()[1]))
        done = [n for a, b, n in parts if (a, b) in ok and n not in self.truncated and self.truncate(n) == "truncated"]
        self.truncated.update(done)
        return done


@pytest.fixture
def outbox(pg_dsn: str, pg_schema: str) -> Iterator[tuple[str, str]]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for stmt in ddl(pg_schema, PARTITION, 6):
            conn.execute(stmt)
    yield pg_dsn, pg_schema


def insert(conn: psycopg.Connection[Any], schema: str, key: bytes) -> int:
    row = conn.execute(
        sql.SQL("INSERT INTO {}.outbox (topic, key, value) VALUES ('t', %s, 'v') RETURNING id").format(
            sql.Identifier(schema)
        ),
        (key,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_late_commit_is_delivered_in_the_batch_after_it_commits(outbox: tuple[str, str]) -> None:
    dsn, schema = outbox
    relay = SqlRelay(dsn, schema)
    with psycopg.connect(dsn) as a, psycopg.connect(dsn) as b:
        late = insert(a, schema, b"k1")  # a's transaction stays open: its row has the lowest id
        early = [insert(b, schema, b"k2"), insert(b, schema, b"k2")]
        b.commit()
        assert late < min(early)
        assert relay.batch() == early, "rows of b, committed, go out while a's transaction is open"
        assert relay.cursor.low <= late, "the id bound passed an open transaction's row"
        assert relay.batch() == [], "nothing new: a is still open"
        after = insert(b, schema, b"k3")
        b.commit()
        assert relay.batch() == [after]
        a.commit()  # the late commit
        assert relay.batch() == [late], "the late commit is caught by the next batch"
        assert relay.batch() == []
    keys = [k for _i, k in relay.published]
    assert sorted(i for i, _k in relay.published) == sorted([late, *early, after]), "each row exactly once"
    assert keys.count(b"k1") == 1
    rows = relay.conn.execute(sql.SQL("SELECT count(*) FROM {}.outbox").format(sql.Identifier(schema))).fetchone()
    assert rows == (4,), "nothing was deleted or marked row by row"
    relay.conn.close()


def test_a_row_written_in_a_savepoint_is_caught_by_its_top_level_txid_not_its_xmin(outbox: tuple[str, str]) -> None:
    """A row inserted in a subtransaction (SAVEPOINT: ORMs' nested transactions) has the subtransaction's
    xid as xmin, and pg_snapshot lists top-level xids only: judged by xmin, a snapshot taken while its
    transaction was open calls it visible, and the relay would skip it for good. The txid column holds
    the top-level xid: the row goes out after its commit."""
    dsn, schema = outbox
    relay = SqlRelay(dsn, schema)
    with psycopg.connect(dsn) as a, psycopg.connect(dsn) as b:
        a.execute("SAVEPOINT nested")
        late = insert(a, schema, b"nested")
        a.execute("RELEASE SAVEPOINT nested")
        early = insert(b, schema, b"k")
        b.commit()  # a later xid ends: the snapshot's xmax passes the subtransaction's xid
        assert relay.batch() == [early]
        lo = relay.cursor.lo
        a.commit()
        row = relay.conn.execute(
            sql.SQL(
                """SELECT xmin::text::xid8 <> txid, pg_visible_in_snapshot(xmin::text::xid8, %s::pg_snapshot),
                          pg_visible_in_snapshot(txid, %s::pg_snapshot) FROM {}.outbox WHERE id = %s"""
            ).format(sql.Identifier(schema)),
            (text_of(lo), text_of(lo), late),
        ).fetchone()
        assert row == (True, True, False), "xmin is the subtransaction's, which the old snapshot calls visible"
        assert relay.batch() == [late]
    relay.conn.close()


def test_an_aborted_transaction_is_never_delivered_and_pages_resume_mid_batch(outbox: tuple[str, str]) -> None:
    dsn, schema = outbox
    relay = SqlRelay(dsn, schema)
    with psycopg.connect(dsn) as a, psycopg.connect(dsn) as b:
        insert(a, schema, b"gone")
        ids = [insert(b, schema, b"k") for _ in range(7)]
        b.commit()
        a.rollback()
        relay.begin_batch()
        first = relay.batch(limit=3)  # three pages, each committed
    assert first == ids
    restarted = SqlRelay(dsn, schema)  # a new leader starts from the committed cursor and fences the old
    assert restarted.cursor == relay.cursor and restarted.batch() == []
    with pytest.raises(FenceError, match="epoch is no longer"):
        relay.db.commit(relay.epoch, relay.cursor)
    relay.conn.close()
    restarted.conn.close()


def test_a_partition_with_an_open_writers_row_is_kept_until_delivered(outbox: tuple[str, str]) -> None:
    dsn, schema = outbox
    relay = SqlRelay(dsn, schema)
    with psycopg.connect(dsn) as a, psycopg.connect(dsn) as b:
        held = insert(a, schema, b"held")  # id 1, in partition [0, 4)
        for _ in range(10):
            insert(b, schema, b"k")
        b.commit()
        for _ in range(3):
            relay.batch()
        assert relay.retire() == [], "low cannot pass the open transaction's id"
        assert relay.truncate("outbox_p0") == "lock timeout", "a forced truncation waits for the writer, then gives up"
        a.commit()
        delivered = []
        for _ in range(3):  # the late row, then two batches for the probe to see its xid end
            delivered += relay.batch()
            insert(b, schema, b"more")
            b.commit()
        assert held in delivered
        retired = relay.retire()
    assert "outbox_p0" in retired and "outbox_p1" in retired, retired
    left = relay.conn.execute(sql.SQL("SELECT min(id) FROM {}.outbox").format(sql.Identifier(schema))).fetchone()
    assert left is not None and left[0] >= relay.cursor.low - PARTITION
    relay.conn.close()


def test_the_cursor_commit_and_the_reads_write_little_wal(outbox: tuple[str, str]) -> None:
    """WAL of the relay per batch: the read statements write none; one cursor UPDATE (HOT) per page."""
    dsn, schema = outbox
    relay = SqlRelay(dsn, schema)
    with psycopg.connect(dsn) as b:
        for _ in range(20):
            insert(b, schema, b"k")
        b.commit()
    lsn = "SELECT pg_current_wal_insert_lsn()"
    relay.conn.execute("CHECKPOINT")
    relay.batch()  # the first read after the checkpoint sets hint bits (an FPI only with wal_log_hints/checksums)
    start = relay.conn.execute(lsn).fetchone()
    relay.begin_batch()
    rows = relay.db.read(relay.cursor, 100)
    mid = relay.conn.execute(lsn).fetchone()
    page = read_page(relay.cursor, rows, 100)
    relay.db.commit(relay.epoch, page.after)
    end = relay.conn.execute(lsn).fetchone()
    assert start and mid and end
    size = "SELECT pg_wal_lsn_diff(%s, %s)"
    read_wal = relay.conn.execute(size, (mid[0], start[0])).fetchone()
    commit_wal = relay.conn.execute(size, (end[0], mid[0])).fetchone()
    assert read_wal and commit_wal
    print(f"\nbatch start + read: {read_wal[0]} B of WAL; cursor commit: {commit_wal[0]} B")
    assert commit_wal[0] < 1000, "the cursor commit is one small HOT update and its commit record"
    relay.conn.close()


def test_concurrent_writers_every_committed_row_once_in_commit_order(pg_dsn: str, pg_schema: str) -> None:
    """Real concurrency: writer threads (shared keys, each taken under a row-level advisory lock as an
    entity's row lock would; some roll back, some stay open ~0.3 s) against a relay that runs batches
    and truncates delivered partitions the whole time. Every committed row goes out exactly once, no
    rolled-back row does, and per key in commit order."""
    import random
    import threading

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for stmt in ddl(pg_schema, 64, 200):
            conn.execute(stmt)
    stop = threading.Event()
    lock = threading.Lock()
    committed: dict[bytes, list[int]] = {}  # key -> ids in commit order
    rolled_back: set[int] = set()
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        rng = random.Random(n)
        try:
            with psycopg.connect(pg_dsn) as conn:
                while not stop.is_set():
                    keys = rng.sample([b"a", b"b", b"c", b"d", b"e", b"f"], rng.randint(1, 2))
                    for k in sorted(keys):  # the entity lock, held to commit: one writer per key at a time
                        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (k.decode(),))
                    ids = [(insert(conn, pg_schema, k), k) for k in keys for _ in range(rng.randint(1, 2))]
                    if rng.random() < 0.05:
                        time.sleep(0.3)  # a long transaction
                    if rng.random() < 0.1:
                        conn.rollback()
                        with lock:
                            rolled_back.update(i for i, _k in ids)
                        continue
                    with lock:  # the commit and its record under one lock: the recorded order is commit order
                        conn.commit()
                        for i, k in ids:
                            committed.setdefault(k, []).append(i)
        except BaseException as exc:  # the test fails with it below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    relay = SqlRelay(pg_dsn, pg_schema)
    retired: list[str] = []
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:
        relay.batch(limit=50)
        retired += relay.retire()
    stop.set()
    for t in threads:
        t.join()
    for _ in range(3):
        relay.batch(limit=50)
    retired += relay.retire()
    relay.conn.close()
    assert not errors, errors
    got = [i for i, _k in relay.published]
    assert len(got) == len(set(got)), "a row went out twice"
    assert not set(got) & rolled_back, "a rolled-back row went out"
    want = {i for ids in committed.values() for i in ids}
    assert set(got) == want, f"missing {sorted(want - set(got))[:10]}"
    for key, ids in committed.items():
        assert [i for i, k in relay.published if k == key] == ids, f"key {key!r} out of commit order"
    late = sum(1 for a, b in itertools.pairwise(got) if b < a)
    print(
        f"\n{len(got)} rows, {len(rolled_back)} rolled back, {late} late commits, {len(retired)} partitions truncated"
    )
    assert retired, "no partition was retired"
