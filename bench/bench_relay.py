"""Relay benchmark (not a test): backlog drain throughput and idle-to-delivery latency.

    .venv/bin/python bench/bench_relay.py [--rows 100000] [--keys 1000] [--partitions 8] [--runs 3]

Uses the project's own Postgres + Kafka (harvest_local.LocalServices; or HARVEST_PG_DSN /
HARVEST_KAFKA_BOOTSTRAP). Prints one JSON document:
- drain: a backlog of ``rows`` outbox rows (100-byte values, ``keys`` keys) moved to a topic with
  ``partitions`` partitions by one relay (NELI leader election included), timed from leadership to
  the outbox being empty; rows/s per run and the median;
- sequenced: the same drain with ``--uuid-sequencing`` (exactly-once commit protocol), measured in
  the same run, interleaved with the at-least-once runs; rows/s and the sequenced / at-least-once
  ratio (targets: >= 30,000 rows/s and ratio >= 0.85);
- baseline: raw confluent-kafka produce of the same records (same producer settings), rows/s,
  and the relay/baseline ratio;
- latency: rows stashed one per transaction at ``--rate`` rows/s; commit -> consumer receipt,
  p50/p99 in ms (the relay idles on LISTEN/NOTIFY between rows).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg  # noqa: E402
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from psycopg import sql  # noqa: E402

from harvest_local.kafka import create_topic  # noqa: E402
from producer.config import HarvestConfig, Limits  # noqa: E402
from producer.harvest import Harvest  # noqa: E402
from producer.schema import init_db  # noqa: E402
from producer.stasher import OutboxRecord, Stasher  # noqa: E402

PRODUCER_TUNING = {"linger.ms": 1, "batch.size": 262144, "compression.type": "none"}
LIMITS = dict(mark_query_records=5000, max_in_flight_records=5000, purge_batch_records=2000, purge_interval=0.05,
              heartbeat_timeout=5.0, min_metrics_interval=60.0)


def _records(topic: str, rows: int, keys: int) -> list[OutboxRecord]:
    pad = "x" * 100
    return [OutboxRecord(topic, f"key-{i % keys}", f"{i:010d}{pad}"[:100], ()) for i in range(rows)]


def _config(dsn: str, bootstrap: str, table: str, **limits: object) -> HarvestConfig:
    return HarvestConfig(data_source=dsn, outbox_table=table, base_kafka_config={"bootstrap.servers": bootstrap},
                         producer_kafka_config=PRODUCER_TUNING, leader_group_id=f"bench-{uuid.uuid4().hex[:8]}",
                         limits=Limits(**{**LIMITS, **limits}))  # type: ignore[arg-type]


SEQ_LIMITS = dict(txn_max_records=5000, txn_max_duration=0.05, producer_ring=4)


def drain_once(dsn: str, bootstrap: str, rows: int, keys: int, partitions: int, sequenced: bool = False) -> float:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    table = f"{schema}.outbox"
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions)
    init_db(dsn, table)
    with psycopg.connect(dsn) as conn:
        Stasher(table).stash_many(conn, _records(topic, rows, keys))
    cfg = _config(dsn, bootstrap, table, **(SEQ_LIMITS if sequenced else {})).replace(uuid_sequencing=sequenced)
    relay = Harvest(cfg).start()
    try:
        while not relay.is_leader:
            time.sleep(0.001)
        t0 = time.perf_counter()
        with psycopg.connect(dsn, autocommit=True) as conn:
            count = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "outbox"))
            while True:
                if relay.metrics.delivered >= rows and conn.execute(count).fetchone()[0] == 0:  # type: ignore[index]
                    break
                time.sleep(0.02)
        elapsed = time.perf_counter() - t0
    finally:
        relay.stop()
        relay.wait(60)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    return rows / elapsed


def baseline_once(bootstrap: str, rows: int, keys: int, partitions: int) -> float:
    topic = f"base-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions)
    recs = [(r.key.encode(), r.value.encode()) for r in _records(topic, rows, keys)]  # type: ignore[union-attr]
    delivered = [0]

    def cb(err: object, msg: object) -> None:
        delivered[0] += 1

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                  "partitioner": "murmur2_random", "on_delivery": cb, **PRODUCER_TUNING})
    p.list_topics(topic, timeout=10)
    t0 = time.perf_counter()
    for k, v in recs:
        while True:
            try:
                p.produce(topic, v, k)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    p.flush(60)
    return rows / (time.perf_counter() - t0)


def latency(dsn: str, bootstrap: str, rate: float, seconds: float, keys: int) -> dict[str, float]:
    schema = f"lat_{uuid.uuid4().hex[:8]}"
    table = f"{schema}.outbox"
    topic = f"lat-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 8)
    init_db(dsn, table)
    relay = Harvest(_config(dsn, bootstrap, table, mark_query_records=100, max_in_flight_records=1000,
                            idle_poll_interval=1.0)).start()
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"lat-{uuid.uuid4()}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(8)])
    sent: dict[bytes, float] = {}
    lat: list[float] = []
    n = int(rate * seconds)
    try:
        while not relay.is_leader:
            time.sleep(0.01)

        def write() -> None:
            st = Stasher(table)
            with psycopg.connect(dsn) as conn:
                start = time.perf_counter()
                for i in range(n):
                    due = start + i / rate
                    delay = due - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                    value = f"{i:010d}"
                    with conn.transaction():
                        st.stash(conn, OutboxRecord(topic, f"key-{i % keys}", value))
                        # stamped just before COMMIT (stamping after could race the consumer)
                        sent[value.encode()] = time.perf_counter()

        w = threading.Thread(target=write)
        w.start()
        deadline = time.perf_counter() + seconds + 30
        while len(lat) < n and time.perf_counter() < deadline:
            m = c.poll(0.05)  # poll, not consume(n): consume waits for n messages or the timeout
            if m is not None:
                if m.error():
                    continue
                now = time.perf_counter()
                t = sent.get(m.value())
                if t is not None:
                    lat.append(now - t)
        w.join()
    finally:
        c.close()
        relay.stop()
        relay.wait(60)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    lat.sort()
    q = statistics.quantiles(lat, n=100) if len(lat) > 1 else [float("nan")] * 99
    return {"rate_rows_per_s": rate, "rows": n, "received": len(lat), "p50_ms": round(q[49] * 1000, 2),
            "p99_ms": round(q[98] * 1000, 2), "max_ms": round(lat[-1] * 1000, 2) if lat else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--latency-seconds", type=float, default=10.0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    services = None
    dsn, bootstrap = os.environ.get("HARVEST_PG_DSN"), os.environ.get("HARVEST_KAFKA_BOOTSTRAP")
    if not (dsn and bootstrap):
        from harvest_local import LocalServices

        services = LocalServices().start()
        dsn, bootstrap = services.endpoints.pg_dsn, services.endpoints.kafka_bootstrap
    try:
        drains, seqs = [], []
        for _ in range(args.runs):  # interleaved, so both modes see the same machine state
            drains.append(drain_once(dsn, bootstrap, args.rows, args.keys, args.partitions))
            seqs.append(drain_once(dsn, bootstrap, args.rows, args.keys, args.partitions, sequenced=True))
        bases = [baseline_once(bootstrap, args.rows, args.keys, args.partitions) for _ in range(args.runs)]
        lat = latency(dsn, bootstrap, args.rate, args.latency_seconds, args.keys)
    finally:
        if services is not None:
            services.stop()
    relay_median, base_median = statistics.median(drains), statistics.median(bases)
    seq_median = statistics.median(seqs)
    print(json.dumps({
        "setup": {"rows": args.rows, "keys": args.keys, "partitions": args.partitions, "value_bytes": 100,
                  "cpus": os.cpu_count(), "producer": PRODUCER_TUNING, "limits": LIMITS},
        "drain_rows_per_s": {"runs": [round(x) for x in drains], "median": round(relay_median)},
        "sequenced_drain_rows_per_s": {"runs": [round(x) for x in seqs], "median": round(seq_median),
                                       "limits": SEQ_LIMITS},
        "sequenced_to_at_least_once_ratio": round(seq_median / relay_median, 3),
        "sequenced_meets_targets": seq_median >= 30000 and seq_median / relay_median >= 0.85,
        "baseline_raw_produce_rows_per_s": {"runs": [round(x) for x in bases], "median": round(base_median)},
        "relay_to_baseline_ratio": round(relay_median / base_median, 3),
        "target_rows_per_s": 30000, "meets_target": relay_median >= 30000,
        "idle_to_delivery_latency": lat,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
