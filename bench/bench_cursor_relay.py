"""The relay on ``outboxLayout: cursor`` (the cursor layout, issue #37) against today's (``mark``), side by
side in one run: drain rate and WAL per row on the primary. Not a test.

    python -m bench.bench_cursor_relay [--rows 200000] [--runs 5] [--partition-ids 100000]

Uses its own Postgres + Kafka (harvest_local.LocalServices; or HARVEST_PG_DSN / HARVEST_KAFKA_BOOTSTRAP).
For each run, mode (at-least-once, ``--uuid-sequencing``) and layout, interleaved: a fresh outbox
(``init-db``; the cursor layout with ``--partition-ids`` ids per partition), ``--rows`` rows written by the
Stasher (COPY, one transaction: the writers' WAL per row), a ``CHECKPOINT`` (so the drain is *cold*: the
relay's first change of each page logs its image, as a burst spanning checkpoints does in production),
then one relay (in process, tuned limits: markQueryRecords 5000, maxInFlightRecords 5000) drains it,
timed from leadership to the backlog being passed (mark: the outbox empty; cursor: the committed
cursor past every row). The relay side's WAL is everything the cluster logged from the relay's start
to the end of its cleanup: for ``mark`` a ``VACUUM`` of the outbox (the dead rows' cleanup), for
``cursor`` a partition-maintenance round (``TRUNCATE`` / ``DROP`` of the delivered partitions), after the
relay idled ``--idle-after`` seconds (both layouts: the cursor's idle batches and commits move ``low`` past
the backlog, and their WAL counts).

Postgres CPU (utime + stime from ``/proc``: the postmaster, its live children and its reaped ones, as
``bench_debezium`` counts it; the server must run on this machine): *writers* over the Stasher's COPY;
*relay side* over the same window as the relay's WAL, less the bench's own watching backend (it polls the
backlog every 2 ms) and less the idle server's rate (measured for a second before the relay starts), so it
holds the relay's statements, the cleanup and the background work they cause (WAL writer, checkpointer,
autovacuum); *relay backends* alone: the CPU of every client backend that opened after the relay started
(the relay's connections; none of them closes before the drain ends), read just before it stops.

Prints JSON: per mode and layout the medians of rows/s, relay WAL bytes per row, full-page images per
1,000 rows, writers' WAL per row, relay process CPU per 100k rows, the Postgres CPU per 100k rows above
(writers, relay side, relay backends, and writers + relay side); and the ratios cursor / mark.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import targets
from bench.backlog import fill_backlog
from bench.bench_debezium import postgres_cpu_s, process_cpu_s
from bench.bench_relay import TUNED_LIMITS, new_topic
from bench.bench_wal import wal_stats
from bench.services import endpoints
from bench.spread import DEFAULT_REPEATS, Recorder
from harvest_outbox.producer.config import HarvestConfig, Limits
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.layouts.cursor.database import cursor_backlog
from harvest_outbox.producer.layouts.cursor.partitions import PartitionKeeper
from harvest_outbox.producer.layouts.cursor.schema import create_partition
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db

LAYOUTS = ("mark", "cursor")
MODES = {"at_least_once": False, "sequenced": True}
IDLE_SAMPLE_S = 1.0


def postmaster_pid(conn: psycopg.Connection) -> int:
    """The server's postmaster (its data directory's ``postmaster.pid``): Postgres CPU is read from /proc."""
    folder = conn.execute("SHOW data_directory").fetchone()[0]  # type: ignore[index]
    try:
        pid = int((Path(folder) / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError) as exc:
        raise SystemExit(
            f"bench_cursor_relay: Postgres CPU needs the server on this machine; {folder}/postmaster.pid "
            f"is not readable ({exc}): unset HARVEST_PG_DSN and the bench starts its own"
        ) from exc
    if process_cpu_s(pid) is None:
        raise SystemExit(f"bench_cursor_relay: postmaster pid {pid} (from {folder}) is not visible in /proc")
    return pid


def _pg_cpu(postmaster: int) -> float:
    cpu = postgres_cpu_s(postmaster)
    assert cpu is not None, f"postmaster {postmaster} went away"
    return cpu


def settled(conn: psycopg.Connection) -> None:
    """Wait until ``conn``'s is the only client backend and the others are reaped: a closed connection's
    backend exits after it leaves ``pg_stat_activity``, and its CPU reaches the postmaster's reaped children's
    only when the postmaster reaps it."""
    others = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
    deadline = time.monotonic() + 30
    while conn.execute(others).fetchone()[0] and time.monotonic() < deadline:  # type: ignore[index]
        time.sleep(0.01)
    time.sleep(0.1)


def relay_backends_cpu_s(conn: psycopg.Connection, since: float) -> float:
    """CPU of the client backends that opened at or after ``since`` (epoch seconds), ``conn``'s excepted."""
    pids = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() "
        "AND backend_start >= to_timestamp(%s)",
        (since,),
    ).fetchall()
    return sum(process_cpu_s(int(pid)) or 0.0 for (pid,) in pids)


def drain_once(
    dsn: str,
    bootstrap: str,
    topic: str,
    rows: int,
    keys: int,
    layout: str,
    sequenced: bool,
    partition_ids: int,
    idle_after: float = 3.0,
) -> dict[str, Any]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    table = f"{schema}.outbox"
    names = init_db(dsn, table, layout=layout, partition_ids=partition_ids)
    watch = psycopg.connect(dsn, autocommit=True)
    postmaster, watcher = postmaster_pid(watch), watch.info.backend_pid
    if layout == "cursor":  # partitions for every id, as a running leader's maintenance makes them ahead
        for start in range(2 * partition_ids, rows + 1, partition_ids):
            watch.execute(create_partition(names, start, start + partition_ids))
    try:
        w0, p0 = wal_stats(watch), _pg_cpu(postmaster)
        fill_backlog(dsn, table, topic, rows, keys)
        settled(watch)
        w1, p1 = wal_stats(watch), _pg_cpu(postmaster)
        watch.execute(sql.SQL("ANALYZE {}").format(names.outbox))
        watch.execute("CHECKPOINT")
        cfg = HarvestConfig(
            data_source=dsn,
            outbox_table=table,
            base_kafka_config={"bootstrap.servers": bootstrap},
            leader_group_id=f"bench-{uuid.uuid4().hex[:8]}",
            limits=Limits(**TUNED_LIMITS),
            uuid_sequencing=sequenced,
            outbox_layout=layout,
        )
        count = sql.SQL("SELECT count(*) FROM {}").format(names.outbox)

        def left() -> int:
            if layout == "cursor":
                return cursor_backlog(watch, names)
            return int(watch.execute(count).fetchone()[0])  # type: ignore[index]

        i0 = time.perf_counter(), _pg_cpu(postmaster)
        time.sleep(IDLE_SAMPLE_S)
        idle_rate = (_pg_cpu(postmaster) - i0[1]) / (time.perf_counter() - i0[0])
        s0, q0, v0, r0 = wal_stats(watch), _pg_cpu(postmaster), process_cpu_s(watcher) or 0.0, time.perf_counter()
        born = time.time()
        relay = Harvest(cfg).start()
        try:
            while not relay.is_leader:
                time.sleep(0.001)
            t0, c0 = time.perf_counter(), time.process_time()
            while relay.metrics.delivered < rows:
                time.sleep(0.005)
            while left():
                time.sleep(0.002)
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            time.sleep(idle_after)  # idle batches move low past the backlog (the cursor layout's retirement)
            backends = relay_backends_cpu_s(watch, born)
        finally:
            relay.stop()
            relay.wait(60)
        watching = (process_cpu_s(watcher) or 0.0) - v0  # the bench's polls, not the relay's work
        cleanup = _cleanup(watch, names, layout)
        settled(watch)
        s1, q1, window = wal_stats(watch), _pg_cpu(postmaster), time.perf_counter() - r0
    finally:
        watch.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
        watch.close()
    return {
        "rows_per_s": rows / elapsed,
        "relay_wal_bytes_per_row": (s1[2] - s0[2]) / rows,
        "relay_fpi_per_1k_rows": (s1[1] - s0[1]) * 1000 / rows,
        "writers_wal_bytes_per_row": (w1[2] - w0[2]) / rows,
        "relay_cpu_s_per_100k": cpu / rows * 100_000,
        "pg_writers_cpu_s_per_100k": (p1 - p0) / rows * 100_000,
        "pg_relay_cpu_s_per_100k": (q1 - q0 - watching - idle_rate * window) / rows * 100_000,
        "pg_relay_backends_cpu_s_per_100k": backends / rows * 100_000,
        "pg_idle_cpu_s_per_s": idle_rate,
        "cleanup": cleanup,
    }


def _cleanup(conn: psycopg.Connection, names: OutboxNames, layout: str) -> str:
    """What the layout leaves to clean after a drain: dead row versions (mark) or delivered partitions."""
    if layout == "mark":
        conn.execute(sql.SQL("VACUUM {}").format(names.outbox))
        return "VACUUM"
    done = PartitionKeeper(names).run(conn)
    return f"truncated {len(done.truncated)}, dropped {len(done.dropped)} partition(s)"


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b > 0 else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=DEFAULT_REPEATS, help="rounds, each draining every mode and layout")
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--partition-ids", type=int, default=100_000)
    ap.add_argument("--idle-after", type=float, default=3.0, help="seconds the relay idles after the drain")
    ap.add_argument(
        "--warmup-rows", type=int, default=50_000, help="a discarded drain per mode first (the broker's JIT)"
    )
    args = ap.parse_args()
    services, dsn, bootstrap = endpoints()
    runs: dict[str, list[dict[str, Any]]] = {f"{m}/{lay}": [] for m in MODES for lay in LAYOUTS}
    recorder = Recorder(
        args.runs,
        f"one discarded mark-layout drain of {args.warmup_rows} rows per mode"
        if args.warmup_rows
        else "none (--warmup-rows 0)",
        targets.for_bench("cursor_relay"),
    )
    try:
        topic = new_topic(bootstrap, args.partitions)
        for sequenced in MODES.values():
            if args.warmup_rows:
                drain_once(dsn, bootstrap, topic, args.warmup_rows, args.keys, "mark", sequenced, args.partition_ids)
        for n in range(args.runs):
            for mode, sequenced in MODES.items():
                # mark first in even rounds, cursor first in odd ones (bench/spread.py)
                for layout in LAYOUTS if n % 2 == 0 else LAYOUTS[::-1]:
                    print(f"[bench cursor relay] {args.rows} rows, {mode}, {layout}", file=sys.stderr, flush=True)
                    runs[f"{mode}/{layout}"].append(
                        drain_once(
                            dsn,
                            bootstrap,
                            topic,
                            args.rows,
                            args.keys,
                            layout,
                            sequenced,
                            args.partition_ids,
                            args.idle_after,
                        )
                    )
    finally:
        if services is not None:
            services.stop()
    for rs in runs.values():
        for r in rs:
            r["pg_total_cpu_s_per_100k"] = r["pg_writers_cpu_s_per_100k"] + r["pg_relay_cpu_s_per_100k"]
    keys = ("rows_per_s", "relay_wal_bytes_per_row", "relay_fpi_per_1k_rows", "writers_wal_bytes_per_row")
    cpus = (
        "relay_cpu_s_per_100k",
        "pg_writers_cpu_s_per_100k",
        "pg_relay_cpu_s_per_100k",
        "pg_relay_backends_cpu_s_per_100k",
        "pg_total_cpu_s_per_100k",
    )
    medians = {
        name: {k: round(statistics.median(r[k] for r in rs), 2 if k in keys else 3) for k in (*keys, *cpus)}
        for name, rs in runs.items()
    }
    ratios = {}
    for mode in MODES:
        mark, cursor = medians[f"{mode}/mark"], medians[f"{mode}/cursor"]
        total = {
            lay: medians[f"{mode}/{lay}"]["relay_wal_bytes_per_row"]
            + medians[f"{mode}/{lay}"]["writers_wal_bytes_per_row"]
            for lay in LAYOUTS
        }
        ratios[mode] = {
            "drain_rate": round(cursor["rows_per_s"] / mark["rows_per_s"], 3),
            "relay_wal_per_row": round(cursor["relay_wal_bytes_per_row"] / mark["relay_wal_bytes_per_row"], 4),
            "total_wal_per_row": round(total["cursor"] / total["mark"], 3),
            "pg_relay_cpu_per_row": _ratio(cursor["pg_relay_cpu_s_per_100k"], mark["pg_relay_cpu_s_per_100k"]),
            "pg_relay_backends_cpu_per_row": _ratio(
                cursor["pg_relay_backends_cpu_s_per_100k"], mark["pg_relay_backends_cpu_s_per_100k"]
            ),
            "pg_total_cpu_per_row": _ratio(cursor["pg_total_cpu_s_per_100k"], mark["pg_total_cpu_s_per_100k"]),
        }
    for mode in MODES:
        mark_runs, cursor_runs = runs[f"{mode}/mark"], runs[f"{mode}/cursor"]
        for key, what in (
            ("rows_per_s", "drain rows/s"),
            ("relay_wal_bytes_per_row", "relay WAL bytes per row"),
            ("pg_relay_cpu_s_per_100k", "Postgres relay-side CPU per row"),
        ):
            if all(r[key] > 0 for r in mark_runs):
                recorder.figure(
                    f"{mode}/{'relay_wal_per_row' if key == 'relay_wal_bytes_per_row' else key}",
                    [r[key] for r in cursor_runs],
                    [r[key] for r in mark_runs],
                    f"outboxLayout cursor / mark, {mode}, {what}",
                )
    print(
        json.dumps(
            {
                "spread": recorder.report(),
                "setup": {**vars(args), "limits": TUNED_LIMITS, "cpus": os.cpu_count(), "load": os.getloadavg()},
                "medians": medians,
                "ratios_cursor_over_mark": ratios,
                "runs": runs,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
