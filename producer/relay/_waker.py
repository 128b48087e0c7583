"""Wake the relay thread the moment a database statement it waits for finishes, or a stasher commits.

While records are in librdkafka's hands the relay thread waits inside ``producer.poll(timeout)``,
which only a delivery report ends early. A finished mark or harvest-transaction commit (on the DB
worker threads) or a stasher's NOTIFY (on the LISTEN connection) would wait out the poll's timeout
and add it to idle-to-delivery latency. When nothing is in librdkafka's hands, the relay waits on
a :class:`Waker` instead: a socket pair that every watched future's completion writes a byte to,
selected together with the LISTEN connection's socket.

Invariants (tests/test_producer/relay/test_waker.py):
- :meth:`Waker.wait` returns as soon as a watched future completes (or an extra socket is
  readable), at the latest after ``timeout``;
- a completion that happens before the wait begins is not lost: the byte stays in the pair until
  a wait drains it;
- ringing never blocks the thread that completes the future (a full socket buffer already means
  "wake up").
"""

from __future__ import annotations

import socket
from concurrent.futures import Future
from typing import Any, TypeVar

from harvest_outbox.producer._readable import readable

T = TypeVar("T")


class Waker:
    __slots__ = ("_receive", "_send")

    def __init__(self) -> None:
        self._receive, self._send = socket.socketpair()
        self._receive.setblocking(False)
        self._send.setblocking(False)

    def watch(self, future: Future[T]) -> Future[T]:
        """Ring when ``future`` completes; returns it."""
        future.add_done_callback(self._ring)
        return future

    def ring(self) -> None:
        """End the current (or the next) wait now: a stop, say."""
        self._ring()

    def _ring(self, _future: Any = None) -> None:
        try:
            self._send.send(b"\0")
        except OSError:  # buffer full (a wake-up is pending anyway) or closed (shutting down)
            pass

    def wait(self, timeout: float, *extra: int | None) -> bool:
        """Block until a watched future completed since the last wait, a file descriptor in
        ``extra`` (None entries skipped) is readable, or ``timeout`` passed; True unless timed out."""
        fds: list[Any] = [self._receive, *(fd for fd in extra if fd is not None)]
        try:
            ready = readable(fds, timeout)
        except OSError:  # an extra descriptor closed under us: the caller re-checks
            return True
        if self._receive in ready:
            try:
                while self._receive.recv(4096):
                    pass
            except OSError:  # drained (BlockingIOError) or closed
                pass
        return bool(ready)

    def close(self) -> None:
        self._receive.close()
        self._send.close()
