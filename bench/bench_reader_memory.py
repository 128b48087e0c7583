"""Benchmark: each reader's peak RSS per process as the topic grows (issue #35 item 4).

A reader's memory should be bounded by its batch (``poll_batch``, a task's ``chunk_records``, a
micro-batch's ``maxOffsetsPerTrigger``), not by the topic: reading a topic ten times larger should
peak at the same RSS, so the figure to watch is ``peak(largest) / peak(smallest)`` per process
kind, ≈ 1 when bounded and ≈ the size ratio when not.

Workload, per size in ``--records`` (default 1M and 10M): a fresh topic of N sequenced records
as the relay writes them in ``--uuid-sequencing`` mode (bench_consumer's writer: transactions of
``--txn`` CONTINUE_TXN records over ``--partitions`` partitions, then an ACK_TXN per touched
partition; ~100-byte values). Then, each in a fresh child process so no figure inherits another's
memory:

* ``iter/reader``: ``ReadCommittedIter.poll_batch(2000)`` reads the N committed records;
  ``iter/raw``: a plain confluent-kafka consumer with librdkafka's defaults reads every record of
  the topic (the baseline); ``iter/raw_bounded``: the same with the reader's bounded prefetch
  (``consumer.config.PREFETCH_DEFAULTS``).
  Peak RSS is the child's own VmHWM (exact), also after each quarter of the records.
* ``spark/harvest``: ``readCommitted(...).count()``, ``readCommitted`` to the ``noop`` sink and
  (``--stream``) ``readCommittedStream(state_location=...)`` with ``maxOffsetsPerTrigger``
  fixed at ``--micro-batch`` records, ``availableNow``, to the ``noop`` sink; ``spark/raw``:
  the same three on Spark's own Kafka source; ``spark/harvest_unreleased`` (``--families``): the
  harvest variants with ``HARVEST_SPARK_RELEASE_FREED=0`` in the executors' environment, the tasks
  leaving what each chunk freed to the allocators (the A/B of ``spark_reader.freed_memory``). One Spark application per (size, family) on
  ``--master`` (default ``local-cluster[2,1,1024]``: executor JVMs and their Python workers are
  processes of their own). The child samples /proc every ``--interval`` s (100 ms) and reports,
  per variant and per process kind -- ``driver_jvm``, ``executor_jvm``, ``python_daemon``,
  ``python_worker`` (forked by a daemon under an executor; on ``local[N]`` the driver JVM is the
  executor), ``driver_python`` (Python processes the driver JVM starts to plan a Python data
  source) -- the largest RSS one process of that kind had. Python workers are not reused
  (``spark.python.worker.reuse=false``): each task's worker is a fresh fork of the daemon, so its
  peak is that task's alone (the harvest tasks also log their own ``ru_maxrss``, split_sequencing's
  phase lines). The variants run in that order in one application, and a JVM's heap keeps what it
  grew to (up to the executor's ``-Xmx``), so a later variant's JVM figure is at least an earlier
  one's.

Prints JSON: per size, records/s and peaks; ``growth``: peak at the largest size over the smallest,
per reader and kind; the load average before and after.

    .venv/bin/python -m bench.bench_reader_memory [--records 1000000,10000000] [--master local[2]] [--no-stream]
        [--readers spark --families harvest,harvest_unreleased]

Services: harvest_local.LocalServices (``HARVEST_KAFKA_BOOTSTRAP`` points it at a running broker).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.bench_consumer import write

ITER_CHILDREN = ("reader", "raw", "raw_bounded")
SPARK_FAMILIES = ("harvest", "harvest_unreleased", "raw")
_RING, _BATCH, _POLL_BATCH = 8192, 256, 2000


# --- process sampling -------------------------------------------------------------------------


def _processes() -> dict[int, tuple[int, bytes]]:
    """``{pid: (ppid, cmdline)}`` of every process visible in /proc."""
    out: dict[int, tuple[int, bytes]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        out[int(entry.name)] = (ppid, cmd)
    return out


def classify(root: int, procs: dict[int, tuple[int, bytes]]) -> dict[int, str]:
    """The kind of each descendant of ``root`` (this process, the Spark driver's Python): the JVM it
    starts is the driver (and, on ``local[N]``, the executor), JVMs running an executor backend
    are executors, a pyspark daemon's forks are Python workers, and a Python process whose nearest
    JVM ancestor is the driver's is the driver's (planning a Python data source)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    below: list[int] = []
    stack = list(children.get(root, []))
    while stack:
        below.append(stack.pop())
        stack.extend(children.get(below[-1], []))
    cluster = any(b"CoarseGrainedExecutorBackend" in procs[pid][1] for pid in below)
    kinds: dict[int, str] = {}
    todo = [(pid, "") for pid in children.get(root, [])]  # (pid, the kind of its nearest JVM ancestor)
    while todo:
        pid, jvm = todo.pop()
        cmd = procs[pid][1]
        exe = cmd.split(b"\0", 1)[0]
        parent_kind = kinds.get(procs[pid][0], "")
        if exe.endswith(b"java"):
            kind = "executor_jvm" if b"CoarseGrainedExecutorBackend" in cmd else "driver_jvm"
            jvm = kind
        elif parent_kind == "python_daemon":
            kind = _worker_kind(jvm, cluster)
        elif b"pyspark.daemon" in cmd:  # its command line names pyspark.worker too: test first
            kind = "python_daemon"
        elif b"pyspark.worker" in cmd:
            kind = _worker_kind(jvm, cluster)
        elif jvm == "driver_jvm" and b"python" in exe:
            kind = "driver_python"
        else:
            kind = "other"
        kinds[pid] = kind
        todo.extend((c, jvm) for c in children.get(pid, []))
    return kinds


def _worker_kind(jvm: str, cluster: bool) -> str:
    """On ``local[N]`` the driver JVM is the executor: its Python workers run the tasks."""
    return "python_worker" if jvm == "executor_jvm" or not cluster else "driver_python"


def _rss(pid: int) -> int:
    try:
        for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class KindSampler:
    """The largest RSS one process of each kind had while :meth:`measure` was active (sampled every
    ``interval`` s), and how many processes of that kind were seen."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._peaks: dict[int, tuple[str, int]] = {}
        self._stop = threading.Event()

    @contextmanager
    def measure(self) -> Iterator[dict[str, Any]]:
        self._peaks = {}
        self._stop.clear()
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        out: dict[str, Any] = {}
        try:
            yield out
        finally:
            self._stop.set()
            thread.join()
            for kind in sorted({k for k, _ in self._peaks.values()} - {"other"}):
                sizes = [rss for k, rss in self._peaks.values() if k == kind]
                out[kind] = {"peak_rss_mb": round(max(sizes) / 2**20, 1), "processes": len(sizes)}

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid, kind in classify(os.getpid(), _processes()).items():
                rss = _rss(pid)
                if rss > self._peaks.get(pid, (kind, 0))[1]:
                    self._peaks[pid] = (kind, rss)
            self._stop.wait(self.interval)


# --- children ---------------------------------------------------------------------------------


def _vm_hwm_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmHWM in /proc/self/status")


def iter_child(bootstrap: str, topic: str, partitions: int, records: int, what: str) -> dict[str, Any]:
    """Read ``records`` with ReadCommittedIter.poll_batch (``what`` "reader": the committed records)
    or a plain consumer ("raw": every record, ACKs included; "raw_bounded": with the reader's prefetch
    bound); the process's peak RSS after each
    quarter of them and the read's records/s."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from harvest_outbox.consumer import ReadCommittedIter
    from harvest_outbox.consumer.config import PREFETCH_DEFAULTS

    marks = [records * q // 4 for q in (1, 2, 3, 4)]
    peaks: list[float] = []
    before = _vm_hwm_mb()
    seen = 0
    replays = 0
    if what == "reader":
        it = ReadCommittedIter({"bootstrap.servers": bootstrap}, topics=[topic], ring_size=_RING, batch_size=_BATCH)
        t0 = time.perf_counter()
        while seen < records:
            got = it.poll_batch(_POLL_BATCH, 10.0)
            if not got:
                raise SystemExit(f"reader stalled at {seen}/{records}")
            for r in got:
                _key, _value, _headers = r.key, r.value, r.headers  # every field, as an application would
            seen += len(got)
            while marks and seen >= marks[0]:
                marks.pop(0)
                peaks.append(_vm_hwm_mb())
        elapsed = time.perf_counter() - t0
        replays = it.stats["replays"]
        it.close()
    else:
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-mem-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                **(PREFETCH_DEFAULTS if what == "raw_bounded" else {}),
            }
        )
        c.list_topics(topic, timeout=30)
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        t0 = time.perf_counter()
        while seen < records:
            got = c.consume(_BATCH, 1.0)
            for m in got:
                _key, _value, _headers = m.key(), m.value(), m.headers()
            seen += len(got)
            while marks and seen >= marks[0]:
                marks.pop(0)
                peaks.append(_vm_hwm_mb())
        elapsed = time.perf_counter() - t0
        c.close()
    return {
        "records": seen,
        "records_per_s": round(seen / elapsed),
        "rss_before_read_mb": before,
        "peak_rss_mb_by_quarter": peaks,
        "peak_rss_mb": peaks[-1],
        "replays": replays,
    }


def spark_child(args: argparse.Namespace, family: str) -> dict[str, Any]:
    """One Spark application: the family's variants in turn, each's rows/s and per-kind peaks."""
    from harvest_outbox.harvest_local.spark import cluster_spark_session, local_spark_session
    from harvest_outbox.spark_reader import readCommitted, readCommittedStream
    from harvest_outbox.spark_reader.freed_memory import ENV as RELEASE_ENV
    from harvest_outbox.spark_reader.split_sequencing import PHASE_LOG_ENV

    scratch = Path(tempfile.mkdtemp(prefix="bench-mem-"))
    phase_dir = scratch / "phases"
    os.environ[PHASE_LOG_ENV] = str(phase_dir)  # local[N]: the workers inherit it; local-cluster: executorEnv
    conf = {
        f"spark.executorEnv.{PHASE_LOG_ENV}": str(phase_dir),
        # harvest_unreleased: the tasks leave what each chunk freed to the allocators (the A/B of
        # spark_reader.freed_memory, in the same run and on the same topic)
        **({f"spark.executorEnv.{RELEASE_ENV}": "0"} if family == "harvest_unreleased" else {}),
        # A fresh Python worker per task: a reused one keeps the RSS an earlier task (or variant) grew
        # it to, so a peak would be the largest of any task so far rather than this variant's.
        "spark.python.worker.reuse": "false",
        **dict(kv.split("=", 1) for kv in args.spark_conf.split(",") if kv),
    }
    master: str = args.master
    t = time.perf_counter()
    if master.startswith("local-cluster["):
        e, c, m = (int(x) for x in master[len("local-cluster[") : -1].split(","))
        spark = cluster_spark_session("bench-reader-memory", e, c, m, extra_conf=conf)
    elif master.startswith("local["):
        spark = local_spark_session("bench-reader-memory", int(master[len("local[") : -1]), extra_conf=conf)
    else:
        raise SystemExit(f"--master {master!r}: pass local[N] or local-cluster[E,C,M]")
    started_s = time.perf_counter() - t
    opts = {"kafka.bootstrap.servers": args.bootstrap}
    topic = args.topic
    extra = dict(kv.split("=", 1) for kv in args.spark_kafka.split(",") if kv)  # the harvest source's only
    hopts = {**opts, **{f"kafka.{k}": v for k, v in extra.items()}}

    def raw(stream: bool = False) -> Any:
        reader = spark.readStream if stream else spark.read
        df = reader.format("kafka").options(**opts).option("subscribe", topic).option("includeHeaders", "true")
        if stream:
            df = df.option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(args.micro_batch))
        return df.load()

    def noop(df: Any) -> int:
        df.write.format("noop").mode("overwrite").save()
        return -1

    def stream(df: Any, name: str) -> int:
        q = (
            df.writeStream.format("noop")
            .option("checkpointLocation", str(scratch / f"chk-{name}"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        if q.exception() is not None:
            raise RuntimeError(f"{name} failed: {q.exception()}")
        return -len(q.recentProgress)  # micro-batches, as a negative: not a row count

    variants: dict[str, Callable[[], int]]
    if family == "raw":
        variants = {"count": lambda: raw().count(), "noop": lambda: noop(raw())}
        if args.stream:
            variants["stream"] = lambda: stream(raw(stream=True), "raw")
    else:
        chunk = {"chunk_records": args.chunk_records} if args.chunk_records else {}
        variants = {
            "count": lambda: readCommitted(spark, topic, hopts, **chunk).count(),
            "noop": lambda: noop(readCommitted(spark, topic, hopts, **chunk)),
        }
        if args.stream:
            variants["stream"] = lambda: stream(
                readCommittedStream(
                    spark,
                    topic,
                    hopts,
                    max_offsets_per_trigger=args.micro_batch,
                    state_location=str(scratch / "state"),
                ),
                "harvest",
            )
    sampler = KindSampler(args.interval)
    out: dict[str, Any] = {"master": master, "session_start_s": round(started_s, 1)}
    rows_expected = args.records if family.startswith("harvest") else args.in_log
    for name, fn in variants.items():
        shutil.rmtree(phase_dir, ignore_errors=True)
        with sampler.measure() as peaks:
            t = time.perf_counter()
            got = fn()
            elapsed = time.perf_counter() - t
        if got >= 0 and got != rows_expected:
            raise SystemExit(f"{family}/{name}: {got} rows, expected {rows_expected}")
        d: dict[str, Any] = {"seconds": round(elapsed, 2), "rows_per_s": round(rows_expected / elapsed)}
        if got < 0 and name == "stream":
            d["micro_batches"] = -got
        d["peaks"] = peaks
        tasks = [json.loads(x) for f in phase_dir.glob("*.jsonl") for x in f.read_text().splitlines() if x]
        if tasks:
            d["harvest_tasks"] = len(tasks)
            d["harvest_task_max_records"] = max(x["records"] for x in tasks)
            d["harvest_task_peak_ru_maxrss_mb"] = round(max(x["peak_rss_bytes"] for x in tasks) / 2**20, 1)
            d["harvest_task_seconds"] = {
                k: round(sum(x.get(k, 0.0) for x in tasks), 2) for k in ("total", "read", "sequence", "release")
            }
        out[name] = d
    spark.stop()
    shutil.rmtree(scratch, ignore_errors=True)
    return out


def _child(args: argparse.Namespace, kind: str, what: str, topic: str, records: int, in_log: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.bench_reader_memory", "--child", f"{kind}:{what}", "--topic", topic]
    cmd += ["--bootstrap", args.bootstrap, "--records", str(records), "--in-log", str(in_log)]
    cmd += ["--partitions", str(args.partitions), "--master", args.master, "--interval", str(args.interval)]
    cmd += ["--micro-batch", str(args.micro_batch), "--chunk-records", str(args.chunk_records or 0)]
    cmd += ["--spark-kafka", args.spark_kafka, "--spark-conf", args.spark_conf]
    cmd += [] if args.stream else ["--no-stream"]
    print(f"[bench_reader_memory] {kind}:{what}, {records:,} records", file=sys.stderr, flush=True)
    # Its own process group: a Spark child's JVMs go with it if it is killed.
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=args.child_timeout, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child {kind}:{what} ({records} records) exited with {done.returncode}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        f"[bench_reader_memory] {kind}:{what}, {records:,} records: {json.dumps(result)}", file=sys.stderr, flush=True
    )
    return result


def _growth(sizes: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Peak at the largest size over the smallest, per reader / variant / process kind."""
    keys = sorted(sizes, key=int)
    small, big = sizes[keys[0]], sizes[keys[-1]]
    out: dict[str, float] = {}
    for what in ITER_CHILDREN:
        a, b = small.get("iter", {}).get(what), big.get("iter", {}).get(what)
        if a and b:
            out[f"iter/{what}"] = round(b["peak_rss_mb"] / a["peak_rss_mb"], 3)
    for family in SPARK_FAMILIES:
        fa, fb = small.get("spark", {}).get(family) or {}, big.get("spark", {}).get(family) or {}
        for variant, va in fa.items():
            vb = fb.get(variant)
            if not isinstance(va, dict) or not isinstance(vb, dict):
                continue
            for kind, pa_ in va["peaks"].items():
                pb = vb["peaks"].get(kind)
                if pb:
                    out[f"spark/{family}/{variant}/{kind}"] = round(pb["peak_rss_mb"] / pa_["peak_rss_mb"], 3)
            if "harvest_task_peak_ru_maxrss_mb" in va and "harvest_task_peak_ru_maxrss_mb" in vb:
                out[f"spark/{family}/{variant}/task_ru_maxrss"] = round(
                    vb["harvest_task_peak_ru_maxrss_mb"] / va["harvest_task_peak_ru_maxrss_mb"], 3
                )
    return out


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", default="1000000,10000000", help="comma-separated topic sizes (committed records)")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--txn", type=int, default=1000)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--master", default="local-cluster[2,1,1024]", help="local[N] or local-cluster[E,C,M]")
    ap.add_argument("--readers", default="iter,spark", help="comma-separated subset of iter,spark")
    ap.add_argument(
        "--families",
        default="harvest,raw",
        help="Spark readers: comma-separated subset of harvest,harvest_unreleased,raw",
    )
    ap.add_argument("--no-stream", dest="stream", action="store_false", help="skip the streaming variants")
    ap.add_argument("--micro-batch", type=int, default=200_000, help="the streams' maxOffsetsPerTrigger")
    ap.add_argument("--chunk-records", type=int, default=0, help="readCommitted's chunk_records (0: its default)")
    ap.add_argument(
        "--spark-kafka",
        default="",
        help="librdkafka properties for the harvest source's consumers, k=v,... (e.g. queued.max.messages.kbytes=1024)",
    )
    ap.add_argument("--spark-conf", default="", help="Spark settings, k=v,... (e.g. spark.default.parallelism=8)")
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between /proc samples")
    ap.add_argument("--child-timeout", type=float, default=3600.0)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--bootstrap", help=argparse.SUPPRESS)
    ap.add_argument("--topic", help=argparse.SUPPRESS)
    ap.add_argument("--in-log", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, what = args.child.split(":")
        records = int(args.records)
        if kind == "iter":
            result = iter_child(
                args.bootstrap, args.topic, args.partitions, records if what == "reader" else args.in_log, what
            )
        else:
            args.records = records
            result = spark_child(args, what)
        print(json.dumps(result))
        return 0

    from harvest_outbox.harvest_local import LocalServices
    from harvest_outbox.harvest_local.kafka import create_topic

    sizes = sorted(int(x) for x in args.records.split(","))
    readers = set(args.readers.split(","))
    load_before = _load()
    out: dict[str, Any] = {}
    with LocalServices() as services:
        args.bootstrap = services.endpoints.kafka_bootstrap
        for n in sizes:
            topic = f"bench_memory_{n}_{uuid.uuid4().hex[:6]}"
            create_topic(args.bootstrap, topic, args.partitions)
            t = time.perf_counter()
            in_log = write(args.bootstrap, topic, n, args.partitions, args.txn, args.value_size)
            size: dict[str, Any] = {"records_in_log": in_log, "write_s": round(time.perf_counter() - t, 1)}
            if "iter" in readers:
                size["iter"] = {w: _child(args, "iter", w, topic, n, in_log) for w in ITER_CHILDREN}
            if "spark" in readers:
                families = [f for f in SPARK_FAMILIES if f in args.families.split(",")]
                size["spark"] = {f: _child(args, "spark", f, topic, n, in_log) for f in families}
            size["load_after"] = _load()
            out[str(n)] = size
            _delete_topic(args.bootstrap, topic)  # a 10M-record topic is ~1.5 GB on disk
    result = {
        "benchmark": "reader peak RSS per process vs topic size",
        "records": sizes,
        "partitions": args.partitions,
        "txn_size": args.txn,
        "value_size": args.value_size,
        "master": args.master,
        "micro_batch": args.micro_batch,
        "spark_kafka": args.spark_kafka,
        "spark_conf": args.spark_conf,
        "chunk_records": args.chunk_records or "default",
        "poll_batch": _POLL_BATCH,
        "sizes": out,
        "growth": _growth(out) if len(out) > 1 else {},
        "size_ratio": round(sizes[-1] / sizes[0], 1),
        "load_before": load_before,
        "load_after": _load(),
        "cpu_count": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    return 0


def _delete_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the futures resolve
    for future in admin.delete_topics([topic]).values():
        future.result(60)


if __name__ == "__main__":
    sys.exit(main())
