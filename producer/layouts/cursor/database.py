"""``outboxLayout: cursor``: the cursor layout's relay database, on the partitioned outbox, which reads by
snapshot instead of marking (docs/design.md, "Outbox layouts"; decisions: producer/layouts/cursor/_watermark.py).

:class:`CursorDatabase` has the mark layout's interface (:class:`~producer.layouts.layout.RelayDatabase`),
not its statements, nor its class: both compose the same session, fence and books (producer/db/), and
the modes run on either unchanged.

- ``mark_with_attempts`` *reads* the next page of the view's batch: a batch starts with one statement
  (``pg_current_snapshot()``, the largest id, and -- only when a probe is due -- ``pg_current_xact_id()``),
  sent with its first page in one REPEATABLE READ transaction (one round trip; the page is read again
  in the rare batch the id source's guard moves); a page is ``id >= from AND visible(txid, hi) AND NOT
  visible(txid, lo) ORDER BY id LIMIT n`` with the persisted attempt counts joined, returned as the mark's
  :data:`~producer.layouts.mark.marks.MarkedRow`;
- ``--uuid-sequencing`` (the :class:`~producer.relay.sequenced._store.SequencedStore`): ``start_view_with_floor`` raises
  the fence as in the mark layout, then gives the cursor row the view's epoch and reads it: the view reads
  from the committed cursor. ``commit_txns`` is the fenced commit of the mark layout minus the delete: the
  cursor ``UPDATE … WHERE epoch = $epoch`` (one row, else fenced), dead rows *copied* to the dead letters,
  attempts forgotten, ACK intents, in one transaction sent as one message;
- at-least-once: a view starts at its first read (the cursor's epoch raised, the cursor read); ``purge``
  and ``dead_letter`` commit the cursor past the longest prefix of read rows that are delivered or
  dead-lettered (their delivery reports have arrived): a crash re-sends at most the rows after it;
  ``reset`` writes nothing (the remark's new view reads again from the committed cursor);
- an idle view (every read row committed, only empty pages since) commits the cursor after them at most
  every :data:`IDLE_COMMIT_INTERVAL` on the read connection, so ``low`` follows an idle outbox and its
  delivered partitions retire; a batch start takes an xid only when a probe is due and new rows arrived;
- a probe unresolved for :data:`HELD_LOW_SECONDS` (a long transaction holds ``low`` back) is logged with
  the scan's width and the oldest transaction holding an xid, at most once a minute;
- partitions: :class:`~producer.layouts.cursor.partitions.PartitionKeeper` after a commit (sharded: by the relay leading
  shard 0; a partition retires below every shard's ``low``);
- ``shards: S`` (docs/sharding.md): a cursor row per shard; a view of the led shards has a
  :class:`~producer.layouts.cursor.views.ViewRead` per shard (:class:`~producer.layouts.cursor.views.View`): a read reads the
  shards' pages in turn, each ``AND <shard of kafka_key> = s`` (the ``(shard, id)`` index); a view start gives
  every led shard's cursor row the view's epoch (locked in shard order); a commit moves each shard's cursor
  past that shard's rows, ``WHERE shard = s AND epoch = E``, the sequenced one behind the fence of every led
  shard; the cursor table must hold exactly shards ``0..S-1`` (checked at connect: never a shard unread);
- ``tableMapping: debezium`` (docs/debezium.md): the statements name the outbox's columns through the table
  mapping, as the mark's do (:func:`~producer.layouts.mark.marks.read_row_fields`): the ordering id is ``harvest_seq``, the
  shard is that of the router's key; ``txid`` is the same column in both tables; a dead letter keeps the row
  (``source_row``, less its ``txid``);
- ``halt_keys`` (``deadLetterPolicy: haltKey``; producer/layouts/cursor/held.py; still refused by the config: the
  admin commands are not done): each read first serves the held rows
  of released keys (after the last one this view served), then copies the page's rows of halted or held
  keys to ``_held`` in a fenced statement and gives the mode the others; the held ones pass with the cursor
  (:attr:`~producer.layouts.cursor.views.ViewRead.skipped`); delivered served rows leave ``_held`` (at-least-once:
  with the purge; sequenced: in the fenced commit), dead-lettered ones move to the dead letters; the rows
  the sequenced mode dropped for a key its view halted (``TxnCommit.held``) are copied to ``_held`` by the
  fenced commit that passes them.

Invariants (tests/test_producer/layouts/cursor/test_cursor_relay.py on Postgres and Kafka; the protocol's are
test_watermark_sequenced.py's on the same :class:`~producer.layouts.cursor.views.CursorViews`):
- no outbox row is ever updated or deleted by the relay (only whole partitions, retired, are truncated);
- the cursor moves only in a commit whose fence still holds (epoch), past rows the view read, in read
  order, all delivered (at-least-once) or committed in the same transaction (sequenced);
- a commit that would pass rows out of read order is refused (:class:`~producer.errors.FenceError`:
  the view ends and the next one reads them again), never committed.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from harvest_outbox.producer.db import Attempts, DeadLetters, OutboxSession, StatementPool, leased
from harvest_outbox.producer.db.fence import DeadRow, Fence, TxnCommit, dead_columns, send_in_one_message
from harvest_outbox.producer.errors import DatabaseError, FenceError, SchemaError
from harvest_outbox.producer.layouts.cursor._ids import (
    OPEN_TRANSACTIONS_SQL,
    IdSource,
    Watch,
    guard,
    id_source_of,
    id_source_sql,
)
from harvest_outbox.producer.layouts.cursor._watermark import Cursor, Probe, needs_xid, page_end, start_batch
from harvest_outbox.producer.layouts.cursor._watermark_sql import snapshot_of, text_of
from harvest_outbox.producer.layouts.cursor.held import (
    dead_letter_held_sql,
    drop_held_sql,
    held_read_sql,
    hold_rows_sql,
    released_sql,
)
from harvest_outbox.producer.layouts.cursor.partitions import PartitionKeeper
from harvest_outbox.producer.layouts.cursor.schema import require_cursor_rows, require_cursor_table
from harvest_outbox.producer.layouts.cursor.views import CursorViews, NotNextRows, Segment, View, ViewRead
from harvest_outbox.producer.layouts.mark.marks import MarkedAttempts, MarkedRow, read_row_fields
from harvest_outbox.producer.mapping.table import GOHARVEST, TableMapping
from harvest_outbox.producer.relay.marked_row import ROW_ATTEMPTS, ROW_ID, ROW_LAST_ERROR
from harvest_outbox.producer.relay.shards import shard_expression
from harvest_outbox.producer.schema import OutboxNames, Statement, ValueType

log = logging.getLogger(__name__)

#: Seconds between an idle view's cursor commits (~120 B of WAL each; only when the cursor moved).
IDLE_COMMIT_INTERVAL = 1.0
#: A probe still unresolved after this many seconds means a transaction older than it holds ``low``
#: back: logged with the scan's width and the oldest transaction holding an xid, at most every
#: :data:`HELD_LOW_LOG_INTERVAL` seconds.
HELD_LOW_SECONDS = 30.0
HELD_LOW_LOG_INTERVAL = 60.0


#: The page reads' planner settings (see CursorDatabase.mark_with_attempts), set and restored around them.
_PLANNER = sql.SQL("SELECT set_config('enable_seqscan', %s, false), set_config('enable_bitmapscan', %s, false)")
#: A new batch's start and its first page, sent together (one round trip, not two): one REPEATABLE READ
#: transaction, so the page is read in the snapshot the batch start takes (its ``hi``; a probe's xid is still
#: assigned after it) and the planner settings are local to it (gone at its COMMIT, nothing to restore).
_FIRST_PAGE = (
    sql.SQL("BEGIN ISOLATION LEVEL REPEATABLE READ"),
    sql.SQL("SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)"),
    sql.SQL("COMMIT"),
)


def shard_filter(shard_count: int | None, row: str = "o", mapping: TableMapping = GOHARVEST) -> sql.Composable:
    """`` AND <row's shard> = %(shard)s`` sharded (the expression of the ``(shard, id)`` index, which then
    serves the read in id order), nothing unsharded. ``mapping``: the table's (``_held`` rows are goharvest's)."""
    if shard_count is None:
        return sql.SQL("")
    return sql.SQL(" AND {} = %(shard)s").format(shard_expression(shard_count, mapping.shard_key(row)))


def row_shard(shard_count: int | None, row: str = "o", mapping: TableMapping = GOHARVEST) -> sql.Composable:
    """SQL: the shard of the outbox (or ``_held``) row ``row`` (0 unsharded)."""
    if shard_count is None:
        return sql.SQL("0")
    return shard_expression(shard_count, mapping.shard_key(row))


def read_sql(
    names: OutboxNames, value_type: ValueType, shard_count: int | None = None, *, in_batch_start: bool = False
) -> sql.Composed:
    """A page of the batch ``(lo, hi]`` from id ``from``, as the mark's rows (:data:`MarkedRow`);
    parameters ``from``, ``hi``, ``lo``, ``n``, ``t0`` (see :func:`~producer.layouts.mark.marks.mark_sql`), and
    ``shard`` sharded (only that shard's rows). ``in_batch_start``: no ``hi``; the page is read in the
    transaction that starts the batch, whose snapshot *is* ``hi`` (``pg_current_snapshot()``, the same under
    REPEATABLE READ: :data:`_FIRST_PAGE`)."""
    hi = sql.SQL("pg_current_snapshot()" if in_batch_start else "%(hi)s::text::pg_snapshot")
    return sql.SQL("""
        WITH m AS (
          SELECT {oid} AS id, {t} AS t, {k} AS k, {v} AS v, {hk} AS hk, {hv} AS hv, {row_bad} AS bad,
                 {p} AS p, {c} AS c
          FROM {o} AS o
          WHERE {oid} >= %(from)s
            AND pg_visible_in_snapshot(o.txid, {hi})
            AND NOT pg_visible_in_snapshot(o.txid, %(lo)s::text::pg_snapshot){shard}
          ORDER BY {oid} LIMIT %(n)s)
        SELECT m.id, m.t, m.k, m.v, m.hk, m.hv, {header_bad}, a.attempts, a.last_error::text, m.p,
               %(t0)s::float8 - coalesce(date_part('epoch', statement_timestamp() - m.c), 0)
        FROM m LEFT JOIN {a} AS a ON a.id = m.id ORDER BY m.id""").format(
        hi=hi,
        o=names.outbox,
        shard=shard_filter(shard_count, mapping=names.mapping),
        **read_row_fields(names, value_type),
    )


def released_rows_sql(names: OutboxNames, value_type: ValueType, shard_count: int | None = None) -> sql.Composed:
    """:func:`~producer.layouts.cursor.held.released_sql`'s rows as the read's (:data:`MarkedRow`), each followed by its
    ``held_seq``; parameters ``shards``, ``serving``, ``n``, ``t0``."""
    return sql.SQL("""
        WITH r AS ({released}),
        m AS (
          SELECT r.held_seq AS s, {oid} AS id, {t} AS t, {k} AS k, {v} AS v, {hk} AS hk, {hv} AS hv,
                 {row_bad} AS bad, {p} AS p, {c} AS c
          FROM r JOIN {h} AS o ON o.id = r.id)
        SELECT m.id, m.t, m.k, m.v, m.hk, m.hv, {header_bad}, a.attempts, a.last_error::text, m.p,
               %(t0)s::float8 - coalesce(date_part('epoch', statement_timestamp() - m.c), 0), m.s
        FROM m LEFT JOIN {a} AS a ON a.id = m.id ORDER BY m.s, m.id""").format(
        released=released_sql(names, row_shard(shard_count, "h")),
        h=names.held,
        **read_row_fields(names, value_type),
    )


def copy_dead_letters_sql(names: OutboxNames, value_type: ValueType) -> sql.Composed:
    """Copy rows ``(id, error, attempts)`` to the dead letters (the outbox row stays: its partition is
    retired with the others) and forget their attempt counts; one statement. A mapped table's dead letter
    keeps the row itself (``source_row``, less ``txid``: a requeue writes it again as a new row)."""
    m = names.mapping
    rec = m.record("o", value_type)
    source = m.source_row("o")
    return sql.SQL("""
        WITH bad(id, error, attempts) AS (SELECT * FROM unnest(%s::bigint[], %s::text[], %s::int[])),
        forgotten AS (DELETE FROM {a} AS a USING bad WHERE a.id = bad.id)
        INSERT INTO {d} (id, create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys,
                         kafka_header_values, error, attempts{source_col})
        SELECT {oid}, {created}, {topic}, {key}, {value}, coalesce({hk}, '{{}}'), coalesce({hv}, '{{}}'),
               bad.error, bad.attempts{source}
        FROM {o} AS o JOIN bad ON {oid} = bad.id
        ON CONFLICT (id) DO UPDATE SET error = EXCLUDED.error, attempts = EXCLUDED.attempts,
                                       dead_time = now()""").format(
        a=names.delivery_attempts,
        d=names.dead_letters,
        o=names.outbox,
        oid=m.id("o"),
        created=m.created("o"),
        topic=rec.topic,
        key=rec.key,
        value=rec.value,
        hk=rec.header_keys,
        hv=rec.header_values,
        source_col=sql.SQL(", source_row") if source is not None else sql.SQL(""),
        source=sql.SQL(", {} - 'txid'").format(source) if source is not None else sql.SQL(""),
    )


def cursor_of(row: Sequence[Any]) -> Cursor:
    """The cursor row's ``lo, hi, pos, low, probe_head, probe_xid`` (text snapshots and xid)."""
    lo, hi, pos, low, ph, px = row
    probe = Probe(int(ph), int(px)) if ph is not None and px is not None else None
    return Cursor(snapshot_of(lo), snapshot_of(hi) if hi else None, int(pos), int(low), probe)


def cursor_params(after: Cursor) -> tuple[Any, ...]:
    p = after.probe
    return (
        text_of(after.lo),
        text_of(after.hi) if after.hi else None,
        after.pos,
        after.low,
        p.head if p else None,
        str(p.xid) if p else None,
    )


def backlog_sql(names: OutboxNames, shard_count: int | None = None, up_to: bool = False) -> sql.Composed:
    """Per shard of ``%(shards)s``: committed rows of the shard its committed cursor has not passed
    ``(shard, count, age of the oldest in seconds)``; with ``up_to``, only ids up to ``%(up_to)s``."""
    m = names.mapping
    return sql.SQL("""
        SELECT c.shard, count({oid}), extract(epoch FROM now() - min({created}))
        FROM {c} AS c LEFT JOIN {o} AS o ON {oid} >= c.low AND {shard} = c.shard{up_to}
          AND NOT pg_visible_in_snapshot(o.txid, c.lo)
          AND (c.hi IS NULL OR NOT pg_visible_in_snapshot(o.txid, c.hi) OR {oid} > c.pos)
        WHERE c.shard = ANY(%(shards)s::int[])
        GROUP BY c.shard ORDER BY c.shard""").format(
        c=names.cursor,
        o=names.outbox,
        oid=m.id("o"),
        created=m.created("o"),
        shard=row_shard(shard_count, mapping=m),
        up_to=sql.SQL(" AND {} <= %(up_to)s").format(m.id("o")) if up_to else sql.SQL(""),
    )


def cursor_backlog(conn: psycopg.Connection, names: OutboxNames, up_to: int | None = None, shards: int = 1) -> int:
    """Rows committed to the outbox and not yet passed by the committed cursor of their shard (tests,
    tools; ``shards``: the outbox's shard count); with ``up_to``, only those with ids up to it."""
    q = backlog_sql(names, shards if shards > 1 else None, up_to is not None)
    rows = conn.execute(q, {"shards": list(range(shards)), "up_to": up_to}).fetchall()
    return sum(int(r[1]) for r in rows)


_Sent = tuple[Statement, Sequence[Any]]


@dataclass(frozen=True)
class _CommitPlan:
    """What one fenced commit of ``view`` passes: rows read and delivered (``ids``) or dead-lettered
    (``dead``), attempt counts to ``forget``, haltKey's ``dropped`` rows, the served held rows among them
    (``held_ids``, ``held_dead``: they leave ``_held``), and per shard its new cursor and what it finished."""

    view: View
    ids: list[int]
    dead: list[DeadRow]
    forget: list[int]
    dropped: list[int]
    held_ids: list[int]
    held_dead: list[DeadRow]
    shards: list[tuple[int, Cursor | None, int, int]]  # (shard, cursor to commit, finished, done)

    @property
    def moved(self) -> list[tuple[int, Cursor]]:
        """The shards whose cursor the commit moves, with it."""
        return [(shard, cur) for shard, cur, _f, _d in self.shards if cur is not None]


class CursorDatabase:
    """The relay's statements on the cursor layout (module doc). ``views`` is shared by the relay's two
    connections, and so is ``keeper``, which maintains the partitions after commits."""

    def __init__(
        self,
        dsn: str,
        names: OutboxNames,
        views: CursorViews,
        *,
        async_commit: bool = False,
        keeper: PartitionKeeper | None = None,
        halt_keys: bool = False,
        shard_count: int | None = None,
        pool: StatementPool | None = None,
    ) -> None:
        self.session = OutboxSession(dsn, names, shard_count, async_commit=async_commit, pool=pool)
        self.fence = Fence(self.session)
        self.attempts = Attempts(self.session)
        self.dead_letters = DeadLetters(self.session)
        #: The last stats(): (topic, key) pairs with a dead letter (the keys haltKey holds).
        self.halted_keys = 0
        self.shard_stats: dict[int, tuple[int, float | None]] = {}  # the last stats(): shard -> (rows, oldest age)
        self.views = views
        self.keeper = keeper
        self.halt_keys = halt_keys
        c = names.cursor
        returning = sql.SQL(" RETURNING shard, lo::text, hi::text, pos, low, probe_head, probe_xid::text")
        # at-least-once: the led shards' cursor rows locked in shard order (two relays never deadlock), then
        # all given one epoch above each one's (a commit checks one number; a new view of any shard fences it)
        self._lock_epochs_sql = sql.SQL(
            "SELECT max(epoch), count(*) FROM (SELECT epoch FROM {} WHERE shard = ANY(%s::int[]) "
            "ORDER BY shard FOR UPDATE) AS led"
        ).format(c)
        self._adopt_sql = sql.Composed(
            [sql.SQL("UPDATE {} SET epoch = %s, updated_at = now() WHERE shard = ANY(%s::int[])").format(c), returning]
        )
        self._commit_cursor_sql = sql.SQL(
            "UPDATE {} SET lo = %s::text::pg_snapshot, hi = %s::text::pg_snapshot, pos = %s, low = %s, "
            "probe_head = %s, probe_xid = %s::text::xid8, updated_at = now() WHERE shard = %s AND epoch = %s"
        ).format(c)
        batch = sql.SQL("SELECT pg_current_snapshot()::text, (SELECT max({}) FROM {}), {}, g.* FROM ({}) AS g")
        #: A batch's start, with and without a probe's xid (an xid costs a commit record: only when due), and
        #: the id source in the same snapshot (producer/layouts/cursor/_ids.py)
        source = id_source_sql(names)
        self._batch_sql = {
            True: batch.format(names.mapping.id(), names.outbox, sql.SQL("pg_current_xact_id()::text"), source),
            False: batch.format(names.mapping.id(), names.outbox, sql.SQL("NULL"), source),
        }
        #: Per shard: the id source at this relay's last batch start (cursor_ids.Watch).
        self._watches: dict[int, Watch] = {}
        self._next_fault_log = 0.0
        self._read_sql: sql.Composed | None = None
        self._first_read_sql: sql.Composed | None = None
        self._planner: tuple[str, str] = ("on", "on")
        self._released_sql: sql.Composed | None = None
        self._held_read_sql = held_read_sql(names, shard_filter(self.shard_count)) if halt_keys else None
        self._copy_dlq_sql: sql.Composed | None = None
        self._backlog_sql = backlog_sql(names, self.shard_count)
        self._next_idle_commit = 0.0
        self._next_held_log = 0.0
        #: The scan gauge, per shard: (ids the last complete batch's reads spanned, rows they returned).
        self._scans: dict[int, tuple[int, int]] = {}
        #: The led shard whose last batch spanned the most ids, as ``_scans``' value (None before one).
        self.scan: tuple[int, int] | None = None
        self.session.watch(connected=self._connected)

    # ------------------------------------------------------------------ the session's
    @property
    def names(self) -> OutboxNames:
        return self.session.names

    @property
    def shard_count(self) -> int | None:
        return self.session.shard_count

    @property
    def shards(self) -> frozenset[int]:
        return self.session.shards

    @property
    def value_type(self) -> ValueType:
        return self.session.value_type

    @property
    def conn(self) -> psycopg.Connection:
        """The connection (made on first use: the layout and the outbox checked, the statements built)."""
        return self.session.conn

    def set_shards(self, shards: frozenset[int]) -> None:
        """Lead these shards from now on (sharded relays, between views)."""
        self.session.set_shards(shards)

    def close(self) -> None:
        self.session.close()

    def _run(
        self,
        what: str,
        query: Statement,
        params: Sequence[Any] | dict[str, Any],
        prepare: bool | None = None,
        cursor: psycopg.Cursor | None = None,
    ) -> psycopg.Cursor:
        return self.session.run(what, query, params, prepare=prepare, cursor=cursor)

    # ------------------------------------------------------------------ the books
    @leased
    def record_attempts(self, items: Sequence[tuple[int, int, str]]) -> int:
        """Persist failed delivery attempts ``(id, attempts so far, error)`` (a count never decreases)."""
        return self.attempts.record(items)

    @leased
    def forget_attempts(self, ids: Sequence[int]) -> int:
        """Delete the attempt counts of rows that were delivered (or are gone)."""
        return self.attempts.forget(ids)

    @leased
    def expire_dead_letters(self, retention: float, limit: int) -> int:
        """Delete up to ``limit`` dead letters parked more than ``retention`` seconds ago; how many were."""
        return self.dead_letters.expire(retention, limit)

    @leased
    def confirm_acks(self, items: Sequence[tuple[bytes, int]]) -> int:
        """Delete the intents of ACKs known to be in the log (``(producer, clock)`` pairs)."""
        return self.fence.confirm_acks(items)

    def _connected(self, conn: psycopg.Connection) -> None:
        require_cursor_table(conn, self.names)
        require_cursor_rows(conn, self.names, self.shard_count or 1)
        row = conn.execute("SELECT current_setting('enable_seqscan'), current_setting('enable_bitmapscan')").fetchone()
        assert row is not None
        self._planner = (str(row[0]), str(row[1]))  # the session's own, restored after each read
        self._read_sql = read_sql(self.names, self.value_type, self.shard_count)
        self._first_read_sql = read_sql(self.names, self.value_type, self.shard_count, in_batch_start=True)
        if self.halt_keys:
            held = conn.execute("SELECT to_regclass(%s)", (self.names.held.as_string(conn),)).fetchone()
            if held is None or held[0] is None:
                raise SchemaError(
                    f"deadLetterPolicy: haltKey on {self.names.display!r} (outboxLayout: cursor) needs its held-rows "
                    f"table {self.names.held.as_string(conn)}, which this outbox predates: run `harvest init-db` "
                    f"(it adds it), or use deadLetterPolicy: skip"
                )
            self._released_sql = released_rows_sql(self.names, self.value_type, self.shard_count)
        self._copy_dlq_sql = copy_dead_letters_sql(self.names, self.value_type)

    # ------------------------------------------------------------------ views
    @leased
    def prepare_mark(self) -> None:
        """Connect and check the layout (the first read parses its statement)."""
        self.conn  # noqa: B018

    @leased
    def start_view_with_floor(
        self, leader_id: uuid.UUID, name: str
    ) -> tuple[int, list[tuple[int, bytes, int, str, int]], int]:
        """The mark layout's view start (the fence raised, the intents read), then the cursor row takes
        the view's epoch and is read: every commit of an earlier view held the fence row lock before
        the raise, so this read sees it, and none can commit after it."""
        epoch, intents, floor = self.fence.start_view_with_floor(leader_id, name)
        rows = self._run("starting a cursor view", self._adopt_sql, (epoch, self._led())).fetchall()
        view = self.views.begin(leader_id, epoch, self._cursors(rows))
        log.debug("cursor view %s epoch %d of shards %s", leader_id, epoch, sorted(view.reads))
        return epoch, intents, floor

    def _led(self) -> list[int]:
        """The shards this relay's views read: the led ones sharded, else the one cursor row, 0."""
        return sorted(self.shards) if self.shard_count is not None else [0]

    def _cursors(self, rows: Sequence[Sequence[Any]]) -> dict[int, Cursor]:
        cursors = {int(r[0]): cursor_of(r[1:]) for r in rows}
        missing = sorted(set(self._led()) - set(cursors))
        if missing:
            raise SchemaError(
                f"the cursor row(s) of shard(s) {missing} of {self.names.display!r} are missing; run `harvest init-db`"
                f"{f' with shards: {self.shard_count}' if self.shard_count else ''} (idempotent; it adds them)"
            )
        return cursors

    def _view_for_read(self, leader_id: uuid.UUID) -> View | None:
        view = self.views.current(leader_id)
        if view is not None or self.views.sequenced:
            return view  # sequenced: a view not (or no longer) current reads nothing
        led = self._led()
        if not led:
            return None
        try:
            with self.conn.transaction():
                top = self.conn.execute(self._lock_epochs_sql, (led,)).fetchone()
                assert top is not None
                epoch = int(top[0] or 0) + 1
                rows = self.conn.execute(self._adopt_sql, (epoch, led)).fetchall()
        except psycopg.Error as exc:
            raise self.session.failed("starting a cursor view", exc) from exc
        return self.views.begin(leader_id, epoch, self._cursors(rows))

    # ------------------------------------------------------------------ reads
    @leased
    def mark_with_attempts(self, leader_id: uuid.UUID, limit: int) -> tuple[list[MarkedRow], MarkedAttempts]:
        """The next page of the view's batch (a new batch when the last one is complete); sharded, the
        pages of the led shards in turn (starting with a different shard each time) until ``limit`` rows."""
        if limit < 1:
            return [], {}
        self.conn  # noqa: B018 -- connects, which builds the read statement
        view = self._view_for_read(leader_id)
        if view is None:
            return [], {}
        served: list[MarkedRow] = []
        if self._released_sql is not None:
            served = self._serve_released(view, limit)
            limit -= len(served)
            if limit < 1:
                return served, {
                    r[ROW_ID]: (r[ROW_ATTEMPTS], r[ROW_LAST_ERROR]) for r in served if r[ROW_ATTEMPTS] is not None
                }
        with self.views.lock:
            order = view.order()
            view.turn += 1
        rows: list[MarkedRow] = []
        idle: list[int] = []
        for shard in order:
            page = self._read_page(view, shard, limit - len(rows))
            if not page:
                idle.append(shard)
            rows += page
            if len(rows) >= limit:
                break
        if idle and time.monotonic() >= self._next_idle_commit:
            self._idle_commit(view, idle)
        rows = served + rows
        attempts: MarkedAttempts = {
            r[ROW_ID]: (r[ROW_ATTEMPTS], r[ROW_LAST_ERROR]) for r in rows if r[ROW_ATTEMPTS] is not None
        }
        return rows, attempts

    def _read_page(self, view: View, shard: int, limit: int) -> list[MarkedRow]:
        """A page of ``shard``'s batch (a new batch when its last one is complete)."""
        read = view.reads[shard]
        cursor = read.cursor
        first: list[MarkedRow] | None = None  # a new batch's first page, read with its start
        if cursor.hi is None:
            # an xid (a commit record) only when a probe is due and rows arrived past low since the last
            # batch start: an idle relay's batches write nothing
            probe = needs_xid(cursor) and (read.head is None or read.head + 1 > cursor.low)
            row: tuple[Any, ...] | None
            if self._held_read_sql is None:  # (haltKey's hold takes the batch's snapshot as a parameter)
                # from where the batch starts unless the id source changed (the guard's rescan) or broke (a
                # probe it drops does not resolve): a page read from elsewhere is read again below
                guess = start_batch(cursor, cursor.lo, None, None).scan_from()
                row, first = self._start_batch_reading(probe, cursor, shard, guess, limit)
            else:
                row = self._run("starting a batch", self._batch_sql[probe], ()).fetchone()
            assert row is not None
            read.head = row[1]
            cursor, may_probe = self._guard(shard, cursor, id_source_of(tuple(row[3:])), row[1])
            before = cursor.probe
            take = probe and may_probe
            cursor = start_batch(cursor, snapshot_of(row[0]), int(row[2]) if take else None, row[1] if take else None)
            # each page's index range starts at low (then pos): while a long transaction holds low back, the
            # batch walks the ids up to the head again, most of them delivered already
            read.batch_width, read.batch_rows = max(0, int(row[1] or 0) - cursor.low + 1), 0
            now = time.monotonic()
            if cursor.probe is not None and cursor.probe is not before:
                read.probe_at = now
            elif cursor.probe is not None and now - read.probe_at >= HELD_LOW_SECONDS and row[1] is not None:
                self._held_low(int(row[1]) - cursor.low, now - read.probe_at)
            if first is not None and cursor.scan_from() != guess:
                first = None
        waiting: set[int] = set()
        if first is not None:
            rows = first
        else:
            rows, waiting = self._read_rows(view, cursor, shard, limit)
        return self._add_page(view, read, shard, cursor, rows, waiting, limit)

    def _start_batch_reading(
        self, probe: bool, cursor: Cursor, shard: int, start: int, limit: int
    ) -> tuple[tuple[Any, ...], list[MarkedRow]]:
        """A new batch's start (:attr:`_batch_sql`'s row) and its first page from id ``start``, in one round
        trip (:data:`_FIRST_PAGE`; the settings' reason: :meth:`_read_rows`)."""
        assert self._first_read_sql is not None
        params = {"from": start, "lo": text_of(cursor.lo), "n": limit, "t0": time.monotonic(), "shard": shard}
        begin, planner, commit = _FIRST_PAGE
        try:
            with self.conn.pipeline():
                self._run("starting a batch", begin, ())
                started = self._run("starting a batch", self._batch_sql[probe], ())
                self._run("planning the reads", planner, ())
                page = self._read_statement(self._first_read_sql, params)
                self._run("starting a batch", commit, ())
                row = started.fetchone()
                rows: list[MarkedRow] = page.fetchall()
        except psycopg.Error as exc:  # raised by the pipeline's sync, after each statement was queued
            raise self.session.failed("starting a batch", exc) from exc
        assert row is not None
        return row, rows

    def _read_rows(self, view: View, cursor: Cursor, shard: int, limit: int) -> tuple[list[MarkedRow], set[int]]:
        """A page of the batch in progress (and haltKey: the ids of its rows now held, :meth:`_hold`)."""
        assert self._read_sql is not None and cursor.hi is not None
        params = {
            "from": cursor.scan_from(),
            "hi": text_of(cursor.hi),
            "lo": text_of(cursor.lo),
            "n": limit,
            "t0": time.monotonic(),
            "shard": shard,
        }
        # A page read must walk the id (or (shard, id)) index from its start and stop at the LIMIT. The
        # planner knows nothing of the rows a burst adds to a partition (its statistics predate them;
        # autovacuum analyzes it later), and with a row estimate under the page's LIMIT it scans the rest
        # of the partition and sorts it instead: ~160 ms per 5,000-row page of a 300,000-row partition of
        # Debezium's table against ~4 ms down the index, 5x Debezium's Postgres CPU per relayed row in
        # bench_debezium (docs/primary-cost.md). Only for the reads: the session's other statements (the
        # fenced commit's) plan worse without them (sequenced drain 0.7x the mark layout's, measured).
        # One pipeline sends the settings, the read and their restoring together: one round trip, not
        # three, which at a trickle (a page per row) was half of the cursor layout's statements.
        try:
            with self.conn.pipeline():
                self._run("planning the reads", _PLANNER, ("off", "off"))
                try:
                    waiting = self._hold(view, params) if self._held_read_sql is not None else set()
                    page = self._read_statement(self._read_sql, params)
                finally:
                    if self.session.live is not None:  # (a failed statement closed it)
                        self._run("planning the reads", _PLANNER, self._planner)
                rows: list[MarkedRow] = page.fetchall()
        except psycopg.Error as exc:  # raised by the pipeline's sync, after each statement was queued
            raise self.session.failed("reading the outbox", exc) from exc
        return rows, waiting

    def _read_statement(self, query: sql.Composed, params: dict[str, Any]) -> psycopg.Cursor:
        """A page read, on the read's own cursor (keys and values loaded as bytes), prepared where it may be."""
        return self._run(
            "reading the outbox", query, params, prepare=self.session.prepare_reads, cursor=self.session.row_cursor
        )

    def _add_page(
        self,
        view: View,
        read: ViewRead,
        shard: int,
        cursor: Cursor,
        rows: list[MarkedRow],
        waiting: set[int],
        limit: int,
    ) -> list[MarkedRow]:
        """Add the page read from ``cursor`` to the view and return its rows (less those held), unless the
        view ended meanwhile."""
        after, complete = page_end(cursor, len(rows), rows[-1][ROW_ID] if rows else None, limit)
        read.batch_rows += len(rows)
        if complete:
            self._scans[shard] = (read.batch_width, read.batch_rows)
        with self.views.lock:
            if self.views.current(view.leader_id) is view:
                view.add(shard, Segment(cursor, [r[ROW_ID] for r in rows], after))
                if waiting:
                    read.skipped.update(waiting)
                    rows = [r for r in rows if r[ROW_ID] not in waiting]
            else:
                rows = []  # the view ended meanwhile: its reads are the next view's to make again
        return rows

    def _serve_released(self, view: View, limit: int) -> list[MarkedRow]:
        """haltKey: held rows of released keys of the led shards in held order, but those this view serves
        already."""
        assert self._released_sql is not None
        params = {
            "shards": sorted(view.reads),
            "serving": sorted(view.serving),
            "n": limit,
            "t0": time.monotonic(),
        }
        # the mark's cursor: text loaded as the bytes the server sends, as the page's rows (their keys
        # are the modes' per-key bookkeeping's, which delivery reports give back as bytes)
        rows = self._run("reading held rows", self._released_sql, params, cursor=self.session.row_cursor).fetchall()
        if not rows:
            return []
        with self.views.lock:
            if self.views.view is not view:
                return []
            view.serving.update(r[0] for r in rows)
        return [tuple(r[:-1]) for r in rows]

    def _hold(self, view: View, params: dict[str, Any]) -> set[int]:
        """haltKey: copy the page's rows of halted or held keys to ``_held`` (fenced by the epoch of the page's
        shard's cursor) and return their ids; a view whose epoch was raised meanwhile copies nothing and ends."""
        assert self._held_read_sql is not None
        flags = self._run("holding rows", self._held_read_sql, {**params, "epoch": view.epoch}).fetchall()
        if any(f[4] for f in flags):
            with self.views.lock:
                if self.views.view is view:
                    self.views.view = None
            raise DatabaseError(
                f"reading {self.names.display!r}: another view raised the cursor's epoch (was {view.epoch}); "
                "this view ends"
            )
        return {int(f[0]) for f in flags if f[3]}

    def _split_served(self, ids: Sequence[int]) -> tuple[list[int], list[int]]:
        """(served held rows, the view's outbox rows) of ``ids``."""
        view = self.views.view
        if view is None or not view.serving:
            return [], list(ids)
        held = [i for i in ids if i in view.serving]
        if not held:
            return [], list(ids)
        return held, [i for i in ids if i not in view.serving]

    def _served_done(self, ids: list[int]) -> None:
        with self.views.lock:
            if self.views.view is not None:
                self.views.view.serving.difference_update(ids)

    def _guard(self, shard: int, cursor: Cursor, now: IdSource, head: int | None) -> tuple[Cursor, bool]:
        """A batch start's look at the id source (producer/layouts/cursor/_ids.py): the cursor to start from (its
        low 0 after a change: a rescan) and whether a probe may be taken; a broken txid default stops the
        read (DatabaseError: the cursor stays) and a broken source is logged, at most once a minute."""
        watch = self._watches.setdefault(shard, Watch())
        decision = guard(cursor, watch.before, now, head, self.names)
        if decision.stop is not None:
            raise DatabaseError(decision.stop)
        watch.note(decision, now)
        if decision.rescan:
            log.warning(
                "%s%s: the id source changed under the relay (ALTER SEQUENCE, a new id default, or the sequence "
                "set below the cursor): this batch reads from id 0, so no row drawn meanwhile is passed unread%s",
                self.names.display,
                f" shard {shard}" if self.shard_count is not None else "",
                "" if cursor.probe is None else f" (the probe at id {cursor.probe.head} is dropped)",
            )
        if decision.fault is not None and time.monotonic() >= self._next_fault_log:
            self._next_fault_log = time.monotonic() + HELD_LOW_LOG_INTERVAL
            log.warning(
                "%s. Until it is fixed the cursor's low is held at %d: rows still flow, but each batch re-reads "
                "from there and no partition retires",
                decision.fault,
                decision.cursor.low,
            )
        may_probe = decision.may_probe
        if may_probe and watch.unsettled:
            rows = self._run("listing open transactions", OPEN_TRANSACTIONS_SQL, ()).fetchone()
            may_probe = watch.settle(frozenset(str(v) for v in (rows[0] if rows else None) or ()))
        return decision.cursor, may_probe

    def _held_low(self, width: int, held: float) -> None:
        """``low`` is held back (docs/primary-cost.md, long-running transactions): each batch re-reads up
        to ``width`` ids of delivered rows and their partitions wait. Say so, naming the oldest transaction
        that holds an xid anywhere in the cluster (xids are cluster-wide: it need not touch the outbox)."""
        now = time.monotonic()
        if now < self._next_held_log:
            return
        self._next_held_log = now + HELD_LOW_LOG_INTERVAL
        oldest = self._run(
            "looking for the oldest transaction",
            sql.SQL(
                "SELECT pid, coalesce(application_name, ''), extract(epoch FROM now() - xact_start), coalesce(state, '') "
                "FROM pg_stat_activity WHERE backend_xid IS NOT NULL ORDER BY age(backend_xid) DESC LIMIT 1"
            ),
            (),
        ).fetchone()
        who = (
            f"the oldest transaction holding an xid is pid {oldest[0]} ({oldest[1] or 'no application_name'}, "
            f"{oldest[3]}, open {float(oldest[2] or 0):.0f}s)"
            if oldest
            else "no transaction holds an xid now (it has just ended)"
        )
        log.warning(
            "%s: a transaction open for over %.0fs holds the cursor's low back: each read starts %d ids below the "
            "outbox's head (delivered rows re-scanned, their partitions kept; no row is delayed but its own); %s. "
            "Bound transactions (idle_in_transaction_session_timeout, transaction_timeout)",
            self.names.display,
            held,
            width,
            who,
        )

    def _idle_commit(self, view: View, shards: list[int]) -> None:
        """An idle shard's cursor, at most every :data:`IDLE_COMMIT_INTERVAL` (fenced by the epoch as every
        cursor commit; a lost one only leaves the committed cursor older)."""
        self._next_idle_commit = time.monotonic() + IDLE_COMMIT_INTERVAL
        moved = False
        for shard in shards:
            with self.views.lock:
                cur = view.reads[shard].idle_cursor() if self.views.view is view else None
                if cur is not None and view.reads[shard].only_snapshots_moved(cur):
                    view.idle_committed(shard, cur, written=False)
                    continue
            if cur is None:
                continue
            n = self._run(
                "committing the cursor", self._commit_cursor_sql, (*cursor_params(cur), shard, view.epoch)
            ).rowcount
            if n == 1:
                moved = True
                with self.views.lock:
                    view.idle_committed(shard, cur)
        if moved:
            self._maintain()  # an idle outbox's delivered partitions retire now, not at the next rows

    @leased
    def stats(self) -> tuple[int, float | None, int]:
        """(backlog rows the led shards' committed cursors have not passed, age of the oldest, dead letters);
        sharded, :attr:`shard_stats` has each led shard's."""
        rows = self._run("metrics query", self._backlog_sql, {"shards": self._led()}).fetchall()
        dead, self.halted_keys = self.dead_letters.counts()
        per_shard = {int(r[0]): (int(r[1]), None if r[2] is None else float(r[2])) for r in rows}
        self.shard_stats = per_shard if self.shard_count is not None else {}
        scans = [self._scans[k] for k in self._led() if k in self._scans]
        self.scan = max(scans) if scans else None
        ages = [a for _n, a in per_shard.values() if a is not None]
        return (
            sum(n for n, _a in per_shard.values()),
            max(ages) if ages else None,
            dead,
        )

    # ------------------------------------------------------------------ at-least-once
    @leased
    def purge(self, ids: Sequence[int]) -> int:
        """Delivered rows: commit the cursor past the delivered prefix of the view's reads (served held
        rows: deleted from ``_held``)."""
        held, ids = self._split_served(ids)
        if held:
            self._run("dropping delivered held rows", drop_held_sql(self.names), (held,))
            self._served_done(held)
        self._passed(ids)
        return len(ids) + len(held)

    @leased
    def reset(self, ids: Sequence[int]) -> int:
        """Nothing to un-mark: the next view reads from the committed cursor."""
        return len(ids)

    @leased
    def hold(self, ids: Sequence[int]) -> int:
        """haltKey, at-least-once: rows the view dropped unsent for a key it halted are copied to ``_held``
        (fenced by the view's epoch, as the read's copy) and pass with the cursor, so the next view does not
        read them, nor the rows delivered after them, again."""
        with self.views.lock:
            view = self.views.view
        if view is None or not ids:
            return 0
        try:
            with self.conn.transaction():
                fenced = self.conn.execute(
                    sql.SQL(
                        "SELECT count(*) FROM (SELECT 1 FROM {} WHERE shard = ANY(%s::int[]) AND epoch = %s "
                        "ORDER BY shard FOR SHARE) AS led"
                    ).format(self.names.cursor),
                    (sorted(view.reads), view.epoch),
                ).fetchone()
                if fenced is None or int(fenced[0]) != len(view.reads):
                    raise FenceError(f"holding rows of {self.names.display!r}: view epoch {view.epoch} is not current")
                n = self.conn.execute(hold_rows_sql(self.names), (list(ids),)).rowcount
        except psycopg.Error as exc:
            self.close()
            raise DatabaseError(f"holding rows of {self.names.display!r} failed: {self.session.redacted(exc)}") from exc
        except FenceError as exc:
            raise DatabaseError(str(exc)) from exc
        with self.views.lock:
            if self.views.view is view:
                groups, _unknown = view.by_shard(list(ids))
                for shard, group in groups.items():
                    view.reads[shard].skipped.update(group)
        self._passed([])
        return n

    @leased
    def dead_letter(self, items: Sequence[tuple[int, str, int]]) -> int:
        """Copy ``(id, error, attempts)`` rows to the dead letters; then they count as passed."""
        self.conn  # noqa: B018 -- connects, which builds the statement for the value column's type
        assert self._copy_dlq_sql is not None
        held, _ = self._split_served([i for i, _, _ in items])
        n = 0
        if held:
            moved = [it for it in items if it[0] in set(held)]
            items = [it for it in items if it[0] not in set(held)]
            n += self._run(
                "dead-letter",
                dead_letter_held_sql(self.names),
                ([i for i, _, _ in moved], [e for _, e, _ in moved], [a for _, _, a in moved]),
            ).rowcount
            self._served_done(held)
        if items:
            n += self._run(
                "dead-letter",
                self._copy_dlq_sql,
                ([i for i, _, _ in items], [e for _, e, _ in items], [a for _, _, a in items]),
            ).rowcount
        self._passed([i for i, _, _ in items])
        return n

    def _passed(self, ids: list[int]) -> None:
        """Commit each shard's cursor past its delivered prefix (those that moved)."""
        with self.views.lock:
            view = self.views.view
            if view is None:
                return
            groups, _unknown = view.by_shard(ids)  # unknown: served held rows, or not this view's reads
            plans = []
            for shard in sorted(view.reads):  # every shard: held rows right behind pass too
                cur, finished, done = view.reads[shard].plan_delivered(groups.get(shard, []))
                if cur is not None:
                    plans.append((shard, cur, finished, done))
        for shard, cur, finished, done in plans:
            n = self._run(
                "committing the cursor", self._commit_cursor_sql, (*cursor_params(cur), shard, view.epoch)
            ).rowcount
            if n != 1:
                raise DatabaseError(
                    f"cursor commit on {self.names.display!r} refused: another view raised the cursor's epoch (shard "
                    f"{shard}, was {view.epoch}); its rows after the committed cursor will be sent again"
                )
            with self.views.lock:
                if self.views.view is view:
                    view.apply(shard, finished, done, cur)
        if plans:
            self._maintain()

    # ------------------------------------------------------------------ --uuid-sequencing
    @leased
    def commit_txns(self, epoch: int, leader_id: uuid.UUID, txns: Sequence[TxnCommit]) -> None:
        """The fenced commit (module doc), decided, then applied: what it writes is decided under the views'
        lock (:meth:`_plan_commit`), sent in one message and committed or rolled back (:meth:`_send_commit`),
        and only once the database said COMMIT does the view forget what it passed."""
        plan = self._plan_commit(epoch, leader_id, txns)
        self._send_commit(plan, epoch, txns)
        with self.views.lock:
            if self.views.view is plan.view:
                for shard, cur, finished, done in plan.shards:
                    plan.view.apply(shard, finished, done, cur)
                plan.view.serving.difference_update(plan.held_ids + [d.id for d in plan.held_dead])
        self._maintain()

    def _plan_commit(self, epoch: int, leader_id: uuid.UUID, txns: Sequence[TxnCommit]) -> _CommitPlan:
        """Which rows the commit passes, per shard, and which of them are held rows served now; refuses
        (:class:`FenceError`) a view that is not current or rows it did not read."""
        n = self.names
        ids = [i for t in txns for i in t.ids]
        dead = [d for t in txns for d in t.dead]
        dropped = [i for t in txns for i in t.held]  # haltKey: read, dropped unsent for a key the view halted
        with self.views.lock:
            view = self.views.current(leader_id)
            if view is None or view.epoch != epoch:
                raise FenceError(f"commit refused on {n.display!r}: view {leader_id} (epoch {epoch}) is not current")
            if dropped and view.serving:  # a served held row dropped stays in _held, where it is
                dropped = [i for i in dropped if i not in view.serving]
            held_ids = [i for i in ids if i in view.serving]
            held_dead = [d for d in dead if d.id in view.serving]
            if held_ids or held_dead:
                ids = [i for i in ids if i not in view.serving]
                dead = [d for d in dead if d.id not in view.serving]
            try:
                groups, unknown = view.by_shard(ids + [d.id for d in dead] + dropped)
                if unknown:
                    raise NotNextRows(f"the commit passes ids {sorted(unknown)[:10]}... that this view did not read")
                shards = []
                for shard in sorted(view.reads):  # every shard: held rows right behind pass too (plan_exact)
                    cur, finished, done = view.reads[shard].plan_exact(groups.get(shard, []))
                    shards.append((shard, cur, finished, done))
            except NotNextRows as exc:
                log.error("%s: %s; ending the view (its rows are read again by the next)", n.display, exc)
                raise FenceError(f"commit refused on {n.display!r}: {exc}") from None
        forget = [i for t in txns for i in t.forget]
        return _CommitPlan(view, ids, dead, forget, dropped, held_ids, held_dead, shards)

    def _commit_statements(self, plan: _CommitPlan, epoch: int, txns: Sequence[TxnCommit]) -> list[_Sent]:
        """The plan's statements, in the order :meth:`_send_commit` reads their counts: the fence, the moved
        cursors, the dead letters, then what returns no count it checks."""
        n = self.names
        self.conn  # noqa: B018 -- connects, which builds the dead-letter statement
        statements: list[_Sent] = [(self.fence.fence_sql, (max(t.ack_clock for t in txns),))]
        statements += [(self._commit_cursor_sql, (*cursor_params(cur), shard, epoch)) for shard, cur in plan.moved]
        if plan.dead:
            assert self._copy_dlq_sql is not None
            statements.append((self._copy_dlq_sql, dead_columns(plan.dead)))
        if plan.forget:
            statements.append((self.attempts.forget_sql, (self.session.id_array(plan.forget),)))
        statements += [
            (
                self.fence.intent_sql,
                (epoch, t.producer, t.ack_clock, [j for j, _ in t.journals], [p for _, p in t.journals]),
            )
            for t in txns
            if t.journals
        ]
        if plan.dropped:
            statements.append((hold_rows_sql(n), (plan.dropped,)))
        # served held rows leave _held in the same transaction: exactly once, as the mark layout's delete
        if plan.held_ids:
            statements.append((drop_held_sql(n), (plan.held_ids,)))
        if plan.held_dead:
            statements.append((dead_letter_held_sql(n), dead_columns(plan.held_dead)))
        return statements

    def _send_commit(self, plan: _CommitPlan, epoch: int, txns: Sequence[TxnCommit]) -> None:
        """One message (why: producer/db/fence.py), then COMMIT, or ROLLBACK and :class:`FenceError` when the
        fence, a cursor or a dead-lettered row says this view no longer owns what it commits."""
        n = self.names
        statements = self._commit_statements(plan, epoch, txns)
        moved = len(plan.moved)
        try:
            conn = self.conn
            epochs, counts = send_in_one_message(conn, statements)
            refusal = None
            if not epochs or any(e != epoch for e in epochs) or len(epochs) != len(plan.view.reads):
                refusal = (
                    f"commit refused by the fence of {n.display!r}{self.session.shard_text}: epochs are "
                    f"{sorted(set(epochs)) or None}, this view's is {epoch}"
                )
            elif any(c != 1 for c in counts[:moved]):
                refusal = f"commit refused by the cursor of {n.display!r}: its epoch is no longer {epoch}"
            elif plan.dead and counts[moved] != len(plan.dead):
                refusal = f"dead-lettering refused on {n.display!r}: some of {len(plan.dead)} row(s) are gone"
            conn.execute("ROLLBACK" if refusal else "COMMIT")
        except psycopg.Error as exc:
            raise self.session.failed("commit", exc) from exc
        if refusal:
            raise FenceError(refusal)

    def _maintain(self) -> None:
        """Partition maintenance, by the relay leading shard 0 (one keeper for the outbox; a partition
        retires only once every shard's committed ``low`` is past it: producer/layouts/cursor/partitions.py)."""
        conn = self.session.live
        if self.keeper is None or conn is None:
            return
        if self.shard_count is None or 0 in self.shards:
            self.keeper.maybe_run(conn)
