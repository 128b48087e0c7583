"""Postgres leader elections of many outboxes on one connection per database (a fleet's process).

A :class:`SharedElection` is one outbox's election with :class:`~producer.election.postgres.PostgresElection`'s
semantics (the same advisory-lock key, lease, fencing, hand-over NOTIFY, held-back standby), but its
lock lives on a :class:`SharedLockSession`: one election connection and thread per database and
process, whatever the number of outboxes. Each check of the session verifies every held lock with one
query, finds which of its standbys' locks are free with another, and tries only those; a lost
session fences every election on it at once (their locks went with it), as a lost connection of their
own would have.

Invariants (``tests/test_producer/election/test_shared_election.py``):
- an election reports leadership only while the session's last successful check (started less than
  the lease ago) saw its lock held by the session's backend;
- closing an election reports revocation first (its relay drains), then unlocks its lock and
  notifies the standbys, on the session's thread, before ``close()`` returns (or the session ends);
- a key is never held twice by one session: a second election of one outbox in the process (a relay
  handed over while its successor starts) waits until the first let go;
- the session connects on the first election's start (a bad DSN fails that start) and closes with the
  last election;
- a joining election waits as long as the session's checks go on taking joiners in (each takes at least one),
  and fails only when none has for :meth:`SharedLockSession.join_limit` (a big fleet's start is slow, not stuck);
- a check makes at most five statements, however many elections join, lead or leave (each is a round trip
  while the process's relay threads compete for the GIL: one per outbox made a 1,000-outbox fleet's checks
  outlast the lease, and every outbox fenced, again and again).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from harvest_outbox.producer.election.advisory_lock import (
    election_connection,
    lock_key,
    resolve_table,
    sharded_members_of,
)
from harvest_outbox.producer.election.lock_session import LockSession, close_quietly
from harvest_outbox.producer.election.neli import ElectionListener
from harvest_outbox.producer.election.postgres import UNLED_CHECKS, leased_pulse, revoke_first
from harvest_outbox.producer.errors import ElectionError
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.redact import redact_error

log = logging.getLogger(__name__)

_DB = "database = (SELECT oid FROM pg_database WHERE datname = current_database())"
#: The leader locks this session holds, as signed 64-bit keys.
_MINE_SQL = (
    "SELECT ((classid::bigint << 32) | objid::bigint) FROM pg_locks WHERE locktype = 'advisory' "
    f"AND pid = pg_backend_pid() AND objsubid = 1 AND granted AND {_DB}"
)
#: Which of the given keys nobody holds.
_FREE_SQL = (
    "SELECT k FROM unnest(%s::bigint[]) AS k WHERE NOT EXISTS (SELECT 1 FROM pg_locks l "
    "WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l." + _DB + " "
    "AND l.classid = ((k >> 32) & 4294967295)::oid AND l.objid = (k & 4294967295)::oid)"
)

#: Try each of the given keys' locks: ``(key, got it)``.
_TRY_SQL = "SELECT k, pg_try_advisory_lock(k) FROM unnest(%s::bigint[]) AS k"
#: Unlock each of the given keys and notify its channel (the standbys) with the relay's name.
_UNLOCK_SQL = (
    "SELECT pg_advisory_unlock(k), pg_notify(c, n) FROM unnest(%s::bigint[], %s::text[], %s::text[]) AS t(k, c, n)"
)
#: The share of ``check_interval`` a check spends at most on elections joining (a round trip each).
JOIN_BUDGET = 0.25


def _unsigned(key: int) -> int:
    return key & 0xFFFFFFFFFFFFFFFF


@dataclass(eq=False)
class _Seat:
    """One election's lock on the session (guarded by the session's ``_mu``)."""

    name: str
    outbox_table: str
    may_acquire: Callable[[], bool] | None
    key: int | None = None
    channel: str = ""
    error: str | None = None
    resolved: threading.Event = field(default_factory=threading.Event)
    held: bool = False
    verified_at: float = 0.0
    generation: int = 0
    unled_checks: int = 0
    leaving: bool = False
    left: threading.Event = field(default_factory=threading.Event)


class SharedLockSession(LockSession):
    """One database's election connection for the :class:`SharedElection`\\ s of this process."""

    _KIND = "leader election (shared session)"
    _THREAD_PREFIX = "harvest-election"
    _STUCK = "%s: shared election thread did not stop; the locks are released when the process exits"
    _log = log

    def __init__(self, dsn: str, name: str, check_interval: float) -> None:
        self._dsn = dsn
        self.name = name
        self.check_interval = check_interval
        self.lease = 2 * check_interval
        self.statement_timeout = max(0.1, check_interval)
        self.connect_timeout = max(2.0, self.lease)
        self._life = threading.Lock()  # start / stop of the thread
        self._seats: list[_Seat] = []
        self._listening: set[str] = set()
        #: Checks that reached the joining outboxes (a join waits while they go on).
        self._join_passes = 0
        self._init_session()

    # ------------------------------------------------------------------ seats
    def join(self, seat: _Seat) -> None:
        with self._life:
            with self._mu:
                self._seats.append(seat)
            if self._thread is None or not self._thread.is_alive():
                self._init_session()
                self._listening = set()
                try:
                    self._start()  # connects on this thread: a bad DSN fails this relay's start
                except BaseException:
                    with self._mu:
                        self._seats.remove(seat)
                    raise
            else:
                self._wake()
        limit = self.join_limit()
        passes = self._join_passes
        while not seat.resolved.wait(limit):
            # A session whose checks still take joiners in is waited for: when hundreds of outboxes start at
            # once, its thread competes with all their relays for the GIL and a check can take longer than
            # the limit (a 1,000-outbox fleet's start failed 22-34 relays here). A stuck one is not.
            if self._join_passes == passes or self._thread is None or not self._thread.is_alive():
                self.leave(seat)
                raise ElectionError(
                    f"{seat.name}: the shared election session did not take the outbox in time (no check took "
                    f"joining outboxes in for {limit:g}s)"
                )
            passes = self._join_passes
        if seat.error is not None:
            self.leave(seat)
            raise ElectionError(seat.error)

    def join_limit(self) -> float:
        """How long a joining election waits for a check to take joiners in before the session counts as stuck."""
        return self.connect_timeout + 2 * self.statement_timeout + self.check_interval + 5

    def leave(self, seat: _Seat) -> None:
        """Unlock ``seat``'s lock (and notify) on the session's thread; the session ends with its last seat."""
        with self._mu:
            seat.leaving = True
        self._wake()
        seat.left.wait(self.connect_timeout + self.statement_timeout + self.check_interval + 1.0)
        with self._life:
            with self._mu:
                if seat in self._seats:
                    self._seats.remove(seat)
                last = not self._seats
            if last and self._thread is not None:
                self._stop_thread()
                self._thread = None

    def seat_state(self, seat: _Seat) -> tuple[bool, int, float]:
        with self._mu:
            return seat.held, seat.generation, seat.verified_at

    # ------------------------------------------------------------------ LockSession
    def _connect(self) -> None:
        conn = election_connection(
            self._dsn, self.name, self.check_interval, self.lease, self.connect_timeout, self.statement_timeout
        )
        try:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            pid = int(row[0]) if row else None
            conn.add_notify_handler(lambda n: self._on_notify() if n.pid != pid else None)
        except BaseException:
            conn.close()
            raise
        self._conn, self._pid = conn, pid
        self._listening = set()

    def _on_notify(self) -> None:
        self._notified = True

    def _check_now(self) -> bool:
        with self._mu:
            return any(s.leaving or not s.resolved.is_set() for s in self._seats)

    def _drop(self, why: str) -> None:
        with self._mu:
            lost = [s for s in self._seats if s.held]
            for seat in self._seats:
                seat.held = False
        if lost:
            log.warning(
                "%s: shared election connection failed (%s): %d lock(s) considered lost", self.name, why, len(lost)
            )
        else:
            log.info("%s: shared election connection failed (%s); reconnecting", self.name, why)
        close_quietly(self._conn)
        self._conn = None

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        with self._mu:
            seats = list(self._seats)
        if conn is not None:
            try:
                self._unlock(conn, seats)
            except psycopg.Error:
                pass  # logged; the locks go with the session
            close_quietly(conn)
        for seat in seats:
            with self._mu:
                seat.held = False
            seat.left.set()

    def _unlock(self, conn: psycopg.Connection, seats: list[_Seat]) -> None:
        """Unlock the held locks of ``seats`` and notify their standbys, in one statement."""
        held = [s for s in seats if s.held and s.key is not None]
        if not held:
            return
        try:
            conn.execute(_UNLOCK_SQL, ([s.key for s in held], [s.channel for s in held], [s.name for s in held]))
        except psycopg.Error as exc:
            log.warning(
                "%s: unlocking %d lock(s) failed (they go with the session): %s",
                self.name,
                len(held),
                redact_error(str(exc), self._dsn).strip(),
            )
            raise
        for seat in held:
            log.info("%s: released the Postgres leader lock", seat.name)

    def _step(self) -> None:
        conn = self._connected()
        if conn is None:
            return
        try:
            with self._mu:
                seats = list(self._seats)
            self._let_go(conn, [s for s in seats if s.leaving and not s.left.is_set()])
            self._join(conn, seats, time.monotonic() + JOIN_BUDGET * self.check_interval)
            self._join_passes += 1
            active = [s for s in seats if s.key is not None and not s.leaving and s.error is None]
            held_keys = self._verify(conn, active)
            self._acquire(conn, [s for s in active if not s.held], held_keys)
        except psycopg.Error as exc:
            self._drop(redact_error(str(exc), self._dsn).strip() or type(exc).__name__)

    def _let_go(self, conn: psycopg.Connection, leaving: list[_Seat]) -> None:
        """1. Elections leaving: unlock the held locks and tell their standbys, in one statement."""
        self._unlock(conn, leaving)
        for seat in leaving:
            with self._mu:
                seat.held = False
            seat.left.set()

    def _join(self, conn: psycopg.Connection, seats: list[_Seat], deadline: float) -> None:
        """2. Elections joining: each outbox's key (whether sharded relays run on it: one query for all of
        them) and its channel (LISTENed in one statement). An unqualified ``outboxTable`` costs a round trip
        to resolve; past ``deadline`` the rest wait for the next check (the locks held meanwhile must be
        verified within their lease)."""
        tables: list[tuple[_Seat, str]] = []
        for seat in seats:
            if not seat.resolved.is_set():
                if tables and time.monotonic() >= deadline:  # (at least one a check: joins always progress)
                    break
                tables.append((seat, resolve_table(conn, seat.outbox_table)))
        if tables:
            members = sharded_members_of(conn, {table for _, table in tables})
            for seat, table in tables:
                self._resolve(seat, table, members.get(table, []))
        channels = sorted({s.channel for s in seats if s.channel} - self._listening)
        if channels:
            conn.execute(sql.SQL("; ").join(sql.SQL("LISTEN {}").format(sql.Identifier(c)) for c in channels))
            self._listening.update(channels)

    def _verify(self, conn: psycopg.Connection, active: list[_Seat]) -> set[int]:
        """3. Every held lock verified by one query; the verification dates from just before it. Returns
        the keys still held."""
        checked = time.monotonic()
        mine = {_unsigned(int(r[0])) for r in conn.execute(_MINE_SQL).fetchall()}
        held_keys: set[int] = set()
        with self._mu:
            for seat in active:
                if not seat.held:
                    continue
                assert seat.key is not None
                if _unsigned(seat.key) in mine:
                    seat.verified_at = checked
                    held_keys.add(_unsigned(seat.key))
                else:
                    seat.held = False
                    log.warning("%s: the shared session no longer holds the leader lock", seat.name)
        return held_keys

    def _acquire(self, conn: psycopg.Connection, waiting: list[_Seat], held_keys: set[int]) -> None:
        """4. Standbys try only the locks nobody holds, all in one statement."""
        if not waiting:
            return
        free = {_unsigned(int(r[0])) for r in conn.execute(_FREE_SQL, ([s.key for s in waiting],)).fetchall()}
        trying: dict[int, _Seat] = {}
        for seat in waiting:
            assert seat.key is not None
            key = _unsigned(seat.key)
            if key in held_keys or key in trying:
                continue  # a predecessor of this outbox in this process still holds it (or tries it now)
            if key not in free:
                seat.unled_checks = 0
                continue
            if seat.may_acquire is not None and not seat.may_acquire():
                seat.unled_checks += 1
                if seat.unled_checks < UNLED_CHECKS:
                    continue
            seat.unled_checks = 0
            trying[key] = seat
        if not trying:
            return
        tried = time.monotonic()
        rows = conn.execute(_TRY_SQL, ([s.key for s in trying.values()],)).fetchall()
        with self._mu:
            for key, got in rows:
                if got:
                    seat = trying[_unsigned(int(key))]
                    seat.held = True
                    seat.verified_at = tried
                    seat.generation += 1

    def _resolve(self, seat: _Seat, table: str, members: list[tuple[int, int]]) -> None:
        if members:
            seat.error = (
                f"sharded relays run on {table} ({', '.join(f'{n} with shards: {s}' for s, n in members)}); this "
                f"one has shards: 1. Changing shards on a live outbox is drain-then-change (docs/sharding.md)"
            )
        else:
            seat.key = lock_key(table)
            seat.channel = f"harvest_leader_{_unsigned(seat.key):016x}"
            log.info("%s: Postgres leader election on %s (shared session %s)", seat.name, table, self.name)
        seat.resolved.set()


class SharedElection:
    """One outbox's Postgres election on its database's :class:`SharedLockSession` (module docstring)."""

    def __init__(
        self,
        session: SharedLockSession,
        outbox_table: str,
        name: str,
        may_acquire: Callable[[], bool] | None = None,
    ) -> None:
        OutboxNames.parse(outbox_table)  # validate early (ConfigError)
        self._session = session
        self._seat = _Seat(name, outbox_table, may_acquire)
        self.name = name
        self._listener: ElectionListener | None = None
        self._leader = False
        self._seen_generation = 0
        self._closed = False

    @property
    def is_leader(self) -> bool:
        return self._leader

    def start(self, listener: ElectionListener) -> None:
        self._listener = listener
        self._session.join(self._seat)

    @property
    def lease(self) -> float:
        return self._session.lease

    def pulse(self) -> bool:
        """No I/O: compares the session's last verification of this lock with the lease."""
        return leased_pulse(self, lambda: self._session.seat_state(self._seat))

    def _holding_line(self) -> str:
        return f"holding the Postgres leader lock of {self._seat.outbox_table} (shared session {self._session.name})"

    def close(self) -> None:
        """Report revocation (the relay drains) before the lock is let go; then unlock and notify."""
        if revoke_first(self):
            self._session.leave(self._seat)

    def __repr__(self) -> str:
        return f"SharedElection(name={self.name!r}, session={self._session.name!r})"


class ElectionSessions:
    """A process's shared election sessions, one per (``dataSource``, check interval)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._mu = threading.Lock()
        self._sessions: dict[tuple[str, float], SharedLockSession] = {}

    def election(
        self, dsn: str, outbox_table: str, name: str, check_interval: float, may_acquire: Callable[[], bool] | None
    ) -> SharedElection:
        with self._mu:
            session = self._sessions.get((dsn, check_interval))
            if session is None:
                session = self._sessions[(dsn, check_interval)] = SharedLockSession(dsn, self._name, check_interval)
        return SharedElection(session, outbox_table, name, may_acquire)
