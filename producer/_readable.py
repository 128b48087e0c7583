"""Waiting until sockets are readable, whatever their descriptor numbers: the one place the relay's
threads wait on sockets of their own (the waker, the LISTEN connections, the lock and layout sessions).

``select.select()`` refuses a descriptor at or above ``FD_SETSIZE`` (1024) with ``ValueError``. A fleet
process passes that number at about 100 outboxes (each has its sockets: two statement connections,
librdkafka's, a waker pair); every wait then failed at once, and the callers, which read a failed wait
as "something happened, look again", spun: an idle fleet of 100 outboxes took 0.95 of a core.
``poll(2)`` has no such limit but counts its timeout in whole milliseconds, and the relay waits in
0.2 ms slices while it serves delivery reports; so ``select()`` serves descriptors below ``FD_SETSIZE``
and ``poll()`` the others (their sub-millisecond waits round up to 1 ms).

Invariants (tests/test_producer/relay/test_readable.py):
- :func:`readable` returns the objects of ``fds`` that are readable (or hung up, or in error) as soon as
  one is, else an empty list after ``timeout`` seconds;
- a descriptor numbered above ``FD_SETSIZE`` is waited on like any other;
- a descriptor closed under the caller is returned as ready (its next read reports the error), never
  raised: the callers re-check their state after every wait.
"""

from __future__ import annotations

import math
import select
from collections.abc import Iterable
from typing import Protocol, TypeVar, Union


class _HasFileno(Protocol):
    def fileno(self) -> int: ...


F = TypeVar("F", bound=Union[int, _HasFileno])  # noqa: UP007 - a TypeVar bound is evaluated at run time

#: select()'s limit on Linux (glibc's FD_SETSIZE): descriptors from here on are poll()'s.
FD_SETSIZE = 1024
_READY = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP | select.POLLNVAL


def readable(fds: Iterable[F], timeout: float | None) -> list[F]:
    """The members of ``fds`` (descriptors or objects with ``fileno()``) that are readable, waiting up
    to ``timeout`` seconds (None: until one is) for the first."""
    given = list(fds)
    numbers = [f if isinstance(f, int) else f.fileno() for f in given]
    if any(n < 0 for n in numbers):  # a closed socket object: ready, as a closed descriptor is
        return [f for f, n in zip(given, numbers, strict=True) if n < 0]
    if max(numbers, default=0) < FD_SETSIZE:
        try:
            ready, _, _ = select.select(given, [], [], timeout)  # (returns the objects it was given)
        except (OSError, ValueError):  # closed under us (EBADF): a closed descriptor is ready
            return given
        return ready
    poller = select.poll()
    for n in set(numbers):
        poller.register(n, select.POLLIN | select.POLLPRI)
    events = poller.poll(None if timeout is None else max(0, math.ceil(timeout * 1000)))
    hit = {fd for fd, mask in events if mask & _READY}
    return [f for f, n in zip(given, numbers, strict=True) if n in hit]
