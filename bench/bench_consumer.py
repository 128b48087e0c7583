"""Benchmark: ReadCommittedIter vs a plain confluent-kafka consumer over the same records.

Writes N sequenced records as the harvest relay does in ``--uuid-sequencing``
mode (harvest transactions of ``--txn`` CONTINUE_TXN records spread over
``--partitions`` partitions, then one ACK_TXN per touched partition), then,
in the same run and alternating, reads them all ``--runs`` times:

* raw: a plain confluent-kafka Consumer (assign, consume() batches of what is
  ready, blocking in poll() only when nothing is), touching key, value, headers
  and offset of every record, as an application would; configured and timed
  like the reader's own consumer (same consume() batch size ``--batch``, no
  per-record offset store, connected before the clock starts);
* committed: ``ReadCommittedIter`` (ring ``--ring``), delivering the N
  committed records (ACKs filtered out), once with ``poll_batch(2000)``
  ("batch", the headline ratio) and once per ``poll()``.

Prints JSON: median records/s of both, the ratio (target >= 0.7), and memory:
peak RSS and a tracemalloc peak of one extra (untimed) committed pass, which
is bounded by the ring and the open spans, not by N.

    .venv/bin/python -m bench.bench_consumer [--records 1000000]

Services: harvest_local.LocalServices (``HARVEST_KAFKA_BOOTSTRAP`` /
``HARVEST_PG_DSN`` point it at running ones).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
import tracemalloc
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from harvest_outbox.consumer import ReadCommittedIter
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--txn", type=int, default=1000)
    ap.add_argument("--ring", type=int, default=8192)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument(
        "--batch",
        type=int,
        default=256,
        help="records per consume() call, for both readers (the reader's default batch_size)",
    )
    args = ap.parse_args()

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
        for _ in range(args.runs):
            rate, cpu_rate = raw_pass(bootstrap, topic, args.partitions, total, args.batch)
            raw.append(rate)
            raw_cpu.append(cpu_rate)
            for mode in ("batch", "poll"):
                rate, cpu_rate, stats[mode] = committed_pass(
                    bootstrap, topic, args.records, args.ring, mode, args.batch
                )
                rates[mode].append(rate)
                cpus[mode].append(cpu_rate)
        rss_before_trace_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
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
        "target_ratio": 0.7,
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
        "peak_rss_mb": round(rss_before_trace_kb / 1024, 1),
        "tracemalloc_peak_mb_committed_pass": round(peak / 2**20, 1),
        "cpu_count": os.cpu_count(),
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
