"""Several relays as real processes (the ``harvest`` CLI with a YAML file): one leader publishes;
kill -9 of the leader and graceful stop both hand over; the outbox still drains in per-key order.
Takeover times are measured and printed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from clilib import harvest_in_process
from relaylib import BackgroundWriter, assert_per_key_order, consume_all, covers, wait_drained

from harvest_outbox.harvest_local.relays import RelayProcess, wait_for, write_config
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

pytestmark = pytest.mark.integration


def test_one_leader_kill9_and_graceful_handover(
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
    cfg = write_config(
        tmp_path / "harvest.yaml",
        dsn=pg_dsn,
        bootstrap=kafka_bootstrap,
        outbox_table=table,
        group=unique_name("g"),
        uuid_sequencing=False,
    )
    relays = [RelayProcess(cfg, f"relay{i}", tmp_path).start() for i in range(3)]
    w = BackgroundWriter(pg_dsn, table, topic)
    try:
        wait_for(lambda: sum(r.elections() for r in relays) >= 1, 60)
        w.start()
        time.sleep(3)  # standbys have joined by now; still exactly one leader
        leaders = [r for r in relays if r.elections()]
        assert len(leaders) == 1, [r.text()[-2000:] for r in relays]
        first = leaders[0]

        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        others = [r for r in relays if r is not first]
        kill_takeover = wait_for(lambda: any(r.elections() for r in others), 60)
        second = next(r for r in others if r.elections())
        print(f"\ntakeover after kill -9: {kill_takeover:.2f}s (session timeout 6s)")
        assert kill_takeover < 20

        time.sleep(1)
        second.proc.send_signal(signal.SIGTERM)
        third = next(r for r in others if r is not second)
        graceful_takeover = wait_for(lambda: third.elections() > 0, 30)
        assert second.proc.wait(30) == 0
        print(f"takeover after graceful stop: {graceful_takeover:.2f}s")
        assert graceful_takeover < 6
        assert "giving up leadership (stopping)" in second.text()

        time.sleep(1)
        w.stop()
        wait_drained(pg_dsn, table, 60)
        total = w.total
        got = consume_all(kafka_bootstrap, topic, covers(w.expected), 30)
        print(f"{total} records stashed, {len(got)} delivered ({len(got) - total} duplicates from the kill)")
        assert_per_key_order(got, w.expected, allow_dups=True)
        assert third.elections() == 1 and sum(r.elections() for r in relays) == 3
    finally:
        w.stop()
        for r in relays:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
        for r in relays:
            try:
                r.proc.wait(20)
            except subprocess.TimeoutExpired:
                r.proc.kill()


def test_cli_init_db_and_dead_letters(
    pg_dsn: str, pg_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = f"{pg_schema}.cli_outbox"
    monkeypatch.setenv("HARVEST_DATA_SOURCE", pg_dsn)
    run = harvest_in_process  # the command's main here (tests/test_producer/clilib.py); the last call a process

    def process(*a: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "harvest_outbox.producer", *a], capture_output=True, text=True, timeout=60
        )

    r = run("init-db", "--outbox-table", table, "--value-type", "bytea")
    assert r.returncode == 0, r.stderr
    assert "ready in the cursor layout" in r.stdout and "value type bytea" in r.stdout  # a new outbox's default
    password = next(p.split("=", 1)[1] for p in pg_dsn.split() if p.startswith("password="))
    r = run("dead-letters", "list", "--outbox-table", table)
    assert r.returncode == 0 and "0 dead letter(s)" in r.stdout
    with psycopg.connect(pg_dsn) as conn:
        names = init_db(conn, table, "bytea", layout="cursor")  # idempotent
        conn.execute(
            f"INSERT INTO {names.dead_letters.as_string(conn)} (id, kafka_topic, kafka_key, kafka_value, "
            "kafka_header_keys, kafka_header_values, error, attempts) VALUES "
            "(7, 't', 'k', 'v', '{}', '{}', 'boom', 5), (8, NULL, 'k', 'v', '{}', '{}', 'no topic', 0)"
        )
    r = run("dead-letters", "list", "--outbox-table", table)
    assert "boom" in r.stdout and "2 dead letter(s)" in r.stdout
    # Topic 't' does not exist in Kafka (none runs here): these exercise the database side only.
    # --all requeues what can be (7) and reports the rest (8 has no topic), exit 1 (#38 item 12).
    r = run("dead-letters", "requeue", "--outbox-table", table, "--all", "--skip-topic-check")
    assert r.returncode == 1 and "id 8 (topic None): kafka_topic is NULL" in r.stderr and password not in r.stderr
    assert "requeued 1" in r.stdout, r.stdout
    r = run("dead-letters", "requeue", "--outbox-table", table, "8", "--skip-topic-check")
    assert r.returncode == 1 and "1 dead letter(s) not requeued" in r.stderr
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f"SELECT count(*) FROM {names.outbox.as_string(conn)}").fetchone() == (1,)
    r = run("dead-letters", "requeue", "--outbox-table", table)
    assert r.returncode == 2 and "give dead-letter ids or --all" in r.stderr
    bad = run("-f", str(tmp_path / "missing.yaml"))
    assert bad.returncode == 2
    r = process("run", "--outbox-table", table, "--data-source", "host=127.0.0.1 port=1 password=zz9secret")
    assert r.returncode == 1 and "zz9secret" not in r.stderr and "cannot connect" in r.stderr


def test_two_embedded_relays_only_the_leader_publishes(
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    from relaylib import relay_config

    from harvest_outbox.producer.harvest import Harvest

    topic = topic_factory(partitions=2)
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g"))
    a = Harvest(cfg.replace(name="a")).start()
    b = Harvest(cfg.replace(name="b")).start()
    try:
        wait_for(lambda: a.is_leader or b.is_leader, 30)
        samples = []
        with psycopg.connect(pg_dsn) as conn:
            Stasher(table).stash_many(conn, [OutboxRecord(topic, f"k{i % 7}", f"v{i}") for i in range(2000)])
        deadline = time.monotonic() + 30
        while (a.metrics.delivered + b.metrics.delivered) < 2000 and time.monotonic() < deadline:
            samples.append((a.is_leader, b.is_leader))
            time.sleep(0.01)
        assert not any(x and y for x, y in samples)
        assert sorted([a.metrics.delivered, b.metrics.delivered]) == [0, 2000]
    finally:
        for r in (a, b):
            r.stop()
        for r in (a, b):
            r.wait(30)
