"""Benchmark: outbox commit -> Parquet and Delta tables, end to end, through the relay and the Spark pipeline.

Workload: one transaction commits ``--rows`` outbox rows (default 1,000,000; ``stash_backlog``: the
demo's backlog, keys round-robin over ``--keys``), while a ``harvest --uuid-sequencing`` relay
(one process, default limits) and the streaming pipeline (``spark_reader.pipeline``, a process of
its own on ``local[2]``, 1 s trigger, already started and idle: a long-lived job) run. Times,
from the commit:

- ``relay``: until the outbox is empty (every row committed to Kafka by the relay);
- ``events``: until the event table (file sink, as its readers see it) holds every row: the
  end-to-end figure;
- ``latest``: until the latest-state table's newest version reflects every key's last version.

Per stage, rows/s. The pipeline runs concurrently with the relay, so its end-to-end rate is
bounded by the relay's; to name the slowest stage, the same run then measures the pipeline alone:
a fresh ``--available-now`` run over the drained topic (``pipeline_alone``: rows / the sum of its
micro-batches' durations from its progress lines, excluding the JVM's start). The baseline of the
ratios is the relay's drain rate, measured in the same run. ``--repeat`` repeats the whole run on
fresh tables and topic (medians are quoted).

Both table formats (``--formats parquet,delta``) run in each repeat, one after the other (the order swapped
each repeat), each on a backlog and topic of its own: Delta (``--format delta``: micro-batches collected to the
driver as Arrow and written by delta-rs) is compared with Parquet (Spark's file sink) in the same run, end to
end and alone (``ratio_delta_vs_parquet``; target >= 0.8; per repeat pair in ``spread``). Memory: the driver's
peak, sampled every 0.25 s over its process group (the Python driver, its JVM with the local executors, the
Python workers), and the Python driver's own high-water mark (``VmHWM``: where Delta's collected
micro-batches live).

Usage: python -m bench.bench_pipeline [--rows 1000000] [--repeat 5] [--formats parquet,delta]. Prints JSON.
Not a test.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench import targets
from bench.spread import DEFAULT_REPEATS, Recorder
from harvest_outbox.harvest_local import LocalServices
from harvest_outbox.harvest_local.kafka import create_topic
from harvest_outbox.harvest_local.pipeline_process import PipelineProcess
from harvest_outbox.harvest_local.relays import RelayProcess, current_leader, wait_for, write_config
from harvest_outbox.harvest_local.workload import committed_versions, create_accounts, stash_backlog

PARTITIONS = 4
_PROGRESS = re.compile(r"progress (\{.*\})$")


def _outbox_rows(dsn: str, outbox: str) -> int:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn) as conn:
        return int(
            conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(*outbox.split(".")))).fetchone()[0]
        )  # type: ignore[index]


def _delta_rows(events: Path) -> int:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return int(DeltaTable(str(events)).count())
    except TableNotFoundError:
        return 0


def _latest_versions(latest: Path, fmt: str = "parquet") -> dict[str, int] | None:
    from harvest_outbox.spark_reader.latest_table import read_local_snapshot

    if fmt == "delta":
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            snapshot = DeltaTable(str(latest)).to_pyarrow_table(columns=["key", "value"])
        except TableNotFoundError:
            return None
    else:
        snapshot = read_local_snapshot(str(latest), columns=["key", "value"])
    if snapshot is None:
        return None
    t = snapshot.to_pydict()
    return {k.decode(): int(json.loads(v)["version"]) for k, v in zip(t["key"], t["value"], strict=True)}


def _events_progress(log_text: str, start_marker: str) -> list[dict[str, Any]]:
    tail = log_text[log_text.rfind(start_marker) :] if start_marker in log_text else log_text
    out = []
    for line in tail.splitlines():
        m = _PROGRESS.search(line)
        if m:
            p = json.loads(m.group(1))
            if p["query"] == "events" and p["rows"]:
                out.append(p)
    return out


class GroupMemory:
    """The peak of the summed resident memory of process group ``pgid``, sampled every 0.25 s."""

    def __init__(self, pgid: int) -> None:
        self.pgid, self.peak = pgid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.wait(0.25):
            total = 0
            for pid in (p for p in os.listdir("/proc") if p.isdigit()):
                try:
                    stat = Path(f"/proc/{pid}/stat").read_text()
                    if int(stat.rsplit(")", 1)[1].split()[2]) == self.pgid:  # field 5: the process group
                        total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
                except (OSError, ValueError, IndexError):
                    continue  # gone meanwhile
            self.peak = max(self.peak, total)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def _python_hwm(pid: int | None) -> int | None:
    """The Python driver's resident high-water mark in bytes (``VmHWM``)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def one_run(
    dsn: str, bootstrap: str, rows: int, keys: int, work: Path, timeout: float, fmt: str = "parquet"
) -> dict[str, Any]:
    from harvest_outbox.producer.schema.ddl import init_db

    schema = f"bench_pipe_{uuid.uuid4().hex[:6]}"
    topic, outbox = f"bench-pipeline-{uuid.uuid4().hex[:6]}", f"{schema}.outbox"
    create_accounts(dsn, schema, keys)
    init_db(dsn, outbox)
    create_topic(bootstrap, topic, PARTITIONS)
    cfg = write_config(work / "harvest.yaml", dsn=dsn, bootstrap=bootstrap, outbox_table=outbox, group=topic)
    relay = RelayProcess(cfg, "relay", work).start()
    pipeline = PipelineProcess(topic=topic, bootstrap=bootstrap, root=work / "pipe", logdir=work, format=fmt)
    alone = PipelineProcess(
        topic=topic, bootstrap=bootstrap, root=work / "alone", logdir=work, name="alone", format=fmt
    )

    def in_events() -> int:
        if fmt == "delta":
            return _delta_rows(pipeline.events_path)
        return sum(f.rows for f in pipeline.committed_files())

    memory: GroupMemory | None = None
    try:
        wait_for(lambda: current_leader([relay]) is not None, 120, "the relay to lead")
        pipeline.start()
        assert pipeline.pid is not None
        memory = GroupMemory(pipeline.pid)
        # Long-lived job: wait until its queries run (Parquet: the latest query logs its first, empty batch).
        started = '"query": "latest"' if fmt == "parquet" else "pipeline running:"
        wait_for(lambda: started in pipeline.text(), timeout, "the pipeline to start", poll=0.5)
        backlog = stash_backlog(dsn, schema, outbox, topic, keys, rows)
        t0 = backlog.committed_at
        truth = committed_versions(dsn, schema)
        times: dict[str, float] = {}
        deadline = time.time() + timeout
        while len(times) < 3:
            now = time.time()
            if "relay" not in times and _outbox_rows(dsn, outbox) == 0:
                times["relay"] = time.time() - t0
            if "events" not in times and in_events() >= rows:
                times["events"] = time.time() - t0
            if "latest" not in times and _latest_versions(pipeline.latest_path, fmt) == truth:
                times["latest"] = time.time() - t0
            if now > deadline or not pipeline.alive:
                raise RuntimeError(f"run incomplete after {now - t0:.0f}s: {times}; logs in {work}")
            time.sleep(0.2)
        in_table = in_events()
        python_hwm = _python_hwm(pipeline.pid)
        group_peak = memory.stop()
        pipeline.stop()
        relay.stop()
        # The pipeline alone over the drained topic: its own processing rate, without the JVM's start.
        alone.start(available_now=True)
        code = alone.wait(timeout)
        if code != 0:
            raise RuntimeError(f"available-now run exited {code}; log {alone.log}")
        progress = _events_progress(alone.text(), "---- start")
        alone_rows = sum(p["rows"] for p in progress)
        alone_ms = sum(p["ms"] for p in progress)
    finally:
        if memory is not None:
            memory.stop()
        pipeline.kill()
        alone.kill()
        relay.stop()
    return {
        "format": fmt,
        "rows": rows,
        "rows_in_event_table": in_table,
        "driver_memory_peak_mb": {
            "process_group": round(group_peak / 2**20),
            "python_driver": None if python_hwm is None else round(python_hwm / 2**20),
        },
        "seconds_from_commit": {k: round(v, 2) for k, v in times.items()},
        "rows_per_s": {k: round(rows / v) for k, v in times.items()},
        "pipeline_alone": {
            "rows": alone_rows,
            "micro_batches": len(progress),
            "batch_ms_sum": alone_ms,
            "rows_per_s": round(alone_rows / (alone_ms / 1000)) if alone_ms else None,
        },
    }


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def med(get: Any) -> float:
        return statistics.median(get(r) for r in runs)

    relay = med(lambda r: r["rows_per_s"]["relay"])
    stages = {
        "relay (outbox -> Kafka)": relay,
        "pipeline alone (Kafka -> event table)": med(lambda r: r["pipeline_alone"]["rows_per_s"] or 0),
    }
    e2e = med(lambda r: r["rows_per_s"]["events"])
    return {
        "median_rows_per_s": {
            "relay_drain": round(relay),
            "end_to_end_event_table": round(e2e),
            "end_to_end_latest_table": round(med(lambda r: r["rows_per_s"]["latest"])),
            "pipeline_alone": round(stages["pipeline alone (Kafka -> event table)"]),
        },
        "range_end_to_end_event_table": [
            min(r["rows_per_s"]["events"] for r in runs),
            max(r["rows_per_s"]["events"] for r in runs),
        ],
        "median_driver_memory_peak_mb": {
            k: med(lambda r, k=k: r["driver_memory_peak_mb"][k] or 0) for k in ("process_group", "python_driver")
        },
        "ratio_end_to_end_vs_relay": round(e2e / relay, 3),
        "slowest_stage": min(stages, key=lambda k: stages[k]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="backlog rows (default 1000000)")
    parser.add_argument("--keys", type=int, default=1000, help="distinct keys (default 1000)")
    parser.add_argument(
        "--repeat", type=int, default=DEFAULT_REPEATS, help=f"whole runs (default {DEFAULT_REPEATS}; medians)"
    )
    parser.add_argument("--formats", default="parquet,delta", help="table formats, in this order (default both)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per stage wait (default 1800)")
    args = parser.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    if not formats or any(f not in ("parquet", "delta") for f in formats):
        parser.error(f"--formats {args.formats!r}: pass parquet, delta or both, comma-separated")
    logging.basicConfig(level=logging.WARNING)
    recorder = Recorder(
        args.repeat, "none: the pipeline is started and idle before each run's commit", targets.for_bench("pipeline")
    )
    runs: dict[str, list[dict[str, Any]]] = {f: [] for f in formats}
    with LocalServices() as services, tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        for i in range(args.repeat):
            # the order swapped each repeat (bench/spread.py): drift hits both formats
            for fmt in formats if i % 2 == 0 else formats[::-1]:
                work = Path(tmp) / f"run-{i}-{fmt}"
                work.mkdir()
                runs[fmt].append(
                    one_run(
                        services.endpoints.pg_dsn,
                        services.endpoints.kafka_bootstrap,
                        args.rows,
                        args.keys,
                        work,
                        args.timeout,
                        fmt,
                    )
                )
    for fmt, rs in runs.items():
        # relay and pipeline run concurrently within a run: each run is its own pair
        recorder.figure(
            f"{fmt}/end_to_end_to_relay",
            [r["rows_per_s"]["events"] for r in rs],
            [r["rows_per_s"]["relay"] for r in rs],
            f"commit -> {fmt} event table / the relay's drain, same run, rows/s",
        )
    if "parquet" in runs and "delta" in runs:
        recorder.figure(
            "delta_vs_parquet",
            [r["rows_per_s"]["events"] for r in runs["delta"]],
            [r["rows_per_s"]["events"] for r in runs["parquet"]],
            "commit -> Delta event table / commit -> Parquet event table, same repeat, rows/s",
        )
    summary = {fmt: _summary(r) for fmt, r in runs.items()}
    out: dict[str, Any] = {
        "benchmark": "pipeline_end_to_end",
        "rows": args.rows,
        "keys": args.keys,
        "repeat": args.repeat,
        "partitions": PARTITIONS,
        "runs": runs,
        "formats": summary,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "spark_master": "local[2]"},
    }
    first = summary[formats[0]]
    out.update({k: first[k] for k in ("median_rows_per_s", "ratio_end_to_end_vs_relay", "slowest_stage")})
    if "parquet" in summary and "delta" in summary:
        p, d = summary["parquet"]["median_rows_per_s"], summary["delta"]["median_rows_per_s"]
        out["ratio_delta_vs_parquet"] = {
            k: round(d[k] / p[k], 3) if p[k] else None
            for k in ("end_to_end_event_table", "end_to_end_latest_table", "pipeline_alone")
        }
    out["spread"] = recorder.report()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
