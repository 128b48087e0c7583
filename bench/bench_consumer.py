"""Benchmark: ReadCommittedIter vs a plain confluent-kafka consumer over the same records.

Writes N sequenced records as the harvest relay does in ``--uuid-sequencing``
mode (harvest transactions of ``--txn`` CONTINUE_TXN records spread over
``--partitions`` partitions, then one ACK_TXN per touched partition), then,
in the same run and alternating, reads them all ``--runs`` times:

* raw: a plain confluent-kafka Consumer (assign, consume() batches of what is
  ready, blocking in poll() only when nothing is), touching key, value, headers
  and offset of every record, as an application would; configured and timed
  like the reader's own consumer (same consume() batch size ``--batch``, no
  per-record offset store, the same bounded prefetch, ``PREFETCH_DEFAULTS``, connected
  before the clock starts);
* committed: ``ReadCommittedIter`` (ring ``--ring``), delivering the N
  committed records (ACKs filtered out), once with ``poll_batch(2000)``
  ("batch", the headline ratio) and once per ``poll()``.

Prints JSON: median records/s of both, the ratio (target >= 0.95, issue #35) with its spread (a ratio
per repeat pair, ``--runs`` pairs after ``--warmup`` untimed passes; bench/spread.py), and memory:
the peak RSS of a reader *process* (a fresh child interpreter that only reads),
at half and at all of the N records, next to a plain consumer's in the same
kind of child: bounded by the consume batch, the ring and librdkafka's fetch
queue, not by N, so the two reader figures agree within noise; and a
tracemalloc peak of one extra (untimed) committed pass.

``--stages`` adds where the reader's time per record goes (Python-thread CPU
ns per record of consume(), the fused batch path -- conversion, queueing into
the Sequencer and dequeueing in one compiled pass -- or those steps one by one
without it, and the application's field access), next to a plain
consumer's, measured by wrapping the reader's internal calls (docs/reading-python.md
quotes the breakdown).

    .venv/bin/python -m bench.bench_consumer [--records 1000000] [--stages]

Services: harvest_local.LocalServices (``HARVEST_KAFKA_BOOTSTRAP`` /
``HARVEST_PG_DSN`` point it at running ones).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
import uuid
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from bench import targets
from bench.spread import DEFAULT_REPEATS, Recorder
from harvest_outbox.consumer import ReadCommittedIter
from harvest_outbox.consumer.config import PREFETCH_DEFAULTS
from harvest_outbox.harvest_local import LocalServices
from harvest_outbox.harvest_local.kafka import create_topic
from harvest_outbox.sequencer import Clock, Publisher, journal_name


def write(bootstrap: str, topic: str, records: int, partitions: int, txn: int, value_size: int) -> int:
    """Returns the total number of records written (CONTINUEs + ACKs)."""
    prod = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 20,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 500000,
            "compression.type": "lz4",
        }
    )
    clock = Clock()
    clock.update(time.time_ns())
    pub = Publisher(clock=clock)
    value = b"x" * value_size
    journals = [journal_name(topic, p) for p in range(partitions)]
    total = 0
    written = 0
    while written < records:
        n = min(txn, records - written)
        clock.update(time.time_ns())
        for i in range(n):
            p = (written + i) % partitions
            u = pub.publish_uncommitted(journals[p])
            while True:
                try:
                    prod.produce(
                        topic, value=value, key=b"k%d" % (written + i), partition=p, headers=[("uuid", u.bytes)]
                    )
                    break
                except BufferError:
                    prod.poll(0.05)
        written += n
        total += n
        for intent in pub.build_ack_intents():
            p = int(intent.journal.rpartition("/")[2])
            prod.produce(topic, value=b"", partition=p, headers=[("uuid", intent.uuid.bytes)])
            total += 1
        prod.poll(0)
    assert prod.flush(120) == 0
    return total


def raw_pass(bootstrap: str, topic: str, partitions: int, total: int, batch: int) -> tuple[float, float]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-raw-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",
            # as the reader's consumer: no per-record offset store in consume()
            "enable.auto.offset.store": False,
            "enable.partition.eof": False,
            **PREFETCH_DEFAULTS,  # the reader's bounded prefetch (consumer/config.py)
        }
    )
    # Connect and fetch metadata before the clock starts, as ReadCommittedIter's constructor does.
    c.list_topics(topic, timeout=30)
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    seen = 0
    t0 = time.perf_counter()
    c0 = time.thread_time()
    sink = 0
    while seen < total:
        # Take what is ready, and block only when nothing is: consume(n, 1.0) alone waits for n
        # records to accumulate and measured half this rate (the reader reads the same way).
        got = c.consume(batch, 0)
        if not got:
            first = c.poll(1.0)
            got = [first, *c.consume(batch - 1, 0)] if first is not None else []
        for m in got:
            if m.error() is not None:
                continue
            # Read every field, as an application would: the accessors are part of the cost measured.
            _key, _value, _headers, o = m.key(), m.value(), m.headers(), m.offset()
            sink += o
            seen += 1
    dt = time.perf_counter() - t0
    cpu = time.thread_time() - c0
    c.close()
    return total / dt, total / cpu


def committed_pass(
    bootstrap: str, topic: str, records: int, ring: int, mode: str = "batch", batch: int = 256
) -> tuple[float, float, dict[str, int]]:
    """``mode``: "batch" reads with ``poll_batch(2000)`` (the reader consumes ``batch`` at a time),
    "poll" one record per ``poll()``."""
    it = ReadCommittedIter({"bootstrap.servers": bootstrap}, topics=[topic], ring_size=ring, batch_size=batch)
    seen = 0
    sink = 0
    t0 = time.perf_counter()
    c0 = time.thread_time()
    if mode == "batch":
        while seen < records:
            batch = it.poll_batch(2000, 5.0)
            if not batch:
                raise SystemExit(f"committed pass stalled at {seen}/{records}")
            for r in batch:
                _key, _value, _headers, o = r.key, r.value, r.headers, r.offset  # every field, as above
                sink += o
            seen += len(batch)
    else:
        while seen < records:
            r = it.poll(5.0)
            if r is None:
                raise SystemExit(f"committed pass stalled at {seen}/{records}")
            _key, _value, _headers, o = r.key, r.value, r.headers, r.offset
            sink += o
            seen += 1
    dt = time.perf_counter() - t0
    cpu = time.thread_time() - c0
    stats = it.stats
    it.close()
    return records / dt, records / cpu, stats


def _peak_rss_mb() -> float:
    """This process's peak RSS: VmHWM (its own address space; ru_maxrss of an exec'd child also counts
    the parent's memory it was forked with), else ru_maxrss where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _reader_child(bootstrap: str, topic: str, partitions: int, records: int, ring: int, batch: int, what: str) -> None:
    """Child process: read ``records`` committed records with poll_batch (``what`` "reader"), or that
    many records with a plain consumer ("raw"); print the process's peak RSS after each quarter of
    them, and of its Python heap (tracemalloc; JSON, last line). Bounded memory: the heap peak is
    the same after all records as after the first quarter (batch, ring, open spans), and the RSS
    peak stops growing once librdkafka's fetch queue is full."""
    marks = [records * q // 4 for q in (1, 2, 3, 4)]
    peaks: list[float] = []
    heap: list[float] = []  # Python heap peak (tracemalloc): the reader's own objects, librdkafka's excluded
    replays: list[int] = []  # replays so far (the first creates the replay consumer, with its own fetch queue)
    before = _peak_rss_mb()
    seen = 0
    tracemalloc.start()
    if what == "reader":
        it = ReadCommittedIter({"bootstrap.servers": bootstrap}, topics=[topic], ring_size=ring, batch_size=batch)
        while seen < records:
            got = it.poll_batch(2000, 5.0)
            if not got:
                raise SystemExit(f"reader stalled at {seen}/{records}")
            seen += len(got)
            while marks and seen >= marks[0]:
                marks.pop(0)
                peaks.append(_peak_rss_mb())
                heap.append(round(tracemalloc.get_traced_memory()[1] / 2**20, 2))
                replays.append(it.stats["replays"])
        it.close()
    else:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-raw-{uuid.uuid4().hex}"})
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        while seen < records:
            got = c.consume(batch, 1.0)
            for m in got:
                m.headers()
            seen += len(got)
            while marks and seen >= marks[0]:
                marks.pop(0)
                peaks.append(_peak_rss_mb())
                heap.append(round(tracemalloc.get_traced_memory()[1] / 2**20, 2))
        c.close()
    got = {"peak_rss_mb_by_quarter": peaks, "heap_peak_mb_by_quarter": heap, "replays_by_quarter": replays}
    print(json.dumps({**got, "rss_before_read_mb": before}))


def _child_rss(args: argparse.Namespace, bootstrap: str, topic: str, records: int, what: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.bench_consumer", "--child", what, "--bootstrap", bootstrap, "--topic", topic]
    cmd += ["--records", str(records), "--partitions", str(args.partitions), "--ring", str(args.ring)]
    cmd += ["--batch", str(args.batch)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"RSS child ({what}, {records} records) failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _raw_stage_pass(bootstrap: str, topic: str, partitions: int, total: int, batch: int, level: int) -> float:
    """raw_pass's loop, Python-thread CPU ns per record: level 0 only consumes, 1 also builds the header
    list (headers(); the reader's conversion does), 2 reads every field as raw_pass does."""
    from harvest_outbox.consumer.uncommitted import _consume_batch

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-raw-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": False,
            **PREFETCH_DEFAULTS,  # the reader's bounded prefetch (consumer/config.py)
        }
    )
    c.list_topics(topic, timeout=30)
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    seen = sink = 0
    c0 = time.thread_time()
    while seen < total:
        got = _consume_batch(c, batch, 1.0)
        if level == 2:
            for m in got:
                _key, _value, _headers, o = m.key(), m.value(), m.headers(), m.offset()
                sink += o
        elif level == 1:
            for m in got:
                m.headers()
        seen += len(got)
    cpu = time.thread_time() - c0
    c.close()
    return cpu / total * 1e9


def stages(bootstrap: str, topic: str, partitions: int, total: int, records: int, ring: int, batch: int) -> dict:
    """Python-thread CPU ns per record by stage, the reader (one poll_batch pass with its internal calls
    wrapped in thread-CPU timers) next to a plain consumer at three levels of work (see _raw_stage_pass)."""
    from harvest_outbox.consumer import committed as com
    from harvest_outbox.consumer import uncommitted as unc

    acc: dict[str, float] = {}
    restore: list[tuple[object, str, object]] = []

    def wrap(owner: object, name: str, key: str) -> None:
        orig = getattr(owner, name)

        def timed(*a: object, **k: object) -> object:
            t = time.thread_time()
            try:
                return orig(*a, **k)
            finally:
                acc[key] = acc.get(key, 0.0) + time.thread_time() - t

        restore.append((owner, name, orig))
        setattr(owner, name, timed)

    out: dict[str, float] = {}
    for level in (0, 1, 2):
        out[f"raw_level{level}_ns"] = _raw_stage_pass(bootstrap, topic, partitions, total, batch, level)
    wrap(unc, "_consume_batch", "consume")
    if unc._native_convert is not None:
        wrap(unc, "_native_convert", "convert_native")
    wrap(unc.ReadUncommittedIter, "_convert_entries", "convert")
    wrap(com.ReadCommittedIter, "_queue_buffered", "queue")
    if com._sequence_raw is not None:
        wrap(com, "_sequence_raw", "fused")
    wrap(com.ReadCommittedIter, "poll_batch", "poll_batch")
    try:
        _, cpu_rate, _ = committed_pass(bootstrap, topic, records, ring, "batch", batch)
    finally:
        for owner, name, orig in reversed(restore):
            setattr(owner, name, orig)
    ns = {k: v / records * 1e9 for k, v in acc.items()}
    reader_total = 1e9 / cpu_rate
    headers = out["raw_level1_ns"] - out["raw_level0_ns"]
    r = {
        "raw_total_ns": out["raw_level2_ns"],
        "raw_consume_and_free_ns": out["raw_level0_ns"],
        "raw_build_header_lists_ns": headers,
        "raw_read_fields_ns": out["raw_level2_ns"] - out["raw_level1_ns"],
        "reader_total_ns": reader_total,
        "reader_consume_ns": ns.get("consume", 0.0),
        # the fused batch path (consumer/_native.pyx sequence_raw): conversion (building each header
        # list first), queueing and dequeueing in one compiled pass; 0 without the native extensions
        "reader_fused_ns": ns.get("fused", 0.0),
        "reader_fused_without_header_lists_ns": ns["fused"] - headers if "fused" in ns else 0.0,
        # the compiled conversion (consumer/_native.pyx convert) of what the fused path leaves to
        # Python, or of every batch without it (then it builds each header list first)
        "reader_convert_ns": ns.get("convert", 0.0),
        "reader_convert_without_header_lists_ns": 0.0
        if "fused" in ns
        else ns.get("convert_native", ns.get("convert", 0.0)) - headers,
        # Sequencer.queue_batch up to each commit, and the first step() of the sequence (entries path)
        "reader_queue_ns": ns.get("queue", 0.0),
        # step_many / step and poll_batch's own bookkeeping (offsets, include_acks, the result list)
        "reader_dequeue_and_bookkeeping_ns": ns.get("poll_batch", 0.0)
        - ns.get("consume", 0.0)
        - ns.get("convert", 0.0)
        - ns.get("queue", 0.0)
        - ns.get("fused", 0.0),
        # reading key, value, headers, offset through Record, and freeing the batch
        "reader_app_loop_and_free_ns": reader_total - ns.get("poll_batch", 0.0),
    }
    return {k: round(v) for k, v in r.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--txn", type=int, default=1000)
    ap.add_argument("--ring", type=int, default=8192)
    ap.add_argument("--runs", type=int, default=DEFAULT_REPEATS, help="repeat pairs (plain consumer, reader)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed passes of each before the repeats")
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument(
        "--batch",
        type=int,
        default=256,
        help="records per consume() call, for both readers (the reader's default batch_size)",
    )
    ap.add_argument("--stages", action="store_true", help="also measure where the reader's time per record goes")
    ap.add_argument("--no-rss", action="store_true", help="skip the reader-process peak RSS children")
    ap.add_argument("--child", choices=["reader", "raw"], help=argparse.SUPPRESS)
    ap.add_argument("--bootstrap", help=argparse.SUPPRESS)
    ap.add_argument("--topic", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _reader_child(args.bootstrap, args.topic, args.partitions, args.records, args.ring, args.batch, args.child)
        return 0

    recorder = Recorder(
        args.runs, f"{args.warmup} untimed pass(es) of each reader after the write", targets.for_bench("consumer")
    )
    with LocalServices() as services:
        bootstrap = services.endpoints.kafka_bootstrap
        topic = f"bench_consumer_{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, args.partitions)
        t0 = time.perf_counter()
        total = write(bootstrap, topic, args.records, args.partitions, args.txn, args.value_size)
        write_s = time.perf_counter() - t0
        raw: list[float] = []
        raw_cpu: list[float] = []
        rates: dict[str, list[float]] = {"batch": [], "poll": []}
        cpus: dict[str, list[float]] = {"batch": [], "poll": []}
        stats: dict[str, dict[str, int]] = {}
        for _ in range(args.warmup):  # untimed: the broker's page cache and the reader's first allocations
            raw_pass(bootstrap, topic, args.partitions, total, args.batch)
            committed_pass(bootstrap, topic, args.records, args.ring, "batch", args.batch)

        def plain() -> None:
            rate, cpu_rate = raw_pass(bootstrap, topic, args.partitions, total, args.batch)
            raw.append(rate)
            raw_cpu.append(cpu_rate)

        def reader() -> None:
            for mode in ("batch", "poll"):
                rate, cpu_rate, stats[mode] = committed_pass(
                    bootstrap, topic, args.records, args.ring, mode, args.batch
                )
                rates[mode].append(rate)
                cpus[mode].append(cpu_rate)

        for n in range(args.runs):
            # one pair per repeat, the order swapped each repeat (bench/spread.py's alternate())
            for side in (plain, reader) if n % 2 == 0 else (reader, plain):
                side()
        rss: dict[str, object] = {}
        if not args.no_rss:
            # Each in a fresh interpreter, so a peak is that reader's alone (this process also wrote).
            reader_rss = _child_rss(args, bootstrap, topic, args.records, "reader")
            raw_rss = _child_rss(args, bootstrap, topic, total, "raw")
            rq, wq = reader_rss["peak_rss_mb_by_quarter"], raw_rss["peak_rss_mb_by_quarter"]
            hq = reader_rss["heap_peak_mb_by_quarter"]
            rss = {
                "reader_rss_before_read_mb": reader_rss["rss_before_read_mb"],
                "reader_peak_rss_mb_by_quarter": rq,
                "raw_peak_rss_mb_by_quarter": wq,
                "reader_peak_rss_vs_raw": round(rq[-1] / wq[-1], 3),
                # all records vs the first half: 2x the records read, the same peak when bounded
                "reader_peak_rss_growth_2x_records": round(rq[-1] / rq[1], 3),
                "reader_heap_peak_mb_by_quarter": hq,
                "reader_heap_peak_growth_2x_records": round(hq[-1] / hq[1], 3),
                "reader_replays_by_quarter": reader_rss["replays_by_quarter"],
            }
        breakdown = (
            stages(bootstrap, topic, args.partitions, total, args.records, args.ring, args.batch)
            if args.stages
            else None
        )
        tracemalloc.start()
        committed_pass(bootstrap, topic, args.records, args.ring, "batch", args.batch)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    med = statistics.median
    raw_med = med(raw)
    out = {
        "benchmark": "consumer.ReadCommittedIter vs plain confluent-kafka Consumer",
        "records_committed": args.records,
        "records_in_log": total,
        "partitions": args.partitions,
        "txn_size": args.txn,
        "ring_size": args.ring,
        "consume_batch": args.batch,
        "value_size": args.value_size,
        "write_seconds": round(write_s, 2),
        "raw_records_per_s": [round(x) for x in raw],
        # batch: poll_batch(2000), the reader consuming --batch records per call as the raw pass does;
        # poll: one record per poll() call.
        "committed_records_per_s": [round(x) for x in rates["batch"]],
        "committed_poll_records_per_s": [round(x) for x in rates["poll"]],
        "raw_median_per_s": round(raw_med),
        "committed_median_per_s": round(med(rates["batch"])),
        "committed_poll_median_per_s": round(med(rates["poll"])),
        "ratio": round(med(rates["batch"]) / raw_med, 3),
        "ratio_poll": round(med(rates["poll"]) / raw_med, 3),
        "target_ratio": 0.95,  # issue #35
        # Records per CPU-second of the Python thread only (librdkafka's threads excluded):
        # the reader's own cost, independent of how fast the broker serves fetches.
        "raw_median_per_python_cpu_s": round(med(raw_cpu)),
        "committed_median_per_python_cpu_s": round(med(cpus["batch"])),
        "committed_poll_median_per_python_cpu_s": round(med(cpus["poll"])),
        "cpu_ratio": round(med(cpus["batch"]) / med(raw_cpu), 3),
        "cpu_ratio_poll": round(med(cpus["poll"]) / med(raw_cpu), 3),
        "replays": stats["batch"].get("replays"),
        "replayed_records": stats["batch"].get("replayed_records"),
        "replay_ms": stats["batch"].get("replay_ms"),
        # Peak RSS of a process that only reads (a child interpreter each, reader and plain consumer),
        # after each quarter of the records: flat after the first quarter or two (librdkafka's fetch
        # queue filling) when memory is bounded by batch, ring and fetch queue rather than by N.
        **rss,
        "tracemalloc_peak_mb_committed_pass": round(peak / 2**20, 1),
        "cpu_count": os.cpu_count(),
    }
    if breakdown is not None:
        out["stages_python_cpu_ns_per_record"] = breakdown
    recorder.figure("poll_batch", rates["batch"], raw, "ReadCommittedIter.poll_batch / plain consumer, records/s")
    recorder.figure("poll", rates["poll"], raw, "ReadCommittedIter.poll / plain consumer, records/s")
    recorder.figure(
        "poll_batch_cpu", cpus["batch"], raw_cpu, "poll_batch / plain consumer, records per Python-thread CPU s"
    )
    recorder.figure("poll_cpu", cpus["poll"], raw_cpu, "poll / plain consumer, records per Python-thread CPU s")
    out["spread"] = recorder.report()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
