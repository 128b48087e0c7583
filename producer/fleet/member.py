"""One outbox of a fleet: its relay, run on a thread of its own and started again after a failure.

The member owns its relay's whole life. Starting a relay connects (to the outbox's database and to
Kafka) and may wait on a slow or lost server; that wait is this member's, on its own thread, so it
never holds up the fleet's other outboxes or the supervisor. A relay that fails (its database
dropped, its schema gone, a fatal Kafka error) is logged with the outbox's id and started again after
``restartBackoff``, doubled per failure in a row up to ``restartBackoffMax``; a relay that ran
:data:`HEALTHY_RUN` seconds resets the backoff.

Invariants (``tests/test_producer/fleet/test_fleet_supervisor.py``):
- at most one relay of the member exists at a time, and a new one is made only after the last one
  stopped (its election left, its connections closed), so one process never holds two leaderships of
  one outbox;
- ``stop()`` ends the member whatever its relay is doing (starting, running, waiting out a backoff);
  ``join()`` returns once its relay stopped;
- a failure is reported (``failures``, ``last_error``, redacted) and never raised to the fleet;
- a hand-over (:meth:`Member.handover`) is a graceful stop followed at once by a new relay, never
  counted as a failure.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harvest_outbox.producer.config import format_duration
from harvest_outbox.producer.fleet.spec import FleetOptions, Outbox
from harvest_outbox.redact import redact_error

log = logging.getLogger(__name__)

#: Seconds a relay must run for its next failure to start the backoff over.
HEALTHY_RUN = 60.0
#: How often the member looks at its running relay (a stop or a hand-over tells the relay itself, and a
#: relay that ends is seen at once: this only bounds how long a missed stop request could go unseen). Each
#: look wakes the member's thread; at 1 s, a 1,000-outbox fleet woke 1,000 threads a second for nothing.
WATCH_INTERVAL = 10.0

RelayFactory = Callable[[Any], Any]  # HarvestConfig -> Harvest | ShardedHarvest


@dataclass(frozen=True)
class MemberStatus:
    id: str
    state: str  # starting | running | backoff | stopping | stopped
    failures: int
    last_error: str | None
    relay: Any  # the current relay, or None


class Member:
    def __init__(self, outbox: Outbox, options: FleetOptions, relay_factory: RelayFactory) -> None:
        self.outbox = outbox
        self._options = options
        self._factory = relay_factory
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._relay: Any = None
        self._state = "starting"
        self.failures = 0
        self.last_error: str | None = None
        self._handing_over = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"harvest-fleet-{outbox.id}", daemon=True)

    @property
    def id(self) -> str:
        return self.outbox.id

    def start(self) -> Member:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            relay = self._relay
        if relay is not None:
            relay.stop()

    def handover(self) -> bool:
        """Stop the running relay gracefully (drained, its lock released, the standbys told) and start a
        new one as a standby at once: the fleet's balance moving this outbox to another process."""
        with self._lock:
            relay, state = self._relay, self._state
        if relay is None or state != "running" or self._stop.is_set():
            return False
        self._handing_over.set()
        relay.stop()
        return True

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def status(self) -> MemberStatus:
        with self._lock:
            return MemberStatus(self.id, self._state, self.failures, self.last_error, self._relay)

    def _set(self, state: str, relay: Any = None) -> None:
        with self._lock:
            self._state, self._relay = state, relay

    def _run(self) -> None:
        backoff = self._options.restart_backoff
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                relay = self._factory(self.outbox.config)
                self._set("starting", relay)
                if self._stop.is_set():  # stop() came before the relay existed to be told
                    relay.stop()
                relay.start()  # returns stopped when stop() came while it waited for a server
                self._set("running", relay)
                while not relay.wait(WATCH_INTERVAL):
                    if self._stop.is_set():
                        relay.stop()
                if self._stop.is_set():
                    break
                if self._handing_over.is_set():
                    self._handing_over.clear()
                    log.info("outbox %s: handed over to another process of the fleet (balance)", self.id)
                    continue
                raise RuntimeError("the relay stopped without being asked to")
            except Exception as exc:
                if self._stop.is_set():
                    break
                self.failures += 1
                self.last_error = redact_error(str(exc), self.outbox.config.data_source)
                if time.monotonic() - began >= HEALTHY_RUN:
                    backoff = self._options.restart_backoff
                log.error(
                    "outbox %s: relay failed (%s); starting it again in %s (failure %d; the other "
                    "outboxes are not affected)",
                    self.id,
                    self.last_error,
                    format_duration(backoff),
                    self.failures,
                )
            self._set("backoff")
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self._options.restart_backoff_max)
        self._set("stopped")
