"""Benchmark: batch ``readCommitted`` versus plain Spark Kafka reads of the same records, one run.

Workload: N records (default 1,000,000) written as harvest --uuid-sequencing writes them:
transactions of 1,000 CONTINUE_TXN records over 8 partitions from a ring of 4 producer ids, each
followed by an ACK_TXN to every partition it touched; 100-byte values, 1,000 keys. Every variant
runs on the same local Spark session (local[2]) against the embedded Kafka broker, in turn within
each repeat, and reports rows/s (medians over the repeats):

- ``raw_count``: Spark's Kafka source, ``count()`` (Spark reads every record but builds no column);
- ``raw_noop``: Spark's Kafka source, every column written to the ``noop`` sink (the payload
  materialised, as any real consumer of the DataFrame does);
- ``readCommitted_count`` / ``readCommitted_noop``: harvest's batch data source (the default);
- ``readCommitted_spark_source_count``: ``source="spark"`` (Spark's Kafka source + ``mapInArrow``).

Ratios to watch (issue #35): ``readCommitted_count / raw_count`` (target >= 0.9) and
``readCommitted_noop / raw_noop`` (target >= 1). Memory: the peak RSS of the Spark JVM (local
mode: driver and executor in one) and of each Python worker while a variant runs, sampled from
/proc every 50 ms; a harvest task holds one ``chunk_records`` chunk plus the open spans, whatever
the topic's size (``--chunk-records`` to see it move).

Spread: each ratio is taken per round (bench/spread.py), the variants' order reversed every other round;
the JSON's ``spread`` holds median and min-max of each.

Usage: python -m bench.bench_spark [--records 1000000] [--repeat 5] [--warmup 1] [--chunk-records 250000].
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
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from bench import targets
from bench.spread import DEFAULT_REPEATS, Recorder
from harvest_outbox.harvest_local import LocalServices
from harvest_outbox.harvest_local.kafka import create_topic
from harvest_outbox.harvest_local.spark import local_spark_session
from harvest_outbox.sequencer import Clock, Publisher

TOPIC = "bench-spark"
PARTITIONS = 8
TXN = 1000
RING = 4


def write(bootstrap: str, records: int) -> int:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 20,
            "batch.size": 1 << 20,
            "queue.buffering.max.messages": 1_000_000,
            "compression.type": "lz4",
        }
    )
    clock = Clock()
    clock.update(time.time_ns())
    ring = [Publisher(clock=clock) for _ in range(RING)]
    value = b"v" * 100
    written = 0
    txn = 0
    while written < records:
        pub = ring[txn % RING]
        for i in range(min(TXN, records - written)):
            p = (written + i) % PARTITIONS
            u = pub.publish_uncommitted(f"{TOPIC}/{p}")
            producer.produce(
                TOPIC, key=f"key-{(written + i) % 1000}".encode(), value=value, partition=p, headers=[("uuid", u.bytes)]
            )
            if i % 10_000 == 0:
                producer.poll(0)
        written += min(TXN, records - written)
        for intent in pub.build_ack_intents():
            producer.produce(
                TOPIC,
                value=None,
                partition=int(intent.journal.rsplit("/", 1)[1]),
                headers=[("uuid", intent.uuid.bytes)],
            )
        txn += 1
        producer.poll(0)
    assert producer.flush(120) == 0
    return written


class RssSampler:
    """Peak RSS (bytes) of this process's descendants while :meth:`measure` is active, per kind:
    the JVM and the Python workers (pyspark's daemon and the workers it forks), sampled from /proc.
    Python workers are reused across jobs and keep what they grew to, so the workers' figure is the
    largest RSS any Python worker had while the variant ran (an upper bound of what its tasks
    needed), and ``python_workers_grew`` counts those that are new or grew by more than 8 MiB."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self._peaks: dict[int, tuple[str, int]] = {}
        self._first: dict[int, int] = {}
        self._stop = threading.Event()

    @contextmanager
    def measure(self) -> Iterator[dict[str, Any]]:
        self._peaks = {}
        self._first = {pid: _rss(pid) for pid, _ in _descendants(os.getpid())}
        self._stop.clear()
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        out: dict[str, Any] = {}
        try:
            yield out
        finally:
            self._stop.set()
            thread.join()
            jvm = [rss for kind, rss in self._peaks.values() if kind == "jvm"]
            workers = [rss for kind, rss in self._peaks.values() if kind == "python"]
            grew = [
                pid
                for pid, (kind, rss) in self._peaks.items()
                if kind == "python" and rss > self._first.get(pid, 0) + (8 << 20)
            ]
            out["jvm_peak_rss_mb"] = round(max(jvm, default=0) / 2**20)
            out["python_worker_peak_rss_mb"] = round(max(workers, default=0) / 2**20)
            out["python_workers_grew"] = len(grew)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid, kind in _descendants(os.getpid()):
                rss = _rss(pid)
                if rss and rss > self._peaks.get(pid, (kind, 0))[1]:
                    self._peaks[pid] = (kind, rss)
            self._stop.wait(self.interval)


def _descendants(root: int) -> list[tuple[int, str]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            cmd = (Path("/proc") / str(pid) / "cmdline").read_bytes()
        except OSError:
            continue
        kind = "jvm" if b"java" in cmd.split(b"\0", 1)[0] else "python" if b"pyspark" in cmd else "other"
        out.append((pid, kind))
    return out


def _rss(pid: int) -> int:
    try:
        for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def timed(fn: Callable[[], int], sampler: RssSampler) -> tuple[int, float, dict[str, Any]]:
    """``(rows, seconds, memory)`` of one variant."""
    with sampler.measure() as memory:
        t = time.perf_counter()
        rows = fn()
        elapsed = time.perf_counter() - t
    return rows, elapsed, memory


def task_phases(folder: Path) -> dict[str, Any]:
    """Seconds the harvest source's tasks spent per phase (split_sequencing.Phases lines), summed."""
    lines = [json.loads(line) for f in folder.glob("*.jsonl") for line in f.read_text().splitlines() if line]
    if not lines:
        return {}
    keys = ("total", "read", "first_batch", "sequence", "downstream", "release")
    return {
        "tasks": len(lines),
        "records": sum(x["records"] for x in lines),
        "task_seconds": {k: round(sum(x.get(k, 0.0) for x in lines), 2) for k in keys},
        "task_peak_rss_mb": round(max(x["peak_rss_bytes"] for x in lines) / 2**20),
    }


def _noop(df: Any) -> int:
    df.write.format("noop").mode("overwrite").save()
    return -1  # the noop sink counts nothing: rows are known from the count variants


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEATS, help="rounds, each running every variant")
    parser.add_argument("--chunk-records", type=int, default=None, help="readCommitted's chunk_records")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds of every variant first (JIT, workers)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from harvest_outbox.spark_reader import readCommitted
    from harvest_outbox.spark_reader.split_sequencing import DEFAULT_CHUNK_RECORDS, PHASE_LOG_ENV

    phase_dir = Path(tempfile.mkdtemp(prefix="bench-spark-phases-"))
    os.environ[PHASE_LOG_ENV] = str(phase_dir)  # inherited by the JVM and its Python workers

    chunk = args.chunk_records or DEFAULT_CHUNK_RECORDS
    recorder = Recorder(
        args.repeat, f"{args.warmup} untimed round(s) of every variant in the same JVM", targets.for_bench("spark")
    )
    sampler = RssSampler()
    with LocalServices() as services:
        bootstrap = services.endpoints.kafka_bootstrap
        create_topic(bootstrap, TOPIC, PARTITIONS)
        t = time.perf_counter()
        written = write(bootstrap, args.records)
        write_s = time.perf_counter() - t
        spark = local_spark_session("bench-spark")
        opts = {"kafka.bootstrap.servers": bootstrap}
        big_fetch = {
            **opts,
            "kafka.max.partition.fetch.bytes": str(16 << 20),
            "kafka.queued.max.messages.kbytes": str(64 << 10),
        }

        def raw() -> Any:
            return (
                spark.read.format("kafka")
                .options(**opts)
                .option("subscribe", TOPIC)
                .option("includeHeaders", "true")
                .load()
            )

        variants: dict[str, Callable[[], int]] = {
            "raw_count": lambda: raw().count(),
            "raw_noop": lambda: _noop(raw()),
            "readCommitted_count": lambda: readCommitted(spark, TOPIC, opts, chunk_records=chunk).count(),
            "readCommitted_noop": lambda: _noop(readCommitted(spark, TOPIC, opts, chunk_records=chunk)),
            "readCommitted_spark_source_count": lambda: readCommitted(spark, TOPIC, opts, source="spark").count(),
            # the harvest source with 16 MiB fetches per partition (kafka_arrow's default is 1 MiB)
            "readCommitted_big_fetch_count": lambda: readCommitted(
                spark, TOPIC, big_fetch, chunk_records=chunk
            ).count(),
        }
        seconds: dict[str, list[float]] = {name: [] for name in variants}
        memory: dict[str, dict[str, Any]] = {}
        in_topic = 0
        phases: dict[str, Any] = {}
        for round_ in range(args.warmup + args.repeat):
            # the order reversed every other round (bench/spread.py): no variant always runs first
            order = list(variants.items())
            for name, fn in order if round_ % 2 == 0 else order[::-1]:
                shutil.rmtree(phase_dir, ignore_errors=True)
                rows, elapsed, mem = timed(fn, sampler)
                phases[name] = task_phases(phase_dir)
                if round_ < args.warmup:
                    continue
                if name == "raw_count":
                    in_topic = rows
                elif name.endswith("_count"):
                    assert rows == written, (name, rows, written)
                seconds[name].append(elapsed)
                memory[name] = {k: max(v, memory.get(name, {}).get(k, 0)) for k, v in mem.items()}
        spark.stop()
    # rows/s of the committed rows for the readers, of every record in the topic for the raw reads
    rate = {
        name: statistics.median((in_topic if name.startswith("raw") else written) / s for s in secs)
        for name, secs in seconds.items()
    }

    def per_round(name: str) -> list[float]:
        return [(in_topic if name.startswith("raw") else written) / s for s in seconds[name]]

    for name, contestant, baseline, what in (
        ("readCommitted", "readCommitted_count", "raw_count", "readCommitted + count / raw Kafka read + count"),
        ("readCommitted_noop", "readCommitted_noop", "raw_noop", "readCommitted / raw read, written to the noop sink"),
        ("spark_source", "readCommitted_spark_source_count", "raw_count", "readCommitted(source='spark') / raw"),
        ("big_fetch", "readCommitted_big_fetch_count", "raw_count", "readCommitted, 16 MiB fetches / raw"),
    ):
        recorder.figure(name, per_round(contestant), per_round(baseline), f"{what}, rows/s")
    print(
        json.dumps(
            {
                "benchmark": "spark_readCommitted_vs_raw",
                "records": written,
                "raw_records_in_topic": in_topic,
                "repeat": args.repeat,
                "chunk_records": chunk,
                "write_records_per_s": round(written / write_s),
                "rows_per_s_median": {k: round(v) for k, v in rate.items()},
                "readCommitted_median_rows_per_s": round(rate["readCommitted_count"]),  # ./dev bench's table
                "seconds": {k: [round(s, 2) for s in v] for k, v in seconds.items()},
                "ratio_median": round(rate["readCommitted_count"] / rate["raw_count"], 3),
                "ratio_noop_median": round(rate["readCommitted_noop"] / rate["raw_noop"], 3),
                "ratio_count_to_raw_noop": round(rate["readCommitted_count"] / rate["raw_noop"], 3),
                "ratio_spark_source_median": round(rate["readCommitted_spark_source_count"] / rate["raw_count"], 3),
                "target_ratio": 0.9,
                "target_ratio_noop": 1.0,
                "peak_rss": memory,
                "harvest_task_phases_last_round": {k: v for k, v in phases.items() if v},
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "spark_master": "local[2]"},
                "spread": recorder.report(),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
