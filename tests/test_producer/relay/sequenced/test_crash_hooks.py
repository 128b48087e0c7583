"""The ``--uuid-sequencing`` crash/pause test hooks stay out of production: the ``harvest`` command
ignores ``HARVEST_TEST_CRASH_AT`` / ``HARVEST_TEST_PAUSE_AT`` (a relay that inherits them from a
stray environment neither stops itself nor dies of a traceback); only the test-only relay runner
(:mod:`harvest_local.relay_runner`) installs them, and it names a bad value in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from seqcheck import Expected, count_rows, seq_yaml, wait_for, write_traffic

from harvest_outbox.harvest_local.relays import RelayProcess
from harvest_outbox.producer.relay.crash_points import CRASH_POINTS
from harvest_outbox.producer.schema.ddl import init_db


def _state(pid: int) -> str:
    """The process's state letter in /proc (``T``: stopped by a signal)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


@pytest.mark.integration
@pytest.mark.parametrize(
    "var, value",
    [
        ("HARVEST_TEST_PAUSE_AT", "after_publish_before_delivery:1"),
        ("HARVEST_TEST_CRASH_AT", "after_commit_before_ack:1"),
        ("HARVEST_TEST_PAUSE_AT", "no_such_point:x"),
    ],
)
def test_the_harvest_command_ignores_the_hook_variables(
    var: str,
    value: str,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    tmp_path: Path,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic = topic_factory(partitions=2)
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    cfg = seq_yaml(
        tmp_path / "harvest.yaml", pg_dsn, kafka_bootstrap, table, unique_name("g"), leader_election="postgres"
    )
    write_traffic(pg_dsn, table, topic, Expected(), 0, 5, rollback_rate=0.0)
    relay = RelayProcess(cfg, "prod", tmp_path)
    env = {**relay.env, var: value}
    with relay.log.open("w") as out:  # the production command itself, not the test runner
        relay.proc = subprocess.Popen(
            [sys.executable, "-m", "harvest_outbox.producer", "-f", str(cfg), "--name", "prod"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    try:
        wait_for(
            lambda: count_rows(pg_dsn, table) == 0 or not relay.alive or _state(relay.proc.pid) == "T",
            60,
            "the relay to drain the outbox",
        )
        assert relay.alive and _state(relay.proc.pid) != "T", relay.text()[-3000:]
        assert count_rows(pg_dsn, table) == 0
        more = threading.Thread(
            target=write_traffic, args=(pg_dsn, table, topic, Expected(), 1, 5), kwargs=dict(rollback_rate=0.0)
        )
        more.start()
        more.join()
        wait_for(lambda: count_rows(pg_dsn, table) == 0 or not relay.alive, 60, "the second batch")
        assert relay.alive and count_rows(pg_dsn, table) == 0, relay.text()[-3000:]
        assert relay.stop() == 0
        assert "test hook" not in relay.text() and "Traceback" not in relay.text()
    finally:
        relay.kill()


@pytest.mark.parametrize(
    "var, value, needle",
    [
        ("HARVEST_TEST_CRASH_AT", "after_commit:2", "'after_commit' is not a crash point"),
        ("HARVEST_TEST_PAUSE_AT", "after_some_acks:two", "'two' is not a whole number"),
        ("HARVEST_TEST_CRASH_AT", "after_some_acks:0", "the count must be 1 or more"),
        ("HARVEST_TEST_PAUSE_AT", ":3", "'' is not a crash point"),
    ],
)
def test_the_test_runner_names_a_bad_hook_value(var: str, value: str, needle: str, tmp_path: Path) -> None:
    cfg = tmp_path / "h.yaml"
    cfg.write_text("harvest:\n  dataSource: host=127.0.0.1 port=1 user=relay\n  uuidSequencing: true\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARVEST_")}
    proc = subprocess.run(
        [sys.executable, "-m", "harvest_outbox.harvest_local.relay_runner", "-f", str(cfg), "--name", "r"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={**env, var: value},
    )
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for part in (var, repr(value), needle, ", ".join(CRASH_POINTS)):
        assert part in err, err
