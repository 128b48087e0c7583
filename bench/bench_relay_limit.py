"""The relay against the hardware's limit on the cursor layout (issue #47): what one Python process reading
the outbox and producing its rows can do, and what the relay does with the same rows, side by side in one
run. Not a test.

    python -m bench.bench_relay_limit [--rows 1000000] [--runs 5] [--page 5000] [--headers 0]

Uses its own Postgres + Kafka (harvest_local.LocalServices; or HARVEST_PG_DSN / HARVEST_KAFKA_BOOTSTRAP).

- **The raw loop**, the limit: keyset pages of ``--page`` rows (``SELECT … WHERE id > last ORDER BY id LIMIT
  page``, autocommit, every column the relay reads) from the cursor layout's outbox, each row produced by one
  confluent-kafka producer with the relay's producer settings (``HarvestConfig.producer_config``: idempotent,
  ``acks=all``, ``linger.ms`` 1, the Java client's key placement) and a delivery callback that counts
  reports, until every report is in (``flush()``). No ordering rule beyond the idempotent producer's, no
  bookkeeping, no commit: nothing a relay could skip.
- **The relay**, on the same kind of backlog in the same process kind (in process, ``Harvest(...)``, NELI
  election), timed from leadership until every record is delivered and the committed cursor has passed
  the backlog: ``--uuid-sequencing`` and at-least-once, each with the defaults a new user gets and tuned
  (markQueryRecords 5000, maxInFlightRecords 5000, as in bench_relay).
- Each run writes a fresh cursor-layout outbox of ``--rows`` rows (100-byte values, ``--keys`` keys, one COPY
  transaction, then ``ANALYZE`` and a ``CHECKPOINT``) for each contestant, in turn: raw, then each relay
  variant, so drift hits all of them alike. Before anything is timed, raw loops of ``--warmup-rows`` run
  and are discarded (a fresh embedded broker runs its first ~million records in the JVM's interpreter: see
  bench_relay's module doc).
- Figures: rows/s and process CPU seconds per 100k rows (``time.process_time``: every thread of this
  process, librdkafka's included) per run; per contestant the median, min and max, and per round the ratio
  to that round's raw loop (bench/spread.py: median and range in ``spread``, with the verdict against the
  issue's targets in bench/targets.py: met only when the whole range clears it). The raw loop runs first in
  even rounds and last in odd ones.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import psycopg
from psycopg import sql

from bench import targets
from bench.backlog import fill_backlog
from bench.bench_relay import TUNED_LIMITS, new_topic
from bench.services import endpoints
from bench.spread import DEFAULT_REPEATS, Recorder, ratio_spread
from harvest_outbox.producer.config import HarvestConfig, Limits
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.layouts.cursor.database import cursor_backlog
from harvest_outbox.producer.layouts.cursor.schema import create_partition
from harvest_outbox.producer.schema.ddl import init_db

PARTITION_IDS = 1_000_000
VARIANTS: dict[str, tuple[bool, bool]] = {  # name -> (uuid_sequencing, tuned)
    "sequenced/defaults": (True, False),
    "sequenced/tuned": (True, True),
    "at_least_once/defaults": (False, False),
    "at_least_once/tuned": (False, True),
}


def _log(msg: str) -> None:
    print(f"[bench relay limit] {msg}", file=sys.stderr, flush=True)


def _outbox(dsn: str, topic: str, rows: int, keys: int, headers: int = 0) -> tuple[str, Any]:
    """A fresh cursor-layout outbox holding ``rows`` rows, analysed and checkpointed: (schema, names)."""
    schema = f"limit_{uuid.uuid4().hex[:8]}"
    names = init_db(dsn, f"{schema}.outbox", layout="cursor", partition_ids=PARTITION_IDS)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for start in range(2 * PARTITION_IDS, rows + 1, PARTITION_IDS):
            conn.execute(create_partition(names, start, start + PARTITION_IDS))
    fill_backlog(dsn, f"{schema}.outbox", topic, rows, keys, headers)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("ANALYZE {}").format(names.outbox))
        conn.execute("CHECKPOINT")
    return schema, names


def _drop(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def raw_loop(dsn: str, names: Any, producer_config: dict[str, Any], page: int) -> dict[str, float]:
    """Read the outbox in keyset pages and produce every row; returns rows/s and CPU s per 100k rows."""
    from confluent_kafka import Producer

    producer = Producer(producer_config)
    reports = {"ok": 0, "failed": 0}

    def report(err: Any, _msg: Any) -> None:
        reports["failed" if err is not None else "ok"] += 1

    page_sql = sql.SQL(
        "SELECT id, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values "
        "FROM {} WHERE id > %s ORDER BY id LIMIT %s"
    ).format(names.outbox)
    produce = producer.produce
    sent = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        t0, c0 = time.perf_counter(), time.process_time()
        last = 0
        while True:
            rows = conn.execute(page_sql, (last, page)).fetchall()
            if not rows:
                break
            for _rid, topic, key, value, hkeys, hvals in rows:
                headers = list(zip(hkeys, hvals, strict=True)) if hkeys else None
                while True:
                    try:
                        produce(topic, value, key, on_delivery=report, headers=headers)
                        break
                    except BufferError:
                        producer.poll(0.005)
            producer.poll(0)
            sent += len(rows)
            last = rows[-1][0]
        producer.flush()
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    if reports["failed"] or reports["ok"] != sent:
        raise RuntimeError(f"raw loop: {reports['ok']} delivered, {reports['failed']} failed of {sent}")
    return {"rows_per_s": sent / elapsed, "cpu_s_per_100k": cpu / sent * 100_000}


def relay_drain(dsn: str, bootstrap: str, names: Any, rows: int, sequenced: bool, tuned: bool) -> dict[str, float]:
    cfg = HarvestConfig(
        data_source=dsn,
        outbox_table=f"{names.outbox.as_string(None)}",
        base_kafka_config={"bootstrap.servers": bootstrap},
        leader_group_id=f"limit-{uuid.uuid4().hex[:8]}",
        uuid_sequencing=sequenced,
        outbox_layout="cursor",
        **({"limits": Limits(**TUNED_LIMITS)} if tuned else {}),
    )
    relay = Harvest(cfg).start()
    try:
        with psycopg.connect(dsn, autocommit=True) as watch:
            while not relay.is_leader:
                time.sleep(0.001)
            t0, c0 = time.perf_counter(), time.process_time()
            while relay.metrics.delivered < rows:
                time.sleep(0.005)
            while cursor_backlog(watch, names):
                time.sleep(0.002)
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        relay.stop()
        relay.wait(60)
    return {"rows_per_s": rows / elapsed, "cpu_s_per_100k": cpu / rows * 100_000}


def _relay_variant(dsn: str, bootstrap: str, rows: int, variant: tuple[bool, bool], names: Any) -> dict[str, float]:
    return relay_drain(dsn, bootstrap, names, rows, *variant)


def _spread(values: list[float], digits: int = 3) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=DEFAULT_REPEATS, help="rounds (each: raw and every variant)")
    ap.add_argument("--page", type=int, default=5000)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument(
        "--headers",
        type=int,
        default=0,
        help="headers per row (source, traceparent, then h2, h3...; default 0, the published figures' backlog)",
    )
    ap.add_argument("--warmup-rows", type=int, default=1_200_000)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: " + ", ".join(VARIANTS))
    args = ap.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")

    services, dsn, bootstrap = endpoints()
    recorder = Recorder(
        args.runs, f"raw loops over {args.warmup_rows:,} rows first, discarded", targets.for_bench("relay_limit")
    )
    producer_config = HarvestConfig(
        data_source=dsn, outbox_table="public.outbox", base_kafka_config={"bootstrap.servers": bootstrap}
    ).producer_config()
    runs: dict[str, list[dict[str, float]]] = {"raw": [], **{v: [] for v in variants}}
    try:
        topic = new_topic(bootstrap, args.partitions)
        warmed = 0
        while warmed < args.warmup_rows:
            n = min(args.rows, args.warmup_rows - warmed)
            schema, names = _outbox(dsn, topic, n, args.keys, args.headers)
            _log(f"warm-up: raw loop of {n} rows")
            raw_loop(dsn, names, producer_config, args.page)
            _drop(dsn, schema)
            warmed += n
        for run in range(args.runs):
            contestants: list[tuple[str, Callable[[Any], dict[str, float]]]] = [
                ("raw", lambda names: raw_loop(dsn, names, producer_config, args.page))
            ]
            for v in variants:
                contestants.append((v, partial(_relay_variant, dsn, bootstrap, args.rows, VARIANTS[v])))
            recorder_order = contestants if run % 2 == 0 else [*contestants[1:], contestants[0]]
            for name, run_one in recorder_order:
                schema, names = _outbox(dsn, topic, args.rows, args.keys, args.headers)
                _log(f"run {run + 1}/{args.runs}: {name}, {args.rows} rows")
                try:
                    runs[name].append(run_one(names))
                finally:
                    _drop(dsn, schema)
    finally:
        if services is not None:
            services.stop()
    result: dict[str, Any] = {
        "setup": vars(args),  # the machine, its load at start and end: the spread's report
        "raw": {
            "rows_per_s": _spread([r["rows_per_s"] for r in runs["raw"]], 0),
            "cpu_s_per_100k": _spread([r["cpu_s_per_100k"] for r in runs["raw"]]),
        },
    }
    for v in variants:
        raw_rates = [r["rows_per_s"] for r in runs["raw"]]
        fig = recorder.figure(v, [r["rows_per_s"] for r in runs[v]], raw_rates, f"relay {v} / raw loop, rows/s")
        cpu = ratio_spread([r["cpu_s_per_100k"] for r in runs[v]], [r["cpu_s_per_100k"] for r in runs["raw"]])
        result[v] = {
            "rows_per_s": _spread([r["rows_per_s"] for r in runs[v]], 0),
            "cpu_s_per_100k": _spread([r["cpu_s_per_100k"] for r in runs[v]]),
            "ratio_to_raw": {k: fig[k] for k in ("median", "min", "max")},
            "cpu_ratio_to_raw": {k: cpu.as_json()[k] for k in ("median", "min", "max")},
            "verdict": fig.get("verdict"),
        }
    result["spread"] = recorder.report()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
