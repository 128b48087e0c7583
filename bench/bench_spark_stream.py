"""Benchmark: streaming ``readCommittedStream`` versus Spark's raw Kafka stream, same sink, same run.

Workload: bench_spark's (N records, default 1,000,000, in transactions of 1,000 CONTINUE_TXN
records over 8 partitions from a ring of 4 producer ids, each followed by an ACK_TXN to every
partition it touched). Each query runs with ``trigger(availableNow=True)`` from the earliest
offsets, ``maxOffsetsPerTrigger`` = N / 10 (so about ten micro-batches, each ending inside open
transactions: state is carried between micro-batches), into a ``foreachBatch`` sink that counts
the micro-batch's rows. Every query has a fresh checkpoint. The raw stream and readCommittedStream
alternate; rows/s are rows / wall time from start to termination. The ratio readCommittedStream /
raw is the figure to watch (target >= 0.5). A third query per repeat, Spark's raw stream through a
``mapInArrow`` that passes the batches through untouched (same columns as readCommittedStream
reads), is the ceiling of any reader whose Python step sees every record: one Arrow round trip
of the payload, which readCommittedStream also makes (out to Python to pack, back when unpacked).
A fourth, ``readCommittedStream(state_location=...)``, is harvest's own streaming data source
(Kafka read in the executors, no Spark Kafka source, shuffle or state store; its state files are
counted after the run).

Spark settings, as docs/reading-spark.md tells users: the RocksDB state store provider (required), changelog
checkpointing (``readCommittedStream`` turns it on itself when unset) and
``spark.sql.shuffle.partitions`` = min(topic partitions, cores) = 2 on ``local[2]``: the stateful
step runs one state store per shuffle partition, each loaded and committed every micro-batch.
The raw stream has no shuffle, so the setting does not touch it.

State: after every micro-batch of readCommittedStream, the state operator's progress
(``numRowsTotal`` and the RocksDB store's SST bytes) is divided by the producers whose spans are
open at the micro-batch's end offsets (known from the write: per partition, the offset of every
ACK): the state kept per open producer.

Phases (issue #35 item 2): for ``readCommittedStream(state_location=...)`` every task appends its
timings to a folder (``split_sequencing.PHASE_LOG_ENV``): seconds reading Kafka into Arrow,
sequencing, and ``downstream`` (suspended while Spark takes the rows into the JVM and through the
sink), summed over the tasks of the last repeat; with the driver's phases from Spark's progress
(``latestOffset``: watermarks, ``queryPlanning``, ``walCommit``/``commitOffsets``, ``addBatch``:
the tasks and the sink). Memory: peak RSS of the JVM and of each Python worker per variant
(bench_spark's sampler), and each task's own ``ru_maxrss`` in the phase lines.

Fairness: every variant runs once untimed first (``--warmup``, default 1: the JVM's JIT, Python
workers and the first Kafka connections), then the variants alternate in each repeat, in one JVM;
without it the raw stream's first repeat ran at a third of its later rate, which a median of 3
did not fully hide.

Spread: each variant's ratio to the raw stream is taken per repeat (bench/spread.py), the order of the
variants reversed every other repeat; the JSON's ``spread`` holds median and min-max of each.

Usage: python -m bench.bench_spark_stream [--records 1000000] [--repeat 5] [--warmup 1] [--variants raw,state_location].
Prints JSON. Not a test.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from bisect import bisect_right
from pathlib import Path
from typing import Any

from bench import targets
from bench.bench_spark import PARTITIONS, RING, TXN, RssSampler, write
from bench.spread import DEFAULT_REPEATS, Recorder
from harvest_outbox.harvest_local import LocalServices
from harvest_outbox.harvest_local.kafka import create_topic
from harvest_outbox.harvest_local.spark import local_spark_session

TOPIC = "bench-spark"  # bench_spark.write writes this topic
_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def ack_offsets(records: int) -> dict[int, list[int]]:
    """Per partition, the offsets of the ACKs bench_spark.write appends: each transaction writes
    its records round-robin over the partitions, then one ACK to each partition it touched."""
    next_offset = dict.fromkeys(range(PARTITIONS), 0)
    acks: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    written = 0
    while written < records:
        n = min(TXN, records - written)
        touched = sorted({(written + i) % PARTITIONS for i in range(n)})
        for i in range(n):
            next_offset[(written + i) % PARTITIONS] += 1
        for p in touched:
            acks[p].append(next_offset[p])
            next_offset[p] += 1
        written += n
    return acks


def open_spans(acks: dict[int, list[int]], end: dict[int, int]) -> tuple[int, int]:
    """``(producers with an open span, records in open spans)`` once every partition p is read up to
    ``end[p]`` (exclusive): a partition whose last read record is not an ACK has one open span (one
    writer), from the record after its last ACK on."""
    opened = records = 0
    for p, e in end.items():
        if e <= 0:
            continue
        i = bisect_right(acks[p], e - 1)  # ACKs at offsets < e
        last_ack = acks[p][i - 1] if i else -1
        if last_ack != e - 1:
            opened += 1
            records += e - 1 - last_ack
    return opened, records


def run_query(spark: Any, sdf: Any, chk: str, max_offsets: int) -> tuple[int, float, list[dict[str, Any]]]:
    counts: list[int] = []

    def sink(df: Any, _batch_id: int) -> None:
        counts.append(df.count())

    t = time.perf_counter()
    query = sdf.writeStream.foreachBatch(sink).option("checkpointLocation", chk).trigger(availableNow=True).start()
    query.awaitTermination()
    elapsed = time.perf_counter() - t
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    return sum(counts), elapsed, [json.loads(p.json) for p in query.recentProgress]


def state_per_open_producer(
    spark: Any, chk: str, progress: list[dict[str, Any]], acks: dict[int, list[int]]
) -> dict[str, Any]:
    """The state readCommittedStream committed after each micro-batch, read back with Spark's state
    data source (``format("statestore")``): the bytes of the stored span and producer states,
    over the producers whose spans are open at the micro-batch's end offsets."""
    from pyspark.sql import functions as F

    samples = []
    for p in progress:
        end = (p.get("sources") or [{}])[0].get("endOffset")
        if not p.get("numInputRows") or not end:
            continue
        end = json.loads(end) if isinstance(end, str) else end
        opened, open_records = open_spans(acks, {int(k): int(v) for k, v in end[TOPIC].items()})
        sizes = {}
        for var, column in (("span", "list_element.blob"), ("producers", "value.producers")):
            df = (
                spark.read.format("statestore")
                .option("path", chk)
                .option("stateVarName", var)
                .option("batchId", p["batchId"])
                .load()
            )
            sizes[var] = df.agg(
                F.count(F.lit(1)).alias("n"), F.coalesce(F.sum(F.length(column)), F.lit(0)).alias("b")
            ).first()
        ops = p.get("stateOperators") or [{}]
        samples.append(
            {
                "batch": p["batchId"],
                "open_producers": opened,
                "open_span_records": open_records,
                "span_chunks": sizes["span"]["n"],
                "span_bytes": int(sizes["span"]["b"]),
                "producer_state_bytes": int(sizes["producers"]["b"]),
                "rocksdb_sst_bytes": int((ops[0].get("customMetrics") or {}).get("rocksdbSstFileSize", 0)),
            }
        )
    with_open = [s for s in samples if s["open_producers"]]
    per_open = [(s["span_bytes"] + s["producer_state_bytes"]) / s["open_producers"] for s in with_open]
    return {
        "micro_batches": samples,
        "state_bytes_per_open_producer_median": round(statistics.median(per_open)) if per_open else None,
        "open_span_records_per_open_producer_median": (
            statistics.median(s["open_span_records"] / s["open_producers"] for s in with_open) if with_open else None
        ),
    }


def _durations(progress: list[dict[str, Any]]) -> dict[str, Any]:
    """Median per micro-batch of each phase Spark reports (ms), and the number of micro-batches;
    for a stateful query also the state operator's time in its stores' commits and in processing
    input (summed over its state stores), and their number."""
    with_rows = [p for p in progress if p.get("numInputRows")]
    batches = [p["durationMs"] for p in with_rows]
    phases = sorted({k for b in batches for k in b})
    out: dict[str, Any] = {
        "micro_batches": len(batches),
        **{k: statistics.median(b.get(k, 0) for b in batches) for k in phases},
    }
    ops = [(p.get("stateOperators") or [None])[0] for p in with_rows]
    if all(ops) and ops:
        for key, name in (
            ("commitTimeMs", "state_commit"),
            ("allUpdatesTimeMs", "state_updates"),
            ("numStateStoreInstances", "state_stores"),
        ):
            out[name] = statistics.median(op.get(key, 0) for op in ops)
    return out


def _state_files(folder: Path) -> dict[str, int]:
    """What readCommittedStream(state_location=...) left behind: files and bytes (one file per
    partition is kept: the states at the last committed offset)."""
    files = [f for f in folder.rglob("*") if f.is_file()]
    return {"files": len(files), "bytes": sum(f.stat().st_size for f in files)}


def _passthrough(batches: Any) -> Any:
    yield from batches


def _task_phases(folder: Path) -> dict[str, Any]:
    """The tasks' phase lines (split_sequencing.Phases.log) summed: seconds per phase over all tasks,
    each phase's share of the tasks' time, and the largest peak RSS a task saw."""
    lines = [json.loads(line) for f in folder.glob("*.jsonl") for line in f.read_text().splitlines() if line]
    if not lines:
        return {}
    keys = ("total", "read", "first_batch", "state", "sequence", "downstream")
    sums = {k: round(sum(x.get(k, 0.0) for x in lines), 2) for k in keys}
    total = sums["total"] or 1.0
    span = max(x["wall_end"] for x in lines) - min(x["wall_start"] for x in lines)
    return {
        "tasks": len(lines),
        "records": sum(x["records"] for x in lines),
        "task_seconds": sums,
        "share": {k: round(sums[k] / total, 3) for k in keys[1:]},
        # wall time from the first task's start to the last one's end, and the share of the two
        # cores' time the tasks' own code was running in it (the rest: Spark's per-task and
        # per-micro-batch work, Python workers started, idle cores)
        "tasks_wall_span_s": round(span, 2),
        "tasks_busy_share_of_2_cores": round(sums["total"] / (2 * span), 3) if span else None,
        "python_workers": len({x["pid"] for x in lines}),
        "task_peak_rss_mb": round(max(x["peak_rss_bytes"] for x in lines) / 2**20),
        # partition reads that went on with a consumer kept from an earlier micro-batch / moved one by a
        # seek / made a new one
        "consumers_reused": sum(x.get("consumers_reused", 0) for x in lines),
        "consumers_sought": sum(x.get("consumers_sought", 0) for x in lines),
        "consumers_missed": sum(x.get("consumers_missed", 0) for x in lines),
        # kept consumers of partitions another task read, advanced to their end (consumer_pool.advance)
        "consumers_advanced": sum(x.get("consumers_advanced", 0) for x in lines),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEATS, help="repeats, each running every variant")
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed rounds of every variant first (JIT, Python workers, consumers)"
    )
    parser.add_argument("--batches", type=int, default=10, help="micro-batches per query (maxOffsetsPerTrigger)")
    parser.add_argument(
        "--variants",
        default="raw,passthrough,state_store,state_location",
        help="comma-separated subset of raw,passthrough,state_store,state_location (raw always runs)",
    )
    args = parser.parse_args()
    chosen = set(args.variants.split(",")) | {"raw"}
    logging.basicConfig(level=logging.WARNING)
    from harvest_outbox.spark_reader import readCommittedStream
    from harvest_outbox.spark_reader.split_sequencing import PHASE_LOG_ENV

    recorder = Recorder(
        args.repeat,
        f"{args.warmup} untimed round(s) of every variant in the same JVM (JIT, Python workers, consumers)",
        targets.for_bench("spark_stream"),
    )
    scratch = Path(tempfile.mkdtemp(prefix="bench-spark-stream-"))
    os.environ[PHASE_LOG_ENV] = str(scratch / "phases")  # inherited by the JVM and its Python workers
    sampler = RssSampler()
    memory: dict[str, dict[str, Any]] = {}

    def measured(name: str, *a: Any) -> tuple[int, float, list[dict[str, Any]]]:
        with sampler.measure() as mem:
            out = run_query(*a)
        memory[name] = {k: max(v, memory.get(name, {}).get(k, 0)) for k, v in mem.items()}
        return out

    with LocalServices() as services:
        bootstrap = services.endpoints.kafka_bootstrap
        create_topic(bootstrap, TOPIC, PARTITIONS)
        t = time.perf_counter()
        written = write(bootstrap, args.records)
        write_s = time.perf_counter() - t
        acks = ack_offsets(written)
        in_topic = written + sum(len(a) for a in acks.values())
        # Not a multiple of a partition's transaction length (TXN / PARTITIONS + 1 offsets): micro-batches
        # end inside open spans, so state is carried between them.
        max_offsets = max(1, in_topic // args.batches) + PARTITIONS * (TXN // PARTITIONS // 2)
        cores = 2  # local_spark_session's local[2]
        spark = local_spark_session(
            "bench-spark-stream",
            cores=cores,
            extra_conf={
                "spark.sql.streaming.stateStore.providerClass": _ROCKSDB,
                "spark.sql.shuffle.partitions": str(min(PARTITIONS, cores)),
            },
        )
        opts = {"kafka.bootstrap.servers": bootstrap}
        raw_rates: list[float] = []
        rc_rates: list[float] = []
        pass_rates: list[float] = []
        src_rates: list[float] = []
        state: dict[str, Any] = {}
        src_state: dict[str, int] = {}
        phases: dict[str, Any] = {}
        progress = pass_progress = src_progress = []
        for i in range(-args.warmup, args.repeat):  # i < 0: warm-up rounds, not measured
            raw_sdf = (
                spark.readStream.format("kafka")
                .options(**opts)
                .option("subscribe", TOPIC)
                .option("startingOffsets", "earliest")
                .option("includeHeaders", "true")
                .option("maxOffsetsPerTrigger", str(max_offsets))
                .load()
            )
            variants = [v for v in ("raw", "passthrough", "state_store", "state_location") if v in chosen]
            # the order reversed every other repeat (bench/spread.py): neither raw nor a contestant always first
            for variant in variants if i % 2 == 0 else variants[::-1]:
                if variant == "raw":
                    raw, raw_s, raw_progress = measured("raw", spark, raw_sdf, str(scratch / f"raw-{i}"), max_offsets)
                    assert raw == in_topic, (raw, in_topic)
                    if i >= 0:
                        raw_rates.append(raw / raw_s)
                elif variant == "passthrough":
                    raw_cols = raw_sdf.select("key", "value", "headers", "partition", "offset", "timestamp")
                    passed, pass_s, pass_progress = measured(
                        "passthrough",
                        spark,
                        raw_cols.mapInArrow(_passthrough, schema=raw_cols.schema),
                        str(scratch / f"pass-{i}"),
                        max_offsets,
                    )
                    assert passed == in_topic, (passed, in_topic)
                    if i >= 0:
                        pass_rates.append(passed / pass_s)
                elif variant == "state_store":
                    sdf = readCommittedStream(spark, TOPIC, opts, max_offsets_per_trigger=max_offsets)
                    committed, rc_s, progress = measured(
                        "state_store", spark, sdf, str(scratch / f"rc-{i}"), max_offsets
                    )
                    assert committed == written, (committed, written)
                    if i >= 0:
                        rc_rates.append(committed / rc_s)
                elif variant == "state_location":
                    src_sdf = readCommittedStream(
                        spark,
                        TOPIC,
                        opts,
                        max_offsets_per_trigger=max_offsets,
                        state_location=str(scratch / f"src-state-{i}"),
                    )
                    shutil.rmtree(scratch / "phases", ignore_errors=True)
                    from_source, src_s, src_progress = measured(
                        "state_location", spark, src_sdf, str(scratch / f"src-{i}"), max_offsets
                    )
                    assert from_source == written, (from_source, written)
                    if i >= 0:
                        src_rates.append(from_source / src_s)
                    src_state = _state_files(scratch / f"src-state-{i}")
                    phases = _task_phases(scratch / "phases")
            if i == -args.warmup:
                spark_conf = {
                    k: spark.conf.get(k, None)
                    for k in (
                        "spark.sql.shuffle.partitions",
                        "spark.sql.streaming.stateStore.providerClass",
                        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
                    )
                }
            if i == args.repeat - 1 and "state_store" in chosen:
                state = state_per_open_producer(spark, str(scratch / f"rc-{i}"), progress, acks)
            durations = {
                "raw": _durations(raw_progress),
                "mapInArrow_passthrough": _durations(pass_progress),
                "readCommittedStream": _durations(progress),
                "readCommittedStream_state_location": _durations(src_progress),
            }
        spark.stop()
    raw_med = statistics.median(raw_rates)
    for name, values, what in (
        ("state_location", src_rates, "readCommittedStream(state_location) / raw stream, rows/s"),
        ("state_store", rc_rates, "readCommittedStream (state store) / raw stream, rows/s"),
        ("passthrough", pass_rates, "raw stream through a pass-through mapInArrow / raw stream, rows/s"),
    ):
        if values:
            recorder.figure(name, values, raw_rates, what)

    def rates(name: str, values: list[float]) -> dict[str, Any]:
        if not values:
            return {}
        med = statistics.median(values)
        return {
            f"{name}_rows_per_s": [round(r) for r in values],
            f"{name}_median_rows_per_s": round(med),
            f"{name}_ratio_median": round(med / raw_med, 3),
        }

    print(
        json.dumps(
            {
                "benchmark": "spark_readCommittedStream_vs_raw_stream",
                "records": written,
                "raw_records_in_topic": in_topic,
                "repeat": args.repeat,
                "warmup": args.warmup,
                "txn_size": TXN,
                "partitions": PARTITIONS,
                "producers": RING,
                "max_offsets_per_trigger": max_offsets,
                "trigger": "availableNow",
                "sink": "foreachBatch count",
                "spark_conf": {k: spark_conf[k] for k in sorted(spark_conf)},
                "write_records_per_s": round(written / write_s),
                "raw_stream_rows_per_s": [round(r) for r in raw_rates],
                "raw_median_rows_per_s": round(raw_med),
                **rates("state_location", src_rates),
                **rates("readCommittedStream", rc_rates),  # the state-store way
                **rates("mapInArrow_passthrough", pass_rates),
                # the names ./dev bench's table reads
                "ratio_median": round(statistics.median(rc_rates) / raw_med, 3) if rc_rates else None,
                "passthrough_ratio_median": round(statistics.median(pass_rates) / raw_med, 3) if pass_rates else None,
                "target_ratio_state_location": 0.9,
                "target_ratio_state_store": 0.5,
                "state_location_files_after_last_run": src_state,
                "state_location_task_phases_last_run": phases,
                "peak_rss": memory,
                "state": state,
                "last_run_batch_durations_ms": durations,
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "spark_master": "local[2]"},
                "spread": recorder.report(),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
