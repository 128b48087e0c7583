"""The relay's database binding: mark, purge, reset, dead-letter, LISTEN, metrics queries.

Statements (``$leader`` = this view's leader id):
- mark: goharvest's query — one ``UPDATE … SET leader_id=$leader WHERE … (SELECT … WHERE
  leader_id IS NULL OR leader_id <> $leader ORDER BY id LIMIT n) RETURNING …`` (rows addressed by
  ``ctid``; see :attr:`OutboxDatabase.conn`). No ``FOR UPDATE
  SKIP LOCKED``: rows are only ever contended by a zombie leader, and stealing them is exactly what
  salvaging a dead leader's rows means; blocking briefly on its row lock is harmless. Every mark
  scans from the start of the outbox: a row committed late (a long transaction's, lower id) goes out
  in the next mark, before any later row of its key (tests/test_producer/test_relay.py).
- purge: ``DELETE … WHERE id = ANY($ids)`` — many ids per statement.
- reset: ``UPDATE … SET leader_id = NULL WHERE id = ANY($ids)``.
- fenced commit (``--uuid-sequencing``): its transactions' rows ``AND leader_id = $leader``, named as
  an id range minus its few holes (:func:`id_range`) or, failing that, as ``id = ANY($ids)``.
- dead-letter: one statement (a CTE) that deletes from the outbox and inserts into the dead-letter
  table, so a row is never in both or neither (and forgets the row's delivery-attempt count).
- attempts: the mark returns each row's persisted failed-attempt count (a LEFT JOIN on the
  delivery-attempts table, in the same statement: no extra round trip); failed attempts are
  upserted (``GREATEST`` of the stored and the new count) with the write-behind jobs, and deleted
  when the row is purged, committed or dead-lettered.

Invariants: every statement runs in autocommit mode (each is its own transaction, as in goharvest),
committed synchronously except on a connection built with ``async_commit`` (the relay's mark
connection: see ``RelayCore.open``, tests/test_producer/test_async_mark.py);
failures are raised as :class:`~producer.errors.DatabaseError` chained to the psycopg error, with
secrets scrubbed from the message.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import Format
from psycopg.types.array import ArrayBinaryLoader

from harvest_outbox.producer.errors import DatabaseError, FenceError, SchemaError
from harvest_outbox.producer.key_halt import halted_filter
from harvest_outbox.producer.redact import redact_dsn, redact_error
from harvest_outbox.producer.schema import (
    OutboxNames,
    Statement,
    ValueType,
    inspect_outbox,
    require_attempts_table,
    require_shards,
    require_utf8_readable,
)
from harvest_outbox.producer.shards import shard_expression

log = logging.getLogger(__name__)

# A marked row, exactly as the mark statement returns it: (id, topic, key bytes, value bytes|None,
# header keys, header values, bad, persisted attempts, last error, partition, created). Header arrays are
# tuples, or None when the row has no headers (empty arrays come back as NULL: no loader call per
# row). ``bad`` is None, or why the row can never be produced (decided by the statement: the table
# mapping's RecordSql.bad, then _HEADER_BAD). ``partition`` is None (the producer's partitioner, by
# key) unless the table mapping places a column there (producer.table_mapping). ``created`` is the
# row's create time on this process's time.monotonic() clock (ROW_CREATED; producer.histograms). A plain
# tuple of atomic values in id order, used as it comes from the driver: the mark allocates nothing
# else per row, and the garbage collector does not track it.
MarkedRow = tuple[
    int,
    "str | None",
    "bytes | None",
    "bytes | None",
    "tuple[str | None, ...] | None",
    "tuple[str | None, ...] | None",
    "str | None",
    "int | None",
    "str | None",
    "int | None",
    float,
]
#: Where a MarkedRow holds its create time (time.monotonic() seconds): the dwell histogram's start.
ROW_CREATED = 10
# Persisted failed delivery attempts of marked rows: id -> (attempts, last error).
MarkedAttempts = dict[int, tuple[int, "str | None"]]


# The relay's transactions are a few statements sent back to back; a session of ours that sits idle
# inside one for this long belongs to a frozen process (SIGSTOP, VM pause) that may hold the fence
# row lock. Postgres then ends that session, so the next leader's view start is not blocked for as
# long as the zombie stays frozen; the zombie's commit is refused by the fence anyway.
IDLE_IN_TRANSACTION_TIMEOUT = "10s"
# A lock wait longer than this fails (and the caller retries after its I/O back-off) instead of
# holding the relay thread, which also runs the leader-election heartbeats.
LOCK_TIMEOUT = "2s"
# A network path to Postgres that silently drops packets (a partition, a NAT entry gone) would
# leave a relay statement waiting for TCP's own give-up, ~15 minutes. These libpq settings (unless
# the DSN sets them) make the kernel fail such a connection after ~20 s of unacknowledged data or
# silence, so the relay's ordinary error path (back off, reconnect, remark) takes over.
TCP_DEFAULTS = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "3",
    "keepalives_count": "3",
    "tcp_user_timeout": "20000",
}


# Why a marked row can never be produced, decided in the mark statement (NULL for a good row): the
# relay thread then checks one value per row instead of five. Its texts are the dead letters' errors.
# Two steps, so a row without headers (nearly every row) costs no array function: the table mapping's
# RecordSql.bad, in the UPDATE's RETURNING, tests only NULLs and the topic; _HEADER_BAD runs on the returned rows and only
# for a row with a header array that is not empty (``hk``/``hv``: the arrays, NULL when empty). Each
# array function detoasts (copies) its array: five of them on every row were 8 % of a 5,000-row mark.
# Multi-dimensional arrays are refused before array_position, which would raise on them.
_HEADER_BAD = """CASE
  WHEN m.bad IS NOT NULL OR (m.hk IS NULL AND m.hv IS NULL) THEN m.bad
  WHEN array_ndims(m.hk) > 1 OR array_ndims(m.hv) > 1 THEN
    'header arrays are multi-dimensional: ' || coalesce(m.hk::text, '{}') || ' / ' || coalesce(m.hv::text, '{}')
    || '; use one-dimensional text arrays'
  WHEN coalesce(cardinality(m.hk), 0) <> coalesce(cardinality(m.hv), 0) THEN
    'header arrays differ in length: ' || coalesce(cardinality(m.hk), 0) || ' key(s) ' || coalesce(m.hk::text, '{}')
    || ' but ' || coalesce(cardinality(m.hv), 0) || ' value(s); each header needs one key and one value'
  WHEN array_position(m.hk, NULL) IS NOT NULL THEN
    'kafka_header_keys contains NULL: header names must not be NULL'
END"""

_TEXT_ARRAY_OID = 1009


class _HeaderArrayLoader(ArrayBinaryLoader):
    """``text[]`` as a tuple, not a list (the mark returns empty header arrays as NULL, so this runs
    only for rows that have headers).

    A marked row is then a tuple of atomic values, which Python's cyclic garbage collector stops
    tracking: the relay holds tens of thousands of marked rows in its queues during a drain, and as
    tracked objects they made every full collection walk all of them."""

    def load(self, data: Any) -> tuple[Any, ...]:  # type: ignore[override]  # a tuple on purpose (above)
        return tuple(super().load(data))


#: The most ids a fenced commit excludes from its range (:func:`id_range`); more, and it names its ids.
MAX_RANGE_HOLES = 64


def id_range(ids: Sequence[int]) -> tuple[int, int, list[int]] | None:
    """``(lo, hi, holes)`` such that the integers of ``[lo, hi]`` other than ``holes`` are exactly
    ``ids``; None if ``ids`` is empty, repeats an id, or leaves more than :data:`MAX_RANGE_HOLES` holes.

    A harvest transaction's rows are consecutive marked rows: in a drain, one run of ids; holes are
    the ids of rows that are not its own (another view's, rows it dead-letters, a late commit marked
    later). Postgres deletes such a range with one index range scan, against one index descent per
    id for ``id = ANY($ids)`` (5,000 rows: ~2.5 against ~5 ms), and the relay builds no array of
    thousands of ids (~1.5 ms of Python per 5,000). ``DELETE … WHERE id BETWEEN lo AND hi AND id <>
    ALL(holes)`` then names the same rows as ``id = ANY(ids)``: the commit's row count check keeps
    its meaning."""
    if not ids:
        return None
    lo, hi = min(ids), max(ids)
    spare = hi - lo + 1 - len(ids)
    if spare > MAX_RANGE_HOLES:
        return None
    present = set(ids)
    if len(present) != len(ids):
        return None  # a repeated id: leave it to the count check of id = ANY(ids)
    holes = [i for i in range(lo, hi + 1) if i not in present] if spare else []
    return lo, hi, holes


def connect(dsn: str, **kwargs: Any) -> psycopg.Connection:
    """The connection every command and relay statement on the outbox uses (autocommit, UTF-8, the
    timeouts above). Refuses a database the relay cannot read (:func:`require_utf8_readable`)."""
    try:
        given = conninfo_to_dict(dsn)
        host = str(given.get("host", ""))
        if not host.startswith("/"):  # TCP only (not a Unix socket)
            kwargs = {**{k: v for k, v in TCP_DEFAULTS.items() if k not in given}, **kwargs}
        # UTF-8 whatever the DSN or the database's encoding say: the mark loads text columns as the
        # bytes the server sends (Kafka keys and values are the UTF-8 of the outbox's text).
        conn = psycopg.connect(dsn, autocommit=True, **{**kwargs, "client_encoding": "UTF8"})
    except psycopg.Error as exc:
        raise DatabaseError(
            f"cannot connect to Postgres ({redact_dsn(dsn)}): {redact_error(str(exc), dsn).strip()}"
        ) from exc
    try:
        require_utf8_readable(conn)
        conn.execute(f"SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION_TIMEOUT}'")
        conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
        return conn
    except psycopg.Error as exc:
        conn.close()
        raise DatabaseError(
            f"cannot connect to Postgres ({redact_dsn(dsn)}): {redact_error(str(exc), dsn).strip()}"
        ) from exc
    except BaseException:
        conn.close()
        raise


class TxnCommit(NamedTuple):
    """What the fenced commit of one harvest transaction writes (:meth:`OutboxDatabase.commit_txns`)."""

    ids: Sequence[int]  # rows it delivered: deleted
    dead: Sequence[tuple[int, str, int]]  # (id, error, attempts): moved to the dead letters
    producer: bytes
    ack_clock: int
    journals: Sequence[tuple[str, int]]  # (topic, partition) it touched: one ACK intent each
    forget: Sequence[int] = ()  # delivered rows with a stored attempt count: the count goes


class OutboxDatabase:
    """One autocommit connection running the relay's statements against one outbox table, or against
    a set of its shards (``shard_count`` > 1, :meth:`set_shards`): marks, metrics and the fence rows
    are then the led shards'; purges, resets and dead letters address ids, which belong to one shard
    anyway. The set changes only between leader views, when no statement of the old view runs."""

    def __init__(
        self,
        dsn: str,
        names: OutboxNames,
        shard_count: int | None = None,
        *,
        async_commit: bool = False,
        halt_keys: bool = False,
    ) -> None:
        self._dsn = dsn
        #: Commit without waiting for the WAL flush (``synchronous_commit = off``): only for a connection
        #: whose writes need not survive a database crash on their own (see RelayCore.open).
        self.async_commit = async_commit
        #: ``deadLetterPolicy: haltKey``: the mark leaves rows of a (topic, key) with a dead letter (producer.key_halt).
        self.halt_keys = halt_keys
        #: The last stats(): (topic, key) pairs with a dead letter (the keys haltKey holds).
        self.halted_keys = 0
        self.names = names
        self.shard_count = shard_count if shard_count and shard_count > 1 else None
        self.shards: frozenset[int] = frozenset()
        self.shard_stats: dict[int, tuple[int, float | None]] = {}  # the last stats(): shard -> (rows, oldest age)
        self._mark_sql: sql.Composed | None = None
        self._state_table = names.state if self.shard_count is None else names.shard_state
        self._set_shard_sql()
        self._conn: psycopg.Connection | None = None
        self._prepare_mark = False
        self._mark_cursor: psycopg.Cursor | None = None
        self.value_type: ValueType = "varchar"
        o, d, a = names.outbox, names.dead_letters, names.delivery_attempts
        m = names.mapping
        oid, leader = m.id(), m.leader()
        # The id arrays are read through a scalar subquery (an InitPlan): as a constant, or as a
        # parameter of a custom plan, Postgres estimated the selectivity of each of its thousands of
        # elements while planning (~0.8 ms for 5,000 ids, as long as a quarter of the DELETE itself);
        # through the subquery it plans an index scan of a runtime array at once.
        ids = sql.SQL("ANY(CAST((SELECT %s::bigint[]) AS bigint[]))")
        self._purge_sql = sql.SQL("DELETE FROM {} WHERE {} = {ids}").format(o, oid, ids=ids)
        self._reset_sql = sql.SQL("UPDATE {} SET {} = NULL WHERE {} = {ids}").format(o, leader, oid, ids=ids)
        # Dead letters (built by ``conn``: the value's expression depends on the column's type, which
        # the connection reads; a dead-letter statement is a connection's first one at times).
        self._dlq_sql: sql.Composed | None = None
        self._commit_delete_sql = sql.SQL("DELETE FROM {} WHERE {} = {ids} AND {} = %s").format(o, oid, leader, ids=ids)
        self._commit_delete_range_sql = sql.SQL(
            "DELETE FROM {} WHERE {id} BETWEEN %s AND %s AND {id} <> ALL(%s::bigint[]) AND {} = %s"
        ).format(o, leader, id=oid)
        self._commit_dlq_sql: sql.Composed | None = None
        self._attempts_sql = sql.SQL("""
            INSERT INTO {a} AS a (id, attempts, last_error)
            SELECT * FROM unnest(%s::bigint[], %s::int[], %s::text[])
            ON CONFLICT (id) DO UPDATE SET attempts = GREATEST(a.attempts, EXCLUDED.attempts),
                                           last_error = EXCLUDED.last_error, updated_at = now()""").format(a=a)
        self._forget_sql = sql.SQL("DELETE FROM {} WHERE id = {ids}").format(a, ids=ids)
        self._stats_dead_sql = sql.SQL(
            "SELECT count(*), count(DISTINCT (kafka_topic, kafka_key)) "
            "FILTER (WHERE kafka_topic IS NOT NULL AND kafka_key IS NOT NULL) FROM {}"
        ).format(d)
        # deadLetterRetention: one batch of expired dead letters (found by the dead_time index init-db makes).
        self._expire_sql = sql.SQL(
            "DELETE FROM {d} WHERE id = ANY(ARRAY(SELECT id FROM {d} "
            "WHERE dead_time < now() - make_interval(secs => %s) LIMIT %s))"
        ).format(d=d)

    def _dead_letter_sql(self, owned: sql.Composable) -> sql.Composed:
        """Move rows ``(id, error, attempts)`` to the dead letters in one statement (a CTE), so a row is
        never in both tables or neither; forgets their attempt counts. ``owned``: an extra condition on
        the outbox row (the fenced commit's ``AND leader = %s``). The dead letter holds the record as
        the table mapping makes it, and, for a mapped table, the row itself (``source_row``)."""
        n, m = self.names, self.names.mapping
        rec = m.record("o", self.value_type)
        source = m.source_row("o")
        cols = sql.SQL(
            "id, create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values, "
            "error, attempts{}"
        ).format(sql.SQL(", source_row") if source is not None else sql.SQL(""))
        return sql.SQL("""
            WITH bad(id, error, attempts) AS (SELECT * FROM unnest(%s::bigint[], %s::text[], %s::int[])),
            forgotten AS (DELETE FROM {a} AS a USING bad WHERE a.id = bad.id),
            moved AS (
              DELETE FROM {o} AS o USING bad WHERE {oid} = bad.id{owned}
              RETURNING {oid}, {created}, {topic}, {key}, {value}, {hk}, {hv}, bad.error, bad.attempts{source})
            INSERT INTO {d} ({cols})
            SELECT * FROM moved
            ON CONFLICT (id) DO UPDATE SET error = EXCLUDED.error, attempts = EXCLUDED.attempts,
                                           dead_time = now()""").format(
            a=n.delivery_attempts,
            o=n.outbox,
            d=n.dead_letters,
            oid=m.id("o"),
            owned=owned,
            created=m.created("o"),
            topic=rec.topic,
            key=rec.key,
            value=rec.value,
            hk=sql.SQL("coalesce({}, '{{}}')").format(rec.header_keys),
            hv=sql.SQL("coalesce({}, '{{}}')").format(rec.header_values),
            source=sql.SQL(", {}").format(source) if source is not None else sql.SQL(""),
            cols=cols,
        )

    def set_shards(self, shards: frozenset[int]) -> None:
        """Lead these shards from now on (sharded relays, between views)."""
        if self.shard_count is None:
            raise ValueError("set_shards on an unsharded outbox database")
        if any(not 0 <= k < self.shard_count for k in shards):
            raise ValueError(f"shards {sorted(shards)} outside 0..{self.shard_count - 1}")
        self.shards = frozenset(shards)
        self._set_shard_sql()
        if self._conn is not None and not self._conn.closed:
            self._build_mark_sql()

    def _set_shard_sql(self) -> None:
        """The statements that depend on the led shards (fixed SQL text per view: the shard indexes
        are small integers, written as an array literal)."""
        n = self.names
        o = n.outbox
        self._intent_sql = sql.SQL("""
            INSERT INTO {} (epoch, producer, clock, topic, kafka_partition, shard_count, shards)
            SELECT %s, %s, %s, t, p, {n}, {ks} FROM unnest(%s::text[], %s::int[]) AS j(t, p)
            ON CONFLICT (producer, topic, kafka_partition)
            DO UPDATE SET epoch = EXCLUDED.epoch, clock = EXCLUDED.clock, create_time = now()""").format(
            n.ack_intents, n=sql.Literal(self.shard_count or 1), ks=self._shard_array()
        )
        if self.shard_count is None:
            self._fence_rows: sql.Composable = sql.SQL("")
            # Unsharded: every intent, including any left by an earlier sharding (its relays are gone).
            self._intents_of_view: sql.Composable = sql.SQL("")
            stats_where: sql.Composable = n.mapping.claimable()
        else:
            expr, arr = shard_expression(self.shard_count, n.mapping.shard_key()), self._shard_array()
            self._fence_rows = sql.SQL(" WHERE shard_count = {} AND shard = ANY({})").format(
                sql.Literal(self.shard_count), arr
            )
            # Intents of views that led any of these shards: those views can no longer commit (their
            # fence includes a shard whose epoch this view bumped). Shard 0's leader also takes over
            # intents of another shard count (left by an earlier sharding, drained and stopped
            # before the change; docs/sharding.md).
            other = (
                sql.SQL(" OR shard_count <> {}").format(sql.Literal(self.shard_count))
                if 0 in self.shards
                else sql.SQL("")
            )
            self._intents_of_view = sql.SQL(" WHERE (shard_count = {} AND shards && {}){}").format(
                sql.Literal(self.shard_count), arr, other
            )
            stats_where = sql.SQL(" WHERE {} = ANY({}){}").format(expr, arr, n.mapping.claimable("AND"))
        self._stats_sql = sql.SQL("""
            SELECT {e}, count(*), extract(epoch FROM now() - min({c})) FROM {o}{w} GROUP BY 1""").format(
            e=shard_expression(self.shard_count, n.mapping.shard_key()) if self.shard_count else sql.SQL("0"),
            c=n.mapping.created(),
            o=o,
            w=stats_where,
        )
        # Locks the fence row(s) (as SELECT … FOR UPDATE would; in shard order, so two commits never
        # deadlock) and raises the clock floor of later views.
        self._fence_sql = sql.SQL("UPDATE {} SET last_clock = GREATEST(last_clock, %s){} RETURNING epoch").format(
            self._state_table, self._fence_rows
        )

    def _shard_array(self) -> sql.Composable:
        ks = sorted(self.shards) if self.shard_count is not None else [0]
        return sql.SQL("'{" + ",".join(str(int(k)) for k in ks) + "}'::int[]")

    @property
    def shard_text(self) -> str:
        """`` (shards 0,3 of 8)`` for messages; empty unsharded."""
        if self.shard_count is None:
            return ""
        return f" (shards {','.join(map(str, sorted(self.shards))) or 'none'} of {self.shard_count})"

    @property
    def conn(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self._dsn)
            self._conn.adapters.register_loader(_TEXT_ARRAY_OID, _HeaderArrayLoader)
            # Prepared statements (the mark; psycopg prepares the others after 5 runs) are parsed
            # once but planned for every run with its own parameters: a generic plan, which Postgres
            # would otherwise settle on after 5 runs, made while the outbox was empty sorted the
            # whole outbox on every mark once a burst arrived (2,600 rows/s instead of ~60,000).
            try:
                self._conn.execute("SET plan_cache_mode = force_custom_plan")
                self._prepare_mark = True
            except psycopg.errors.UndefinedObject:  # PostgreSQL < 12: the mark stays unprepared
                self._prepare_mark = False
            if self.async_commit:
                self._conn.execute("SET synchronous_commit = off")
            self.value_type = inspect_outbox(self._conn, self.names)
            require_attempts_table(self._conn, self.names)
            if self.shard_count is not None:
                require_shards(self._conn, self.names, self.shard_count)
                # A led shard's rows are spread over the whole outbox, so Postgres' default cost of a
                # random page (4) made the planner read the primary key in id order and hash every
                # row's key instead of taking the shard's range of the (shard, id) index, once the
                # outbox's pages were half empty (OUTBOX_FILLFACTOR; 100k rows, 5,000-row marks).
                # The relay's working set is the head of the outbox, in shared buffers: a random
                # page costs about what a sequential one does (the usual setting for SSDs and RAM).
                self._conn.execute("SET random_page_cost = 1.1")
            # Key and value come back as varchar and are loaded as the bytes the server sent (UTF-8,
            # the connection's client encoding): no convert_to() call per column and row on the
            # database (4 % of a 5,000-row mark) and the same bytes. Only on the mark's own cursor.
            self._dlq_sql = self._dead_letter_sql(sql.SQL(""))
            self._commit_dlq_sql = self._dead_letter_sql(sql.SQL(" AND {} = %s").format(self.names.mapping.leader("o")))
            self._mark_cursor = self._conn.cursor()
            bytea = self._conn.adapters.get_loader(psycopg.postgres.types["bytea"].oid, Format.BINARY)
            assert bytea is not None  # psycopg always has it
            self._mark_cursor.adapters.register_loader("varchar", bytea)
            self._build_mark_sql()
        return self._conn

    def _build_mark_sql(self) -> None:
        # goharvest's mark, with the rows addressed by ctid (a TID scan) instead of a second
        # primary-key probe per row (``id IN (SELECT id …)``): half the database work per marked
        # row (bench/bench_relay.py measures both). A row updated by someone else between the
        # subquery and the UPDATE has moved to a new ctid and is simply left for the next mark.
        # Sharded, the subquery reads the led shards' rows from the (shard, id) index.
        o, m = self.names.outbox, self.names.mapping
        oid, leader, mine = m.id(), m.leader(), m.claimable("AND")
        if self.halt_keys:  # the claim's outbox is ``c``; see producer.key_halt
            c = m.record("c", self.value_type)
            mine = sql.Composed([mine, halted_filter(self.names, c.topic, c.key)])
        if self.shard_count is None:
            claim: sql.Composable = sql.SQL(
                "SELECT ctid FROM {o} AS c WHERE ({l} IS NULL OR {l} <> %(leader)s){mine} ORDER BY {id} LIMIT %(n)s"
            ).format(o=o, l=leader, id=oid, mine=mine)
        else:
            # One index range per led shard, merged in id order (a Merge Append of the (shard, id)
            # index scans): a relay leading several shards never reads other shards' rows.
            expr = shard_expression(self.shard_count, m.shard_key())
            branches = [
                sql.SQL(
                    "(SELECT ctid, {id} AS id FROM {o} AS c WHERE {e} = {k} AND ({l} IS NULL OR {l} <> "
                    "%(leader)s){mine} ORDER BY {id} LIMIT %(n)s)"
                ).format(o=o, e=expr, k=sql.Literal(k), l=leader, id=oid, mine=mine)
                for k in sorted(self.shards)
            ] or [sql.SQL("(SELECT ctid, {id} AS id FROM {o} WHERE false)").format(o=o, id=oid)]
            claim = sql.SQL("SELECT ctid FROM ({}) AS led ORDER BY id LIMIT %(n)s").format(
                sql.SQL(" UNION ALL ").join(branches)
            )
        # Sorted by Postgres, and each row in its final shape (MarkedRow): the relay's thread, which
        # holds the GIL while it turns the result into Python objects, does no per-row work after
        # the driver (slicing and sorting 5,000 rows in Python cost ~3 ms a mark, on the critical path).
        # The create time comes back on the relay's time.monotonic() clock: %(t0)s (the relay's reading
        # just before sending the mark) minus the row's age at the statement's start on the database's
        # own clock, so neither host's wall clock (nor their skew) enters a dwell. A row without one
        # (NULL) counts from its mark. One float per row, no per-row work in Python.
        rec = m.record("o", self.value_type)
        self._mark_sql = sql.SQL("""
            WITH m AS (
              UPDATE {o} AS o SET {l} = %(leader)s
              WHERE ctid = ANY(ARRAY({claim}))
              RETURNING {oid} AS id, {t} AS t, {k} AS k, {v} AS v, {hk} AS hk, {hv} AS hv, {row_bad} AS bad,
                        {p} AS p, {c} AS c)
            SELECT m.id, m.t, m.k, m.v, m.hk, m.hv, {header_bad}, a.attempts, a.last_error::text, m.p,
                   %(t0)s::float8 - coalesce(date_part('epoch', statement_timestamp() - m.c), 0)
            FROM m LEFT JOIN {a} AS a ON a.id = m.id ORDER BY m.id""").format(
            o=o,
            l=leader,
            claim=claim,
            oid=m.id("o"),
            t=rec.topic,
            k=rec.key,
            v=rec.value,
            hk=rec.header_keys,
            hv=rec.header_values,
            a=self.names.delivery_attempts,
            row_bad=rec.bad,
            header_bad=sql.SQL(_HEADER_BAD),
            p=rec.partition,
            c=m.created("o"),
        )

    def _run(
        self,
        what: str,
        query: Statement,
        params: Sequence[Any] | dict[str, Any],
        prepare: bool | None = None,
        cursor: psycopg.Cursor | None = None,
    ) -> psycopg.Cursor:
        try:
            return (cursor or self.conn).execute(query, params, binary=True, prepare=prepare)
        except psycopg.Error as exc:
            self.close()  # a broken connection is replaced on next use
            raise DatabaseError(
                f"{what} on {self.names.display!r} failed: {redact_error(str(exc), self._dsn).strip()}"
            ) from exc

    def prepare_mark(self) -> None:
        """Connect and run the mark once for no rows, so the first real mark is quick: a fresh
        backend loads the outbox's catalog entries and parses the statement on its first run
        (~12 ms of a standby's first mark after an election, measured, against ~2 ms warm). Claims
        nothing: ``LIMIT 0`` takes no row and writes nothing (no transaction id is assigned)."""
        self.mark_with_attempts(uuid.UUID(int=0), 0)

    def mark(self, leader_id: uuid.UUID, limit: int) -> list[MarkedRow]:
        """Mark up to ``limit`` unowned (or other-leader-owned) rows for ``leader_id``; sorted by id."""
        return self.mark_with_attempts(leader_id, limit)[0]

    def mark_with_attempts(self, leader_id: uuid.UUID, limit: int) -> tuple[list[MarkedRow], MarkedAttempts]:
        """:meth:`mark`, plus the persisted failed-attempt counts of the marked rows that have one."""
        conn = self.conn  # establishes the mark statement
        assert self._mark_sql is not None and conn is not None
        # Prepared (parsed once: a trickle's one-row mark took ~0.6 ms unprepared, ~0.5 prepared) but
        # planned anew on every run (plan_cache_mode, see conn): never a generic plan. Where Postgres
        # cannot force that, never prepared (psycopg would prepare it after its 5th run).
        params = {"leader": leader_id, "n": limit, "t0": time.monotonic()}  # t0: see _build_mark_sql
        rows: list[MarkedRow] = self._run(
            "mark", self._mark_sql, params, prepare=self._prepare_mark, cursor=self._mark_cursor
        ).fetchall()
        attempts: MarkedAttempts = {r[0]: (r[7], r[8]) for r in rows if r[7] is not None}
        return rows, attempts

    def record_attempts(self, items: Sequence[tuple[int, int, str]]) -> int:
        """Persist failed delivery attempts ``(id, attempts so far, error)`` (a count never decreases)."""
        return self._run(
            "recording delivery attempts",
            self._attempts_sql,
            ([i for i, _, _ in items], [n for _, n, _ in items], [e for _, _, e in items]),
        ).rowcount

    def forget_attempts(self, ids: Sequence[int]) -> int:
        """Delete the attempt counts of rows that were delivered (or are gone)."""
        return self._run("forgetting delivery attempts", self._forget_sql, (self._id_array(ids),)).rowcount

    @staticmethod
    def _id_array(ids: Sequence[int]) -> str:
        # A bigint[] literal: much cheaper to build than letting the driver dump a list element-wise.
        return "{" + ",".join(map(str, ids)) + "}"

    def purge(self, ids: Sequence[int]) -> int:
        return self._run("purge", self._purge_sql, (self._id_array(ids),)).rowcount

    def reset(self, ids: Sequence[int]) -> int:
        return self._run("reset", self._reset_sql, (self._id_array(ids),)).rowcount

    def dead_letter(self, items: Sequence[tuple[int, str, int]]) -> int:
        """Move ``(id, error, attempts)`` rows to the dead-letter table, atomically."""
        ids = [i for i, _, _ in items]
        errors = [e for _, e, _ in items]
        attempts = [a for _, _, a in items]
        self.conn  # noqa: B018 -- connects, which builds the statement for the value column's type
        assert self._dlq_sql is not None
        return self._run("dead-letter", self._dlq_sql, (ids, errors, attempts)).rowcount

    def expire_dead_letters(self, retention: float, limit: int) -> int:
        """Delete up to ``limit`` dead letters parked more than ``retention`` seconds ago; how many were."""
        return self._run("deleting expired dead letters", self._expire_sql, (float(retention), limit)).rowcount

    # ---------------------------------------------------------------- --uuid-sequencing (docs/design.md §5)
    def start_view(self, leader_id: uuid.UUID, name: str) -> tuple[int, list[tuple[int, bytes, int, str, int]]]:
        """:meth:`start_view_with_floor` without the clock floor."""
        epoch, intents, _floor = self.start_view_with_floor(leader_id, name)
        return epoch, intents

    def start_view_with_floor(
        self, leader_id: uuid.UUID, name: str
    ) -> tuple[int, list[tuple[int, bytes, int, str, int]], int]:
        """One transaction: bump the fence epoch (taking its row lock), then read every persisted,
        unconfirmed ACK intent ``(epoch, producer, clock, topic, partition)`` in commit order.
        Also returns the clock floor: the largest ACK clock any view committed (``last_clock``).

        The intents are read by a statement *after* the UPDATE, so in READ COMMITTED it sees every
        commit that held the fence row lock before us."""
        n = self.names
        try:
            conn = self.conn
            with conn.transaction():
                if self.shard_count is None:
                    row = conn.execute(
                        sql.SQL(
                            "UPDATE {} SET epoch = epoch + 1, leader_id = %s, leader_name = %s, updated_at = now() "
                            "RETURNING epoch, last_clock"
                        ).format(self._state_table),
                        (leader_id, name),
                    ).fetchone()
                else:
                    row = self._bump_shard_epochs(conn, leader_id, name)
                if row is None:
                    raise SchemaError(
                        f"fence row of {n.display!r}{self.shard_text} is missing; run `harvest init-db` "
                        f"(it is idempotent) to create it"
                    )
                intents = conn.execute(
                    sql.SQL(
                        "SELECT epoch, producer, clock, topic, kafka_partition FROM {}{} "
                        "ORDER BY epoch, clock, topic, kafka_partition"
                    ).format(n.ack_intents, self._intents_of_view)
                ).fetchall()
        except psycopg.errors.UndefinedTable as exc:
            self.close()
            raise SchemaError(
                f"--uuid-sequencing needs the fence and ACK-intent tables of {n.display!r}; run "
                f"`harvest init-db` (idempotent) to create them: {exc}".strip()
            ) from exc
        except psycopg.Error as exc:
            self.close()
            raise DatabaseError(
                f"starting a leader view on {n.display!r} failed: {redact_error(str(exc), self._dsn).strip()}"
            ) from exc
        floor = max([int(row[1])] + [int(c) for _e, _p, c, _t, _pt in intents])
        return int(row[0]), [(int(e), bytes(p), int(c), t, int(pt)) for e, p, c, t, pt in intents], floor

    def _bump_shard_epochs(self, conn: psycopg.Connection, leader_id: uuid.UUID, name: str) -> tuple[int, int] | None:
        """A view of several shards: lock their fence rows (in shard order), then give every one the
        same new epoch, above each one's current epoch, so the view's commits check one number, and a
        new view of any of its shards fences the whole view. Returns (epoch, largest last_clock)."""
        rows = conn.execute(
            sql.SQL("SELECT shard, epoch, last_clock FROM {}{} ORDER BY shard FOR UPDATE").format(
                self._state_table, self._fence_rows
            )
        ).fetchall()
        if len(rows) != len(self.shards):
            return None
        epoch = max(int(e) for _s, e, _c in rows) + 1
        conn.execute(
            sql.SQL("UPDATE {} SET epoch = %s, leader_id = %s, leader_name = %s, updated_at = now(){}").format(
                self._state_table, self._fence_rows
            ),
            (epoch, leader_id, name),
        )
        return epoch, max(int(c) for _s, _e, c in rows)

    def commit_txn(
        self,
        epoch: int,
        leader_id: uuid.UUID,
        ids: Sequence[int],
        dead: Sequence[tuple[int, str, int]],
        producer: bytes,
        ack_clock: int,
        journals: Sequence[tuple[str, int]],
        forget: Sequence[int] = (),
    ) -> None:
        """Commit one harvest transaction: :meth:`commit_txns` of one."""
        self.commit_txns(epoch, leader_id, [TxnCommit(ids, dead, producer, ack_clock, journals, forget)])

    def commit_txns(self, epoch: int, leader_id: uuid.UUID, txns: Sequence[TxnCommit]) -> None:
        """Commit consecutive harvest transactions of one view in ONE DB transaction: lock the fence
        row and check it still holds ``epoch``; delete exactly their ids (owned by ``leader_id``);
        move their dead rows to the dead letters; insert one ACK intent per journal of each; delete the
        attempt counts of their ``forget`` ids (committed rows that had failed before). Raises
        :class:`FenceError` (rolled back) if the fence moved or a row is no longer this view's.

        Committing transactions k..k+j together is committing each in turn with nothing in between:
        their ACKs are still produced in transaction order, after this returns. Their producers
        differ (the ring opens k+M only after ACK k is enqueued), so no intent row is written twice."""
        n = self.names
        ids = [i for t in txns for i in t.ids]
        dead = [d for t in txns for d in t.dead]
        forget = [i for t in txns for i in t.forget]
        dead_letters: tuple[Statement, Sequence[Any]] | None = None
        if dead:
            self.conn  # noqa: B018 -- connects, which builds the dead-letter statement for the value's type
            assert self._commit_dlq_sql is not None
            dead_letters = (
                self._commit_dlq_sql,
                ([i for i, _, _ in dead], [e for _, e, _ in dead], [a for _, _, a in dead], leader_id),
            )
        statements: list[tuple[Statement, Sequence[Any]]] = [(self._fence_sql, (max(t.ack_clock for t in txns),))]
        if ids:
            span = id_range(ids)
            if span is None:
                statements.append((self._commit_delete_sql, (self._id_array(ids), leader_id)))
            else:
                lo, hi, holes = span
                statements.append((self._commit_delete_range_sql, (lo, hi, self._id_array(holes), leader_id)))
        if dead_letters is not None:
            statements.append(dead_letters)
        if forget:
            statements.append((self._forget_sql, (self._id_array(forget),)))
        statements += [
            (self._intent_sql, (epoch, t.producer, t.ack_clock, [j for j, _ in t.journals], [p for _, p in t.journals]))
            for t in txns
            if t.journals
        ]
        try:
            conn = self.conn
            # Two round trips: the whole transaction up to COMMIT as ONE simple-protocol message, then
            # COMMIT (or ROLLBACK) once its results are checked. One message, because Postgres runs a
            # statement as soon as it has read it: a relay frozen (SIGSTOP, a VM pause) half way
            # through sending a pipeline would leave its session running, holding the fence row lock
            # taken by the first statement, with no timeout covering it (idle_in_transaction_session_
            # timeout only starts once a request is complete), so no other relay could start a view
            # until the zombie woke up. Postgres reads a whole message before running any of it, and
            # once this one has run the session waits "idle in transaction", which the timeout ends.
            # The parameters are written into the text client-side (psycopg's quoting): the ids are a
            # bigint[] literal either way, and the statements are cheap to plan.
            literal = psycopg.ClientCursor(conn)
            request = ";\n".join(["BEGIN"] + [literal.mogrify(q, params) for q, params in statements])
            cur = conn.execute(request, prepare=False)
            cur.nextset()  # BEGIN's
            epochs = [int(r[0]) for r in cur.fetchall()]
            counts = []
            while cur.nextset():
                counts.append(cur.rowcount)
            refusal = None
            if not epochs or any(e != epoch for e in epochs) or len(epochs) != max(1, len(self.shards)):
                shown = epochs[0] if len(set(epochs)) == 1 else (sorted(set(epochs)) or None)
                refusal = (
                    f"commit refused by the fence of {n.display!r}{self.shard_text}: epoch is {shown}, this "
                    f"view's is {epoch}"
                )
            elif ids and counts[0] != len(ids):
                refusal = (
                    f"commit refused on {n.display!r}: {len(ids) - counts[0]} of {len(ids)} row(s) are no "
                    f"longer owned by leader view {leader_id}"
                )
            elif dead and counts[1 if ids else 0] != len(dead):
                refusal = (
                    f"dead-lettering refused on {n.display!r}: {len(dead) - counts[1 if ids else 0]} row(s) "
                    f"are no longer owned by leader view {leader_id}"
                )
            conn.execute("ROLLBACK" if refusal else "COMMIT")
        except psycopg.Error as exc:
            self.close()
            raise DatabaseError(f"commit on {n.display!r} failed: {redact_error(str(exc), self._dsn).strip()}") from exc
        if refusal:
            raise FenceError(refusal)

    def confirm_acks(self, items: Sequence[tuple[bytes, int]]) -> int:
        """Delete the intents of ACKs known to be in the log (``(producer, clock)`` pairs)."""
        if not items:
            return 0
        q = sql.SQL(
            "DELETE FROM {} WHERE (producer, clock) IN (SELECT * FROM unnest(%s::bytea[], %s::bigint[]))"
        ).format(self.names.ack_intents)
        return self._run("confirming ACK intents", q, ([p for p, _ in items], [c for _, c in items])).rowcount

    def stats(self) -> tuple[int, float | None, int]:
        """(backlog rows, age in seconds of the oldest row, dead letters)."""
        per_shard = {
            int(k): (int(c), None if age is None else float(age))
            for k, c, age in self._run("metrics query", self._stats_sql, ()).fetchall()
        }
        dead = self._run("metrics query", self._stats_dead_sql, ()).fetchone()
        self.halted_keys = int(dead[1]) if dead is not None else 0
        self.shard_stats = {k: per_shard.get(k, (0, None)) for k in sorted(self.shards)}
        ages = [age for _c, age in per_shard.values() if age is not None]
        return (
            sum(c for c, _age in per_shard.values()),
            max(ages) if ages else None,
            int(dead[0]) if dead is not None else 0,
        )

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # closing a broken connection: nothing to salvage
                pass
            self._conn = None


class Listener:
    """LISTEN on the outbox's channel; :meth:`wait` returns early when a stasher commits."""

    def __init__(self, dsn: str, names: OutboxNames) -> None:
        self._dsn = dsn
        self._channel = names.channel
        self._conn: psycopg.Connection | None = None

    def _ensure(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self._dsn)
            self._conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        return self._conn

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds for a notification; True if one (or more) arrived.
        On a connection problem, sleeps the timeout and returns True (so the caller polls)."""
        import time

        try:
            conn = self._ensure()
            got = False
            for _ in conn.notifies(timeout=timeout, stop_after=1):
                got = True
            if got:  # drain whatever else queued up, so one burst is one wake-up
                for _ in conn.notifies(timeout=0):
                    pass
            return got
        except (psycopg.Error, DatabaseError) as exc:
            log.warning(
                "LISTEN connection problem (falling back to polling): %s", redact_error(str(exc), self._dsn).strip()
            )
            self.close()
            time.sleep(timeout)
            return True

    def fileno(self) -> int | None:
        """The LISTEN connection's socket (readable when a notification arrives), None if it is down."""
        conn = self._conn
        if conn is None or conn.closed:
            return None
        try:
            return conn.fileno()
        except psycopg.Error:
            return None

    def pending(self) -> bool:
        """Non-blocking: has a notification arrived (consumed if so)?"""
        try:
            conn = self._ensure()
            got = False
            for _ in conn.notifies(timeout=0):
                got = True
            return got
        except (psycopg.Error, DatabaseError):
            self.close()
            return True

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None
