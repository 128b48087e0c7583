"""Round trips through the real embedded services: Postgres, Kafka (confluent-kafka), Spark's Kafka source."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from confluent_kafka import Consumer, Producer
from psycopg import sql

pytestmark = pytest.mark.integration


def test_postgres_row_round_trip(pg_dsn: str, pg_schema: str) -> None:
    table = sql.Identifier(pg_schema, "things")
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id bigserial PRIMARY KEY, body text NOT NULL)").format(table))
        conn.execute(sql.SQL("INSERT INTO {} (body) VALUES (%s), (%s)").format(table), ("a", "b"))
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(sql.SQL("SELECT id, body FROM {} ORDER BY id").format(table)).fetchall()
    assert rows == [(1, "a"), (2, "b")]


def test_postgres_requires_password(pg_dsn: str) -> None:
    wrong = " ".join("password=wrong" if part.startswith("password=") else part for part in pg_dsn.split())
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(wrong)


def test_kafka_produce_consume_round_trip(kafka_bootstrap: str, topic_factory) -> None:
    topic = topic_factory(partitions=3)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True, "acks": "all"})
    sent = {f"k{i}".encode(): f"v{i}".encode() for i in range(30)}
    for key, value in sent.items():
        producer.produce(topic, key=key, value=value, headers=[("h", key)])
    assert producer.flush(30) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": f"g-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: dict[bytes, tuple[bytes, list]] = {}
    try:
        for _ in range(200):
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                if len(got) == len(sent):
                    break
                continue
            got[msg.key()] = (msg.value(), msg.headers())
    finally:
        consumer.close()
    assert {k: v for k, (v, _) in got.items()} == sent
    assert all(headers == [("h", key)] for key, (_, headers) in got.items())


def test_auto_topic_creation_is_off(kafka_bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "message.timeout.ms": 3000})
    errors: list = []
    producer.produce(f"never-created-{uuid.uuid4().hex}", value=b"x", on_delivery=lambda err, _m: errors.append(err))
    producer.flush(10)
    assert errors and errors[0] is not None


@pytest.mark.spark
def test_spark_reads_topic_through_kafka_source(spark, kafka_bootstrap: str, topic_factory) -> None:
    topic = topic_factory(partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(50):
        producer.produce(topic, key=f"k{i % 5}".encode(), value=f"{i}".encode(), headers=[("n", str(i).encode())])
    assert producer.flush(30) == 0

    df = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka_bootstrap)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .load()
    )
    rows = df.selectExpr("CAST(value AS STRING) AS v", "partition", "headers").collect()
    assert sorted(int(r.v) for r in rows) == list(range(50))
    assert {r.partition for r in rows} <= {0, 1}
    assert all(r.headers[0].key == "n" and r.headers[0].value.decode() == r.v for r in rows)


def test_embedded_kafka_files_are_private(services, kafka_bootstrap: str, topic_factory) -> None:
    """The broker's data and logs hold every test message: owner-only (0700 directories, no group or
    other bits on any file), also for what the broker creates after start (a topic's segment files)."""
    import os
    import stat

    if services.kafka is None:
        pytest.skip("Kafka is not the embedded one (HARVEST_KAFKA_BOOTSTRAP or testcontainers)")
    topic = topic_factory()
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(topic, b"private")
    assert producer.flush(30) == 0
    root = services.kafka.root
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    seen, exposed = 0, []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            mode = stat.S_IMODE(os.lstat(path).st_mode)
            seen += 1
            if mode & 0o077:
                exposed.append(f"{path} {oct(mode)}")
    assert any(topic in d for d in os.listdir(services.kafka.data)), "the topic's directory was not found"
    assert seen > 10 and not exposed, exposed


def test_free_ports_are_never_handed_out_twice() -> None:
    """A service takes several ports before it binds any (Kafka: client, controller, proxied): the
    kernel may offer a just-closed ephemeral port again, so free_port() remembers what it gave."""
    import socket

    from harvest_outbox.harvest_local.workdir import free_port

    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", ports[-1]))  # and nothing listens on them


def test_a_failing_kafka_tool_reports_its_exception_not_its_stack_frames(tmp_path) -> None:
    """The broker's storage format step failing (here: two listeners on one port) names the
    exception and its message; the stack frames under it are left out."""
    from harvest_outbox.harvest_local.errors import ServiceError
    from harvest_outbox.harvest_local.kafka import EmbeddedKafka

    kafka = EmbeddedKafka(root=tmp_path / "kafka")
    kafka.controller_port = kafka.port  # a broken configuration: the tool refuses it
    with pytest.raises(ServiceError) as err:
        kafka.start(timeout=60)
    text = str(err.value)
    assert "StorageTool format failed" in text and "Exception" in text, text
    assert "port" in text.lower(), text
    assert "\tat " not in text and "\n at " not in text, text
    assert not (kafka.data / "meta.properties").exists()  # not formatted: the next start formats again
