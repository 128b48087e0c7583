"""The relay's database binding: :class:`OutboxDatabase`, one connection running the relay's statements.

Its concepts have modules of their own, re-exported here (``from harvest_outbox.producer.db import …``):
- :mod:`~producer.db._session`: :func:`connect` and the session every statement runs in (autocommit,
  UTF-8, timeouts, the connection replaced after a failure);
- :mod:`~producer.layouts.mark.marks`: the mark (goharvest's query) and the :data:`MarkedRow` it returns;
- :mod:`~producer.db._statements`: purge, reset, dead-letter and delivery-attempt statements by id;
- :mod:`~producer.db.fence`: ``--uuid-sequencing``'s view start and fenced commit (:class:`TxnCommit`,
  :func:`id_range`);
- :mod:`~producer.db._listener`: :class:`Listener`, LISTEN for a stasher's NOTIFY.

Invariants: every statement runs in autocommit mode (each is its own transaction, as in goharvest),
committed synchronously except on a connection built with ``async_commit`` (the relay's mark
connection: see ``RelayCore.open``, tests/test_producer/test_async_mark.py);
failures are raised as :class:`~producer.errors.DatabaseError` chained to the psycopg error, with
secrets scrubbed from the message. The mark returns each row's persisted failed-attempt count (a LEFT
JOIN on the delivery-attempts table, in the same statement: no extra round trip); failed attempts are
upserted with the write-behind jobs, and deleted when the row is purged, committed or dead-lettered.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

import psycopg
from psycopg import sql
from psycopg.pq import Format

from harvest_outbox.producer.db._listener import Listener
from harvest_outbox.producer.db._session import (
    IDLE_IN_TRANSACTION_TIMEOUT,
    LOCK_TIMEOUT,
    TCP_DEFAULTS,
    OutboxSession,
    connect,
)
from harvest_outbox.producer.db._statements import (
    dead_letter_sql,
    dead_letter_stats_sql,
    expire_dead_letters_sql,
    purge_sql,
    record_attempts_sql,
    reset_sql,
)
from harvest_outbox.producer.db.fence import MAX_RANGE_HOLES, FencedCommits, TxnCommit, id_range
from harvest_outbox.producer.layouts.mark.marks import ROW_CREATED, MarkedAttempts, MarkedRow, mark_sql
from harvest_outbox.producer.relay.shards import shard_expression
from harvest_outbox.producer.schema import OutboxNames

__all__ = [
    "IDLE_IN_TRANSACTION_TIMEOUT",
    "LOCK_TIMEOUT",
    "MAX_RANGE_HOLES",
    "ROW_CREATED",
    "TCP_DEFAULTS",
    "FencedCommits",
    "Listener",
    "MarkedAttempts",
    "MarkedRow",
    "OutboxDatabase",
    "OutboxSession",
    "TxnCommit",
    "connect",
    "id_range",
]


class OutboxDatabase(FencedCommits):
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
        super().__init__(dsn, names, shard_count, async_commit=async_commit)
        #: ``deadLetterPolicy: haltKey``: the mark leaves rows of a (topic, key) with a dead letter (producer.relay.key_halt).
        self.halt_keys = halt_keys
        #: The last stats(): (topic, key) pairs with a dead letter (the keys haltKey holds).
        self.halted_keys = 0
        self.shard_stats: dict[int, tuple[int, float | None]] = {}  # the last stats(): shard -> (rows, oldest age)
        self._mark_sql: sql.Composed | None = None
        self._mark_cursor: psycopg.Cursor | None = None
        self._purge_sql = purge_sql(names)
        self._reset_sql = reset_sql(names)
        # Dead letters (built by ``conn``: the value's expression depends on the column's type, which
        # the connection reads; a dead-letter statement is a connection's first one at times).
        self._dlq_sql: sql.Composed | None = None
        self._attempts_sql = record_attempts_sql(names)
        self._stats_dead_sql = dead_letter_stats_sql(names)
        # deadLetterRetention: one batch of expired dead letters.
        self._expire_sql = expire_dead_letters_sql(names)
        self._build_stats_sql()

    def _shards_changed(self) -> None:
        super()._shards_changed()
        self._build_stats_sql()
        if self._conn is not None and not self._conn.closed:
            self._build_mark_sql()

    def _connected(self, conn: psycopg.Connection) -> None:
        super()._connected(conn)
        self._dlq_sql = dead_letter_sql(self.names, self.value_type, sql.SQL(""))
        # Key and value come back as varchar and are loaded as the bytes the server sent (UTF-8,
        # the connection's client encoding): no convert_to() call per column and row on the
        # database (4 % of a 5,000-row mark) and the same bytes. Only on the mark's own cursor.
        self._mark_cursor = conn.cursor()
        bytea = conn.adapters.get_loader(psycopg.postgres.types["bytea"].oid, Format.BINARY)
        assert bytea is not None  # psycopg always has it
        self._mark_cursor.adapters.register_loader("varchar", bytea)
        self._build_mark_sql()

    def _build_stats_sql(self) -> None:
        """The backlog per led shard (one group unsharded): rows and the oldest row's age."""
        n = self.names
        if self.shard_count is None:
            where: sql.Composable = n.mapping.claimable()
        else:
            expr = shard_expression(self.shard_count, n.mapping.shard_key())
            where = sql.SQL(" WHERE {} = ANY({}){}").format(expr, self._shard_array(), n.mapping.claimable("AND"))
        self._stats_sql = sql.SQL("""
            SELECT {e}, count(*), extract(epoch FROM now() - min({c})) FROM {o}{w} GROUP BY 1""").format(
            e=shard_expression(self.shard_count, n.mapping.shard_key()) if self.shard_count else sql.SQL("0"),
            c=n.mapping.created(),
            o=n.outbox,
            w=where,
        )

    def _build_mark_sql(self) -> None:
        self._mark_sql = mark_sql(self.names, self.value_type, self.shard_count, self.shards, self.halt_keys)

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
        params = {"leader": leader_id, "n": limit, "t0": time.monotonic()}  # t0: see db_mark.mark_sql
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

    def purge(self, ids: Sequence[int]) -> int:
        return self._run("purge", self._purge_sql, (self._id_array(ids),)).rowcount

    def reset(self, ids: Sequence[int]) -> int:
        return self._run("reset", self._reset_sql, (self._id_array(ids),)).rowcount

    def hold(self, ids: Sequence[int]) -> int:
        """haltKey: rows the view dropped unsent for a key it halted. This layout leaves them marked (the next
        view's mark skips them); the cursor layout's store copies them to ``_held`` (producer/layouts/cursor/database.py)."""
        return 0

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
