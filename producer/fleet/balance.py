"""Spreading a fleet's leaderships over its processes (outboxes elected by Postgres locks).

Postgres locks go to whoever asks first, so the first process of a fleet to start would lead every
outbox and the others would idle. The balance gives each process a *share*: ``ceil(outboxes /
processes)``, where *processes* is the number of live relays of the fleet's outboxes (each holds its
outbox's layout lock, :mod:`producer.relay.admission`; a dead process's sessions and their locks go
with it). A standby whose process already leads its share leaves the lock to the others
(:class:`~producer.election.postgres.PostgresElection`'s ``may_acquire``), and a process that leads
more than its share (others joined) hands the surplus over: those outboxes' relays stop gracefully
(drained, unlocked, the standbys notified) and start again as standbys.

Invariants (``tests/test_producer/fleet/test_fleet_balance.py``):
- an outbox is never left unled for the balance's sake: a held-back standby takes a lock nobody has
  held for ``UNLED_CHECKS`` checks in a row;
- a process hands over only while it leads more than its share, at most its surplus, and only after
  the fleet has looked for processes at least once (before that the share is every outbox);
- sharded outboxes and NELI elections are left to their own elections (counted in neither number).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from harvest_outbox.redact import redact_error

log = logging.getLogger(__name__)

#: How often the fleet counts its processes and hands over a surplus.
BALANCE_INTERVAL = 2.0

_LIVE_SQL = (
    "SELECT l.classid::bigint, count(*) FROM pg_locks l WHERE l.locktype = 'advisory' "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND l.objsubid = 2 AND l.granted AND l.classid::bigint = ANY(%s) GROUP BY l.classid"
)


def balanced(config: Any) -> bool:
    """Whether an outbox's relay takes part in the balance."""
    return bool(config.leader_election == "postgres" and config.shards == 1)


def share(outboxes: int, processes: int) -> int:
    return math.ceil(outboxes / max(1, processes)) if outboxes else 0


def surplus(led: Sequence[str], own_share: int) -> list[str]:
    """Which led outboxes to hand over: the last ones by id beyond the share."""
    return sorted(led)[own_share:] if len(led) > own_share else []


class Balance:
    """The fleet process's share and who to hand over; ``leads`` says which balanced outboxes this process
    leads now, ``outboxes`` which it serves: ``[(id, dataSource, outboxTable)]``."""

    def __init__(
        self,
        leads: Callable[[], list[str]],
        outboxes: Callable[[], list[tuple[str, str, str]]],
        connect: Callable[[str], Any] | None = None,
    ) -> None:
        self._leads = leads
        self._outboxes = outboxes
        self._connect = connect or _connect
        self._conns: dict[str, Any] = {}
        self._keys: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        #: Live relays per outbox at the last count (0: not counted yet).
        self.processes = 0

    def share(self) -> int:
        served = len(self._outboxes())
        return served if self.processes == 0 else share(served, self.processes)

    def may_acquire(self) -> bool:
        return len(self._leads()) < self.share()

    def count(self) -> int:
        """Count the fleet's live processes (the most live relays any of its outboxes has)."""
        by_dsn: dict[str, list[str]] = {}
        for _id, dsn, table in self._outboxes():
            by_dsn.setdefault(dsn, []).append(table)
        most = 0
        for dsn, tables in by_dsn.items():
            try:
                most = max(most, self._count_on(dsn, tables))
            except Exception as exc:  # a lost database: count the others, keep the last figure
                self._drop(dsn)
                log.debug("fleet balance: cannot count relays: %s", redact_error(str(exc), dsn))
        if most:
            self.processes = most
        return self.processes

    def _count_on(self, dsn: str, tables: Iterable[str]) -> int:
        from harvest_outbox.producer.election.advisory_lock import resolve_table
        from harvest_outbox.producer.relay.admission import namespace

        conn = self._conns.get(dsn)
        if conn is None or conn.closed:
            conn = self._conns[dsn] = self._connect(dsn)
        keys = []
        for table in tables:
            key = self._keys.get((dsn, table))
            if key is None:
                key = self._keys[(dsn, table)] = namespace(resolve_table(conn, table))
            keys.append(key)
        rows = conn.execute(_LIVE_SQL, (keys,)).fetchall()
        return max((int(n) for _k, n in rows), default=0)

    def to_hand_over(self) -> list[str]:
        if self.processes == 0:
            return []
        return surplus(self._leads(), self.share())

    def _drop(self, dsn: str) -> None:
        conn = self._conns.pop(dsn, None)
        if conn is not None:
            try:
                conn.close()
            except Exception:  # already broken
                pass

    def close(self) -> None:
        for dsn in list(self._conns):
            self._drop(dsn)


def _connect(dsn: str) -> Any:
    from harvest_outbox.producer.db.credentials import open_connection

    return open_connection(dsn, autocommit=True, connect_timeout=5, application_name="harvest-fleet-balance")
