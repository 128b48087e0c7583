"""Registry encoding at the relay (producer/encode/serialization.py) on a real Apicurio Registry, Postgres
and Kafka: values of configured topics arrive in the Confluent wire format under the registered
schema's id, decodable by confluent-kafka's deserializers; a row that does not match its schema is
dead-lettered with the field and the rule, before anything reaches the topic; other topics' rows
are published as stored. Both modes; a sharded Debezium outbox too."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql
from relaylib import Got, relay_config, wait_drained

from harvest_outbox.harvest_local.registry import EmbeddedRegistry
from harvest_outbox.producer.config.serialization import SerializationConfig
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.ops._deadletters import list_dead_letters
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

pytestmark = pytest.mark.integration

ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "note", "type": "string"}],
}
PAYMENT = {
    "type": "object",
    "properties": {"amount": {"type": "number", "minimum": 0}, "currency": {"type": "string"}},
    "required": ["amount", "currency"],
}


def read(bootstrap: str, topic: str, count: int, timeout: float = 30.0) -> list[Got]:
    """``topic``'s committed records (ACKs and aborted ones left out with --uuid-sequencing; every
    record at least once otherwise), by partition and offset."""
    from harvest_outbox.consumer import ReadCommittedIter

    got: list[Got] = []
    deadline = time.monotonic() + timeout
    with ReadCommittedIter({"bootstrap.servers": bootstrap}, topics=[topic]) as it:
        while len(got) < count and time.monotonic() < deadline:
            rec = it.poll(1.0)
            if rec is not None:
                got.append(Got(rec.key.decode(), rec.value, [], rec.partition, rec.offset))  # type: ignore[union-attr]
    return sorted(got, key=lambda g: (g.partition, g.offset))


def decode(registry: EmbeddedRegistry, topic: str, values: list[bytes], kind: str = "avro") -> list[object]:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry.url})
    ctx = SerializationContext(topic, MessageField.VALUE)
    if kind == "avro":
        avro = AvroDeserializer(client)
        return [avro(v, ctx) for v in values]
    schema = client.get_latest_version(f"{topic}-value").schema
    js = JSONDeserializer(schema, schema_registry_client=client)
    return [js(v, ctx) for v in values]


@pytest.mark.parametrize(
    ("sequenced", "worker"),
    [(False, False), (True, False), (False, True)],
    ids=["at-least-once", "uuid-sequencing", "at-least-once-encode-worker"],
)
def test_relay_encodes_configured_topics_and_parks_rows_that_do_not_match(
    sequenced: bool,
    worker: bool,
    schema_registry: EmbeddedRegistry,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
) -> None:
    orders, payments, plain = topic_factory(2, "orders"), topic_factory(1, "payments"), topic_factory(1, "plain")
    order_id = schema_registry.register(f"{orders}-value", json.dumps(ORDER))
    payment_id = schema_registry.register(f"{payments}-value", json.dumps(PAYMENT), "JSON")
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    st = Stasher(table)
    good_orders = [{"id": i, "note": f"n{i}"} for i in range(50)]
    with psycopg.connect(pg_dsn) as conn:
        st.stash_many(conn, [OutboxRecord(orders, f"k{i % 5}", json.dumps(o)) for i, o in enumerate(good_orders[:25])])
        poison = {
            "wrong_type": st.stash(conn, OutboxRecord(orders, "k1", json.dumps({"id": "seven", "note": "x"}))),
            "missing_field": st.stash(conn, OutboxRecord(orders, "k2", json.dumps({"id": 7}))),
            "not_json": st.stash(conn, OutboxRecord(orders, "k3", "id=7")),
            "negative": st.stash(conn, OutboxRecord(payments, "p1", json.dumps({"amount": -5, "currency": "EUR"}))),
        }
        st.stash_many(conn, [OutboxRecord(orders, f"k{i % 5}", json.dumps(o)) for i, o in enumerate(good_orders[25:])])
        st.stash(conn, OutboxRecord(payments, "p1", json.dumps({"amount": 12.5, "currency": "EUR"})))
        st.stash(conn, OutboxRecord(orders, "k9", None))  # a tombstone stays a tombstone
        st.stash(conn, OutboxRecord(plain, "x", "as stored"))
    serialization = SerializationConfig.from_mapping(
        {
            "registry": {"url": schema_registry.url},
            "topics": [
                {"topic": orders, "serializer": "avro"},
                {"topicPattern": "payments_.*", "serializer": "jsonSchema"},
            ],
            "encodeWorker": worker,  # Avro values encoded in a child process (producer/encode/worker.py)
        }
    )
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, f"g-{uuid.uuid4().hex[:8]}").replace(
        uuid_sequencing=sequenced, serialization=serialization
    )
    relay = Harvest(cfg).start()
    try:
        wait_drained(pg_dsn, table, 60)
        assert relay.state.value == "running"
        with psycopg.connect(pg_dsn) as conn:
            dead = {d.id: d.error for d in list_dead_letters(conn, table)}
    finally:
        relay.stop()
        relay.wait(30)
    assert set(dead) == set(poison.values()), dead
    reasons = {name: dead[i] for name, i in poison.items()}
    assert "value does not match its schema" in reasons["wrong_type"] and "id" in reasons["wrong_type"]
    assert "note" in reasons["missing_field"], reasons["missing_field"]
    assert reasons["not_json"].startswith("bad row: value is not JSON"), reasons["not_json"]
    assert "field $.amount" in reasons["negative"] and "rule: minimum" in reasons["negative"], reasons["negative"]

    got = read(kafka_bootstrap, orders, 51)
    values = [g.value for g in sorted(got, key=lambda g: (g.partition, g.offset)) if g.value is not None]
    assert len(values) == 50 and next(g for g in got if g.value is None).key == "k9"
    assert {v[0] for v in values} == {0} and {int.from_bytes(v[1:5], "big") for v in values} == {order_id}
    assert sorted(decode(schema_registry, orders, values), key=lambda o: o["id"]) == good_orders  # type: ignore[index]
    per_key: dict[str, list[int]] = {}
    for g in sorted(got, key=lambda g: (g.partition, g.offset)):
        if g.value is not None:
            per_key.setdefault(g.key, []).append(decode(schema_registry, orders, [g.value])[0]["id"])  # type: ignore[index]
    assert all(ids == sorted(ids) for ids in per_key.values()), "per-key order"

    pay = read(kafka_bootstrap, payments, 1)
    assert [int.from_bytes(g.value[1:5], "big") for g in pay] == [payment_id]  # type: ignore[index]
    assert decode(schema_registry, payments, [pay[0].value], "json") == [{"amount": 12.5, "currency": "EUR"}]  # type: ignore[list-item]
    assert [g.value for g in read(kafka_bootstrap, plain, 1)] == [b"as stored"]


def test_sharded_relays_encode_a_debezium_outbox(
    schema_registry: EmbeddedRegistry, pg_dsn: str, kafka_bootstrap: str, pg_schema: str, unique_name
) -> None:
    from harvest_outbox.harvest_local.kafka import create_topic
    from harvest_outbox.producer.mapping.table import table_mapping
    from harvest_outbox.producer.relay.sharded import ShardedHarvest

    prefix = unique_name("ev")
    mapping = table_mapping("debezium", {"route.topic.replacement": prefix + ".${routedByValue}"})
    table = f"{pg_schema}.outbox_event"
    names = OutboxNames.parse(table, mapping)
    topic = f"{prefix}.Order"
    create_topic(kafka_bootstrap, topic, 2)
    schema_registry.register(f"{topic}-value", json.dumps(ORDER))
    init_db(pg_dsn, table, shards=2, mapping=mapping)
    payloads = [{"id": i, "note": f"n{i}"} for i in range(120)]
    with psycopg.connect(pg_dsn) as conn, conn.cursor() as cur:
        cur.executemany(
            sql.SQL(
                "INSERT INTO {} (id, aggregatetype, aggregateid, type, payload) VALUES (%s, 'Order', %s, 'Created', %s)"
            ).format(names.outbox),
            [(uuid.uuid4(), f"k{p['id'] % 9}", json.dumps(p)) for p in payloads],
        )
        bad = uuid.uuid4()
        cur.execute(
            sql.SQL(
                "INSERT INTO {} (id, aggregatetype, aggregateid, type, payload) VALUES (%s, 'Order', 'k1', 'Created', %s)"
            ).format(names.outbox),
            (bad, json.dumps({"id": 1.5, "note": "x"})),
        )
    serialization = SerializationConfig.from_mapping(
        {"registry": {"url": schema_registry.url}, "topics": [{"topicPattern": f"{prefix}\\..*", "serializer": "avro"}]}
    )
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(
        table_mapping=mapping,
        shards=2,
        leader_election="postgres",
        leader_lock_check_interval=0.2,
        serialization=serialization,
    )
    relays = [ShardedHarvest(cfg.replace(name=f"r{i}")).start() for i in range(2)]
    try:
        got = read(kafka_bootstrap, topic, 120, 60)
        with psycopg.connect(pg_dsn) as conn:
            for _ in range(100):
                dead = list_dead_letters(conn, table)
                if dead:
                    break
                time.sleep(0.1)
    finally:
        for r in relays:
            r.stop()
    assert len(got) == 120
    decoded = decode(schema_registry, topic, [g.value for g in got])  # type: ignore[misc]
    assert sorted(decoded, key=lambda o: o["id"]) == payloads  # type: ignore[index]
    assert len(dead) == 1 and "value does not match its schema" in dead[0].error, dead
