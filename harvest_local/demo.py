"""The main job on embedded services: outbox rows -> Kafka -> read back in Python and in Spark.

This is the foundation's end-to-end run. It stands up real Postgres, Kafka and Spark, writes rows
to a goharvest-schema outbox table in application transactions (some roll back), publishes the
committed rows to Kafka, then reads the topic back with confluent-kafka and with Spark's Kafka
source, and prints a verdict. Later work replaces the publish step with the harvest relay and the
reads with the read-committed readers.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import psycopg
from confluent_kafka import Consumer, Producer
from psycopg import sql

from harvest_local.launcher import LocalServices

log = logging.getLogger("harvest.demo")


@dataclass
class Tally:
    committed: list[tuple[str, str]] = field(default_factory=list)  # (key, value) in commit order
    rolled_back: int = 0
    published: int = 0
    python_read: list[tuple[str, str, int]] = field(default_factory=list)  # key, value, partition
    spark_rows: int = 0
    spark_distinct: int = 0
    timings: dict[str, float] = field(default_factory=dict)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev demo", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000, help="rows to write (default 2000)")
    parser.add_argument("--keys", type=int, default=50, help="distinct keys (default 50)")
    parser.add_argument("--partitions", type=int, default=4, help="topic partitions (default 4)")
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark read")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)-7s %(message)s", datefmt="%H:%M:%S")
    for noisy in ("py4j", "harvest_local.maven"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    tally = Tally()
    started = time.monotonic()
    with LocalServices() as services:
        ends = services.endpoints
        step("services up", tally, started)
        table = sql.Identifier("public", "outbox")
        topic = f"demo-orders-{uuid.uuid4().hex[:6]}"
        services_create_topic(ends.kafka_bootstrap, topic, args.partitions)
        with psycopg.connect(ends.pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
            conn.execute(sql.SQL(OUTBOX_DDL).format(table=table))
        write_rows(ends.pg_dsn, table, topic, args.rows, args.keys, tally)
        step(f"wrote {len(tally.committed)} committed rows ({tally.rolled_back} rolled back)", tally, started)
        publish(ends.pg_dsn, table, ends.kafka_bootstrap, tally)
        step(f"published {tally.published} rows to {topic}", tally, started)
        read_python(ends.kafka_bootstrap, topic, len(tally.committed), tally)
        step(f"read {len(tally.python_read)} records back with confluent-kafka", tally, started)
        if not args.no_spark:
            read_spark(ends.kafka_bootstrap, topic, tally)
            step(f"Spark read {tally.spark_rows} rows through its Kafka source", tally, started)
    return report(tally, args)


OUTBOX_DDL = """
CREATE TABLE {table} (
    id                  BIGSERIAL PRIMARY KEY,
    create_time         TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
    kafka_topic         VARCHAR(249) NOT NULL,
    kafka_key           VARCHAR(100) NOT NULL,
    kafka_value         VARCHAR(10000),
    kafka_header_keys   TEXT[] NOT NULL,
    kafka_header_values TEXT[] NOT NULL,
    leader_id           UUID
)"""


def services_create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from harvest_local.kafka import create_topic

    create_topic(bootstrap, topic, partitions)


def write_rows(dsn: str, table: sql.Identifier, topic: str, rows: int, keys: int, tally: Tally) -> None:
    rng = random.Random(7)
    insert = sql.SQL(
        "INSERT INTO {} (kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values) "
        "VALUES (%s, %s, %s, %s, %s)"
    ).format(table)
    seq = 0
    with psycopg.connect(dsn) as conn:
        while seq < rows:
            batch = []
            for _ in range(rng.randint(1, 20)):
                key = f"customer-{rng.randrange(keys)}"
                batch.append((key, f"order-{seq}"))
                seq += 1
            with conn.cursor() as cur:
                cur.executemany(insert, [(topic, k, v, ["source"], ["demo"]) for k, v in batch])
            if rng.random() < 0.1:
                conn.rollback()
                tally.rolled_back += len(batch)
            else:
                conn.commit()
                tally.committed.extend(batch)


def publish(dsn: str, table: sql.Identifier, bootstrap: str, tally: Tally) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, "partitioner": "murmur2_random"})
    failures: list[object] = []
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(sql.SQL(
            "SELECT id, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values "
            "FROM {} ORDER BY id").format(table)).fetchall()
        for _id, topic, key, value, hkeys, hvalues in rows:
            producer.produce(topic, key=key, value=value, headers=list(zip(hkeys, hvalues)),
                             on_delivery=lambda err, _msg: failures.append(err) if err else None)
            producer.poll(0)
        if producer.flush(60) or failures:
            raise RuntimeError(f"publish failed: {failures[:3]}")
        conn.execute(sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(table), ([r[0] for r in rows],))
    tally.published = len(rows)


def read_python(bootstrap: str, topic: str, expected: int, tally: Tally) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"demo-{uuid.uuid4()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    deadline = time.monotonic() + 60
    try:
        while len(tally.python_read) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.5):
                if msg.error() is None:
                    tally.python_read.append((msg.key().decode(), msg.value().decode(), msg.partition()))
    finally:
        consumer.close()


def read_spark(bootstrap: str, topic: str, tally: Tally) -> None:
    from harvest_local.spark import local_spark_session

    spark = local_spark_session("harvest-demo")
    try:
        df = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).load())
        tally.spark_rows = df.count()
        tally.spark_distinct = df.select("value").distinct().count()
    finally:
        spark.stop()


def step(what: str, tally: Tally, started: float) -> None:
    tally.timings[what] = time.monotonic() - started
    log.info("[%6.1fs] %s", tally.timings[what], what)


def report(tally: Tally, args: argparse.Namespace) -> int:
    expected = Counter(tally.committed)
    got = Counter((k, v) for k, v, _ in tally.python_read)
    lost = sum((expected - got).values())
    duplicates = sum((got - expected).values())
    order_violations = 0
    per_key: dict[str, list[str]] = defaultdict(list)
    for key, value, _ in tally.python_read:
        per_key[key].append(value)
    committed_per_key: dict[str, list[str]] = defaultdict(list)
    for key, value in tally.committed:
        committed_per_key[key].append(value)
    for key, values in per_key.items():
        if values != [v for v in committed_per_key[key] if v in set(values)]:
            order_violations += 1
    spark_ok = args.no_spark or (tally.spark_rows == len(tally.committed) == tally.spark_distinct)
    rows = [
        ("rows committed by writers", len(tally.committed)),
        ("rows rolled back (must not appear)", tally.rolled_back),
        ("rows published", tally.published),
        ("records read (Python)", len(tally.python_read)),
        ("records read (Spark)", "skipped" if args.no_spark else tally.spark_rows),
        ("lost", lost),
        ("duplicates", duplicates),
        ("keys out of order", order_violations),
    ]
    width = max(len(name) for name, _ in rows)
    print("\nharvest demo verdict")
    print("-" * (width + 12))
    for name, value in rows:
        print(f"{name:<{width}}  {value:>9}")
    print("-" * (width + 12))
    ok = lost == 0 and duplicates == 0 and order_violations == 0 and spark_ok
    print("OK: every committed row delivered once, in per-key order" if ok else "FAILED: see the table above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
