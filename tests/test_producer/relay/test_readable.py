"""``producer/_readable.py``: waiting for sockets whatever their descriptor numbers (pure, no services).

A fleet process of ~100 outboxes holds descriptors above 1,024, which ``select()`` refuses: the relay's
waits then failed at once and its threads spun (0.95 of a core for an idle fleet of 100). Each invariant
of the module is a test here, on descriptors below and above ``FD_SETSIZE``, and the relay's waker on
one above it.
"""

from __future__ import annotations

import os
import resource
import socket
import time
from collections.abc import Iterator

import pytest

from harvest_outbox.producer._readable import FD_SETSIZE, readable
from harvest_outbox.producer.relay._waker import Waker

HIGH = FD_SETSIZE + 500


@pytest.fixture()
def pairs() -> Iterator[list[tuple[socket.socket, socket.socket]]]:
    made = [socket.socketpair() for _ in range(2)]
    yield made
    for a, b in made:
        a.close()
        b.close()


@pytest.fixture()
def high_fd(pairs: list[tuple[socket.socket, socket.socket]]) -> Iterator[tuple[int, socket.socket]]:
    """A descriptor numbered above FD_SETSIZE (the read end of a pair, duplicated there) and its writer."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft <= HIGH:
        resource.setrlimit(resource.RLIMIT_NOFILE, (HIGH + 100, hard))  # fails loudly if the hard limit is lower
    reader, writer = pairs[1]
    fd = os.dup2(reader.fileno(), HIGH)
    yield fd, writer
    os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _timed(fds: list, timeout: float) -> tuple[list, float]:
    started = time.monotonic()
    got = readable(fds, timeout)
    return got, time.monotonic() - started


def test_a_quiet_wait_times_out_and_a_readable_socket_ends_it_at_once(pairs: list) -> None:
    (r1, w1), (r2, _w2) = pairs
    got, took = _timed([r1, r2.fileno()], 0.2)
    assert got == [] and 0.15 <= took < 5
    w1.send(b"x")
    got, took = _timed([r1, r2.fileno()], 5.0)
    assert got == [r1] and took < 2.5


def test_a_descriptor_above_fd_setsize_is_waited_on(high_fd: tuple[int, socket.socket], pairs: list) -> None:
    fd, writer = high_fd
    assert fd >= FD_SETSIZE
    quiet = pairs[0][0]
    got, took = _timed([quiet, fd], 0.2)
    assert got == [] and 0.15 <= took < 5  # select() raised ValueError here: a wait that never waited
    writer.send(b"x")
    got, took = _timed([quiet, fd], 5.0)
    assert got == [fd] and took < 2.5


@pytest.mark.parametrize("high", [False, True], ids=["low", "high"])
def test_a_closed_descriptor_is_ready_not_raised(high: bool, high_fd: tuple[int, socket.socket], pairs: list) -> None:
    if high:
        fd = os.dup2(pairs[0][0].fileno(), HIGH + 1)
    else:
        fd = os.dup(pairs[0][0].fileno())
    os.close(fd)
    assert fd in readable([pairs[1][0], fd], 5.0)
    closed = socket.socket()
    closed.close()
    assert readable([closed], 5.0) == [closed]


def test_the_relays_waker_waits_with_a_high_descriptor_among_its_sockets(high_fd: tuple[int, socket.socket]) -> None:
    fd, writer = high_fd
    waker = Waker()
    try:
        started = time.monotonic()
        assert waker.wait(0.2, fd) is False
        assert time.monotonic() - started >= 0.15  # it waited (it used to return True at once, and spin)
        writer.send(b"x")
        assert waker.wait(5.0, fd) is True
    finally:
        waker.close()
