"""Benchmark: batch ``readCommitted`` versus a plain Spark Kafka read + count of the same records.

Workload: N records (default 1,000,000) written as harvest --uuid-sequencing writes them:
transactions of 1,000 CONTINUE_TXN records over 8 partitions from a ring of 4 producer ids, each
followed by an ACK_TXN to every partition it touched; 100-byte values, 1,000 keys. Both reads run on
the same local Spark session (local[2]) against the embedded Kafka broker, alternately, and report
rows/s; the ratio readCommitted / raw is the figure to watch (target >= 0.5).

Usage: python -m bench.bench_spark [--records 1000000] [--repeat 3]. Prints JSON. Not a test.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import sys
import time

from confluent_kafka import Producer

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from harvest_outbox.spark_reader import readCommitted

    with LocalServices() as services:
        bootstrap = services.endpoints.kafka_bootstrap
        create_topic(bootstrap, TOPIC, PARTITIONS)
        t = time.perf_counter()
        written = write(bootstrap, args.records)
        write_s = time.perf_counter() - t
        spark = local_spark_session("bench-spark")
        opts = {"kafka.bootstrap.servers": bootstrap}
        raw_rates, rc_rates = [], []
        for _ in range(args.repeat):
            t = time.perf_counter()
            raw = (
                spark.read.format("kafka")
                .options(**opts)
                .option("subscribe", TOPIC)
                .option("includeHeaders", "true")
                .load()
                .count()
            )
            raw_rates.append(raw / (time.perf_counter() - t))
            t = time.perf_counter()
            committed = readCommitted(spark, TOPIC, opts).count()
            rc_rates.append(committed / (time.perf_counter() - t))
            assert committed == written, (committed, written)
        spark.stop()
    raw_med, rc_med = statistics.median(raw_rates), statistics.median(rc_rates)
    print(
        json.dumps(
            {
                "benchmark": "spark_readCommitted_vs_raw",
                "records": written,
                "raw_records_in_topic": raw,
                "repeat": args.repeat,
                "write_records_per_s": round(written / write_s),
                "raw_read_count_rows_per_s": [round(r) for r in raw_rates],
                "readCommitted_rows_per_s": [round(r) for r in rc_rates],
                "raw_median_rows_per_s": round(raw_med),
                "readCommitted_median_rows_per_s": round(rc_med),
                "ratio_median": round(rc_med / raw_med, 3),
                "target_ratio": 0.5,
                "machine": {
                    "cpus": __import__("os").cpu_count(),
                    "python": platform.python_version(),
                    "spark_master": "local[2]",
                },
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
