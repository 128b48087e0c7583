"""``outboxLayout: mark`` (goharvest's): the relay's database binding on an outbox it marks, purges and
resets (docs/design.md, "Outbox layouts"): :class:`MarkDatabase`, one connection running the relay's
statements, on the parts both layouts compose (:class:`~producer.db.OutboxSession`,
:class:`~producer.db.fence.Fence`, :class:`~producer.db.Attempts`, :class:`~producer.db.DeadLetters`).

- the mark: goharvest's query (:mod:`~producer.layouts.mark.marks`), returning each row's persisted
  failed-attempt count (a LEFT JOIN on the delivery-attempts table, in the same statement: no extra round
  trip); prepared, planned anew on every run;
- purge (``DELETE … WHERE id = ANY($ids)``), reset (``UPDATE … SET leader_id = NULL``) and the
  dead-letter move (one statement, a CTE: deleted from the outbox, inserted into the dead letters, the
  attempt count forgotten: a dead-lettered row is never in both tables or neither) address rows by id;
- ``--uuid-sequencing``: the fenced commit deletes its transactions' rows ``AND leader_id = $leader``
  (an id range minus its holes, :func:`~producer.db.fence.id_range`), moves their dead rows, forgets their
  attempt counts and writes the ACK intents, in one transaction sent as one message.

Invariants: every statement runs in autocommit mode (each is its own transaction, as in goharvest),
committed synchronously except on a connection built with ``async_commit`` (the relay's mark
connection: see ``RelayCore.open``, tests/test_producer/layouts/mark/test_async_mark.py); failures are raised as
:class:`~producer.errors.DatabaseError` chained to the psycopg error, with secrets scrubbed from the
message; attempt counts are upserted with the write-behind jobs, and deleted when the row is purged,
committed or dead-lettered; a fenced commit changes nothing unless the fence holds its epoch and every
row is still its view's (:class:`~producer.errors.FenceError`, rolled back).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from harvest_outbox.producer.db import ANY_IDS, Attempts, DeadLetters, OutboxSession, StatementPool, leased
from harvest_outbox.producer.db.fence import DeadRow, Fence, TxnCommit, dead_columns, id_range, send_in_one_message
from harvest_outbox.producer.errors import FenceError
from harvest_outbox.producer.layouts.mark.marks import MarkedAttempts, MarkedRow, mark_sql
from harvest_outbox.producer.relay.shards import shard_expression
from harvest_outbox.producer.schema import OutboxNames, Statement, ValueType


def purge_sql(names: OutboxNames) -> sql.Composed:
    """Delete the rows of ids ``%s`` (an :func:`id_array`)."""
    return sql.SQL("DELETE FROM {} WHERE {} = {ids}").format(names.outbox, names.mapping.id(), ids=ANY_IDS)


def reset_sql(names: OutboxNames) -> sql.Composed:
    """Give up the rows of ids ``%s``: the next mark of any view claims them."""
    m = names.mapping
    return sql.SQL("UPDATE {} SET {} = NULL WHERE {} = {ids}").format(names.outbox, m.leader(), m.id(), ids=ANY_IDS)


def dead_letter_sql(names: OutboxNames, value_type: ValueType, owned: sql.Composable) -> sql.Composed:
    """Move rows ``(id, error, attempts)`` to the dead letters in one statement (a CTE), so a row is
    never in both tables or neither; forgets their attempt counts. ``owned``: an extra condition on
    the outbox row (the fenced commit's ``AND leader = %s``). The dead letter holds the record as
    the table mapping makes it, and, for a mapped table, the row itself (``source_row``)."""
    n, m = names, names.mapping
    rec = m.record("o", value_type)
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


def backlog_by_shard(conn: psycopg.Connection, names: OutboxNames, count: int) -> dict[int, tuple[int, float | None]]:
    """Per shard of ``count`` with rows: (rows no view has purged, age of the oldest in seconds)."""
    m = names.mapping
    rows = conn.execute(
        sql.SQL("SELECT {e}, count(*), extract(epoch FROM now() - min({c})) FROM {o}{w} GROUP BY 1").format(
            e=shard_expression(count, m.shard_key()), c=m.created(), o=names.outbox, w=m.claimable()
        )
    ).fetchall()
    return {int(s): (int(n), None if age is None else float(age)) for s, n, age in rows}


class MarkDatabase:
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
        pool: StatementPool | None = None,
    ) -> None:
        self.session = OutboxSession(dsn, names, shard_count, async_commit=async_commit, pool=pool)
        self.fence = Fence(self.session)
        self.attempts = Attempts(self.session)
        self.dead_letters = DeadLetters(self.session)
        #: ``deadLetterPolicy: haltKey``: the mark leaves rows of a (topic, key) with a dead letter (producer.relay.key_halt).
        self.halt_keys = halt_keys
        #: The last stats(): (topic, key) pairs with a dead letter (the keys haltKey holds).
        self.halted_keys = 0
        self.shard_stats: dict[int, tuple[int, float | None]] = {}  # the last stats(): shard -> (rows, oldest age)
        #: The cursor layout's scan gauge; this layout reads no id range (always None).
        self.scan: tuple[int, int] | None = None
        self._mark_sql: sql.Composed | None = None
        self._purge_sql = purge_sql(names)
        self._reset_sql = reset_sql(names)
        # Dead letters (built by ``conn``: the value's expression depends on the column's type, which
        # the connection reads; a dead-letter statement is a connection's first one at times).
        self._dlq_sql: sql.Composed | None = None
        o, m = names.outbox, names.mapping
        oid, leader = m.id(), m.leader()
        self._commit_delete_sql = sql.SQL("DELETE FROM {} WHERE {} = {ids} AND {} = %s").format(
            o, oid, leader, ids=ANY_IDS
        )
        self._commit_delete_range_sql = sql.SQL(
            "DELETE FROM {} WHERE {id} BETWEEN %s AND %s AND {id} <> ALL(%s::bigint[]) AND {} = %s"
        ).format(o, leader, id=oid)
        self._commit_dlq_sql: sql.Composed | None = None
        self._build_stats_sql()
        self.session.watch(connected=self._connected, shards_changed=self._shards_changed)

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
        """The connection (made on first use: the outbox checked, the statements built)."""
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

    # ------------------------------------------------------------------ statements
    def _shards_changed(self) -> None:
        self._build_stats_sql()
        if self.session.live is not None:
            self._build_mark_sql()

    def _connected(self, conn: psycopg.Connection) -> None:
        self._commit_dlq_sql = dead_letter_sql(
            self.names, self.value_type, sql.SQL(" AND {} = %s").format(self.names.mapping.leader("o"))
        )
        self._dlq_sql = dead_letter_sql(self.names, self.value_type, sql.SQL(""))
        self._build_mark_sql()

    def _build_stats_sql(self) -> None:
        """The backlog per led shard (one group unsharded): rows and the oldest row's age."""
        n = self.names
        if self.shard_count is None:
            where: sql.Composable = n.mapping.claimable()
        else:
            expr = shard_expression(self.shard_count, n.mapping.shard_key())
            where = sql.SQL(" WHERE {} = ANY({}){}").format(
                expr, self.session.shard_array(), n.mapping.claimable("AND")
            )
        self._stats_sql = sql.SQL("""
            SELECT {e}, count(*), extract(epoch FROM now() - min({c})) FROM {o}{w} GROUP BY 1""").format(
            e=shard_expression(self.shard_count, n.mapping.shard_key()) if self.shard_count else sql.SQL("0"),
            c=n.mapping.created(),
            o=n.outbox,
            w=where,
        )

    def _build_mark_sql(self) -> None:
        self._mark_sql = mark_sql(self.names, self.value_type, self.shard_count, self.shards, self.halt_keys)

    @leased
    def prepare_mark(self) -> None:
        """Connect and run the mark once for no rows, so the first real mark is quick: a fresh
        backend loads the outbox's catalog entries and parses the statement on its first run
        (~12 ms of a standby's first mark after an election, measured, against ~2 ms warm). Claims
        nothing: ``LIMIT 0`` takes no row and writes nothing (no transaction id is assigned)."""
        self.mark_with_attempts(uuid.UUID(int=0), 0)

    def mark(self, leader_id: uuid.UUID, limit: int) -> list[MarkedRow]:
        """Mark up to ``limit`` unowned (or other-leader-owned) rows for ``leader_id``; sorted by id."""
        return self.mark_with_attempts(leader_id, limit)[0]

    @leased
    def mark_with_attempts(self, leader_id: uuid.UUID, limit: int) -> tuple[list[MarkedRow], MarkedAttempts]:
        """:meth:`mark`, plus the persisted failed-attempt counts of the marked rows that have one."""
        conn = self.conn  # establishes the mark statement
        assert self._mark_sql is not None and conn is not None
        # Prepared (parsed once: a trickle's one-row mark took ~0.6 ms unprepared, ~0.5 prepared) but
        # planned anew on every run (plan_cache_mode, see conn): never a generic plan. Where Postgres
        # cannot force that, never prepared (psycopg would prepare it after its 5th run).
        params = {"leader": leader_id, "n": limit, "t0": time.monotonic()}  # t0: see db_mark.mark_sql
        rows: list[MarkedRow] = self._run(
            "mark", self._mark_sql, params, prepare=self.session.prepare_reads, cursor=self.session.row_cursor
        ).fetchall()
        attempts: MarkedAttempts = {r[0]: (r[7], r[8]) for r in rows if r[7] is not None}
        return rows, attempts

    @leased
    def record_attempts(self, items: Sequence[tuple[int, int, str]]) -> int:
        """Persist failed delivery attempts ``(id, attempts so far, error)`` (a count never decreases)."""
        return self.attempts.record(items)

    @leased
    def forget_attempts(self, ids: Sequence[int]) -> int:
        """Delete the attempt counts of rows that were delivered (or are gone)."""
        return self.attempts.forget(ids)

    @leased
    def purge(self, ids: Sequence[int]) -> int:
        return self._run("purge", self._purge_sql, (self.session.id_array(ids),)).rowcount

    @leased
    def reset(self, ids: Sequence[int]) -> int:
        return self._run("reset", self._reset_sql, (self.session.id_array(ids),)).rowcount

    @leased
    def hold(self, ids: Sequence[int]) -> int:
        """haltKey: rows the view dropped unsent for a key it halted. This layout leaves them marked (the next
        view's mark skips them); the cursor layout's store copies them to ``_held`` (producer/layouts/cursor/database.py)."""
        return 0

    @leased
    def dead_letter(self, items: Sequence[tuple[int, str, int]]) -> int:
        """Move ``(id, error, attempts)`` rows to the dead-letter table, atomically."""
        ids = [i for i, _, _ in items]
        errors = [e for _, e, _ in items]
        attempts = [a for _, _, a in items]
        self.conn  # noqa: B018 -- connects, which builds the statement for the value column's type
        assert self._dlq_sql is not None
        return self._run("dead-letter", self._dlq_sql, (ids, errors, attempts)).rowcount

    @leased
    def expire_dead_letters(self, retention: float, limit: int) -> int:
        """Delete up to ``limit`` dead letters parked more than ``retention`` seconds ago; how many were."""
        return self.dead_letters.expire(retention, limit)

    @leased
    def stats(self) -> tuple[int, float | None, int]:
        """(backlog rows, age in seconds of the oldest row, dead letters)."""
        per_shard = {
            int(k): (int(c), None if age is None else float(age))
            for k, c, age in self._run("metrics query", self._stats_sql, ()).fetchall()
        }
        dead, self.halted_keys = self.dead_letters.counts()
        self.shard_stats = {k: per_shard.get(k, (0, None)) for k in sorted(self.shards)}
        ages = [age for _c, age in per_shard.values() if age is not None]
        return (
            sum(c for c, _age in per_shard.values()),
            max(ages) if ages else None,
            dead,
        )

    # ------------------------------------------------------------------ --uuid-sequencing
    def start_view(self, leader_id: uuid.UUID, name: str) -> tuple[int, list[tuple[int, bytes, int, str, int]]]:
        """:meth:`start_view_with_floor` without the clock floor."""
        return self.fence.start_view(leader_id, name)

    @leased
    def start_view_with_floor(
        self, leader_id: uuid.UUID, name: str
    ) -> tuple[int, list[tuple[int, bytes, int, str, int]], int]:
        """The fence's view start (:meth:`~producer.db.fence.Fence.start_view_with_floor`)."""
        return self.fence.start_view_with_floor(leader_id, name)

    @leased
    def confirm_acks(self, items: Sequence[tuple[bytes, int]]) -> int:
        """Delete the intents of ACKs known to be in the log (``(producer, clock)`` pairs)."""
        return self.fence.confirm_acks(items)

    def commit_txn(
        self,
        epoch: int,
        leader_id: uuid.UUID,
        ids: Sequence[int],
        dead: Sequence[DeadRow],
        producer: bytes,
        ack_clock: int,
        journals: Sequence[tuple[str, int]],
        forget: Sequence[int] = (),
    ) -> None:
        """Commit one harvest transaction: :meth:`commit_txns` of one."""
        self.commit_txns(epoch, leader_id, [TxnCommit(ids, dead, producer, ack_clock, journals, forget)])

    @leased
    def commit_txns(self, epoch: int, leader_id: uuid.UUID, txns: Sequence[TxnCommit]) -> None:
        """Commit consecutive harvest transactions of one view in ONE DB transaction: lock the fence
        row and check it still holds ``epoch``; delete exactly their ids (owned by ``leader_id``);
        move their dead rows to the dead letters; insert one ACK intent per journal of each; delete the
        attempt counts of their ``forget`` ids (committed rows that had failed before). Raises
        :class:`FenceError` (rolled back) if the fence moved or a row is no longer this view's.

        Committing transactions k..k+j together is committing each in turn with nothing in between:
        their ACKs are still produced in transaction order, after this returns. Their producers
        differ (the ring opens k+M only after ACK k is enqueued), so no intent row is written twice."""
        ids = [i for t in txns for i in t.ids]
        dead = [d for t in txns for d in t.dead]
        self._send_commit(self._commit_statements(epoch, leader_id, txns, ids, dead), epoch, leader_id, ids, dead)

    def _commit_statements(
        self,
        epoch: int,
        leader_id: uuid.UUID,
        txns: Sequence[TxnCommit],
        ids: list[int],
        dead: list[DeadRow],
    ) -> list[tuple[Statement, Sequence[Any]]]:
        """The commit's statements, in the order :meth:`_send_commit` reads their counts: the fence, the
        delete of ``ids``, the move of ``dead`` to the dead letters, then the forgotten attempts and the
        ACK intents."""
        s = self.session
        forget = [i for t in txns for i in t.forget]
        statements: list[tuple[Statement, Sequence[Any]]] = [(self.fence.fence_sql, (max(t.ack_clock for t in txns),))]
        if ids:
            span = id_range(ids)
            if span is None:
                statements.append((self._commit_delete_sql, (s.id_array(ids), leader_id)))
            else:
                lo, hi, holes = span
                statements.append((self._commit_delete_range_sql, (lo, hi, s.id_array(holes), leader_id)))
        if dead:
            s.conn  # noqa: B018 -- connects, which builds the dead-letter statement for the value's type
            assert self._commit_dlq_sql is not None
            statements.append((self._commit_dlq_sql, (*dead_columns(dead), leader_id)))
        if forget:
            statements.append((self.attempts.forget_sql, (s.id_array(forget),)))
        statements += [
            (
                self.fence.intent_sql,
                (epoch, t.producer, t.ack_clock, [j for j, _ in t.journals], [p for _, p in t.journals]),
            )
            for t in txns
            if t.journals
        ]
        return statements

    def _send_commit(
        self,
        statements: list[tuple[Statement, Sequence[Any]]],
        epoch: int,
        leader_id: uuid.UUID,
        ids: list[int],
        dead: list[DeadRow],
    ) -> None:
        """One message (why: producer/db/fence.py), then COMMIT, or ROLLBACK and :class:`FenceError` when the
        fence moved or a row is no longer this view's."""
        s = self.session
        n = s.names
        try:
            conn = s.conn
            epochs, counts = send_in_one_message(conn, statements)
            refusal = None
            if not epochs or any(e != epoch for e in epochs) or len(epochs) != max(1, len(s.shards)):
                shown = epochs[0] if len(set(epochs)) == 1 else (sorted(set(epochs)) or None)
                refusal = (
                    f"commit refused by the fence of {n.display!r}{s.shard_text}: epoch is {shown}, this "
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
            raise s.failed("commit", exc) from exc
        if refusal:
            raise FenceError(refusal)
