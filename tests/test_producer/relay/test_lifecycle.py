"""producer/relay/lifecycle.py: the states and steps Harvest and ShardedHarvest share (pure logic, a fake
relay whose steps record themselves; the real relays run it in test_signals, test_shards, test_failover)."""

from __future__ import annotations

import logging
import threading

import pytest

from harvest_outbox.producer.config import HarvestConfig
from harvest_outbox.producer.errors import HarvestError
from harvest_outbox.producer.relay.lifecycle import RelayLifecycle, State


class Fake(RelayLifecycle):
    _log = logging.getLogger("test.lifecycle")
    _THREAD_PREFIX = "fake"

    def __init__(self, open_error: BaseException | None = None, loop_error: BaseException | None = None) -> None:
        self.config = HarvestConfig(name="r1")
        self._init_lifecycle()
        self.steps: list[str] = []
        self.open_error, self.loop_error = open_error, loop_error
        self.looping = threading.Event()
        self.stop_while_opening = False

    def _open(self) -> None:
        self.steps.append("open")
        if self.stop_while_opening:
            self.stop()
        if self.open_error is not None:
            raise self.open_error

    def _abandon_start(self) -> None:
        self.steps.append("abandon")
        self._state = State.STOPPED

    def _log_started(self) -> None:
        self.steps.append("started")

    def _loop(self) -> None:
        self.looping.set()
        if self.loop_error is not None:
            raise self.loop_error
        self._stop_requested.wait()

    def _close(self) -> None:
        self.steps.append(f"close:{self._state.value}")


def test_start_loop_stop_wait_go_through_the_states_in_order() -> None:
    relay = Fake()
    assert relay.state is State.CREATED
    with relay as same:
        assert same is relay and relay.looping.wait(5)
        assert relay.state is State.RUNNING
        assert relay._thread is not None and relay._thread.name == "fake-r1"
        relay.stop()
        assert relay.state is State.STOPPING  # as soon as stop() is called
    assert relay.state is State.STOPPED
    assert relay.steps == ["open", "started", "close:stopping"]
    with pytest.raises(HarvestError, match="cannot start a relay in state stopped"):
        relay.start()


def test_a_failed_open_is_abandoned_and_raised_and_no_thread_runs() -> None:
    relay = Fake(open_error=OSError("no database"))
    with pytest.raises(OSError, match="no database"):
        relay.start()
    assert relay.state is State.STOPPED and relay._thread is None
    assert relay.steps == ["open", "abandon"]
    assert relay.wait(0) is True


def test_a_stop_while_opening_abandons_the_start_and_returns_stopped() -> None:
    relay = Fake()
    relay.stop_while_opening = True
    assert relay.start() is relay
    assert relay.state is State.STOPPED and relay._thread is None
    assert relay.steps == ["open", "abandon"]


def test_the_error_that_ended_the_loop_is_re_raised_chained_by_every_wait() -> None:
    cause = RuntimeError("broker fenced us")
    relay = Fake(loop_error=cause).start()
    for _ in range(2):
        with pytest.raises(HarvestError, match="relay r1 failed: broker fenced us") as info:
            relay.wait(10)
        assert info.value.__cause__ is cause
    # (the loop may end before start() logged "started": both run after the thread starts)
    assert relay.state is State.STOPPED and "close:stopping" in relay.steps


def test_fatal_picks_what_wait_re_raises() -> None:
    class Unwrapping(Fake):
        def _fatal(self, exc: BaseException) -> BaseException:
            return exc.__cause__ or exc

    inner = ValueError("inner")
    outer = HarvestError("outer")
    outer.__cause__ = inner
    relay = Unwrapping(loop_error=outer).start()
    with pytest.raises(HarvestError) as info:
        relay.wait(10)
    assert info.value.__cause__ is inner
