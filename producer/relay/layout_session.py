"""One layout session per database for many relays of one process (a fleet): every relay's layout lock
(:mod:`producer.relay.admission`) held on a single connection instead of one connection per relay.

A relay's :class:`~producer.relay.admission.LayoutGuard` given a :class:`SharedLayoutSession` admits
on it (the same transaction, the same refusal) and, on close, releases its shared lock on it. Shared
advisory locks count per session, so two relays of one outbox in one process (a relay handed over
while its successor starts) each hold and release their own. When the session is lost, every guard
on it is admitted again on a new one, and a guard whose outbox meanwhile got relays of another layout
gets that :class:`~producer.relay.admission.LayoutError` as its ``failure`` (its relay stops), as
with a session of its own.

Invariants (``tests/test_producer/relay/test_layout_session.py``):
- a guard's lock is held on the session from its admission until its release, or until the session
  is lost and then again from its re-admission on;
- statements on the session run one at a time (a mutex), so admissions stay serial and no two
  threads use the connection at once;
- the session closes once its last guard released (the next guard opens a new one).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any

import psycopg

from harvest_outbox.producer._readable import readable
from harvest_outbox.producer.election.lock_session import close_quietly
from harvest_outbox.producer.errors import DatabaseError, HarvestError
from harvest_outbox.redact import redact_dsn, redact_error

if TYPE_CHECKING:
    from harvest_outbox.producer.relay.admission import LayoutGuard

log = logging.getLogger(__name__)


class SharedLayoutSession:
    """The layout session of one database (``dsn``) for the guards of one process; ``name`` is what
    ``pg_stat_activity`` shows (``harvest-layout:<name>``)."""

    def __init__(self, dsn: str, name: str) -> None:
        self._dsn = dsn
        self.name = name
        self._mu = threading.RLock()
        self._conn: psycopg.Connection[Any] | None = None
        #: guard -> the resolved table its lock is on (None while it waits for a re-admission)
        self._guards: dict[LayoutGuard, str | None] = {}
        self._stop = threading.Event()
        self._wake_r, self._wake_w = -1, -1
        self._thread: threading.Thread | None = None

    @property
    def guards(self) -> int:
        with self._mu:
            return len(self._guards)

    def admit(self, guard: LayoutGuard) -> str:
        """Admit ``guard``'s relay on this session (opening it first if needed); raises as admission does."""
        from harvest_outbox.producer.relay.admission import admit

        with self._mu:
            conn = self._connection()
            try:
                table = admit(conn, guard.outbox_table, guard.layout, guard.name)
            except psycopg.Error as exc:
                self._lost(redact_error(str(exc), self._dsn).strip() or type(exc).__name__)
                raise DatabaseError(
                    f"cannot check the relay layout ({redact_dsn(self._dsn)}): "
                    f"{redact_error(str(exc), self._dsn).strip()}"
                ) from exc
            self._guards[guard] = table
            self._start_watch()
            return table

    def release(self, guard: LayoutGuard) -> None:
        """Let go of ``guard``'s lock; the session closes with its last guard."""
        from harvest_outbox.producer.relay.admission import namespace

        with self._mu:
            table = self._guards.pop(guard, None)
            conn = self._conn
            if table is not None and conn is not None:
                try:
                    conn.execute(
                        "SELECT pg_advisory_unlock_shared(%s::int, %s::int)", (namespace(table), guard.layout.key)
                    )
                except psycopg.Error as exc:  # the session is gone: so is the lock
                    self._lost(redact_error(str(exc), self._dsn).strip() or type(exc).__name__)
            if not self._guards:
                self._close()

    # ------------------------------------------------------------------ the session
    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            from harvest_outbox.producer.db import connect

            conn = connect(self._dsn, application_name=f"harvest-layout:{self.name}"[:63])
            try:
                conn.execute("SET idle_session_timeout = 0")  # PostgreSQL 14+: the session is idle by design
            except psycopg.errors.UndefinedObject:
                pass
            self._conn = conn
        return self._conn

    def _lost(self, why: str) -> None:
        """The session is gone: every guard waits for its re-admission (the watch thread does it)."""
        close_quietly(self._conn)
        self._conn = None
        if any(t is not None for t in self._guards.values()):
            log.warning(
                "%s: shared layout session lost (%s); re-admitting %d relay(s)", self.name, why, len(self._guards)
            )
        self._guards = dict.fromkeys(self._guards)

    def _start_watch(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._watch, name=f"harvest-layout-{self.name}", daemon=True)
        self._thread.start()

    def _close(self) -> None:
        self._stop.set()
        if self._wake_w >= 0:
            os.write(self._wake_w, b"x")
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            # the watch takes the mutex only briefly; it sees _stop and ends
            self._mu.release()
            try:
                thread.join(5.0)
            finally:
                self._mu.acquire()
        close_quietly(self._conn)
        self._conn = None
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1

    def _watch(self) -> None:
        from harvest_outbox.producer.relay.admission import CHECK_INTERVAL, RETRY_INTERVAL, admit

        wake_r = self._wake_r
        while not self._stop.is_set():
            with self._mu:
                conn = self._conn
                waiting = [g for g, t in self._guards.items() if t is None]
            if conn is None or waiting:
                if self._stop.wait(RETRY_INTERVAL if conn is None else 0):
                    break
                with self._mu:
                    if self._stop.is_set():
                        break
                    for guard in [g for g, t in self._guards.items() if t is None]:
                        try:
                            self._guards[guard] = admit(
                                self._connection(), guard.outbox_table, guard.layout, guard.name
                            )
                        except (psycopg.Error, DatabaseError) as exc:
                            log.warning("%s: cannot re-admit its relay layout yet: %s", guard.name, exc)
                            self._lost(str(exc))
                            break
                        except HarvestError as exc:  # another layout was admitted while the session was gone
                            log.error("%s: %s", guard.name, exc)
                            guard.failure = exc
                            self._guards.pop(guard, None)
                continue
            try:
                readable([conn.fileno(), wake_r], CHECK_INTERVAL)
            except (OSError, ValueError):
                pass
            if self._stop.is_set():
                break
            with self._mu:
                if self._conn is not conn:
                    continue
                try:
                    conn.execute("SELECT 1")  # also reads whatever made the socket readable (FATAL, EOF)
                except psycopg.Error as exc:
                    self._lost(redact_error(str(exc), self._dsn).strip() or type(exc).__name__)


class LayoutSessions:
    """A process's shared layout sessions, one per ``dataSource`` (what a fleet gives its relays)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._mu = threading.Lock()
        self._sessions: dict[str, SharedLayoutSession] = {}

    def for_dsn(self, dsn: str) -> SharedLayoutSession:
        with self._mu:
            session = self._sessions.get(dsn)
            if session is None:
                session = self._sessions[dsn] = SharedLayoutSession(dsn, self._name)
            return session
