"""Sharded relays benchmark (not a test): one outbox, ``shards: 8``, drained by 1, 2 and 3 relay
processes at once, beside one unsharded relay process on the same backlog.

    .venv/bin/python -m bench.bench_shards [--rows 1000000] [--relays 1,2,3] [--election neli]

Uses the project's own Postgres + Kafka (harvest_local.LocalServices; or HARVEST_PG_DSN /
HARVEST_KAFKA_BOOTSTRAP). Each run: the relays start on an empty outbox (the ``harvest`` CLI, default
limits, at-least-once, the default NELI election) and spread the shards; then the whole backlog
(100-byte values, ``keys`` keys, ``partitions`` partitions) becomes visible in one commit (an
``INSERT … SELECT`` from a staging table) and is timed until the outbox is empty. Per relay: rows it
delivered (its ``/metrics``), its share, and its process CPU seconds per 100k rows it delivered
(``/proc``: the Python thread, DB workers and librdkafka threads of every shard loop). Prints one
JSON document. The baseline is one unsharded relay (``shards: 1``) on the same backlog, and the
database's own mark+purge loop (bench_relay.py) for context.

On a 2-core machine that also runs Postgres and the broker, the database is the limit, so the
aggregate rate cannot grow with relays; what must show is that rows spread evenly and relay CPU per
row stays flat (docs/sharding.md has the projection for a machine where it is not the limit).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import socket
import statistics
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import targets
from bench.services import endpoints
from bench.spread import DEFAULT_REPEATS, Recorder
from harvest_outbox.harvest_local.kafka import create_topic
from harvest_outbox.harvest_local.relays import RelayProcess, wait_for
from harvest_outbox.producer.config import load_yaml
from harvest_outbox.producer.errors import ElectionError
from harvest_outbox.producer.observe.shard_status import neli_leaders, postgres_leaders
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

SHARDS = 8
_CLK = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK  # utime + stime


def _delivered(port: int) -> int:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    m = re.search(r"^harvest_delivered_records_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    return int(float(m.group(1))) if m else 0


def _yaml(path: Path, dsn: str, bootstrap: str, table: str, group: str, shards: int, port: int, election: str) -> Path:
    lines = [
        "harvest:",
        "  baseKafkaConfig:",
        f'    bootstrap.servers: "{bootstrap}"',
        f'  dataSource: "{dsn}"',
        f"  outboxTable: {table}",
        f"  leaderGroupID: {group}",
        f"  shards: {shards}",
        f"  leaderElection: {election}",
        f"  prometheusPort: {port}",
        "  prometheusBindAddress: 127.0.0.1",
        "  limits:",
        "    heartbeatTimeout: 5s",
        "logging:",
        "  level: Info",
        "",
    ]
    path.write_text("\n".join(lines))
    os.chmod(path, 0o600)
    return path


def _leaders(cfg: Path) -> dict[int, str]:
    """Who leads which shard, from the election itself (as ``harvest shards`` shows it)."""
    config = load_yaml(cfg).harvest
    if config.leader_election == "postgres":
        with psycopg.connect(config.data_source) as conn:
            return postgres_leaders(conn, config.outbox_table, config.shards)
    return neli_leaders(config)


def _spread(cfg: Path, relays: int, shards: int) -> bool:
    by: dict[str, int] = {}
    try:
        leaders = _leaders(cfg)
    except ElectionError:  # the group is rebalancing: not spread yet
        return False
    for name in leaders.values():
        by[name] = by.get(name, 0) + 1
    return len(by) == relays and sum(by.values()) == shards and max(by.values()) <= -(-shards // relays) + 1


def drain_once(
    dsn: str,
    bootstrap: str,
    workdir: Path,
    rows: int,
    keys: int,
    partitions: int,
    relays: int,
    shards: int,
    election: str,
) -> dict[str, Any]:
    schema = f"sh_{uuid.uuid4().hex[:8]}"
    table = f"{schema}.outbox"
    topic = f"bench-shards-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions)
    names = OutboxNames.parse(table)
    init_db(dsn, table, shards=shards)
    staging = sql.Identifier(schema, "staging")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS)").format(staging, names.outbox))
    value = "x" * 100
    stasher = Stasher(f"{schema}.staging")
    with psycopg.connect(dsn) as conn:
        for start in range(0, rows, 100_000):
            stasher.stash_many(
                conn, [OutboxRecord(topic, f"key-{i % keys}", value) for i in range(start, min(rows, start + 100_000))]
            )
    group = f"bench-{uuid.uuid4().hex[:8]}"
    procs: list[tuple[RelayProcess, int]] = []
    try:
        for i in range(relays):
            port = _free_port()
            cfg = _yaml(workdir / f"{schema}-{i}.yaml", dsn, bootstrap, table, group, shards, port, election)
            procs.append((RelayProcess(cfg, f"r{i}", workdir).start(), port))
        if shards > 1:  # every shard led, spread: at most ceil(S / relays) + 1 each
            wait_for(lambda: _spread(cfg, relays, shards), 120, "shards spread", poll=0.2)
        else:
            wait_for(lambda: any(p.elections() for p, _ in procs), 120, "a leader", poll=0.1)
        time.sleep(1.0)
        cpu0 = [_cpu_seconds(p.proc.pid) for p, _ in procs]  # type: ignore[union-attr]
        with psycopg.connect(dsn) as conn:  # the whole backlog appears in one commit
            conn.execute(sql.SQL("INSERT INTO {} SELECT * FROM {} ORDER BY id").format(names.outbox, staging))
        t0 = time.perf_counter()
        count = sql.SQL("SELECT count(*) FROM {}").format(names.outbox)
        with psycopg.connect(dsn, autocommit=True) as conn:
            while conn.execute(count).fetchone()[0]:  # type: ignore[index]
                time.sleep(0.01)
        elapsed = time.perf_counter() - t0
        cpu = [_cpu_seconds(p.proc.pid) - c for (p, _), c in zip(procs, cpu0, strict=True)]  # type: ignore[union-attr]
        time.sleep(1.5)  # the relays' counters are read every metrics interval
        delivered = [_delivered(port) for _, port in procs]
    finally:
        for p, _ in procs:
            p.stop(60)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    return {
        "rows_per_s": rows / elapsed,
        "delivered": delivered,
        "shares": [round(d / max(1, sum(delivered)), 3) for d in delivered],
        "cpu_s_per_100k_rows": [round(c / max(1, d) * 100_000, 3) for c, d in zip(cpu, delivered, strict=True)],
        "cpu_s_per_100k_rows_all": round(sum(cpu) / rows * 100_000, 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--relays", default="1,2,3")
    ap.add_argument("--runs", type=int, default=DEFAULT_REPEATS, help="rounds, each running every figure")
    ap.add_argument("--election", default="neli", choices=("neli", "postgres"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    services, dsn, bootstrap = endpoints()
    import tempfile

    from bench.bench_relay import db_limit_once

    counts = [int(x) for x in args.relays.split(",")]
    recorder = Recorder(
        args.runs, "none: every run starts its relays on an empty outbox first", targets.for_bench("shards")
    )
    report: dict[str, Any] = {
        "benchmark": "sharded_relays",
        "rows": args.rows,
        "shards": SHARDS,
        "keys": args.keys,
        "partitions": args.partitions,
        "election": args.election,
        "cpus": os.cpu_count(),
        "limits": "defaults",
        "mode": "at-least-once",
        "runs": args.runs,
    }
    try:
        with tempfile.TemporaryDirectory(prefix="bench-shards-") as tmp:
            work = Path(tmp)
            runs: dict[str, list[dict[str, Any]]] = {"unsharded/1": []} | {f"shards{SHARDS}/{n}": [] for n in counts}
            limit: list[float] = []
            for i in range(args.runs):  # interleaved: every figure sees the same machine state
                limit.append(db_limit_once(dsn, bootstrap, args.rows, args.keys, args.partitions, 5000))
                print("[bench shards] unsharded, 1 relay", file=sys.stderr, flush=True)
                runs["unsharded/1"].append(
                    drain_once(dsn, bootstrap, work, args.rows, args.keys, args.partitions, 1, 1, args.election)
                )
                # the sharded runs' order reversed every other round (bench/spread.py)
                for n in counts if i % 2 == 0 else counts[::-1]:
                    print(f"[bench shards] shards: {SHARDS}, {n} relay(s)", file=sys.stderr, flush=True)
                    runs[f"shards{SHARDS}/{n}"].append(
                        drain_once(
                            dsn, bootstrap, work, args.rows, args.keys, args.partitions, n, SHARDS, args.election
                        )
                    )
        base = statistics.median(r["rows_per_s"] for r in runs["unsharded/1"])
        report["db_limit_rows_per_s"] = round(statistics.median(limit))
        for name, rs in runs.items():
            med = statistics.median(r["rows_per_s"] for r in rs)
            last = rs[-1]
            report[name] = {
                "rows_per_s": round(med),
                "runs": [round(r["rows_per_s"]) for r in rs],
                "ratio_to_unsharded": round(med / base, 3),
                "ratio_to_db_limit": round(med / report["db_limit_rows_per_s"], 3),
                "shares": last["shares"],
                "cpu_s_per_100k_rows_per_relay": last["cpu_s_per_100k_rows"],
                "cpu_s_per_100k_rows_all_relays": statistics.median(r["cpu_s_per_100k_rows_all"] for r in rs),
            }
    finally:
        if services is not None:
            services.stop()
    for name, rs in runs.items():
        if name != "unsharded/1":
            recorder.figure(
                f"{name}_to_unsharded",
                [r["rows_per_s"] for r in rs],
                [r["rows_per_s"] for r in runs["unsharded/1"]],
                f"{name.split('/')[1]} relay process(es) on shards: {SHARDS} / one unsharded relay, rows/s",
            )
    report["spread"] = recorder.report()
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
