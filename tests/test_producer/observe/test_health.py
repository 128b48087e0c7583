"""/healthz and /readyz of real running relays over real HTTP (next to /metrics) and the bind
address. The README's alert rules against the metrics a relay exports: test_dashboard.py."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from relaylib import relay_config

from harvest_outbox.harvest_local.relays import write_config
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.relay.events import MeterRead
from harvest_outbox.producer.schema.ddl import init_db

pytestmark = pytest.mark.integration


def get(relay: Harvest, path: str) -> tuple[int, Any]:
    url = f"http://127.0.0.1:{relay.prometheus_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            status, raw, ctype = resp.status, resp.read(), resp.headers.get("Content-Type")
    except urllib.error.HTTPError as exc:
        status, raw, ctype = exc.code, exc.read(), exc.headers.get("Content-Type")
    return status, (json.loads(raw) if ctype == "application/json" else raw.decode())


def wait_for(what: str, cond: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _relay(pg_dsn: str, bootstrap: str, table: str, group: str, **limits: Any) -> Harvest:
    cfg = relay_config(pg_dsn, bootstrap, table, group, **limits).replace(
        prometheus_port=0,
        prometheus_bind_address="127.0.0.1",
        leader_election="postgres",
        leader_lock_check_interval=0.2,
    )
    return Harvest(cfg)


def test_leader_and_standby_are_live_and_ready_next_to_metrics(
    pg_dsn: str, kafka_bootstrap: str, pg_schema: str, unique_name: Callable[[str], str]
) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    a = _relay(pg_dsn, kafka_bootstrap, table, unique_name("g")).start()
    wait_for("a to lead", lambda: a.is_leader)
    b = _relay(pg_dsn, kafka_bootstrap, table, unique_name("g")).start()
    try:
        for relay in (a, b):
            server = relay._prometheus[0]
            assert server.server_address[0] == "127.0.0.1"  # the configured bind address, not 0.0.0.0
            wait_for("a first loop iteration", lambda r=relay: get(r, "/healthz")[0] == 200)
        status, body = get(a, "/healthz")
        assert status == 200 and body["status"] == "alive" and body["relay"] == a.config.name
        assert 0 <= body["loop_age_seconds"] <= a.config.limits.liveness_timeout
        status, body = get(a, "/readyz")
        assert (status, body["status"], body["role"], body["database"]) == (200, "ready", "leader", "ok")
        assert body["leader_id"] == str(a.leader_id) and body["state"] == "running"
        status, body = get(b, "/readyz")
        assert (status, body["role"], body["leader_id"]) == (200, "standby", None)
        status, text = get(a, "/metrics")
        assert status == 200 and f'harvest_is_leader{{relay="{a.config.name}"}} 1.0' in text
        wait_for(
            "the leader's first backlog reading",
            lambda: re.search(rf'harvest_backlog_rows{{relay="{a.config.name}"}} 0\.0', get(a, "/metrics")[1]),
        )
        standby_text = get(b, "/metrics")[1]
        for gauge in ("harvest_backlog_rows", "harvest_oldest_unsent_age_seconds", "harvest_dead_letter_rows"):
            assert f'{gauge}{{relay="{b.config.name}"}} NaN' in standby_text  # only the leader measures the outbox
        status, not_found = get(a, "/nope")
        assert status == 404 and "/healthz" in not_found

        # Hand-over: the standby becomes the leader and says so.
        a.stop()
        assert a.wait(60)
        wait_for("b to lead", lambda: get(b, "/readyz")[1]["role"] == "leader")
        with pytest.raises(urllib.error.URLError):  # a stopped relay's endpoint is closed
            urllib.request.urlopen(f"http://127.0.0.1:{a.prometheus_port}/healthz", timeout=2)
    finally:
        for relay in (a, b):
            relay.stop()
            relay.wait(60)


def test_stalled_loop_fails_healthz_and_stopping_fails_readyz(
    pg_dsn: str, kafka_bootstrap: str, pg_schema: str, unique_name: Callable[[str], str]
) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    stall, stalled = threading.Event(), threading.Event()

    def handler(event: object) -> None:
        # The relay loop emits MeterRead on its own thread: blocking here stalls the loop for real.
        if isinstance(event, MeterRead) and stall.is_set():
            stalled.set()
            while stall.is_set():
                time.sleep(0.05)

    cfg = _relay(
        pg_dsn, kafka_bootstrap, table, unique_name("g"), min_metrics_interval=0.2, liveness_timeout=1.0
    ).config
    relay = Harvest(cfg, handler).start()
    try:
        wait_for("the relay to lead and be live", lambda: relay.is_leader and get(relay, "/healthz")[0] == 200)
        stall.set()
        assert stalled.wait(10)
        status, body = wait_for("/healthz to fail", lambda: (r := get(relay, "/healthz"))[0] == 503 and r)
        assert body["status"] == "dead" and body["reason"].startswith("relay loop stalled: no iteration for")
        assert "livenessTimeout 1s" in body["reason"]
        status, body = get(relay, "/readyz")
        assert status == 503 and body["reason"].startswith("relay loop stalled")
        relay.stop()  # while the loop is still blocked: the relay is stopping, not ready
        status, body = get(relay, "/readyz")
        assert (status, body["status"], body["state"], body["reason"]) == (503, "not ready", "stopping", "stopping")
        stall.clear()
        assert relay.wait(60)
    finally:
        stall.clear()
        relay.stop()
        relay.wait(60)


def test_readyz_fails_while_the_database_refuses_the_relay(
    pg_dsn: str, kafka_bootstrap: str, pg_schema: str, unique_name: Callable[[str], str]
) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    role, password = unique_name("relay_role"), "pw-" + unique_name("secret")
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(sql.Identifier(role), sql.Literal(password))
        )
    dsn = make_conninfo(pg_dsn, user=role, password=password)
    relay = _relay(dsn, kafka_bootstrap, table, unique_name("g")).start()
    try:
        wait_for("ready", lambda: get(relay, "/readyz")[0] == 200)
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(role)))
            # Drop the probe's session: its reconnection is now refused, as after a database restart.
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE usename = %s AND application_name = 'harvest-health'",
                (role,),
            )
        # The first probe after the kill reports the terminated session, the next ones the refused login.
        _status, body = wait_for(
            "/readyz to fail on the refused login",
            lambda: (r := get(relay, "/readyz"))[0] == 503 and "log in" in r[1]["reason"] and r,
        )
        assert body["reason"].startswith("database unreachable:") and body["status"] == "not ready"
        assert body["database"] == body["reason"] and f'role "{role}" is not permitted to log in' in body["reason"]
        assert password not in json.dumps(body)
        assert get(relay, "/healthz")[0] == 200  # the loop itself still turns: not a restart case
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("ALTER ROLE {} LOGIN").format(sql.Identifier(role)))
        wait_for("/readyz to recover", lambda: get(relay, "/readyz")[0] == 200)
    finally:
        relay.stop()
        relay.wait(60)
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def test_cli_relay_process_serves_health_on_the_flagged_address(
    pg_dsn: str, kafka_bootstrap: str, pg_schema: str, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """The ``harvest`` CLI as a real process: ``--prometheus-port 0 --prometheus-bind-address 127.0.0.1``."""
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    cfg = write_config(
        tmp_path / "relay.yaml",
        dsn=pg_dsn,
        bootstrap=kafka_bootstrap,
        outbox_table=table,
        group=unique_name("g"),
        leader_election="postgres",
        leader_lock_check_interval="200ms",
    )
    log = tmp_path / "relay.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "harvest_outbox.producer",
                "-f",
                str(cfg),
                "--name",
                "cli-relay",
                "--prometheus-port",
                "0",
                "--prometheus-bind-address",
                "127.0.0.1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        port = int(
            wait_for(
                "the endpoint's log line",
                lambda: re.search(
                    r"metrics on http://127\.0\.0\.1:(\d+)/metrics \(\+ /healthz, /readyz\)", log.read_text()
                ),
                60,
            ).group(1)
        )

        def readyz() -> tuple[int, Any]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
                    return resp.status, json.loads(resp.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())

        _status, body = wait_for(
            "the CLI relay to lead", lambda: (r := readyz())[0] == 200 and r[1]["role"] == "leader" and r, 60
        )
        assert body["relay"] == "cli-relay" and body["database"] == "ok"
        assert pg_dsn.split("password=")[1].split()[0] not in log.read_text()  # the DSN stays out of the log
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
