"""The cursor layout's statements on Postgres (issue #37; docs/design.md §11; costed in docs/primary-cost.md "The SQL"): the
partitioned outbox, the cursor row, and the four statements the relay would run -- batch start, page
read, fenced cursor commit, partition retirement -- with producer/layouts/cursor/_watermark.py deciding every value.
Run by tests/test_producer/layouts/cursor/test_watermark_pg.py and bench/bench_watermark_wal.py; **not used by the
relay yet** (no mode reads through it).

Invariants this module keeps (the decisions' assumptions, docs/design.md §11):

- A1: the outbox's id default takes the writer's xid before it draws the id (a ``CASE`` evaluates its
  condition first), from a ``CACHE 1`` sequence;
- a row's transaction is its ``txid`` column (``DEFAULT pg_current_xact_id()``: the top-level xid), never
  the ``xmin`` system column: a row written inside a savepoint (a subtransaction: ORMs' nested
  transactions, PL/pgSQL exception blocks) has the subtransaction's xid as ``xmin``, and ``pg_snapshot``
  lists only top-level xids, so ``pg_visible_in_snapshot(xmin, snapshot)`` calls such a row visible while
  its transaction is still open (the Postgres test shows it);
- the batch start is one statement: its snapshot is the statement's, its xid assigned after it, and
  ``max(id)`` is read with that snapshot;
- a page read filters with the two snapshots in SQL exactly as :meth:`Cursor.pending` does (the
  Postgres test compares them on every page);
- a cursor commit updates one row or raises :class:`~producer.errors.FenceError`; a retirement takes
  its lock under ``lock_timeout`` and re-checks against the committed cursor before ``TRUNCATE``.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
from psycopg import sql

from harvest_outbox.producer.errors import FenceError
from harvest_outbox.producer.layouts.cursor._watermark import Cursor, Probe, Snapshot, start_batch


def ddl(schema: str, partition_ids: int, partitions: int) -> list[sql.Composable]:
    """The partitioned outbox, its sequence, the cursor row (shard 0), and
    ``partitions`` partitions of ``partition_ids`` ids plus a DEFAULT one (never retired)."""
    if partition_ids < 1 or partitions < 1:
        raise ValueError(f"partition_ids and partitions must be at least 1, got {partition_ids} and {partitions}")
    s = sql.Identifier(schema)
    stmts: list[sql.Composable] = [
        sql.SQL("CREATE SEQUENCE {} CACHE 1").format(sql.Identifier(schema, "outbox_id_seq")),
        sql.SQL(
            """CREATE TABLE {s}.outbox (
                id bigint NOT NULL DEFAULT
                   CASE WHEN pg_current_xact_id() IS NOT NULL THEN nextval({seq}::regclass) END,
                txid xid8 NOT NULL DEFAULT pg_current_xact_id(),
                topic text NOT NULL,
                key bytea,
                value bytea,
                PRIMARY KEY (id)
            ) PARTITION BY RANGE (id)"""
        ).format(s=s, seq=sql.Literal(sql.Identifier(schema, "outbox_id_seq").as_string(None))),
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
    ]
    for p in range(partitions):
        stmts.append(
            sql.SQL("CREATE TABLE {} PARTITION OF {}.outbox FOR VALUES FROM ({}) TO ({})").format(
                sql.Identifier(schema, f"outbox_p{p}"),
                s,
                sql.Literal(p * partition_ids),
                sql.Literal((p + 1) * partition_ids),
            )
        )
    stmts.append(
        sql.SQL("CREATE TABLE {} PARTITION OF {}.outbox DEFAULT").format(sql.Identifier(schema, "outbox_rest"), s)
    )
    return stmts


def snapshot_of(text: str) -> Snapshot:
    """A ``pg_snapshot``'s text form, ``xmin:xmax:xip,…``."""
    try:
        xmin, xmax, xip = text.split(":")
        return Snapshot(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))
    except ValueError as exc:
        raise ValueError(f"not a pg_snapshot: {text!r} (expected xmin:xmax:xip,...)") from exc


def text_of(snap: Snapshot) -> str:
    return f"{snap.xmin}:{snap.xmax}:{','.join(str(x) for x in sorted(snap.xip))}"


class WatermarkSession:
    """The relay's statements on one autocommit connection, for one shard's cursor row."""

    def __init__(self, conn: psycopg.Connection[Any], schema: str, shard: int = 0) -> None:
        self.conn, self.schema, self.shard = conn, schema, shard
        s = self.s = sql.Identifier(schema)
        xid8 = sql.Identifier("txid")
        self._read = sql.SQL(
            """SELECT id, {xid8}::text, topic, key, value FROM {s}.outbox
               WHERE id >= %(from)s
                 AND pg_visible_in_snapshot({xid8}, %(hi)s::pg_snapshot)
                 AND NOT pg_visible_in_snapshot({xid8}, %(lo)s::pg_snapshot)
               ORDER BY id LIMIT %(n)s"""
        ).format(s=s, xid8=xid8)
        self._read_all = sql.SQL(
            "SELECT id, {xid8}::text, topic, key, value FROM {s}.outbox WHERE id >= %(from)s ORDER BY id"
        ).format(s=s, xid8=xid8)
        self._undelivered = sql.SQL(
            "SELECT count(*) FROM {p} WHERE NOT pg_visible_in_snapshot({xid8}, %s::pg_snapshot)"
        )
        self._xid8 = xid8

    def load(self) -> tuple[int, Cursor]:
        """The committed cursor and its epoch."""
        row = self.conn.execute(
            sql.SQL(
                """SELECT epoch, lo::text, hi::text, pos, low, probe_head, probe_xid::text
                   FROM {}.outbox_cursor WHERE shard = %s"""
            ).format(self.s),
            (self.shard,),
        ).fetchone()
        if row is None:
            raise LookupError(f"no cursor row for shard {self.shard} in {self.schema}.outbox_cursor: run its DDL")
        epoch, lo, hi, pos, low, ph, px = row
        probe = Probe(ph, int(px)) if ph is not None else None
        return epoch, Cursor(snapshot_of(lo), snapshot_of(hi) if hi else None, pos, low, probe)

    def new_view(self) -> tuple[int, Cursor]:
        """Raise the fence: the old view's commits are refused from now on."""
        self.conn.execute(
            sql.SQL("UPDATE {}.outbox_cursor SET epoch = epoch + 1 WHERE shard = %s").format(self.s), (self.shard,)
        )
        return self.load()

    def begin_batch(self, cursor: Cursor, probe: bool = True) -> Cursor:
        """Snapshot, head and (after the snapshot, when ``probe``) an xid, in one statement."""
        xid = sql.SQL(", pg_current_xact_id()::text") if probe else sql.SQL("")
        row = self.conn.execute(
            sql.SQL("SELECT pg_current_snapshot()::text, (SELECT max(id) FROM {}.outbox){}").format(self.s, xid)
        ).fetchone()
        assert row is not None
        return start_batch(cursor, snapshot_of(row[0]), int(row[2]) if probe else None, row[1])

    def read(self, cursor: Cursor, limit: int) -> list[tuple[int, int, tuple[int, str, bytes, bytes]]]:
        """The page query: ``(id, xid8, (id, topic, key, value))`` of pending rows, in id order."""
        if cursor.hi is None:
            raise ValueError("no batch in progress: begin_batch first")
        params = {"from": cursor.scan_from(), "hi": text_of(cursor.hi), "lo": text_of(cursor.lo), "n": limit}
        return [(i, int(x), (i, t, k, v)) for i, x, t, k, v in self.conn.execute(self._read, params)]

    def read_unfiltered(self, cursor: Cursor) -> list[tuple[int, int, tuple[int, str, bytes, bytes]]]:
        """Every row from the scan's start (a check of the page query's WHERE, not for the relay)."""
        rows = self.conn.execute(self._read_all, {"from": cursor.scan_from()})
        return [(i, int(x), (i, t, k, v)) for i, x, t, k, v in rows]

    def commit(self, epoch: int, after: Cursor) -> None:
        """The fenced cursor commit (sequenced: inside the fenced-commit transaction)."""
        p = after.probe
        n = self.conn.execute(
            sql.SQL(
                """UPDATE {}.outbox_cursor SET lo = %s::pg_snapshot, hi = %s::pg_snapshot, pos = %s, low = %s,
                   probe_head = %s, probe_xid = %s::xid8 WHERE shard = %s AND epoch = %s"""
            ).format(self.s),
            (
                text_of(after.lo),
                text_of(after.hi) if after.hi else None,
                after.pos,
                after.low,
                p.head if p else None,
                str(p.xid) if p else None,
                self.shard,
                epoch,
            ),
        ).rowcount
        if n != 1:
            raise FenceError(f"cursor commit refused: shard {self.shard}'s epoch is no longer {epoch}")

    def partitions(self) -> list[tuple[int, int, str]]:
        """The outbox's range partitions ``(start, end, name)`` (the DEFAULT one left out)."""
        rows = self.conn.execute(
            """SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i
               JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass""",
            (sql.Identifier(self.schema, "outbox").as_string(self.conn),),
        ).fetchall()
        out = []
        for name, bound in rows:
            m = re.search(r"FROM \('?(-?\d+)'?\) TO \('?(-?\d+)'?\)", bound)
            if m is not None:
                out.append((int(m.group(1)), int(m.group(2)), name))
        return sorted(out)

    def truncate(self, name: str, lock_timeout_ms: int = 200) -> str:
        """``LOCK`` under a short ``lock_timeout``, re-check against the committed cursor, ``TRUNCATE``:
        ``"truncated"``, ``"lock timeout"`` (a writer still holds the partition) or ``"undelivered"``."""
        part = sql.Identifier(self.schema, name)
        try:
            with self.conn.transaction():
                self.conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{lock_timeout_ms}ms")))
                lo = self.conn.execute(
                    sql.SQL("SELECT lo::text FROM {}.outbox_cursor WHERE shard = %s FOR SHARE").format(self.s),
                    (self.shard,),
                ).fetchone()
                assert lo is not None
                self.conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(part))
                left = self.conn.execute(self._undelivered.format(p=part, xid8=self._xid8), (lo[0],)).fetchone()
                assert left is not None
                if left[0]:
                    return "undelivered"
                self.conn.execute(sql.SQL("TRUNCATE {}").format(part))
                return "truncated"
        except psycopg.errors.LockNotAvailable:
            return "lock timeout"
