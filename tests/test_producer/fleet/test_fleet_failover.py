"""A fleet of three relay processes serving 20+ outboxes across two databases, exactly once through
kill -9, a pause, a graceful stop, and tenants added and removed while writers keep committing (and
rolling back) into every outbox.

One fleet file for all three processes (``harvest -f fleet.yaml``): two listed outboxes, every
``<prefix>_t*`` schema of the first database discovered (the listed two among them: relayed once),
and every ``t*`` schema of a second database found through ``databases:``. Leadership is per outbox
(Postgres locks), so a killed process's outboxes move one by one to the others. At the end one
topic holds every outbox's records, from as many transactional producers as views there were, and is
read and sequenced: every committed row once, in per-key commit order, nothing rolled back visible.
"""

from __future__ import annotations

import json
import random
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from seqcheck import (
    Expected,
    SeqRelay,
    check_exactly_once,
    count_rows,
    read_intents,
    stash_or_roll_back,
    wait_for,
)

from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 4
PER_DB = 10
#: fleet.statementConnections: each process's pool per database
POOL = 3


def _fleet_yaml(path: Path, dsn1: str, dsn2: str, db2: str, bootstrap: str, prefix: str) -> Path:
    listed = "\n".join(
        f"  - {{id: listed{i}, dataSource: '{dsn1}', outboxTable: {prefix}_t0{i}.outbox}}" for i in range(2)
    )
    path.write_text(
        f"""harvest:
  baseKafkaConfig: {{bootstrap.servers: "{bootstrap}"}}
  producerKafkaConfig: {{linger.ms: 5}}
  dataSource: '{dsn1}'
  uuidSequencing: true
  leaderElection: postgres
  leaderLockCheckInterval: 500ms
  prometheusPort: 0
  limits:
    minPollInterval: 100ms
    minMetricsInterval: 1s
    idlePollInterval: 300ms
    ioErrorBackoff: 100ms
    markQueryRecords: 300
    txnMaxRecords: 200
    txnMaxDuration: 20ms
outboxes:
{listed}
discover:
  - schemas: "{prefix}_t*"
  - dataSource: '{dsn2}'
    databases: ["{db2}"]
    schemas: "t*"
fleet: {{discoveryInterval: 1s, restartBackoff: 200ms, statementConnections: {POOL}}}
logging: {{level: Info}}
"""
    )
    path.chmod(0o600)
    return path


def test_fleet_of_three_processes_serves_outboxes_of_two_databases_exactly_once(
    pg_dsn: str,
    kafka_bootstrap: str,
    tmp_path: Path,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    prefix, db2 = unique_name("f"), unique_name("fleetdb")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db2)))
    dsn2 = make_conninfo(pg_dsn, dbname=db2)
    tables: dict[str, tuple[str, str]] = {}  # outbox id -> (dsn, table)
    database1 = psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"]

    def tenant(dsn: str, schema: str, oid: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        init_db(dsn, f"{schema}.outbox")
        tables[oid] = (dsn, f"{schema}.outbox")

    for i in range(PER_DB):
        schema = f"{prefix}_t{i:02d}"
        tenant(pg_dsn, schema, f"listed{i}" if i < 2 else f"{database1}/{schema}.outbox")
        tenant(dsn2, f"t{i:02d}", f"{db2}/t{i:02d}.outbox")
    cfg = _fleet_yaml(tmp_path / "fleet.yaml", pg_dsn, dsn2, db2, kafka_bootstrap, prefix)

    exp = Expected()
    stop_writing = threading.Event()
    writing: dict[str, tuple[str, str]] = dict(tables)  # the outboxes writers write to now
    lock = threading.Lock()

    def writer(w: int) -> None:
        """Transactions of 1-8 rows into each outbox in turn, a fifth rolled back; per outbox and writer
        three keys, so each key's rows span many transactions (and views)."""
        rnd, seq = random.Random(w), 0
        stashers: dict[str, Stasher] = {}
        conns: dict[str, psycopg.Connection] = {}
        try:
            while not stop_writing.is_set():
                with lock:
                    targets = sorted(writing.items())
                for oid, (dsn, table) in targets:
                    if dsn not in conns:
                        conns[dsn] = psycopg.connect(dsn)
                    st = stashers.setdefault(table, Stasher(table))
                    batch = []
                    for _ in range(rnd.randint(1, 8)):
                        batch.append(OutboxRecord(topic, f"{oid}-w{w}-k{rnd.randrange(3)}", f"{oid}-w{w}-{seq}", []))
                        seq += 1
                    stash_or_roll_back(conns[dsn], st, batch, rnd.random() < 0.2, exp)
                time.sleep(0.02)
        finally:
            for conn in conns.values():
                conn.close()

    relays = {"a": SeqRelay(cfg, "a", tmp_path)}

    def leads(relay: SeqRelay) -> set[str]:
        """Outbox ids this live process leads now: elected and not stopped since, from its log."""
        if not relay.alive:
            return set()
        led: set[str] = set()
        name = re.escape(relay.name)
        for line in relay.text().splitlines():
            if m := re.search(rf" {name}/(\S+): elected leader", line):
                led.add(m.group(1))
            elif m := re.search(rf"relay {name}/(\S+) stopped$", line):
                led.discard(m.group(1))
        return led

    def led_by(names: tuple[str, ...], wanted: set[str]) -> Callable[[], bool]:
        def check() -> bool:
            union: set[str] = set()
            for n in names:
                union |= leads(relays[n])
            return wanted <= union

        return check

    def drained() -> bool:
        return all(count_rows(dsn, table) == 0 and not read_intents(dsn, table) for dsn, table in tables.values())

    writers = [threading.Thread(target=writer, args=(w,)) for w in range(2)]
    try:
        # a starts first and takes every outbox; b and c join, and the balance hands each its share
        took = {"a leads all": wait_for(led_by(("a",), set(tables)), 90, "every outbox led by a")}
        for t in writers:
            t.start()
        relays.update({n: SeqRelay(cfg, n, tmp_path) for n in ("b", "c")})
        share = -(-len(tables) // 3)

        def spread() -> bool:
            led = [leads(relays[n]) for n in ("a", "b", "c")]
            return set().union(*led) == set(tables) and all(1 <= len(x) <= share for x in led)

        took["spread"] = wait_for(
            spread, 90, f"{len(tables)} outboxes spread over three processes, at most {share} each"
        )
        spread_at = {n: sorted(leads(relays[n])) for n in ("a", "b", "c")}

        # /readyz and /metrics of a fleet: every outbox by id
        port = int(_port(relays["b"]))
        wait_for(lambda: _get(port, "/readyz")[0] == 200, 60, "b ready for every outbox")
        ready = json.loads(_get(port, "/readyz")[1])
        assert set(ready["outboxes"]) == set(tables)
        roles = {oid: o["role"] for oid, o in ready["outboxes"].items()}
        assert {oid for oid, role in roles.items() if role == "leader"} == set(leads(relays["b"])), roles
        assert _get(port, f"/readyz?outbox={db2}/t03.outbox")[0] == 200
        assert _get(port, "/readyz?outbox=nope")[0] == 404
        exported = _get(port, "/metrics")[1]
        assert f'outbox="{db2}/t03.outbox"' in exported

        # standbys are cold in a fleet: a process's statements lease connections of its pool per database
        # (fleet.statementConnections) only where it leads; its election locks, layout locks and LISTENs
        # share one session each per database
        def sessions(prefix: str) -> int:
            with psycopg.connect(pg_dsn) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s", (prefix + "%",)
                ).fetchone()
            return int(row[0]) if row else 0

        def settled() -> bool:  # the relays handed over by the balance have started again as standbys
            # (a LISTEN session only on a database where the process leads an outbox)
            return all(
                sessions(f"harvest-election:{n}") == sessions(f"harvest-layout:{n}") == 2
                and sessions(f"harvest-listen:{n}") <= 2
                for n in ("a", "b", "c")
            )

        wait_for(settled, 30, "an election, a layout and a LISTEN session per database in each process")
        with psycopg.connect(pg_dsn) as conn:  # the second database is this test's alone (the first is shared
            # with the tests running beside it on the same server)
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (db2,)).fetchone()
        db2_backends = int(row[0]) if row else 0
        pooled = {n: sessions(f"harvest-statements:{n}") for n in ("a", "b", "c")}
        assert all(0 < p <= 2 * POOL for p in pooled.values()), pooled
        # at most the pool and 3 shared sessions per database and process (not 2 per led outbox); the rest
        # is this test's writers' and the balance's
        assert db2_backends <= 3 * (POOL + 3) + 10, db2_backends

        # a tenant added while running: discovery finds it, one process leads it
        tenant(dsn2, "t10", f"{db2}/t10.outbox")
        with lock:
            writing[f"{db2}/t10.outbox"] = tables[f"{db2}/t10.outbox"]
        took["new tenant"] = wait_for(led_by(("a", "b", "c"), {f"{db2}/t10.outbox"}), 30, "the new tenant led")

        # kill -9 of a: each outbox it led moves to b or c
        assert leads(relays["a"]), "a leads no outbox: the kill would prove nothing"
        relays["a"].kill()
        took["kill -9"] = wait_for(led_by(("b", "c"), set(tables)), 60, "a's outboxes taken over")

        # b paused past the lock check interval: Postgres locks stay with its live session; resumed, it goes on
        relays["b"].pause()
        time.sleep(4)
        relays["b"].resume()

        # a tenant removed: writers stop, its rows drain, its schema leaves the discovered names
        gone = f"{db2}/t05.outbox"
        with lock:
            dsn, table = writing.pop(gone)
        wait_for(lambda: count_rows(dsn, table) == 0 and not read_intents(dsn, table), 60, "the leaving tenant drained")
        with psycopg.connect(dsn2, autocommit=True) as conn:
            conn.execute("ALTER SCHEMA t05 RENAME TO gone05")
        del tables[gone]
        wait_for(
            lambda: all(f"stopped ['{gone}']" in r.text() for r in (relays["b"], relays["c"])),
            30,
            "the removed tenant's relays stopped",
        )

        # graceful stop of c: its outboxes hand over to b
        assert relays["c"].stop() == 0
        took["graceful stop"] = wait_for(led_by(("b",), set(tables)), 60, "c's outboxes handed over")

        # SIGHUP: b reads the file again; an outbox listed under a new id is stopped (drained) and started
        cfg.write_text(cfg.read_text().replace("id: listed1,", "id: billing1,"))
        assert relays["b"].proc is not None
        relays["b"].proc.send_signal(signal.SIGHUP)
        tables["billing1"] = tables.pop("listed1")
        wait_for(lambda: "started ['billing1'], stopped ['listed1']" in relays["b"].text(), 30, "b's reload")
        took["reload"] = wait_for(led_by(("b",), set(tables)), 60, "the renamed outbox led again")

        stop_writing.set()
        for t in writers:
            t.join()
        took["drain"] = wait_for(drained, 120, "every outbox drained")
        assert relays["b"].stop() == 0
        res = check_exactly_once(kafka_bootstrap, topic, PARTITIONS, exp)
        print(
            f"\nfleet: {len(tables)} outboxes, {exp.total} rows exactly once, {len(exp.rolled_back)} rolled back, "
            f"{res.acks} ACKs; spread {', '.join(f'{n}: {len(v)}' for n, v in spread_at.items())}; "
            f"{db2_backends} Postgres backends on the second database with three processes (pooled: {pooled}); "
            + ", ".join(f"{k}: {v:.1f}s" for k, v in took.items())
        )
        assert res.acks > 0
    finally:
        stop_writing.set()
        for t in writers:
            if t.is_alive():
                t.join(30)
        for r in relays.values():
            r.stop()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db2)))
            for i in range(PER_DB):
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(f"{prefix}_t{i:02d}")))


def _get(port: int, path: str) -> tuple[int, str]:

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _port(relay: SeqRelay) -> str:
    def found() -> str | None:
        for line in relay.text().splitlines():
            if "metrics on http://" in line:
                return line.split("metrics on http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1]
        return None

    wait_for(lambda: found() is not None, 30, "the fleet's endpoint")
    port = found()
    assert port is not None
    return port
