"""The lifecycle every relay process shares: :class:`~producer.harvest.Harvest` (one relay loop) and
:class:`~producer.relay.sharded.ShardedHarvest` (``shards: S``: a shard election around a relay loop).

``start()`` opens what the relay needs (:meth:`RelayLifecycle._open`), then runs
:meth:`RelayLifecycle._loop` on its own thread until ``stop()``; ``wait()`` joins it and re-raises
the error that ended it. The subclasses say what opening, looping, abandoning a failed start and
closing mean; this class owns the states and their order.

Invariants:
- ``state`` goes CREATED -> RUNNING -> STOPPING -> STOPPED, or CREATED -> STOPPED when ``start()``
  fails or a ``stop()`` arrived while it was starting (then whatever was opened is released and no
  thread runs); ``start()`` in any other state raises :class:`~producer.errors.HarvestError`;
- ``state`` reads STOPPING as soon as ``stop()`` is called on a running relay;
- the loop's thread always ends through :meth:`RelayLifecycle._close`, after which ``state`` is
  STOPPED; an error that ended the loop is kept and re-raised, chained, by every later ``wait()``.
"""

from __future__ import annotations

import enum
import logging
import threading
from abc import ABC, abstractmethod
from typing import Any, TypeVar

from harvest_outbox.producer.config import HarvestConfig
from harvest_outbox.producer.errors import HarvestError, LayoutChanged

__all__ = ["RelayLifecycle", "State"]

_R = TypeVar("_R", bound="RelayLifecycle")


class State(enum.Enum):
    CREATED = "created"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


class RelayLifecycle(ABC):
    """Start, stop, wait and the states of a relay process (module doc); subclasses fill in the steps."""

    config: HarvestConfig
    #: The subclass's module logger: its lines keep their logger name.
    _log: logging.Logger
    #: The loop thread is named ``<_THREAD_PREFIX>-<relay name>``.
    _THREAD_PREFIX = "harvest"

    def _init_lifecycle(self) -> None:
        self._stop_requested = threading.Event()
        self._state = State.CREATED
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._prometheus: Any = None

    # ------------------------------------------------------------------ what a subclass says
    @abstractmethod
    def _open(self) -> None:
        """Connect and join the election (fail fast); runs on the caller's thread."""

    @abstractmethod
    def _abandon_start(self) -> None:
        """Release what a failed or stopped-while-starting ``_open`` opened; the state becomes STOPPED."""

    @abstractmethod
    def _log_started(self) -> None:
        """Say, once the loop runs, where the relay started and how it elects."""

    @abstractmethod
    def _loop(self) -> None:
        """The relay thread's work until ``_stop_requested`` is set; raising ends the relay with that error."""

    def _fatal(self, exc: BaseException) -> BaseException:
        """The error ``wait()`` re-raises for ``exc``, which ended the loop."""
        return exc

    @abstractmethod
    def _close(self) -> None:
        """Release everything after the loop ended (may set ``_error`` if there is none yet)."""

    # ------------------------------------------------------------------ the lifecycle
    @property
    def state(self) -> State:
        return State.STOPPING if self._state is State.RUNNING and self._stop_requested.is_set() else self._state

    @property
    def prometheus_port(self) -> int | None:
        """The port the Prometheus endpoint listens on (useful with ``prometheus_port=0``)."""
        return None if self._prometheus is None else int(self._prometheus[0].server_port)

    def start(self: _R) -> _R:
        """Connect and join the election; the relay loop runs on its own thread. A ``stop()`` meanwhile
        (from a signal handler, on this thread) ends a wait for Kafka: the relay returns stopped."""
        if self._state is not State.CREATED:
            raise HarvestError(f"cannot start a relay in state {self._state.value}")
        from harvest_outbox.producer.db.credentials import provide

        provide(self.config.data_source, self.config.password_provider)  # before any connection
        from harvest_outbox.producer.kafka.probe import check_connection

        try:
            # A TLS or SASL setting that cannot work fails the start now, naming the fix (not a relay that
            # retries the handshake forever).
            check_connection(self.config.base_kafka_config, stop=self._stop_requested, what=f"relay {self.config.name}")
            self._open()
        except BaseException:
            self._abandon_start()
            raise
        if self._stop_requested.is_set():  # stopped while starting (a signal while Kafka did not answer)
            self._abandon_start()
            self._log.info("relay %s stopped while starting", self.config.name)
            return self
        self._state = State.RUNNING
        self._thread = threading.Thread(target=self._run, name=f"{self._THREAD_PREFIX}-{self.config.name}", daemon=True)
        self._thread.start()
        self._log_started()
        return self

    def stop(self) -> None:
        """Ask the relay to stop: it drains in-flight records, flushes purges, leaves the election."""
        self._stop_requested.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the relay to stop; True if it did. Re-raises the error that killed it, if any."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False
        if self._error is not None:
            raise HarvestError(f"relay {self.config.name} failed: {self._error}") from self._error
        return True

    def __enter__(self: _R) -> _R:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.wait()

    def _run(self) -> None:
        try:
            self._loop()
        except LayoutChanged as exc:  # an online migration (producer/relay/layout_change.py): expected, no trace
            self._log.warning("relay %s stops: %s", self.config.name, exc)
            self._error = self._fatal(exc)
        except BaseException as exc:  # fatal: remember it for wait(), then shut down
            self._log.exception("relay %s failed", self.config.name)
            self._error = self._fatal(exc)
        finally:
            self._state = State.STOPPING
            self._close()
            self._state = State.STOPPED
            self._log.info("relay %s stopped", self.config.name)
