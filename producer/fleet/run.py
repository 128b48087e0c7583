"""``harvest run -f fleet.yaml``: the fleet as a process, SIGHUP reloading the file.

In a fleet, SIGHUP means "read the file again" (new outboxes start, removed ones stop and hand over,
changed ones restart; discovery looks again); SIGTERM / SIGINT stop every outbox's relay gracefully,
as for one relay. A file that no longer reads is logged and the fleet keeps its last good one.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.producer.fleet.spec import FleetFile

log = logging.getLogger(__name__)


def run_fleet(
    first: FleetFile,
    read_again: Callable[[], FleetFile | None],
    attach: Callable[[Any], None],
    stopped: threading.Event,
) -> int:
    """Run the fleet until a stop signal; ``attach(fleet)`` hands it to the stop signals, ``stopped``
    is set once one arrived."""
    from harvest_outbox.producer.fleet.endpoint import start_fleet_endpoint
    from harvest_outbox.producer.fleet.supervisor import Fleet

    fleet = Fleet(first)
    reload_asked = threading.Event()
    previous = signal.signal(signal.SIGHUP, lambda _s, _f: reload_asked.set())
    attach(fleet)
    endpoint = None
    try:
        if first.prometheus_port is not None:
            endpoint = start_fleet_endpoint(
                fleet, first.prometheus_port, first.prometheus_bind_address, first.prometheus_basic_auth
            )
        if not stopped.is_set():
            fleet.start()
        while not stopped.is_set():
            if reload_asked.wait(0.5) and not stopped.is_set():
                reload_asked.clear()
                _reload(fleet, read_again)
    finally:
        signal.signal(signal.SIGHUP, previous)
        fleet.stop()
        fleet.wait()
        if endpoint is not None:
            endpoint[0].shutdown()
    return 0


def _reload(fleet: Any, read_again: Callable[[], FleetFile | None]) -> None:
    try:
        file = read_again()
    except ConfigError as exc:
        log.error("SIGHUP: the file does not read (%s); the fleet keeps its last good config", exc)
        return
    if file is None:
        log.error("SIGHUP: the file is not a fleet file any more; the fleet keeps its last good config")
        return
    change = fleet.reload(file)
    log.info("SIGHUP: config read again; %s", _said(change))


def _said(change: Any) -> str:
    if not change:
        return "nothing changed"
    return f"started {list(change.added)}, stopped {list(change.removed)}, restarted {list(change.changed)}"
