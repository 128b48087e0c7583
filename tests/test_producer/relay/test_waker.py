"""producer.relay._waker's invariants: a watched future's completion ends a wait at once (also when it
happened before the wait), extra sockets wake it too, a timeout ends it otherwise, and ringing
never blocks."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from harvest_outbox.producer.relay._waker import Waker


def test_completion_during_the_wait_ends_it_at_once() -> None:
    waker = Waker()
    with ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        waker.watch(pool.submit(time.sleep, 0.05))
        assert waker.wait(5.0) is True
        assert time.monotonic() - started < 1.0
    waker.close()


def test_completion_before_the_wait_is_not_lost() -> None:
    waker = Waker()
    future: Future[int] = Future()
    waker.watch(future)
    future.set_result(1)
    started = time.monotonic()
    assert waker.wait(5.0) is True
    assert time.monotonic() - started < 1.0
    assert waker.wait(0.05) is False  # drained: the next wait times out
    waker.close()


def test_an_extra_readable_socket_wakes_it_and_none_is_skipped() -> None:
    waker = Waker()
    a, b = socket.socketpair()
    threading.Timer(0.05, b.send, args=(b"x",)).start()
    started = time.monotonic()
    assert waker.wait(5.0, None, a.fileno()) is True
    assert time.monotonic() - started < 1.0
    a.close(), b.close()
    waker.close()


def test_timeout_ends_a_wait_with_nothing_to_wake_it() -> None:
    waker = Waker()
    started = time.monotonic()
    assert waker.wait(0.05) is False
    assert 0.04 <= time.monotonic() - started < 1.0
    waker.close()


def test_ringing_never_blocks_even_with_the_buffer_full() -> None:
    waker = Waker()
    futures = [Future() for _ in range(20_000)]  # a socketpair's buffer is full after a few hundred rings
    for f in futures:
        waker.watch(f)
    started = time.monotonic()
    for f in futures:
        f.set_result(None)  # far more bytes than a socket buffer holds
    assert time.monotonic() - started < 30
    with pytest.raises(BlockingIOError):  # the buffer did fill: the rings above went on past it
        waker._send.send(b"\0")
    assert waker.wait(1.0) is True
    waker.close()
    Future().add_done_callback(waker._ring)  # closed: ringing is a no-op, not an error
    late: Future[None] = Future()
    waker.watch(late)
    late.set_result(None)
