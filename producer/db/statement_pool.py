"""One pool of statement connections per database for the relays of one process (a fleet): the led
outboxes' mark and write workers borrow a connection for each unit of work (a statement, or the few
statements of one method: a fenced commit's transaction, a cursor read with its planner settings) and
give it back, instead of keeping two connections per led outbox.

Each relay keeps its two workers (single-thread executors), so its statements still run in the order it
submitted them on each; a worker holds at most one connection and never waits for another while holding
it, so no pool size can deadlock. A borrower that need not wait prefers the connection it had last (its
statements are prepared and its outbox checked there), then one already in its ``synchronous_commit``
state; one that waited takes the first connection given back.

Invariants (``tests/test_producer/db/test_statement_pool.py``; on Postgres,
``tests/test_producer/fleet/test_fleet_pool.py``):
- at most ``size`` connections are open at once (lent, idle and being opened); after a :meth:`resize`
  down, the surplus is closed as it comes back;
- a connection is lent to one borrower at a time; it comes back idle or is closed: a connection whose
  statement failed (closed by its session), that is broken, still in a transaction, or whose socket has
  something unasked for while idle (a server that ended the session: ``pg_terminate_backend``, a restart)
  is closed and never lent again, and the next borrower gets a new one;
- a lease runs with the ``synchronous_commit`` its borrower asked for (off for the mark worker's,
  the server's default for the write worker's), set on the connection only when it differs;
- borrowers that find every connection lent wait in line, first come first served (a connection given
  back goes to the first of them, as does room under the bound), at most ``wait`` seconds, then get a
  :class:`~producer.errors.DatabaseError` naming ``fleet.statementConnections`` (the relay's ordinary error
  path: a warning, a back-off, a remark);
- connections idle for :data:`IDLE_CLOSE` seconds are closed (a fleet that leads less gives them back).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from harvest_outbox.producer._readable import readable
from harvest_outbox.producer.db._session import SessionConnection, open_session_connection
from harvest_outbox.producer.errors import DatabaseError
from harvest_outbox.redact import redact_dsn, redact_error

log = logging.getLogger(__name__)
#: Prepared statements a pooled connection keeps (psycopg's default is 100): enough for every outbox of a
#: pool's database to keep its ~15 statements prepared on every connection.
PREPARED_MAX = 5000

#: Seconds a borrower waits in line for a connection. A process whose relays all drain at once saturates
#: its CPU and the line moves slowly: 100 outboxes draining on 10 connections waited over 2 s (157 leases
#: failed and re-marked at a 2 s bound: bench_outboxes --cpu-outboxes 100), none at this one. A database
#: whose statements hang still holds a relay's view start (its relay thread waits on it) this long, not longer.
WAIT = 10.0
#: Seconds an idle connection stays open.
IDLE_CLOSE = 60.0


@dataclass
class PoolStats:
    """Counters since the pool was made (tests, logs)."""

    size: int
    open: int
    idle: int
    opened: int = 0
    #: Closed because they failed, broke, were left in a transaction or ended by the server.
    discarded: int = 0
    leases: int = 0
    #: Leases that waited for a connection to come back, and those that waited in vain.
    waited: int = 0
    timeouts: int = 0
    #: The longest wait that was served (seconds).
    longest_wait: float = 0.0
    #: ``synchronous_commit`` set on a lease.
    switched: int = 0


class _Waiter:
    """A borrower waiting in line: handed a connection, or a free place to open one (``slot``)."""

    __slots__ = ("held", "ready", "slot")

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.held: SessionConnection | None = None
        self.slot = False


class StatementPool:
    """The statement connections of one database (``dsn``) for the relays of one process; ``name`` is what
    ``pg_stat_activity`` shows (``harvest-statements:<name>``)."""

    def __init__(self, dsn: str, name: str, size: int, *, wait: float = WAIT) -> None:
        if size < 1:
            raise ValueError(f"a statement pool of {size} connections")
        self._dsn = dsn
        self.name = name
        self._size = size
        self._wait = wait
        self._mu = threading.Lock()
        self._idle: list[SessionConnection] = []  # most recently given back last
        #: Borrowers waiting, in arrival order: each connection that comes back goes to the first (no
        #: borrower overtakes one that waits, so none waits its whole bound while others come and go).
        self._waiters: deque[_Waiter] = deque()
        self._open = 0  # lent, idle and being opened
        self._closed = False
        self._stats = PoolStats(size, 0, 0)

    @property
    def size(self) -> int:
        return self._size

    @property
    def dsn(self) -> str:
        return self._dsn

    def stats(self) -> PoolStats:
        with self._mu:
            return PoolStats(
                **{**self._stats.__dict__, "size": self._size, "open": self._open, "idle": len(self._idle)}
            )

    def resize(self, size: int) -> None:
        """A new bound (a reloaded fleet file): idle connections over it close now, lent ones as they return."""
        if size < 1:
            raise ValueError(f"a statement pool of {size} connections")
        with self._mu:
            self._size = size
            surplus = []
            while self._open > self._size and self._idle:
                surplus.append(self._idle.pop(0))
                self._open -= 1
            self._free_slots()
        for held in surplus:
            _close(held)

    def lease(self, owner: Any, async_commit: bool) -> SessionConnection:
        """A connection for ``owner`` (a session) alone until :meth:`give_back`, in ``async_commit``'s
        ``synchronous_commit``; raises DatabaseError after :attr:`wait` seconds without one."""
        deadline = 0.0
        while True:
            waiter = None
            with self._mu:
                if self._closed:
                    raise DatabaseError(f"{self.name}: the statement pool of {redact_dsn(self._dsn)} is closed")
                self._stats.leases += 1
                held = self._take(owner, async_commit)
                opening = held is None and self._open < self._size
                if opening:
                    self._open += 1  # counted while it opens: the bound holds meanwhile
                elif held is None:
                    waiter = _Waiter()
                    self._waiters.append(waiter)
                    if not deadline:
                        deadline = time.monotonic() + self._wait
                        self._stats.waited += 1
            if waiter is not None:
                waiter.ready.wait(max(0.0, deadline - time.monotonic()))
                with self._mu:
                    if not waiter.ready.is_set():  # not served in time: out of the line
                        self._waiters.remove(waiter)
                        self._stats.timeouts += 1
                        raise DatabaseError(
                            f"no statement connection to {redact_dsn(self._dsn)} came free within {self._wait:g}s: "
                            f"this process's relays use all {self._size} of fleet.statementConnections; raise "
                            f"fleet.statementConnections (connections per database and process), or look for slow "
                            f"statements or lock waits on that database"
                        )
                    self._stats.longest_wait = max(
                        self._stats.longest_wait, self._wait - max(0.0, deadline - time.monotonic())
                    )
                if self._closed and waiter.held is None and not waiter.slot:
                    raise DatabaseError(f"{self.name}: the statement pool of {redact_dsn(self._dsn)} is closed")
                held, opening = waiter.held, waiter.slot
            if opening:
                return self._new(async_commit)
            assert held is not None
            if _ended(held):
                self._discard(held)
                continue
            if held.async_commit != async_commit:
                self._switch(held, async_commit)
            return held

    def give_back(self, held: SessionConnection) -> None:
        """The borrower is done: to the first waiting borrower, idle, or closed (failed, broken, in a
        transaction, over the bound)."""
        conn = held.conn
        bad = conn.closed or conn.broken or conn.info.transaction_status != TransactionStatus.IDLE
        with self._mu:
            keep = not bad and not self._closed and self._open <= self._size
            if keep:
                held.idle_since = time.monotonic()
                if self._waiters:
                    waiter = self._waiters.popleft()
                    waiter.held = held
                    waiter.ready.set()
                else:
                    self._idle.append(held)
            else:
                self._open -= 1
                if bad:
                    self._stats.discarded += 1
                self._free_slots()
            stale = self._stale()
        for c in ([] if keep else [held]) + stale:
            _close(c)

    def close(self) -> None:
        """Close every idle connection; lent ones close as they come back; waiting borrowers get an error."""
        with self._mu:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            waiters, self._waiters = self._waiters, deque()
        for waiter in waiters:
            waiter.ready.set()
        for held in idle:
            _close(held)

    # ------------------------------------------------------------------ inside (under _mu unless said)
    def _take(self, owner: Any, async_commit: bool) -> SessionConnection | None:
        """An idle connection: the owner's last, one in its commit mode, any; newest first. None while
        others wait in line (they are served first)."""
        idle = self._idle
        if not idle or self._waiters:
            return None
        last = getattr(owner, "last_leased", None)
        pick = None
        if last is not None and last.async_commit == async_commit and last in idle:
            pick = last
        else:
            pick = next((h for h in reversed(idle) if h.async_commit == async_commit), None)
            if pick is None:
                pick = last if last is not None and last in idle else idle[-1]
        idle.remove(pick)
        return pick

    def _free_slots(self) -> None:
        """Room under the bound goes to the first waiters: each opens a connection of its own."""
        while self._waiters and self._open < self._size:
            waiter = self._waiters.popleft()
            waiter.slot = True
            self._open += 1
            waiter.ready.set()

    def _stale(self) -> list[SessionConnection]:
        """Idle connections unused for :data:`IDLE_CLOSE` seconds, taken out of the pool."""
        if not self._idle or time.monotonic() - self._idle[0].idle_since < IDLE_CLOSE:
            return []
        cut = time.monotonic() - IDLE_CLOSE
        stale = [h for h in self._idle if h.idle_since < cut]
        self._idle = [h for h in self._idle if h.idle_since >= cut]
        self._open -= len(stale)
        return stale

    def _new(self, async_commit: bool) -> SessionConnection:
        """Open a connection in a place already counted (not under the lock)."""
        try:
            held = open_session_connection(
                self._dsn, async_commit=async_commit, application_name=f"harvest-statements:{self.name}"[:63]
            )
        except BaseException as exc:
            with self._mu:
                self._open -= 1
                self._free_slots()
            if isinstance(exc, psycopg.Error):
                raise DatabaseError(
                    f"cannot connect to Postgres ({redact_dsn(self._dsn)}): {redact_error(str(exc), self._dsn).strip()}"
                ) from exc
            raise
        # Shared by many outboxes, a connection sees each one's statements: psycopg's default cache of 100
        # prepared statements churned (re-prepared, deallocated) once a pool served more than a few outboxes.
        held.conn.prepared_max = PREPARED_MAX
        with self._mu:
            self._stats.opened += 1
        return held

    def _switch(self, held: SessionConnection, async_commit: bool) -> None:
        """Set the lease's ``synchronous_commit`` (off, or the server's default for this role and database);
        not under the lock."""
        try:
            held.conn.execute("SET synchronous_commit = off" if async_commit else "RESET synchronous_commit")
        except psycopg.Error as exc:
            held.conn.close()
            self._discard(held)
            raise DatabaseError(
                f"setting synchronous_commit on a pooled connection to {redact_dsn(self._dsn)} failed: "
                f"{redact_error(str(exc), self._dsn).strip()}"
            ) from exc
        held.async_commit = async_commit
        with self._mu:
            self._stats.switched += 1

    def _discard(self, held: SessionConnection) -> None:
        """A lent connection found unusable before its borrower had it (not under the lock)."""
        with self._mu:
            self._open -= 1
            self._stats.discarded += 1
            self._free_slots()
        _close(held)


def _ended(held: SessionConnection) -> bool:
    """An idle connection's socket is readable: the server sent what nobody asked for (the FATAL of a
    terminated session, an EOF), so it is closed instead of failing its borrower's statement."""
    conn = held.conn
    if conn.closed or conn.broken:
        return True
    try:
        return bool(readable([conn.fileno()], 0))  # (select() alone refused descriptors past 1,024: see _readable)
    except (OSError, psycopg.Error):
        return True


def _close(held: SessionConnection) -> None:
    try:
        held.conn.close()
    except Exception:  # already broken
        pass


class StatementPools:
    """A process's statement pools, one per ``dataSource`` (what a fleet gives its unsharded relays); ``size``
    0: none (each relay keeps connections of its own)."""

    def __init__(self, name: str, size: int) -> None:
        self._name = name
        self._size = size
        self._mu = threading.Lock()
        self._pools: dict[str, StatementPool] = {}

    def for_dsn(self, dsn: str) -> StatementPool | None:
        with self._mu:
            if self._size == 0:
                return None
            pool = self._pools.get(dsn)
            if pool is None:
                pool = self._pools[dsn] = StatementPool(dsn, self._name, self._size)
            return pool

    def resize(self, size: int) -> None:
        """A new size for every pool; 0 for the relays started from now on (those leasing from a pool keep it)."""
        with self._mu:
            self._size = size
            pools = list(self._pools.values()) if size > 0 else []
        for pool in pools:
            pool.resize(size)

    def close(self) -> None:
        with self._mu:
            pools = list(self._pools.values())
        for pool in pools:
            pool.close()
            st = pool.stats()
            log.info(
                "statement pool of %s closed: %d lease(s), %d waited (%d in vain; the longest served %.3fs), "
                "%d connection(s) opened, %d dropped, synchronous_commit switched %d time(s)",
                redact_dsn(pool.dsn),
                st.leases,
                st.waited,
                st.timeouts,
                st.longest_wait,
                st.opened,
                st.discarded,
                st.switched,
            )
