"""``harvest run -f fleet.yaml``: the fleet as a process, SIGHUP reloading the file; or, with
``fleet.workers``, the supervisor of its worker processes (:func:`run_workers`, producer/fleet/workers.py).

In a fleet, SIGHUP means "read the file again" (new outboxes start, removed ones stop and hand over,
changed ones restart; discovery looks again); SIGTERM / SIGINT stop every outbox's relay gracefully,
as for one relay. A file that no longer reads is logged and the fleet keeps its last good one.
"""

from __future__ import annotations

import logging
import signal
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.producer.fleet.spec import FleetFile
from harvest_outbox.producer.fleet.workers import (
    WATCH_INTERVAL,
    WorkerRole,
    Workers,
    worker_commands,
    worker_name,
)

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


def _file_again(read_again: Callable[[], FleetFile | None], keeper: str) -> tuple[bool, FleetFile | None]:
    """The file read again on SIGHUP: (whether it read, the fleet file or None for one relay's file); an
    error is logged, saying that ``keeper`` keeps its last good config."""
    try:
        return True, read_again()
    except ConfigError as exc:
        log.error("SIGHUP: the file does not read (%s); %s keeps its last good config", exc, keeper)
        return False, None


def _reload(fleet: Any, read_again: Callable[[], FleetFile | None]) -> None:
    read, file = _file_again(read_again, "the fleet")
    if not read:
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


def run_workers(
    first: FleetFile,
    argv: Sequence[str],
    read_again: Callable[[], FleetFile | None],
    attach: Callable[[Any], None],
    stopped: threading.Event,
) -> int:
    """The supervisor's life: start the workers, serve the endpoint, pass SIGHUP on, stop on a stop
    signal (``attach`` hands the supervisor to the stop signals; ``read_again`` reads the file on SIGHUP)."""
    from harvest_outbox.producer.fleet.worker_endpoint import start_workers_endpoint

    folder = Path(tempfile.mkdtemp(prefix="harvest-workers-"))
    workers = Workers(first.options, worker_commands(first, argv, folder), folder)
    reload_asked = threading.Event()
    previous = signal.signal(signal.SIGHUP, lambda _s, _f: reload_asked.set())
    log.info(
        "fleet.workers: %d worker processes share the outboxes (named %s .. %s)",
        len(workers.workers),
        worker_name(first.base_name, 0),
        worker_name(first.base_name, len(workers.workers) - 1),
    )
    endpoint = None
    try:
        if first.prometheus_port is not None:
            endpoint = start_workers_endpoint(
                workers, first.prometheus_port, first.prometheus_bind_address, first.prometheus_basic_auth
            )
        attach(workers)
        if not stopped.is_set():
            workers.start()
        # This thread starts the workers, starts them again when they exit, and waits for them at the end.
        while not stopped.is_set():
            if reload_asked.wait(WATCH_INTERVAL) and not stopped.is_set():
                reload_asked.clear()
                _said_on_reload(first, read_again)
                workers.reload()
            workers.look()
    finally:
        signal.signal(signal.SIGHUP, previous)
        workers.terminate()
        code = workers.wait()
        if endpoint is not None:
            endpoint[0].shutdown()
    return code


def _said_on_reload(first: FleetFile, read_again: Callable[[], FleetFile | None]) -> None:
    """What a SIGHUP changes here: the workers read the file themselves; their number stays until a restart."""
    read, file = _file_again(read_again, "each worker")
    if not read:
        return
    if file is not None and file.options.workers != first.options.workers:
        log.warning(
            "SIGHUP: fleet.workers is now %d; the %d running workers stay until the process restarts",
            file.options.workers,
            first.options.workers,
        )
    log.info("SIGHUP: passed on to every worker")
