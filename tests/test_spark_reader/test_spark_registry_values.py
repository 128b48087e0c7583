"""readCommitted(..., value_format=...) decodes registry-encoded values (spark_reader/registry_values.py)
on a real Apicurio Registry, Kafka and local Spark: every writer schema id a topic holds decodes (two
versions of the subject here), a tombstone stays null, raw_value keeps the stored bytes, and a
value not in the wire format fails the query naming the record."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from harvest_outbox.harvest_local.registry import EmbeddedRegistry
from harvest_outbox.spark_reader import readCommitted
from harvest_outbox.spark_reader.errors import ReaderConfigError

pytestmark = pytest.mark.integration

V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [{"name": "id", "type": "long"}]}
V2 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "note", "type": "string", "default": ""}],
}


def test_values_come_back_decoded_across_schema_versions(
    spark, schema_registry: EmbeddedRegistry, kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = topic_factory(1, "orders")
    client = SchemaRegistryClient({"url": schema_registry.url})
    ctx = SerializationContext(topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    id1 = client.register_schema(f"{topic}-value", Schema(json.dumps(V1), "AVRO"))
    v1 = AvroSerializer(client, json.dumps(V1), conf={"auto.register.schemas": False})
    for i in range(3):
        producer.produce(topic, v1({"id": i}, ctx), b"k")
    id2 = client.register_schema(f"{topic}-value", Schema(json.dumps(V2), "AVRO"))
    v2 = AvroSerializer(client, json.dumps(V2), conf={"auto.register.schemas": False})
    for i in range(3, 5):
        producer.produce(topic, v2({"id": i, "note": f"n{i}"}, ctx), b"k")
    producer.produce(topic, None, b"k")
    assert producer.flush(10) == 0 and id1 != id2

    opts = {"kafka.bootstrap.servers": kafka_bootstrap}
    df = readCommitted(spark, topic, opts, value_format="avro", schema_registry={"url": schema_registry.url})
    rows = df.orderBy("offset").select("value", "raw_value").collect()
    assert [json.loads(r.value) if r.value is not None else None for r in rows] == [
        {"id": 0},
        {"id": 1},
        {"id": 2},
        {"id": 3, "note": "n3"},
        {"id": 4, "note": "n4"},
        None,
    ]
    assert {int.from_bytes(bytes(r.raw_value)[1:5], "big") for r in rows if r.raw_value} == {id1, id2}

    producer.produce(topic, b"plain bytes", b"k")
    producer.flush(10)
    df = readCommitted(spark, topic, opts, value_format="avro", schema_registry={"url": schema_registry.url})
    with pytest.raises(Exception, match=rf"record {topic}/0@6: value is not in the registry wire format"):
        df.collect()
    with pytest.raises(ReaderConfigError, match="needs the registry's client settings"):
        readCommitted(spark, topic, opts, value_format="avro")


def test_a_stream_decodes_with_decode_values(
    spark, schema_registry: EmbeddedRegistry, kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path
) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from harvest_outbox.spark_reader import readCommittedStream
    from harvest_outbox.spark_reader.registry_values import decode_values

    topic = topic_factory(1, "orders")
    client = SchemaRegistryClient({"url": schema_registry.url})
    client.register_schema(f"{topic}-value", Schema(json.dumps(V1), "AVRO"))
    serialize = AvroSerializer(client, json.dumps(V1), conf={"auto.register.schemas": False})
    ctx = SerializationContext(topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(4):
        producer.produce(topic, serialize({"id": i}, ctx), b"k")
    assert producer.flush(10) == 0

    sdf = readCommittedStream(
        spark, topic, {"kafka.bootstrap.servers": kafka_bootstrap}, state_location=str(tmp_path / "state")
    )
    decoded = decode_values(sdf, "avro", {"url": schema_registry.url})
    out, chk = tmp_path / "out", tmp_path / "chk"
    query = (
        decoded.select("offset", "value")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(chk))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    rows = spark.read.parquet(str(out)).orderBy("offset").collect()
    assert [json.loads(r.value) for r in rows] == [{"id": i} for i in range(4)]
