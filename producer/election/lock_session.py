"""The election connection's thread, shared by both Postgres elections (:mod:`.postgres`, one lock;
:mod:`.sharded_postgres`, a lock per shard): start, the check loop, waking and stopping.

One thread per election owns the connection: every ``check_interval`` (or at once when the server
sends something unasked — a NOTIFY from a relay that let a lock go, or the end of the session — or
when :meth:`LockSession._check_now` says so) it runs one :meth:`LockSession._step` (verify, acquire,
let go), and drops the connection on an unexpected error so nothing stale is believed held. The
relay's thread only reads what the steps recorded (``pulse``), so neither waits on the other.

Invariants:
- ``_start`` connects on the caller's thread first: a bad DSN or an unreachable database fails the
  relay's start with :class:`~producer.errors.ElectionError` (DSN redacted), never in the thread;
- after ``_stop_thread`` the thread has ended and the locks were released by it (or, with no
  thread, by ``_stop_thread`` itself), or it is stuck in a call bounded by the connect and statement
  timeouts and the locks go with the process; the wake pipe's descriptors are closed either way;
- a ``_step`` that raised is logged and followed by ``_drop``: the next check reconnects.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from abc import ABC, abstractmethod
from typing import Any

import psycopg

from harvest_outbox.producer._readable import readable
from harvest_outbox.producer.errors import ElectionError
from harvest_outbox.redact import redact_dsn, redact_error

__all__ = ["LockSession", "close_quietly"]


def close_quietly(conn: psycopg.Connection | None) -> None:
    """Close an election connection that may already be broken (nothing to salvage from it)."""
    if conn is not None:
        try:
            conn.close()
        except Exception:
            pass


class LockSession(ABC):
    """The thread and connection of a Postgres election (module doc); subclasses say what a check does."""

    #: How the election names itself in its log lines and errors ("leader election", "shard election").
    _KIND: str
    #: The thread is named ``<_THREAD_PREFIX>-<relay name>``.
    _THREAD_PREFIX: str
    #: Logged when the thread does not end in time on close.
    _STUCK: str
    #: The subclass's module logger: its lines keep their logger name.
    _log: logging.Logger

    name: str
    check_interval: float
    connect_timeout: float
    statement_timeout: float
    _dsn: str

    def _init_session(self) -> None:
        self._closed = False
        self._stop = threading.Event()
        self._wake_r, self._wake_w = -1, -1
        self._thread: threading.Thread | None = None
        self._mu = threading.Lock()  # guards what the thread shares with pulse()
        self._conn: psycopg.Connection[Any] | None = None
        self._pid: int | None = None
        self._notified = False  # a NOTIFY was read off the connection since the last check began

    # ------------------------------------------------------------------ what a subclass says
    @abstractmethod
    def _connect(self) -> None:
        """Open the election connection (``self._conn``, ``self._pid``) and LISTEN; raises on failure."""

    @abstractmethod
    def _step(self) -> None:
        """One check on the connection (reconnecting first if it is gone)."""

    @abstractmethod
    def _drop(self, why: str) -> None:
        """Forget every lock as lost and close the connection (the next check reconnects)."""

    @abstractmethod
    def _release(self) -> None:
        """Unlock and notify on the way out, then close the connection."""

    def _unlock_and_close(
        self, conn: psycopg.Connection[Any], statement: str, params: tuple[Any, ...], done: str
    ) -> None:
        """Run the unlock ``statement`` (with its NOTIFY), log ``done``, close ``conn``; a failure is
        logged (DSN redacted): the locks go with the connection anyway."""
        try:
            conn.execute(statement, params)
            self._log.info("%s: %s", self.name, done)
        except psycopg.Error as exc:
            self._log.warning(
                "%s: unlocking failed (the lock goes with the connection): %s",
                self.name,
                redact_error(str(exc), self._dsn).strip(),
            )
        finally:
            close_quietly(conn)

    def _connected(self) -> psycopg.Connection[Any] | None:
        """The connection, made again first if it is gone; None (logged, DSN redacted) when it cannot be
        made now: the next check tries again."""
        if self._conn is None:
            try:
                self._connect()
            except (psycopg.Error, ElectionError) as exc:
                self._log.warning(
                    "%s: cannot connect for %s (%s): %s",
                    self.name,
                    self._KIND,
                    redact_dsn(self._dsn),
                    redact_error(str(exc), self._dsn).strip(),
                )
                return None
        return self._conn

    def _check_now(self) -> bool:
        """True when the next check should not wait for ``check_interval``."""
        return False

    def _look_again(self) -> bool:
        """After a check: True to check again at once (a NOTIFY read with its reply)."""
        return self._notified

    # ------------------------------------------------------------------ the session
    def _start(self) -> None:
        try:
            self._connect()  # fail fast on a bad DSN / unreachable database
        except psycopg.Error as exc:
            raise ElectionError(
                f"cannot start Postgres {self._KIND} ({redact_dsn(self._dsn)}): "
                f"{redact_error(str(exc), self._dsn).strip()}"
            ) from exc
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._loop, name=f"{self._THREAD_PREFIX}-{self.name}", daemon=True)
        self._thread.start()

    def _wake(self) -> None:
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass

    def _stop_thread(self) -> None:
        """End the thread (it releases the locks) and close the wake pipe; see the module doc."""
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(self.connect_timeout + self.statement_timeout + 1.0)
            if self._thread.is_alive():
                self._log.warning(self._STUCK, self.name)
                return
        else:
            self._release()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1

    def _loop(self) -> None:
        next_check = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_check or self._check_now():
                next_check = now + self.check_interval
                self._notified = False
                try:
                    self._step()
                except Exception as exc:  # a bug must not leave a stale "held": drop, fence, retry
                    self._log.exception("%s: %s check failed", self.name, self._KIND)
                    self._drop(f"unexpected {type(exc).__name__}")
                if self._look_again():
                    next_check = 0.0
            timeout = max(0.0, next_check - time.monotonic())
            fds = [self._wake_r]
            conn = self._conn
            if conn is not None and not conn.closed:
                fds.append(conn.fileno())
            try:
                ready = readable(fds, timeout)
            except (OSError, ValueError):
                ready = []
            if self._stop.is_set():
                break
            if self._wake_r in ready:  # a wake-up: read it, or select returns at once from now on
                try:
                    os.read(self._wake_r, 4096)
                except OSError:
                    pass
            if conn is not None and ready and conn.fileno() in ready:
                # Unasked input: a NOTIFY (a relay let a lock go, joined or left) or the server ending
                # our session. Look now.
                next_check = 0.0
        self._release()
