"""The relay's wake-up: LISTEN on the outbox's channel, so a stasher's commit (its NOTIFY) ends the relay's
idle wait at once instead of at the next poll.

Invariant: a LISTEN connection problem never stops the relay: :meth:`Listener.wait` and
:meth:`Listener.pending` report a wake-up (the caller marks, as a poll would) and the connection is
made again on next use.
"""

from __future__ import annotations

import logging

import psycopg
from psycopg import sql

from harvest_outbox.producer._readable import readable
from harvest_outbox.producer.db._session import connect
from harvest_outbox.producer.errors import DatabaseError
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.redact import redact_error

# The logger its lines had before Listener left producer/db/__init__.py: a user's log filter keeps working.
log = logging.getLogger("harvest_outbox.producer.db")


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
        fd = self.fileno()
        if fd is not None:
            # The relay asks on every turn of a busy loop: a quiet socket answers with one syscall, where
            # psycopg's notifies() costs a generator round (~10x). Every notification psycopg had read was
            # returned by the last call, so nothing can wait in its buffers while the socket is quiet.
            try:
                ready = readable([fd], 0)
            except OSError:
                ready = [fd]  # let psycopg find out what is wrong with the connection
            if not ready:
                return False
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
