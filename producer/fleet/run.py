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
from harvest_outbox.producer.fleet.workers import WorkerRole

log = logging.getLogger(__name__)


def run_fleet(
    first: FleetFile,
    read_again: Callable[[], FleetFile | None],
    attach: Callable[[Any], None],
    stopped: threading.Event,
    role: WorkerRole | None = None,
) -> int:
    """Run the fleet until a stop signal; ``attach(fleet)`` hands it to the stop signals, ``stopped``
    is set once one arrived. ``role``: this process is a worker of a supervisor (``fleet.workers``)."""
    from harvest_outbox.producer.fleet.endpoint import start_fleet_endpoint
    from harvest_outbox.producer.fleet.supervisor import Fleet

    if role is not None:
        role.bind_to_parent()
    _raise_open_files_limit()
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
            if role is not None:
                role.said_port(endpoint[0].server_port)
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


def _raise_open_files_limit() -> None:
    """Raise the soft limit on open files to the hard one, as the JVM does for Kafka and Debezium: a led
    outbox holds ~20 descriptors (its connections, librdkafka's sockets and pipes, a waker pair), and the
    common soft limit of 1,024 would stop a fleet near 50 outboxes with "Too many open files"."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1 << 20 if hard == resource.RLIM_INFINITY else min(hard, 1 << 20)  # (Linux's nr_open default)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        log.info("open files limit raised from %d to %d (the hard limit)", soft, want)
    except (OSError, ValueError) as exc:
        log.warning(
            "open files limit stays %d (could not raise it to %d: %s): a large fleet may run out", soft, want, exc
        )


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
