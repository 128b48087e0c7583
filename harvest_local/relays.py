"""harvest relays as real processes (the ``harvest`` CLI with a YAML file), for the demo and fault runs.

A :class:`RelayProcess` is one ``python -m harvest_outbox.producer -f <yaml> --name <name>``; its log goes to a
file, which is also how leadership is observed (the relay logs ``elected leader`` on acquisition).
The DSN travels in the YAML file (mode 0600), never on a command line, where ``ps`` would show it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

#: Environment variables of the crash/pause test hooks, in :func:`producer.relay.crash_points.install_crash_points`'s
#: order (crash, pause): only :mod:`harvest_local.relay_runner` honours them, and only per process.
TEST_HOOKS = ("HARVEST_TEST_CRASH_AT", "HARVEST_TEST_PAUSE_AT")


def write_config(
    path: Path,
    *,
    dsn: str,
    bootstrap: str,
    outbox_table: str,
    group: str | None = None,
    uuid_sequencing: bool = True,
    heartbeat_timeout: str = "2s",
    extra_limits: dict[str, str] | None = None,
    leader_election: str | None = None,
    leader_lock_check_interval: str | None = None,
    shards: int | None = None,
    outbox_layout: str | None = None,
) -> Path:
    """A relay YAML with fast test/demo timings; ``extra_limits`` override or add ``limits`` keys.
    ``group`` names the NELI group (and its leader topic); None leaves both to the defaults."""
    limits = {
        "heartbeatTimeout": heartbeat_timeout,
        "minPollInterval": "100ms",
        "minMetricsInterval": "1s",
        "idlePollInterval": "500ms",
        **(extra_limits or {}),
    }
    lines = [
        "harvest:",
        "  baseKafkaConfig:",
        f'    bootstrap.servers: "{bootstrap}"',
        "  producerKafkaConfig:",
        "    linger.ms: 5",
    ]
    if group is not None:
        lines += [f"  leaderGroupID: {group}", f"  leaderTopic: {group}-leader"]
    lines += [
        f'  dataSource: "{dsn}"',
        f"  outboxTable: {outbox_table}",
        f"  uuidSequencing: {'true' if uuid_sequencing else 'false'}",
    ]
    if leader_election:
        lines.append(f"  leaderElection: {leader_election}")
    if leader_lock_check_interval:
        lines.append(f"  leaderLockCheckInterval: {leader_lock_check_interval}")
    if shards is not None:
        lines.append(f"  shards: {shards}")
    if outbox_layout is not None:
        lines.append(f"  outboxLayout: {outbox_layout}")
    lines.append("  limits:")
    lines += [f"    {k}: {v}" for k, v in limits.items()]
    lines += ["logging:", "  level: Info", ""]
    path.write_text("\n".join(lines))
    os.chmod(path, 0o600)
    return path


class RelayProcess:
    def __init__(
        self, config: Path, name: str, logdir: Path, env: dict[str, str] | None = None, faults: str | None = None
    ) -> None:
        """``faults``: e.g. ``"produce=0.02,delivery=0.02"`` runs the relay through
        :mod:`harvest_local.relay_runner`, which injects them, as do the crash/pause hooks' variables in
        ``env`` (only that runner honours them); otherwise the ``harvest`` CLI itself runs."""
        self.config, self.name, self.faults = config, name, faults
        self.log = logdir / f"{name}.log"
        # The relay's crash/pause test hooks are set per process, never inherited.
        inherited = {k: v for k, v in os.environ.items() if k not in TEST_HOOKS}
        self.env = {**inherited, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False

    def start(self) -> RelayProcess:
        with self.log.open("a") as log:
            module, env = "harvest_outbox.producer", dict(self.env)
            if self.faults or any(k in env for k in TEST_HOOKS):
                module, env["HARVEST_FAULTS"] = "harvest_outbox.harvest_local.relay_runner", self.faults or ""
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, "-f", str(self.config), "--name", self.name],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def elections(self) -> int:
        """How many times this relay logged an election (acquisitions of leadership)."""
        return self.text().count("elected leader")

    def fenced(self) -> int:
        """How many times this relay's Postgres election fenced it."""
        return self.text().count(": fenced")

    def kill(self) -> None:
        if self.alive:
            assert self.proc is not None
            if self.paused:
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()

    def pause(self) -> None:
        if self.alive:
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.alive and self.paused:
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGCONT)
            self.paused = False

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (after SIGCONT: it may have been stopped from outside), then SIGKILL after ``timeout``."""
        if not self.alive:
            return self.proc.returncode if self.proc else None
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def current_leader(relays: list[RelayProcess]) -> RelayProcess | None:
    """The live relay that most recently logged an election (logs are appended, so compare mtimes)."""
    best: tuple[float, RelayProcess] | None = None
    for relay in relays:
        if relay.alive and not relay.paused and relay.elections() > 0:
            stamp = _last_election_time(relay)
            if best is None or stamp > best[0]:
                best = (stamp, relay)
    return best[1] if best else None


def _last_election_time(relay: RelayProcess) -> float:
    # Log lines start with an asctime; fall back to the file's mtime.
    for line in reversed(relay.text().splitlines()):
        if "elected leader" in line:
            try:
                return time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))
            except ValueError:
                break
    return relay.log.stat().st_mtime


def wait_for(cond: Callable[[], object], timeout: float, what: str = "condition", poll: float = 0.05) -> float:
    """Seconds until ``cond()`` held; ``TimeoutError`` naming ``what`` after ``timeout`` seconds."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(poll)
    return time.monotonic() - start
