"""The embedded Apicurio Registry is a real Confluent-compatible registry: confluent-kafka's client
registers, encodes and decodes against it; stopped, it refuses connections; started again, it
serves on the same URL (empty: in-memory storage)."""

from __future__ import annotations

import json

import pytest

from harvest_outbox.harvest_local.registry import EmbeddedRegistry

pytestmark = pytest.mark.integration

ORDER = json.dumps(
    {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}, {"name": "note", "type": "string"}]}
)


def test_registry_round_trip_stop_and_restart(schema_registry: EmbeddedRegistry, unique_name) -> None:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = unique_name("orders")
    client = SchemaRegistryClient({"url": schema_registry.url})
    schema_id = client.register_schema(f"{topic}-value", Schema(ORDER, "AVRO"))
    ctx = SerializationContext(topic, MessageField.VALUE)
    encoded = AvroSerializer(client, conf={"auto.register.schemas": False, "use.latest.version": True})(
        {"id": 7, "note": "x"}, ctx
    )
    assert encoded[0] == 0 and int.from_bytes(encoded[1:5], "big") == schema_id  # Confluent wire format
    assert AvroDeserializer(client)(encoded, ctx) == {"id": 7, "note": "x"}

    url = schema_registry.url
    schema_registry.stop()
    try:
        with pytest.raises(Exception, match=r"(?i)connect|refused"):
            SchemaRegistryClient({"url": url}).get_subjects()
    finally:
        schema_registry.start()
    assert schema_registry.url == url
    assert SchemaRegistryClient({"url": url}).get_subjects() == []  # in-memory: back empty
