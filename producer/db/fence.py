"""The ``--uuid-sequencing`` relay's statements both outbox layouts share (docs/design.md §5): the leader
view's fence (:class:`Fence`), the ACK intents, and a fenced commit sent as one message
(:func:`send_in_one_message`); what a commit writes besides is its layout's (the mark layout deletes the
rows: :meth:`~producer.layouts.mark.database.MarkDatabase.commit_txns`; the cursor layout moves its cursor:
:meth:`~producer.layouts.cursor.database.CursorDatabase.commit_txns`).

- view start: one transaction bumps the fence epoch (taking its row lock: the led shards' rows, in shard
  order) and then reads every unconfirmed ACK intent;
- fenced commit: the fence statement first, then the layout's, one ACK intent per journal; all in one DB
  transaction sent as one message.

Invariants (the ones :class:`~producer.relay.sequenced._store.SequencedStore` states, kept here on Postgres):
- a view's start sees every commit that held the fence row lock before it (the intents are read after
  the UPDATE, in READ COMMITTED);
- a commit changes nothing unless the fence still holds its view's epoch and every row it deletes or
  dead-letters is still its view's: it raises :class:`~producer.errors.FenceError` (rolled back);
- a :class:`~producer.errors.DatabaseError` from a commit means its outcome is unknown;
- a relay frozen half way through a commit never holds the fence row lock beyond the session's
  ``idle_in_transaction_session_timeout`` (:data:`~producer.db._session.IDLE_IN_TRANSACTION_TIMEOUT`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple

import psycopg
from psycopg import sql

from harvest_outbox.producer.db._rendered import rendered
from harvest_outbox.producer.db._session import OutboxSession
from harvest_outbox.producer.errors import SchemaError
from harvest_outbox.producer.schema import Statement

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


def send_in_one_message(
    conn: psycopg.Connection, statements: Sequence[tuple[Statement, Sequence[Any]]]
) -> tuple[list[int], list[int]]:
    """Run ``BEGIN`` and ``statements`` (the first one returns fence epochs, one per row) as ONE
    simple-protocol message and leave the transaction open: returns (the first statement's epochs, the
    row count of each later statement). The caller checks them, then sends ``COMMIT`` or ``ROLLBACK``.

    One message, because Postgres runs a statement as soon as it has read it: a relay frozen (SIGSTOP,
    a VM pause) half way through sending a pipeline would leave its session running, holding the fence
    row lock taken by the first statement, with no timeout covering it (idle_in_transaction_session_
    timeout only starts once a request is complete), so no other relay could start a view until the
    zombie woke up. Postgres reads a whole message before running any of it, and once this one has run
    the session waits "idle in transaction", which the timeout ends. The parameters are written into
    the text client-side (psycopg's quoting): ids are a bigint[] literal either way, and the statements
    are cheap to plan."""
    literal = psycopg.ClientCursor(conn)
    request = ";\n".join(["BEGIN"] + [literal.mogrify(rendered(conn, q), params) for q, params in statements])
    cur = conn.execute(request, prepare=False)
    cur.nextset()  # BEGIN's
    epochs = [int(r[0]) for r in cur.fetchall()]
    counts = []
    while cur.nextset():
        counts.append(cur.rowcount)
    return epochs, counts


class DeadRow(NamedTuple):
    """A row a harvest transaction moves to the dead letters instead of delivering it."""

    id: int
    error: str
    attempts: int


def dead_columns(dead: Sequence[DeadRow]) -> tuple[list[int], list[str], list[int]]:
    """(ids, errors, attempts) of dead-lettered rows: the array parameters of one dead-letter statement."""
    return [d.id for d in dead], [d.error for d in dead], [d.attempts for d in dead]


class TxnCommit(NamedTuple):
    """What the fenced commit of one harvest transaction writes (a layout's ``commit_txns``)."""

    ids: Sequence[int]  # rows it delivered: deleted
    dead: Sequence[DeadRow]  # moved to the dead letters
    producer: bytes
    ack_clock: int
    journals: Sequence[tuple[str, int]]  # (topic, partition) it touched: one ACK intent each
    forget: Sequence[int] = ()  # delivered rows with a stored attempt count: the count goes
    #: haltKey: rows dropped unsent for a key the view halted; the mark layout leaves them marked (ignored
    #: here), the cursor layout's commit copies them to ``_held`` and passes them (producer/layouts/cursor/database.py)
    held: Sequence[int] = ()


class Fence:
    """The view start and the ACK intents of ``--uuid-sequencing``, on a session both layouts' relay
    databases compose (a layout's fenced commit sends :attr:`fence_sql` first and :attr:`intent_sql` for
    its journals: :meth:`~producer.layouts.mark.database.MarkDatabase.commit_txns`). Sharded, the fence
    rows and the intents are the led shards' (``set_shards`` of the session)."""

    def __init__(self, session: OutboxSession) -> None:
        self.session = session
        self._state_table = session.names.state if session.shard_count is None else session.names.shard_state
        self._build_fence_sql()
        session.watch(shards_changed=self._build_fence_sql)

    def _build_fence_sql(self) -> None:
        """The fence and intent statements of the led shards (fixed SQL text per view: the shard indexes
        are small integers, written as an array literal)."""
        s = self.session
        n = s.names
        #: One ACK intent per journal: (epoch, producer, clock, topics, partitions).
        self.intent_sql = sql.SQL("""
            INSERT INTO {} (epoch, producer, clock, topic, kafka_partition, shard_count, shards)
            SELECT %s, %s, %s, t, p, {n}, {ks} FROM unnest(%s::text[], %s::int[]) AS j(t, p)
            ON CONFLICT (producer, topic, kafka_partition)
            DO UPDATE SET epoch = EXCLUDED.epoch, clock = EXCLUDED.clock, create_time = now()""").format(
            n.ack_intents, n=sql.Literal(s.shard_count or 1), ks=s.shard_array()
        )
        if s.shard_count is None:
            self._fence_rows: sql.Composable = sql.SQL("")
            # Unsharded: every intent, including any left by an earlier sharding (its relays are gone).
            self._intents_of_view: sql.Composable = sql.SQL("")
        else:
            arr = s.shard_array()
            self._fence_rows = sql.SQL(" WHERE shard_count = {} AND shard = ANY({})").format(
                sql.Literal(s.shard_count), arr
            )
            # Intents of views that led any of these shards: those views can no longer commit (their
            # fence includes a shard whose epoch this view bumped). Shard 0's leader also takes over
            # intents of another shard count (left by an earlier sharding, drained and stopped
            # before the change; docs/sharding.md).
            other = (
                sql.SQL(" OR shard_count <> {}").format(sql.Literal(s.shard_count)) if 0 in s.shards else sql.SQL("")
            )
            self._intents_of_view = sql.SQL(" WHERE (shard_count = {} AND shards && {}){}").format(
                sql.Literal(s.shard_count), arr, other
            )
        # Locks the fence row(s) (as SELECT … FOR UPDATE would; in shard order, so two commits never
        # deadlock) and raises the clock floor of later views. Returns one epoch per fence row.
        self.fence_sql = sql.SQL("UPDATE {} SET last_clock = GREATEST(last_clock, %s){} RETURNING epoch").format(
            self._state_table, self._fence_rows
        )

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
        s = self.session
        n = s.names
        try:
            conn = s.conn
            with conn.transaction():
                if s.shard_count is None:
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
                        f"fence row of {n.display!r}{s.shard_text} is missing; run `harvest init-db` "
                        f"(it is idempotent) to create it"
                    )
                intents = conn.execute(
                    sql.SQL(
                        "SELECT epoch, producer, clock, topic, kafka_partition FROM {}{} "
                        "ORDER BY epoch, clock, topic, kafka_partition"
                    ).format(n.ack_intents, self._intents_of_view)
                ).fetchall()
        except psycopg.errors.UndefinedTable as exc:
            s.close()
            raise SchemaError(
                f"--uuid-sequencing needs the fence and ACK-intent tables of {n.display!r}; run "
                f"`harvest init-db` (idempotent) to create them: {exc}".strip()
            ) from exc
        except psycopg.Error as exc:
            raise s.failed("starting a leader view", exc) from exc
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
        if len(rows) != len(self.session.shards):
            return None
        epoch = max(int(e) for _s, e, _c in rows) + 1
        conn.execute(
            sql.SQL("UPDATE {} SET epoch = %s, leader_id = %s, leader_name = %s, updated_at = now(){}").format(
                self._state_table, self._fence_rows
            ),
            (epoch, leader_id, name),
        )
        return epoch, max(int(c) for _s, _e, c in rows)

    def confirm_acks(self, items: Sequence[tuple[bytes, int]]) -> int:
        """Delete the intents of ACKs known to be in the log (``(producer, clock)`` pairs)."""
        if not items:
            return 0
        q = sql.SQL(
            "DELETE FROM {} WHERE (producer, clock) IN (SELECT * FROM unnest(%s::bytea[], %s::bigint[]))"
        ).format(self.session.names.ack_intents)
        return self.session.run("confirming ACK intents", q, ([p for p, _ in items], [c for _, c in items])).rowcount
