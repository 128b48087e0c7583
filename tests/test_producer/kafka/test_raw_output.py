"""Nothing reaches the operator's terminal raw (issue #38 items 11 and 15):
- a relay ``name`` holding control characters (a newline, ESC) is refused by the config with an error that
  shows it escaped, since the name goes into every log line; the default name is printable whatever the host;
- librdkafka's lines of the start-up leader-topic lookup go through logging (``harvest_outbox.librdkafka``),
  never as raw ``%3|...|FAIL|`` lines on stderr, and a down broker's repeated connection failures are
  logged once per window, not ~20 times a second."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from harvest_outbox.producer.config import HarvestConfig, default_name
from harvest_outbox.producer.errors import ConfigError, ElectionError
from harvest_outbox.producer.ops.cli import main

BAD_NAMES = [
    ("relay\nforged log line", "\\n"),
    ("relay\x1b[31mred", "\\x1b"),
    ("relay\rover", "\\r"),
    ("tab\there", "\\t"),
    ("nul\x00", "\\x00"),
    ("del\x7f", "\\x7f"),
    ("sep\u2028arator", "\\u2028"),
]


@pytest.mark.parametrize(("name", "escaped"), BAD_NAMES, ids=[repr(n) for n, _ in BAD_NAMES])
def test_a_name_with_control_characters_is_refused_and_shown_escaped(name: str, escaped: str) -> None:
    with pytest.raises(ConfigError) as info:
        HarvestConfig(name=name)
    message = str(info.value)
    assert message.startswith("name: ") and escaped in message and message.isprintable()
    assert "printable" in message  # the fix


def test_the_cli_refuses_such_a_name_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--name", "relay\n2026-01-01 INFO forged", "--bootstrap-servers", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "name: " in err and "\\n" in err


def test_default_name_is_printable_whatever_the_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "evil\nhost\x1b[2J")
    name = default_name()
    assert name.isprintable() and "\x1b" not in name
    assert HarvestConfig().name.isprintable()


def test_the_leader_topic_lookup_logs_through_logging_once_per_repeated_failure(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against a closed port librdkafka retries the connection ~20 times a second, each a ``FAIL`` line."""
    from harvest_outbox.producer.election.neli import ensure_topic
    from harvest_outbox.producer.kafka import LIBRDKAFKA_LOG

    # The repeated-line filter is the process's: an earlier test's "Connection refused" lines (within its
    # 30 s window) would hide this one's, so the test starts a window of its own.
    for line_filter in LIBRDKAFKA_LOG.filters:
        if hasattr(line_filter, "_seen"):
            monkeypatch.setattr(line_filter, "_seen", {})
    caplog.set_level(logging.INFO, logger=LIBRDKAFKA_LOG.name)
    started = time.monotonic()
    with pytest.raises(ElectionError, match="cannot reach Kafka"):
        ensure_topic({"bootstrap.servers": "127.0.0.1:1"}, "harvest.neli", timeout=3.0)
    assert time.monotonic() - started < 10
    err = capfd.readouterr().err
    assert "%3|" not in err and "|FAIL|" not in err, err[:500]
    # this lookup's lines only: a client another test on this worker left running (say, one still dialing a
    # Kafka node that test stopped) logs through the same logger meanwhile
    fails = [
        r
        for r in caplog.records
        if r.name == LIBRDKAFKA_LOG.name and "FAIL" in r.getMessage() and "127.0.0.1:1/" in r.getMessage()
    ]
    assert 1 <= len(fails) <= 2, [r.getMessage() for r in fails]
    assert "Connection refused" in fails[0].getMessage()


def test_a_relay_started_against_a_closed_kafka_port_prints_no_raw_librdkafka_line(pg_dsn: str, pg_schema: str) -> None:
    """``harvest run`` (NELI) on a real Postgres, Kafka down: librdkafka's lines of the start-up lookup come
    out in the log format, a repeated one once, and none as a raw ``%3|`` line."""
    table = f"{pg_schema}.outbox"
    env = {**os.environ, "HARVEST_DATA_SOURCE": pg_dsn}
    subprocess.run(
        [sys.executable, "-m", "harvest_outbox.producer", "init-db", "--outbox-table", table],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harvest_outbox.producer",
            "run",
            "--outbox-table",
            table,
            "--bootstrap-servers",
            "127.0.0.1:1",
            "--log-level",
            "INFO",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(6)  # start-up and ~5 s of the leader-topic lookup against the closed port
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert "%3|" not in err and "|FAIL|" not in err, err[:2000]
    fails = [line for line in err.splitlines() if "harvest_outbox.librdkafka" in line and "FAIL" in line]
    assert 1 <= len(fails) <= 2, err[:2000]
