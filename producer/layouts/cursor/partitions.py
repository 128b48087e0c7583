"""``outboxLayout: cursor``: partition maintenance -- id-range partitions created ahead of the ids, and
retired once the committed cursor's ``low`` has passed them (producer/layouts/cursor/_watermark.py, rule I4).

Run by the leader at most every :data:`MAINTENANCE_INTERVAL` seconds, after a cursor commit: on the write
connection after the modes' commits, on the read connection after an idle view's commit (so an idle
outbox's delivered partitions retire too; one round at a time,
:class:`~producer.layouts.cursor.database.CursorDatabase`). Each step is its own transaction under a
short ``lock_timeout``: it never queues long behind a writer, and a step that cannot take its lock is
tried again at the next round.

- ahead: while the last partition ends within :data:`~producer.layouts.cursor.schema.PARTITIONS_AHEAD`
  partitions of the sequence's last id, the next one (the last one's width) is created apart and
  ``ATTACH``-ed under the outbox's ``SHARE ROW EXCLUSIVE`` lock (waited for at most
  :data:`ATTACH_LOCK_TIMEOUT_MS`; writers pause for the few ms it is held): with no INSERT running, no
  writer can have routed an id of the new range to the DEFAULT partition, which would fail its
  transaction. Ids that went to the DEFAULT partition while maintenance was behind stay there (it is
  retired once ``low`` has passed them all) and the next partition starts above them;
- retire: a partition ``[start, end)`` with ``end <= low`` of every shard's committed cursor (``shards: S``:
  one cursor row per shard, all read ``FOR SHARE`` in the same transaction) is locked, re-checked -- no row
  that the ``lo`` of its shard's cursor does not see -- and ``TRUNCATE``-d; a partition that fails the
  re-check is kept and logged as an error (never truncated: fail closed). Sharded, the relay leading
  shard 0 runs the rounds (producer/layouts/cursor/database.py ``_maintain``): one keeper per outbox;
- drop: a retired (empty) partition is then ``DROP``-ped under :data:`DROP_LOCK_TIMEOUT_MS` (the drop
  needs the outbox's own lock: new writers wait behind it at most that long); kept for the next round
  when the lock does not come.

Invariants (tests/test_producer/layouts/cursor/test_cursor_relay.py): a partition is truncated only under the rule
I4 and the re-check; the DEFAULT partition is never retired; every partition created or retired is logged.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from harvest_outbox.producer.layouts.cursor.schema import PARTITIONS_AHEAD, range_partitions, rest_partition_name
from harvest_outbox.producer.mapping.names import OutboxNames
from harvest_outbox.producer.relay.shards import shard_expression

log = logging.getLogger(__name__)

#: Seconds between maintenance rounds of a leader (a round reads the catalog: a few ms).
MAINTENANCE_INTERVAL = 5.0
#: How long a step waits for a lock before it gives up until the next round.
LOCK_TIMEOUT_MS = 200
#: How long a partition's DROP waits for the outbox's lock (writers queue behind it meanwhile).
DROP_LOCK_TIMEOUT_MS = 50
#: How long creating a partition waits for the outbox's SHARE ROW EXCLUSIVE lock (new writers queue behind
#: it meanwhile; once held, the ATTACH takes a few ms, once per partition of ids).
ATTACH_LOCK_TIMEOUT_MS = 50


@dataclass
class Round:
    """What one maintenance round did (partition names)."""

    created: list[str] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # retirable by low, refused by the re-check


class PartitionKeeper:
    """The leader's partition maintenance for one outbox (see module doc)."""

    def __init__(self, names: OutboxNames, interval: float | None = None, shard_count: int | None = None) -> None:
        self.names = names
        #: ``shards: S`` (None: 1): the cursor rows are shards ``0..S-1``, and a row's shard is its key's
        self._row_shard = (
            shard_expression(shard_count, names.mapping.shard_key("o"))
            if shard_count is not None and shard_count > 1
            else sql.SQL("0")
        )
        #: Seconds between rounds (None: :data:`MAINTENANCE_INTERVAL` when the keeper is made).
        self.interval = MAINTENANCE_INTERVAL if interval is None else interval
        self._next = 0.0
        self._rest = names.qualified(rest_partition_name(names))
        self._running = threading.Lock()

    def maybe_run(self, conn: psycopg.Connection) -> Round | None:
        """A round if one is due and none is running (the relay's two connections share the keeper: the
        write one after commits, the read one after an idle view's commit); a database error is logged
        (the round is tried again later)."""
        now = time.monotonic()
        if now < self._next or not self._running.acquire(blocking=False):
            return None
        try:
            self._next = now + self.interval
            return self.run(conn)
        except psycopg.Error as exc:
            log.warning(
                "partition maintenance of %s failed (tried again in %.0fs): %s", self.names.display, self.interval, exc
            )
            return None
        finally:
            self._running.release()

    def run(self, conn: psycopg.Connection) -> Round:
        done = Round()
        self._ahead(conn, done)
        self._retire(conn, done)
        return done

    def _ahead(self, conn: psycopg.Connection, done: Round) -> None:
        n = self.names
        parts = range_partitions(conn, n)
        if not parts:
            return
        start, end, _name = parts[-1]
        width = end - start
        while end <= self._head(conn) + PARTITIONS_AHEAD * width:
            try:
                with conn.transaction():
                    conn.execute(
                        sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{ATTACH_LOCK_TIMEOUT_MS}ms"))
                    )
                    # No INSERT runs while this is held (writers take ROW EXCLUSIVE), so no id is being drawn
                    # or routed: a writer routing an id of the new range to the DEFAULT partition just before
                    # the ATTACH would fail its transaction (its routing predates the new partition).
                    conn.execute(sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(n.outbox))
                    head = self._head(conn)
                    if end <= head:
                        # maintenance fell behind (a lock it waited for, the relay down): ids up to head went
                        # to the DEFAULT partition (retired with it, all below low); go on above them
                        skip = (head // width + 1) * width
                        log.warning(
                            "ids [%d, %d] of %s went to its DEFAULT partition (partition maintenance fell behind); "
                            "new partitions start at %d",
                            end,
                            head,
                            n.display,
                            skip,
                        )
                        end = skip
                    name = n.partition_name(end)
                    part = n.qualified(name)
                    conn.execute(
                        sql.SQL("CREATE TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS)").format(part, n.outbox)
                    )
                    conn.execute(
                        sql.SQL("ALTER TABLE {} ATTACH PARTITION {} FOR VALUES FROM ({}) TO ({})").format(
                            n.outbox, part, sql.Literal(end), sql.Literal(end + width)
                        )
                    )
            except psycopg.errors.LockNotAvailable:
                log.info("partitions of %s: the outbox's lock is not available, created at the next round", n.display)
                return
            log.info("created partition %s of %s for ids [%d, %d)", name, n.display, end, end + width)
            done.created.append(name)
            end += width

    def _head(self, conn: psycopg.Connection) -> int:
        seq = conn.execute(sql.SQL("SELECT last_value FROM {}").format(self.names.id_sequence)).fetchone()
        return int(seq[0]) if seq else 0

    def _retire(self, conn: psycopg.Connection, done: Round) -> None:
        n = self.names
        # every shard's committed cursor must be past a partition (each shard's rows are spread over all of them)
        row = conn.execute(sql.SQL("SELECT min(low) FROM {}").format(n.cursor)).fetchone()
        if row is None or row[0] is None:
            return
        low = int(row[0])
        self._retire_rest(conn, low, done)
        for start, end, name in range_partitions(conn, n):
            if end > low:
                break
            verdict = self._truncate(conn, name, end)
            if verdict == "truncated":
                done.truncated.append(name)
                log.info(
                    "retired partition %s of %s (ids [%d, %d), below the committed cursor's low %d): truncated",
                    name,
                    n.display,
                    start,
                    end,
                    low,
                )
                if self._drop(conn, name):
                    done.dropped.append(name)
                    log.info("dropped retired partition %s of %s", name, n.display)
            elif verdict == "undelivered":
                done.kept.append(name)
                log.error(
                    "partition %s of %s is below the committed cursor's low %d but holds rows its lo has not seen: "
                    "kept (not truncated); please report this",
                    name,
                    n.display,
                    low,
                )

    def _retire_rest(self, conn: psycopg.Connection, low: int, done: Round) -> None:
        """The DEFAULT partition holds rows only when maintenance fell behind; it is truncated (never
        dropped) once every row in it is below ``low`` (I1: their transactions have ended, none can
        come back) and seen by ``lo``, re-checked under its lock as any partition."""
        top = conn.execute(sql.SQL("SELECT max({}) FROM {}").format(self.names.mapping.id(), self._rest)).fetchone()
        if top is None or top[0] is None or int(top[0]) >= low:
            return
        name = rest_partition_name(self.names)
        verdict = self._truncate(conn, name, int(top[0]) + 1, rest=True)
        if verdict == "truncated":
            done.truncated.append(name)
            log.info("retired the rows of %s's DEFAULT partition %s (all below low %d)", self.names.display, name, low)

    def _truncate(self, conn: psycopg.Connection, name: str, end: int, rest: bool = False) -> str:
        """Lock, re-check against the committed cursor, TRUNCATE: ``truncated``, ``lock timeout``,
        ``undelivered`` or ``moved`` (the committed low is no longer past it: never, low only rises)."""
        n, part = self.names, self.names.qualified(name)
        try:
            with conn.transaction():
                conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{LOCK_TIMEOUT_MS}ms")))
                # every shard's cursor, locked (in shard order) until the TRUNCATE commits
                cur = conn.execute(
                    sql.SQL("SELECT min(low) FROM (SELECT low FROM {} ORDER BY shard FOR SHARE) AS c").format(n.cursor)
                ).fetchone()
                if cur is None or cur[0] is None or end > int(cur[0]):
                    return "moved"
                conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(part))
                # the re-check, for each row against the cursor of its shard
                left = conn.execute(
                    sql.SQL(
                        "SELECT count(*) FROM {} AS o JOIN {} AS c ON c.shard = {} "
                        "WHERE NOT pg_visible_in_snapshot(o.txid, c.lo)"
                    ).format(part, n.cursor, self._row_shard)
                ).fetchone()
                if left is None or left[0]:
                    return "undelivered"
                if rest:  # rows may have arrived since the caller looked: all still below low?
                    top = conn.execute(sql.SQL("SELECT max({}) FROM {}").format(n.mapping.id(), part)).fetchone()
                    if top is not None and top[0] is not None and int(top[0]) >= int(cur[0]):
                        return "moved"
                conn.execute(sql.SQL("TRUNCATE {}").format(part))
                return "truncated"
        except psycopg.errors.LockNotAvailable:
            return "lock timeout"

    def _drop(self, conn: psycopg.Connection, name: str) -> bool:
        try:
            with conn.transaction():
                conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{DROP_LOCK_TIMEOUT_MS}ms")))
                conn.execute(sql.SQL("DROP TABLE {}").format(self.names.qualified(name)))
            return True
        except psycopg.errors.LockNotAvailable:
            return False
