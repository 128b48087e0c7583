"""``fleet.workers: N``: one fleet file relayed by N worker processes under one supervisor.

A fleet process runs every relay it leads on one interpreter: its relays' threads take turns at one
lock, so a fleet uses about one core however many the machine has, and a busy outbox's relay holds
that lock while a trickling one waits (docs/fleet.md, "Worker processes"). With ``workers: N`` the
``harvest`` process becomes a supervisor: it starts N ``harvest`` processes on the same file, each a
fleet process as when run by hand (its own sessions, pool and Kafka producers), named
``<name>-w<k>``, and the balance (producer/fleet/balance.py) shares the outboxes between them as it
does between fleet processes on several hosts. The supervisor relays nothing itself.

Invariants (``tests/test_producer/fleet/test_fleet_workers.py``):
- a worker that exits while the supervisor runs is started again after ``restartBackoff`` (doubled per
  exit within ``STEADY`` seconds of its start, up to ``restartBackoffMax``); its outboxes fail over to
  the other workers in the meantime, as for any fleet process;
- SIGTERM / SIGINT to the supervisor stop every worker gracefully (their in-flight records drained) and
  the supervisor exits when the last one has (the signal's handler only sets a flag, :meth:`Workers.stop`:
  it never waits for the lock that starting a worker holds); SIGHUP is passed on (each worker reads the file);
- workers never outlive the supervisor: each stops gracefully (one SIGTERM to itself) within
  ``PARENT_CHECK`` seconds of its supervisor's death, a kill -9 too;
- workers are in a session of their own: a terminal's Ctrl-C reaches the supervisor only, which
  passes one SIGTERM on (a second signal to a worker would end its drain);
- the supervisor's endpoint (``prometheusPort``) answers for the workers'
  (producer/fleet/worker_endpoint.py). The supervisor's life: ``producer.fleet.run.run_workers``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harvest_outbox.producer.fleet.spec import FleetFile, FleetOptions

log = logging.getLogger(__name__)

#: A worker that ran this long before it exited starts again after the first backoff, not a doubled one.
STEADY = 60.0
#: How often the supervisor looks at its workers (and for a SIGHUP).
WATCH_INTERVAL = 0.2
#: The hidden flag that makes a ``harvest run`` a worker: ``--fleet-worker <k>/<n>/<supervisor pid>``.
WORKER_FLAG = "--fleet-worker"
#: ... and where it writes its endpoint's port: ``--fleet-worker-port-file <path>``.
PORT_FILE_FLAG = "--fleet-worker-port-file"
#: How often a worker looks whether its supervisor is still there.
PARENT_CHECK = 0.5


@dataclass(frozen=True)
class WorkerRole:
    """What a worker process knows of its place: its index, where it says its port, its supervisor."""

    index: int
    port_file: str | None
    parent: int

    @staticmethod
    def parse(value: str, port_file: str | None) -> WorkerRole:
        """``value``: ``<index>/<count>/<supervisor's pid>`` (the pid given, not read: a supervisor killed
        while its worker starts must not leave it running)."""
        try:
            k, n, parent = (int(x) for x in value.split("/"))
        except ValueError:
            raise ValueError(f"{WORKER_FLAG}: {value!r} is not <index>/<count>/<supervisor pid>") from None
        if not 0 <= k < n:
            raise ValueError(f"{WORKER_FLAG}: {value!r}: the index must be below the count")
        return WorkerRole(k, port_file, parent)

    def bind_to_parent(self) -> None:
        """One SIGTERM to this process (a graceful stop) once its supervisor is gone: a thread looks at the
        parent process every ``PARENT_CHECK`` seconds. (Not Linux's parent-death signal: it comes once per
        thread of the dying parent, and a second SIGTERM would end the drain.)"""

        def watch() -> None:
            while os.getppid() == self.parent:
                time.sleep(PARENT_CHECK)
            log.warning("worker %d: the supervisor (pid %d) is gone: stopping", self.index, self.parent)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, name="harvest-worker-parent", daemon=True).start()

    def said_port(self, port: int) -> None:
        """Tell the supervisor where this worker's endpoint listens (written whole, then renamed)."""
        if self.port_file is None:
            return
        tmp = f"{self.port_file}.tmp"
        Path(tmp).write_text(str(port))
        os.replace(tmp, self.port_file)


def worker_name(base_name: str, index: int) -> str:
    return f"{base_name}-w{index}"


class Worker:
    """One worker process: started, watched, started again."""

    def __init__(self, index: int, command: Sequence[str], port_file: Path) -> None:
        self.index = index
        self.command = list(command)
        self.port_file = port_file
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.restarts = 0
        self.backoff = 0.0
        self.next_start = 0.0
        self.last_exit: int | None = None

    def start(self) -> None:
        self.port_file.unlink(missing_ok=True)
        # A session (and process group) of its own: the terminal's Ctrl-C goes to the supervisor, which
        # passes on one SIGTERM.
        self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, start_new_session=True)
        self.started_at = time.monotonic()
        log.info("worker %d started (pid %d)", self.index, self.proc.pid)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def port(self) -> int | None:
        """The worker's endpoint port, once it said it (None before, or while it is down)."""
        if self.pid is None:
            return None
        try:
            return int(self.port_file.read_text())
        except (OSError, ValueError):
            return None

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:  # it exited between the poll and the signal
                pass


def worker_commands(
    fleet: FleetFile, argv: Sequence[str], folder: Path, python: str = sys.executable
) -> list[list[str]]:
    """Each worker's command line: the supervisor's own arguments, then what makes the process worker k
    (argparse takes the last of a repeated option): its name, its index, where it says its endpoint's port.
    Each worker's endpoint listens on this host only, on a port of the kernel's choosing, with the file's
    ``prometheusBasicAuth``."""
    n = fleet.options.workers
    commands = []
    for k in range(n):
        own = [python, "-m", "harvest_outbox.producer", *argv, "--name", worker_name(fleet.base_name, k)]
        own += [WORKER_FLAG, f"{k}/{n}/{os.getpid()}", PORT_FILE_FLAG, str(port_file(folder, k))]
        if fleet.prometheus_port is not None:
            own += ["--prometheus-port", "0", "--prometheus-bind-address", "127.0.0.1"]
        commands.append(own)
    return commands


def port_file(folder: Path, index: int) -> Path:
    return folder / f"w{index}.port"


class Workers:
    """The supervisor: ``start()``, then ``look()`` every ``WATCH_INTERVAL`` until ``stop()``; ``wait()``
    for the workers' exits.
    ``commands``: each worker's command line (:func:`worker_commands`); ``folder``: where they say their
    ports (removed by ``wait()``)."""

    def __init__(self, options: FleetOptions, commands: Sequence[Sequence[str]], folder: Path) -> None:
        self.options = options
        self._dir = folder
        self.workers = [Worker(k, command, port_file(folder, k)) for k, command in enumerate(commands)]
        self.stopping = threading.Event()
        self.started = threading.Event()
        self._lock = threading.Lock()  # a worker is never started again once terminate() has signalled them
        self._terminated = False

    def start(self) -> None:
        for w in self.workers:
            w.start()
        self.started.set()

    def look(self) -> None:
        """Start again, after its backoff, a worker that exited (the supervisor's main loop calls it every
        ``WATCH_INTERVAL``)."""
        now = time.monotonic()
        for w in self.workers:
            self._look_at(w, now)

    def _look_at(self, w: Worker, now: float) -> None:
        if self.stopping.is_set():  # the workers are stopping: wait() reaps them and says how each ended
            return
        if w.proc is None:
            with self._lock:
                if now >= w.next_start and not self.stopping.is_set():
                    w.restarts += 1
                    try:
                        w.start()
                    except OSError as exc:  # (no process to start: out of memory or pids)
                        w.backoff = min(self.options.restart_backoff_max, 2 * w.backoff or self.options.restart_backoff)
                        w.next_start = now + w.backoff
                        log.error("worker %d did not start (%s); trying again in %gs", w.index, exc, w.backoff)
            return
        code = w.proc.poll()
        if code is None or self.stopping.is_set():
            return
        ran = now - w.started_at
        first, most = self.options.restart_backoff, self.options.restart_backoff_max
        w.backoff = first if ran >= STEADY or not w.backoff else min(most, w.backoff * 2)
        w.last_exit, w.proc, w.next_start = code, None, now + w.backoff
        log.error(
            "worker %d exited (%s) after %.1fs; its outboxes fail over to the other workers; starting it again in %gs",
            w.index,
            _exit_said(code),
            ran,
            w.backoff,
        )

    def reload(self) -> None:
        """SIGHUP: every worker reads the file again."""
        for w in self.workers:
            w.signal(signal.SIGHUP)

    def stop(self) -> None:
        """Ask for the stop (a stop signal's handler calls it: it only sets a flag, so it never waits for the
        lock that starting a worker holds); :meth:`terminate` carries it out."""
        self.stopping.set()

    def terminate(self) -> None:
        """Stop every worker gracefully: one SIGTERM each (a second one would end its drain), and none
        started again after it."""
        with self._lock:
            self.stopping.set()
            if self._terminated:
                return
            self._terminated = True
            for w in self.workers:
                w.signal(signal.SIGTERM)

    def wait(self) -> int:
        """Wait for every worker to exit; 0 when each stopped cleanly, else the first other exit code."""
        worst = 0
        for w in self.workers:
            if w.proc is None:
                continue
            code = w.proc.wait()
            log.info("worker %d stopped (%s)", w.index, _exit_said(code))
            if code not in (0, -signal.SIGTERM) and not worst:
                worst = code if code > 0 else 1
        for f in self._dir.glob("*"):
            f.unlink(missing_ok=True)
        self._dir.rmdir()
        return worst

    def statuses(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        out = []
        for w in self.workers:
            pid = w.pid
            out.append(
                {
                    "worker": w.index,
                    "state": "running" if pid is not None else ("stopped" if self.stopping.is_set() else "backoff"),
                    "pid": pid,
                    "restarts": w.restarts,
                    "last_exit": w.last_exit,
                    **({"starts_in_s": round(max(0.0, w.next_start - now), 1)} if pid is None else {}),
                }
            )
        return out


def _exit_said(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
