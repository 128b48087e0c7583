"""The mark-less relay's SQL sketch (docs/primary-cost.md "The mark-less relay") on the real Postgres
the fixtures start, driven by producer/watermark.py's decisions: a transaction that commits late (a
lower id than rows already relayed) is caught by the snapshot interval, with two writer connections
and a relay connection; the read query's WHERE agrees with the module's ``Cursor.pending``; a
partition holding an open writer's row is not truncated (the module does not offer it, and a forced
``LOCK`` times out under ``lock_timeout``), and once delivered it is. Nothing is marked: the outbox
rows are never updated or deleted one by one.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from harvest_outbox.producer.watermark import Cursor, Probe, Snapshot, read_page, retirable, start_batch

PARTITION = 4  # ids per partition: a handful of rows spans several


def ddl(schema: str, partition: int = PARTITION, partitions: int = 6) -> list[sql.Composable]:
    s = sql.Identifier(schema)
    seq = sql.Identifier(schema, "outbox_id_seq")
    stmts: list[sql.Composable] = [
        sql.SQL("CREATE SEQUENCE {} CACHE 1").format(seq),
        # A1: the CASE evaluates its condition first, so the transaction has its xid before it draws the id
        sql.SQL(
            """CREATE TABLE {s}.outbox (
                id bigint NOT NULL DEFAULT CASE WHEN pg_current_xact_id() IS NOT NULL THEN nextval({seq_name}::regclass) END,
                topic text NOT NULL,
                key bytea,
                value bytea,
                PRIMARY KEY (id)
            ) PARTITION BY RANGE (id)"""
        ).format(s=s, seq_name=sql.Literal(f"{schema}.outbox_id_seq")),
        sql.SQL(
            """CREATE TABLE {s}.outbox_cursor (
                shard int PRIMARY KEY,
                epoch bigint NOT NULL,
                lo pg_snapshot NOT NULL,
                hi pg_snapshot,
                pos bigint NOT NULL,
                low bigint NOT NULL,
                probe_head bigint,
                probe_xid xid8
            )"""
        ).format(s=s),
        sql.SQL("INSERT INTO {s}.outbox_cursor VALUES (0, 1, '3:3:', NULL, 0, 0, NULL, NULL)").format(s=s),
        # xmin is a 32-bit xid; the rows a statement sees are younger than its snapshot's xmax (xid8)
        sql.SQL(
            """CREATE FUNCTION {s}.xid8_of(x xid, ref xid8) RETURNS xid8 LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
               $$ SELECT (ref::text::bigint - ((ref::text::bigint - x::text::bigint) & 4294967295))::text::xid8 $$"""
        ).format(s=s),
    ]
    for p in range(partitions):
        stmts.append(
            sql.SQL("CREATE TABLE {} PARTITION OF {}.outbox FOR VALUES FROM ({}) TO ({})").format(
                sql.Identifier(schema, f"outbox_p{p}"), s, sql.Literal(p * partition), sql.Literal((p + 1) * partition)
            )
        )
    stmts.append(
        sql.SQL("CREATE TABLE {} PARTITION OF {}.outbox DEFAULT").format(sql.Identifier(schema, "outbox_rest"), s)
    )
    return stmts


def snapshot_of(text: str) -> Snapshot:
    xmin, xmax, xip = text.split(":")
    return Snapshot(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))


def text_of(snap: Snapshot) -> str:
    return f"{snap.xmin}:{snap.xmax}:{','.join(str(x) for x in sorted(snap.xip))}"


class SqlRelay:
    """The relay's statements, one autocommit connection; decisions by producer/watermark.py."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.s = sql.Identifier(schema)
        self.schema = schema
        self.epoch, self.cursor = self.load()
        self.published: list[tuple[int, bytes]] = []
        self.truncated: set[str] = set()

    def load(self) -> tuple[int, Cursor]:
        row = self.conn.execute(
            sql.SQL(
                "SELECT epoch, lo::text, hi::text, pos, low, probe_head, probe_xid::text FROM {}.outbox_cursor WHERE shard = 0"
            ).format(self.s)
        ).fetchone()
        assert row is not None
        epoch, lo, hi, pos, low, ph, px = row
        probe = Probe(ph, int(px)) if ph is not None else None
        return epoch, Cursor(snapshot_of(lo), snapshot_of(hi) if hi else None, pos, low, probe)

    def begin_batch(self) -> None:
        """Snapshot, head and (after the snapshot) an xid, in one statement."""
        row = self.conn.execute(
            sql.SQL(
                "SELECT pg_current_snapshot()::text, (SELECT max(id) FROM {}.outbox), pg_current_xact_id()::text"
            ).format(self.s)
        ).fetchone()
        assert row is not None
        self.cursor = start_batch(self.cursor, snapshot_of(row[0]), int(row[2]), row[1])

    READ = """SELECT id, {s}.xid8_of(xmin, pg_snapshot_xmax(pg_current_snapshot()))::text, key FROM {s}.outbox
              WHERE id >= %(from)s {where} ORDER BY id LIMIT %(n)s"""
    WHERE = """AND pg_visible_in_snapshot({s}.xid8_of(xmin, pg_snapshot_xmax(pg_current_snapshot())), %(hi)s::pg_snapshot)
               AND NOT pg_visible_in_snapshot({s}.xid8_of(xmin, pg_snapshot_xmax(pg_current_snapshot())), %(lo)s::pg_snapshot)"""

    def read(self, limit: int, filtered: bool = True) -> list[tuple[int, int, bytes]]:
        c = self.cursor
        assert c.hi is not None
        where = sql.SQL(self.WHERE).format(s=self.s) if filtered else sql.SQL("")
        q = sql.SQL(self.READ).format(s=self.s, where=where)
        params = {"from": c.scan_from(), "hi": text_of(c.hi), "lo": text_of(c.lo), "n": limit if filtered else 10**6}
        return [(i, int(x), k) for i, x, k in self.conn.execute(q, params).fetchall()]

    def batch(self, limit: int = 100) -> list[int]:
        """One batch, page by page, each page's cursor committed (fenced) once it is "delivered"."""
        if self.cursor.hi is None:
            self.begin_batch()
        out: list[int] = []
        while True:
            rows = self.read(limit)
            unfiltered = self.read(limit, filtered=False)
            page = read_page(self.cursor, [(i, x, (i, k)) for i, x, k in rows], limit)
            same = read_page(self.cursor, [(i, x, (i, k)) for i, x, k in unfiltered], limit)
            assert page.rows == same.rows, "the read query's WHERE and Cursor.pending disagree"
            self.published.extend(page.rows)
            out.extend(i for i, _k in page.rows)
            self.commit(page.after)
            if page.complete:
                return out

    def commit(self, after: Cursor) -> None:
        p = after.probe
        n = self.conn.execute(
            sql.SQL(
                """UPDATE {}.outbox_cursor SET lo = %s::pg_snapshot, hi = %s::pg_snapshot, pos = %s, low = %s,
                   probe_head = %s, probe_xid = %s::xid8 WHERE shard = 0 AND epoch = %s"""
            ).format(self.s),
            (
                text_of(after.lo),
                text_of(after.hi) if after.hi else None,
                after.pos,
                after.low,
                p.head if p else None,
                str(p.xid) if p else None,
                self.epoch,
            ),
        ).rowcount
        assert n == 1, "fenced: another view took the cursor"
        self.cursor = after

    def partitions(self) -> list[tuple[int, int, str]]:
        rows = self.conn.execute(
            """SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i
               JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass""",
            (f"{self.schema}.outbox",),
        ).fetchall()
        out = []
        for name, bound in rows:
            m = re.search(r"FROM \('?(\d+)'?\) TO \('?(\d+)'?\)", bound)
            if m is None:
                continue  # the DEFAULT partition: never retired
            out.append((int(m.group(1)), int(m.group(2)), name))
        return sorted(out)

    def truncate(self, name: str) -> str:
        """LOCK under a short lock_timeout, re-check against the committed cursor, TRUNCATE."""
        part = sql.Identifier(self.schema, name)
        try:
            with self.conn.transaction():
                self.conn.execute("SET LOCAL lock_timeout = '200ms'")
                lo = self.conn.execute(
                    sql.SQL("SELECT lo::text FROM {}.outbox_cursor WHERE shard = 0 FOR SHARE").format(self.s)
                ).fetchone()
                assert lo is not None
                self.conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(part))
                undelivered = self.conn.execute(
                    sql.SQL(
                        """SELECT count(*) FROM {p} WHERE NOT pg_visible_in_snapshot(
                           {s}.xid8_of(xmin, pg_snapshot_xmax(pg_current_snapshot())), %s::pg_snapshot)"""
                    ).format(p=part, s=self.s),
                    (lo[0],),
                ).fetchone()
                assert undelivered is not None
                if undelivered[0]:
                    return "undelivered"
                self.conn.execute(sql.SQL("TRUNCATE {}").format(part))
                return "truncated"
        except psycopg.errors.LockNotAvailable:
            return "lock timeout"

    def retire(self) -> list[str]:
        parts = self.partitions()
        ok = {(a, b) for a, b in retirable([(a, b) for a, b, _n in parts], self.load()[1])}
        done = [n for a, b, n in parts if (a, b) in ok and n not in self.truncated and self.truncate(n) == "truncated"]
        self.truncated.update(done)
        return done


@pytest.fixture
def outbox(pg_dsn: str, pg_schema: str) -> Iterator[tuple[str, str]]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for stmt in ddl(pg_schema):
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
    restarted = SqlRelay(dsn, schema)  # a new leader starts from the committed cursor
    assert restarted.cursor == relay.cursor and restarted.batch() == []
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
    rows = relay.read(100)
    mid = relay.conn.execute(lsn).fetchone()
    page = read_page(relay.cursor, [(i, x, i) for i, x, _k in rows], 100)
    relay.commit(page.after)
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
        for stmt in ddl(pg_schema, partition=64, partitions=200):
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
