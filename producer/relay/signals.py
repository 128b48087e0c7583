"""How the ``harvest run`` process answers stop signals.

SIGTERM, SIGINT and SIGHUP all ask for a graceful stop (SIGHUP too: the relay has no configuration to
reload, and a hang-up of the terminal or of a supervisor that sends it means "go away", not "die
mid-drain"): the relay drains its records in flight, flushes or commits, leaves the election, and
the process exits 0. The handlers are installed before anything slow (this module imports only the
standard library, and the command installs them before it loads the relay), and a signal that
arrives before the relay exists is remembered and honoured as soon as it does.

A second stop signal while stopping ends the process at once with the ``forced`` exit code: the
operator chose not to wait for the drain. Nothing is lost by it: undelivered rows stay in the outbox
and the next leader sends them (records already in flight may be sent twice, as after a crash).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

log = logging.getLogger("harvest")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


#: A signal handler as ``signal.signal`` takes and returns it (None: one not installed from Python).
Handler = Callable[[int, "FrameType | None"], Any] | int | signal.Handlers | None


class Stoppable(Protocol):
    def stop(self) -> None: ...


class StopSignals:
    """The process's stop-signal handlers: ``install()``, then ``attach(relay)`` once it exists."""

    def __init__(self, forced_exit: int) -> None:
        self.requested = threading.Event()
        self._forced_exit = forced_exit
        self._relay: Stoppable | None = None
        self._previous: dict[int, Handler] = {}
        self._signal = signal.SIGTERM  # the first stop signal received

    def install(self) -> StopSignals:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def release(self) -> None:
        """Restore the previous handlers (a command that is not the relay ends as the signal says);
        a stop signal that already arrived is delivered again, to them."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        if self.requested.is_set():
            signal.raise_signal(self._signal)

    def attach(self, relay: Stoppable) -> None:
        """``relay.stop()`` on the next stop signal, or now if one already arrived."""
        self._relay = relay
        if self.requested.is_set():
            relay.stop()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested.is_set():
            log.warning(
                "received %s again while stopping: exiting now, without waiting for the drain "
                "(undelivered rows stay in the outbox)",
                name,
            )
            for handler in logging.getLogger().handlers:
                handler.flush()
            # os._exit, not sys.exit: an interpreter exit would still join the database workers and
            # let librdkafka flush, which is exactly the wait the operator refused.
            os._exit(self._forced_exit)
        self._signal = signal.Signals(signum)
        self.requested.set()
        log.info("received %s: stopping (draining in-flight records; send it again to exit at once)", name)
        if self._relay is not None:
            self._relay.stop()
