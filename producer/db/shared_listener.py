"""One LISTEN connection per database for many relays of one process (a fleet): each relay's
:class:`SharedListener` is a pipe its thread waits on, rung by a dispatcher thread that reads every
channel's NOTIFYs off the single connection.

A :class:`SharedListener` offers what :class:`~producer.db._listener.Listener` offers the relay
(``wait``, ``pending``, ``fileno``, ``close``), so the relay's wake-up logic is the same whichever
it has.

Invariants (``tests/test_producer/db/test_shared_listener.py``):
- a NOTIFY on a channel rings every listener of that channel (and no other) once or more; a burst of
  them is one wake-up for a listener that drains;
- a lost connection rings every listener (each relay marks, as a poll would) and is made again, with
  every channel LISTENed again, by the dispatcher; a relay never blocks on it;
- the connection is used by one thread at a time (a mutex), closes :data:`LINGER` seconds after its last
  listener left unless another came (cold standbys subscribe and leave at once while they start: without
  it, a fleet's start opened and closed a connection per outbox, several at a time), and a listener's
  pipe is closed exactly once;
- a hub holds at most one connection at a time: a listener that comes while the last dispatcher is
  closing its connection waits for it to end.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import psycopg
from psycopg import sql

from harvest_outbox.producer._readable import readable
from harvest_outbox.producer.db._session import connect
from harvest_outbox.producer.errors import DatabaseError
from harvest_outbox.redact import redact_error

log = logging.getLogger(__name__)

#: Seconds between the dispatcher's attempts to connect again after a failure.
RETRY_INTERVAL = 1.0
#: Seconds the connection stays after its last listener left: a cold standby subscribes and leaves at once
#: while it starts, and a fleet's outboxes start one after another (without it, a connection each).
LINGER = 2.0
#: Seconds a new listener waits at most for the last dispatcher to close its connection.
ENDING_WAIT = 10.0


class SharedListener:
    """One relay's wake-up on a :class:`ListenHub` (module docstring)."""

    def __init__(self, hub: ListenHub, channel: str) -> None:
        self.channel = channel
        self._hub = hub
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._closed = False

    def ring(self) -> None:
        try:
            os.write(self._w, b"n")
        except (BlockingIOError, OSError):  # full: a wake-up is already waiting
            pass

    def _drain(self) -> bool:
        got = False
        try:
            while os.read(self._r, 4096):
                got = True
        except (BlockingIOError, OSError):
            pass
        return got

    def fileno(self) -> int | None:
        return None if self._closed else self._r

    def pending(self) -> bool:
        """Non-blocking: has a notification arrived (consumed if so)?"""
        return not self._closed and self._drain()

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds for a notification; True if one (or more) arrived."""
        if self._closed:
            return False
        try:
            ready = readable([self._r], timeout)
        except OSError:
            return True
        return bool(ready) and self._drain()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._hub.unsubscribe(self)
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass


class ListenHub:
    """The LISTEN connection of one database for the relays of this process. The connection belongs to
    the dispatcher thread alone; subscribing only changes the channel list and wakes it."""

    def __init__(self, dsn: str, name: str) -> None:
        self._dsn = dsn
        self.name = name
        self._mu = threading.Lock()
        self._subs: dict[str, list[SharedListener]] = {}
        #: The running dispatcher's stop event, wake pipe and thread (a new set per dispatcher).
        self._stop: threading.Event | None = None
        self._wake_w = -1
        self._thread: threading.Thread | None = None
        #: The last dispatcher told to stop, until it has closed its connection.
        self._ending: threading.Thread | None = None
        #: When the last listener left (the dispatcher ends LINGER seconds later if none came).
        self._empty_since = 0.0

    def subscribe(self, channel: str) -> SharedListener:
        listener = SharedListener(self, channel)
        with self._mu:
            ending = self._ending if self._stop is None else None
        if ending is not None:
            ending.join(ENDING_WAIT)  # outside the mutex: the dispatcher takes it while it ends
        with self._mu:
            self._subs.setdefault(channel, []).append(listener)
            if self._stop is None:
                self._stop = threading.Event()
                wake_r, self._wake_w = os.pipe()
                self._thread = threading.Thread(
                    target=self._run,
                    args=(self._stop, wake_r, self._wake_w),
                    name=f"harvest-listen-{self.name}",
                    daemon=True,
                )
                self._thread.start()
            else:
                self._poke()
        return listener

    def unsubscribe(self, listener: SharedListener) -> None:
        with self._mu:
            subs = self._subs.get(listener.channel, [])
            if listener in subs:
                subs.remove(listener)
            if not subs:
                self._subs.pop(listener.channel, None)
            if not self._subs:
                self._empty_since = time.monotonic()  # the dispatcher ends after LINGER, if none came
            self._poke()

    def _poke(self) -> None:
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass

    def _ring_all(self) -> None:
        with self._mu:
            listeners = [listener for subs in self._subs.values() for listener in subs]
        for listener in listeners:
            listener.ring()

    def _run(self, stop: threading.Event, wake_r: int, wake_w: int) -> None:
        conn: psycopg.Connection[Any] | None = None
        listening: set[str] = set()
        try:
            while not stop.is_set():
                try:
                    if conn is None or conn.closed:
                        conn = connect(self._dsn, application_name=f"harvest-listen:{self.name}"[:63])
                        listening = set()
                    with self._mu:
                        wanted = set(self._subs)
                    for channel in wanted - listening:
                        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                        listening.add(channel)
                    for channel in listening - wanted:
                        conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(channel)))
                        listening.discard(channel)
                    fd = conn.fileno()
                except (psycopg.Error, DatabaseError) as exc:
                    self._lost(conn, exc)
                    conn = None
                    stop.wait(RETRY_INTERVAL)
                    self._end_if_unused(stop)
                    continue
                with self._mu:  # without listeners, wake up when the linger ends
                    timeout = 1.0 if self._subs else max(0.01, LINGER - (time.monotonic() - self._empty_since))
                try:
                    ready = readable([fd, wake_r], min(1.0, timeout))
                except OSError:
                    ready = [fd]
                if wake_r in ready:
                    try:
                        os.read(wake_r, 4096)
                    except OSError:
                        pass
                self._end_if_unused(stop)
                if stop.is_set() or fd not in ready:
                    continue
                try:
                    channels = {notify.channel for notify in conn.notifies(timeout=0)}
                except (psycopg.Error, DatabaseError) as exc:
                    self._lost(conn, exc)
                    conn = None
                    continue
                with self._mu:
                    rung = [listener for channel in channels for listener in self._subs.get(channel, ())]
                for listener in rung:
                    listener.ring()
        finally:
            if conn is not None:
                try:
                    conn.close()
                except Exception:  # already broken
                    pass
            for fd in (wake_r, wake_w):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _end_if_unused(self, stop: threading.Event) -> None:
        """No listener for LINGER seconds: this dispatcher ends (a new listener starts another)."""
        with self._mu:
            if self._subs or self._stop is not stop or time.monotonic() - self._empty_since < LINGER:
                return
            stop.set()  # the dispatcher closes its connection and its pipe
            self._stop, self._wake_w = None, -1
            self._ending, self._thread = self._thread, None

    def _lost(self, conn: psycopg.Connection[Any] | None, exc: Exception) -> None:
        """The connection failed: every relay marks (as a poll would), the dispatcher connects again."""
        log.warning(
            "%s: shared LISTEN connection problem (the relays poll meanwhile): %s",
            self.name,
            redact_error(str(exc), self._dsn).strip(),
        )
        self._ring_all()
        if conn is not None:
            try:
                conn.close()
            except Exception:  # already broken
                pass


class ListenHubs:
    """A process's LISTEN connections, one per ``dataSource``."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._mu = threading.Lock()
        self._hubs: dict[str, ListenHub] = {}

    def listener(self, dsn: str, channel: str) -> SharedListener:
        with self._mu:
            hub = self._hubs.get(dsn)
            if hub is None:
                hub = self._hubs[dsn] = ListenHub(dsn, self._name)
        return hub.subscribe(channel)
