"""Stop signals of the ``harvest`` command, run as a real process: SIGTERM, SIGINT and SIGHUP stop the
relay gracefully with exit code 0 whenever they arrive (while the interpreter is still starting,
while a NELI relay looks for a Kafka that does not answer, while it runs), and a second one while it
stops ends the process at once with exit code 3."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from seqcheck import Expected, write_traffic

from harvest_outbox.harvest_local.relays import wait_for, write_config
from harvest_outbox.producer.schema.ddl import init_db

EXIT_FORCED = 3  # producer.ops.cli.EXIT_FORCED

pytestmark = pytest.mark.integration

#: Seconds a stop signal may take to end the relay (a loaded CI machine included).
PROMPT = 4.0


def _closed_port() -> str:
    """An address nothing listens on (a Kafka that does not answer)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _start(cfg: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "harvest_outbox.producer", "-f", str(cfg), "--name", "sig"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def _catches(pid: int, sig: signal.Signals) -> bool:
    """The process has a handler for ``sig`` (its SigCgt mask in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return bool(caught >> (sig - 1) & 1)


def _ended(proc: subprocess.Popen[bytes], log: Path, within: float) -> int:
    try:
        return proc.wait(within)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"still running {within:g}s after the signal:\n{log.read_text()[-3000:]}")


@pytest.mark.parametrize(
    "sig, delay",
    [
        (signal.SIGTERM, 0.0),
        (signal.SIGTERM, 0.1),
        (signal.SIGTERM, 1.5),
        (signal.SIGINT, 1.5),
        (signal.SIGHUP, 0.0),
        (signal.SIGHUP, 1.5),
    ],
    ids=lambda v: v.name if isinstance(v, signal.Signals) else f"{v}s",
)
def test_a_signal_stops_a_relay_whose_kafka_does_not_answer(
    sig: signal.Signals, delay: float, pg_dsn: str, pg_schema: str, tmp_path: Path, unique_name: Callable[[str], str]
) -> None:
    """``delay`` after the process first catches the signal: 0 is while the interpreter still imports
    the relay (the handlers come first), 1.5 s is while the NELI election waits for Kafka."""
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    cfg = write_config(
        tmp_path / "relay.yaml", dsn=pg_dsn, bootstrap=_closed_port(), outbox_table=table, group=unique_name("g")
    )
    log = tmp_path / "relay.log"
    proc = _start(cfg, log)
    wait_for(lambda: _catches(proc.pid, sig) or proc.poll() is not None, 10, "the stop-signal handlers", poll=0.001)
    time.sleep(delay)
    assert proc.poll() is None, log.read_text()
    proc.send_signal(sig)
    assert _ended(proc, log, PROMPT) == 0, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()


def test_a_signal_stops_a_sharded_relay_whose_kafka_does_not_answer(
    pg_dsn: str, pg_schema: str, tmp_path: Path, unique_name: Callable[[str], str]
) -> None:
    """``shards: 4`` with NELI: the per-shard leader topic is looked up by the shard election."""
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table, shards=4)
    cfg = write_config(
        tmp_path / "relay.yaml",
        dsn=pg_dsn,
        bootstrap=_closed_port(),
        outbox_table=table,
        group=unique_name("g"),
        shards=4,
    )
    log = tmp_path / "relay.log"
    proc = _start(cfg, log)
    time.sleep(2.0)
    assert proc.poll() is None, log.read_text()
    proc.send_signal(signal.SIGTERM)
    assert _ended(proc, log, PROMPT) == 0, log.read_text()[-3000:]
    assert "stopped while starting" in log.read_text()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda v: v.name)
def test_a_signal_stops_a_running_relay(
    sig: signal.Signals,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    tmp_path: Path,
    unique_name: Callable[[str], str],
) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    cfg = write_config(
        tmp_path / "relay.yaml", dsn=pg_dsn, bootstrap=kafka_bootstrap, outbox_table=table, group=unique_name("g")
    )
    log = tmp_path / "relay.log"
    proc = _start(cfg, log)
    try:
        wait_for(lambda: "elected leader" in log.read_text() or proc.poll() is not None, 60, "the relay to lead")
        proc.send_signal(sig)
        assert _ended(proc, log, PROMPT) == 0, log.read_text()[-3000:]
        assert f"received {sig.name}: stopping" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_second_signal_while_stopping_exits_at_once(
    pg_dsn: str, pg_schema: str, tmp_path: Path, topic_factory: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    """The graceful stop waits for the records in flight to a Kafka that does not answer; the second
    SIGTERM ends that wait."""
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    write_traffic(pg_dsn, table, "t", Expected(), 0, 3, rollback_rate=0.0)
    cfg = write_config(
        tmp_path / "relay.yaml",
        dsn=pg_dsn,
        bootstrap=_closed_port(),
        outbox_table=table,
        uuid_sequencing=False,
        leader_election="postgres",
        leader_lock_check_interval="200ms",
    )
    log = tmp_path / "relay.log"
    proc = _start(cfg, log)
    try:
        wait_for(lambda: "elected leader" in log.read_text() or proc.poll() is not None, 60, "the relay to lead")
        time.sleep(1.0)  # the leader's records are in flight
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert proc.poll() is None, "the graceful stop did not wait for the records in flight: nothing to force"
        proc.send_signal(signal.SIGTERM)
        assert _ended(proc, log, PROMPT) == EXIT_FORCED, log.read_text()[-3000:]
        assert "received SIGTERM again while stopping: exiting now" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
