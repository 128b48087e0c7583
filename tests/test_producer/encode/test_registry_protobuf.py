"""Protobuf registry encoding at the relay (producer/encode/serialization.py, harvest_outbox/protobuf_schema.py)
on a real Apicurio Registry, Postgres and Kafka: JSON rows of a topic whose subject holds a ``.proto``
arrive as that message in the Confluent wire format (schema id, message indexes), readable by
confluent-kafka's ProtobufDeserializer; a row that does not fit the message is dead-lettered naming
the field, before anything reaches the topic. Both modes."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable

import psycopg
import pytest
from relaylib import relay_config, wait_drained

from harvest_outbox.harvest_local.registry import EmbeddedRegistry
from harvest_outbox.producer.config.serialization import SerializationConfig
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.ops._deadletters import list_dead_letters
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher
from harvest_outbox.protobuf_schema import ProtoSchemaError, message_class, to_serialized

ORDER_PROTO = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";

message Audit { string by = 1; }
message Order {
  int64 id = 1;
  string note = 2;
  google.protobuf.Timestamp at = 3;
}
"""


def test_message_class_picks_the_named_or_first_message_and_refuses_what_does_not_compile() -> None:
    assert message_class(ORDER_PROTO).DESCRIPTOR.full_name == "shop.Audit"
    assert message_class(ORDER_PROTO, "shop.Order").DESCRIPTOR.full_name == "shop.Order"
    assert message_class(ORDER_PROTO, "Order").DESCRIPTOR.full_name == "shop.Order"
    serialized = to_serialized(ORDER_PROTO)
    assert to_serialized(serialized) == serialized  # already serialized: passed through
    with pytest.raises(ProtoSchemaError, match=r"recordName .shop\.Nope. is not a top-level message"):
        message_class(ORDER_PROTO, "shop.Nope")
    with pytest.raises(ProtoSchemaError, match=r"does not compile: registry_schema\.proto:1:"):
        message_class('syntax = "proto3"; message {')


@pytest.mark.integration
@pytest.mark.parametrize("sequenced", [False, True], ids=["at-least-once", "uuid-sequencing"])
def test_relay_encodes_json_rows_as_the_registered_protobuf_message(
    sequenced: bool,
    schema_registry: EmbeddedRegistry,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf import json_format

    from harvest_outbox.consumer import ReadCommittedIter
    from harvest_outbox.protobuf_schema import SerializedProtobufClient

    orders = topic_factory(2, "orders")
    schema_id = schema_registry.register(f"{orders}-value", ORDER_PROTO, "PROTOBUF")
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    st = Stasher(table)
    good = [{"id": str(i), "note": f"n{i}", "at": f"2026-01-01T00:00:{i:02d}Z"} for i in range(30)]
    with psycopg.connect(pg_dsn) as conn:
        st.stash_many(conn, [OutboxRecord(orders, f"k{i % 4}", json.dumps(o)) for i, o in enumerate(good[:15])])
        poison = {
            "wrong_type": st.stash(conn, OutboxRecord(orders, "k1", json.dumps({"id": "seven", "note": "x"}))),
            "unknown_field": st.stash(conn, OutboxRecord(orders, "k2", json.dumps({"id": 7, "colour": "red"}))),
            "not_object": st.stash(conn, OutboxRecord(orders, "k3", json.dumps([1, 2]))),
        }
        st.stash_many(conn, [OutboxRecord(orders, f"k{i % 4}", json.dumps(o)) for i, o in enumerate(good[15:])])
    serialization = SerializationConfig.from_mapping(
        {
            "registry": {"url": schema_registry.url},
            "topics": [{"topic": orders, "serializer": "protobuf", "recordName": "shop.Order"}],
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
    assert "Failed to parse id field" in reasons["wrong_type"], reasons["wrong_type"]
    assert 'no field named "colour"' in reasons["unknown_field"], reasons["unknown_field"]
    assert "expected a JSON object for message shop.Order" in reasons["not_object"], reasons["not_object"]

    values: list[bytes] = []
    read_back: list[object] = []
    deadline = time.monotonic() + 30
    registry = {"url": schema_registry.url}
    with ReadCommittedIter(
        {"bootstrap.servers": kafka_bootstrap}, topics=[orders], value_format="protobuf", schema_registry=registry
    ) as it:
        while len(values) < len(good) and time.monotonic() < deadline:
            rec = it.poll(1.0)
            if rec is not None:
                values.append(rec.raw_value)  # type: ignore[attr-defined]
                read_back.append(rec.value)
    assert len(values) == len(good)
    # the reader's dicts: the .proto's field names, int64 as a string (proto3's JSON mapping)
    assert sorted(read_back, key=lambda o: int(o["id"])) == good  # type: ignore[index]
    # magic byte, the registered id, message index [1] (shop.Order is the file's second message)
    assert {v[:7] for v in values} == {b"\x00" + schema_id.to_bytes(4, "big") + b"\x02\x02"}
    client = SerializedProtobufClient(SchemaRegistryClient({"url": schema_registry.url}))
    cls = message_class(ORDER_PROTO, "shop.Order")
    des = ProtobufDeserializer(cls, {"use.deprecated.format": False}, client)
    ctx = SerializationContext(orders, MessageField.VALUE)
    decoded = [json_format.MessageToDict(des(v, ctx), always_print_fields_with_no_presence=True) for v in values]
    assert sorted(decoded, key=lambda o: int(o["id"])) == good


ORDER_V2 = """syntax = "proto3";
package shop;

message Order {
  int64 id = 1;
  string note = 2;
  message Line { string sku = 1; int32 qty = 2; }
  repeated Line lines = 3;
}
"""


@pytest.mark.integration
def test_spark_reader_decodes_protobuf_values_of_every_writer_schema(
    spark, schema_registry: EmbeddedRegistry, kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    from confluent_kafka import Producer

    from harvest_outbox.producer.encode.serialization import RowEncoder
    from harvest_outbox.spark_reader import readCommitted

    topic = topic_factory(1, "orders")
    config = SerializationConfig.from_mapping(
        {
            "registry": {"url": schema_registry.url},
            "topics": [{"topic": topic, "serializer": "protobuf", "recordName": "shop.Order"}],
        }
    )
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    id1 = schema_registry.register(f"{topic}-value", ORDER_PROTO, "PROTOBUF")
    rows = [(i, topic, "k", json.dumps({"id": i, "note": f"n{i}"}), None, None, None) for i in range(2)]
    for row in RowEncoder(config).encode(rows):  # type: ignore[arg-type]
        producer.produce(topic, row[3], b"k")
    id2 = schema_registry.register(f"{topic}-value", ORDER_V2, "PROTOBUF")
    v2 = {"id": 2, "note": "n2", "lines": [{"sku": "a", "qty": 3}]}
    for row in RowEncoder(config).encode([(2, topic, "k", json.dumps(v2), None, None, None)]):  # type: ignore[arg-type]
        producer.produce(topic, row[3], b"k")
    producer.produce(topic, None, b"k")
    assert producer.flush(10) == 0 and id1 != id2

    opts = {"kafka.bootstrap.servers": kafka_bootstrap}
    df = readCommitted(spark, topic, opts, value_format="protobuf", schema_registry={"url": schema_registry.url})
    got = df.orderBy("offset").select("value", "raw_value").collect()
    assert [json.loads(r.value) if r.value is not None else None for r in got] == [
        {"id": "0", "note": "n0"},  # an unset message field (at) is left out, scalars are not
        {"id": "1", "note": "n1"},
        {"id": "2", "note": "n2", "lines": [{"sku": "a", "qty": 3}]},
        None,
    ]
    assert [int.from_bytes(bytes(r.raw_value)[1:5], "big") for r in got if r.raw_value] == [id1, id1, id2]


@pytest.mark.integration
def test_a_registered_proto_that_does_not_compile_makes_rows_wait_not_dead_letters(
    schema_registry: EmbeddedRegistry,
) -> None:
    from harvest_outbox.producer.encode.serialization import RegistryUnavailable, RowEncoder

    topic = f"broken_{uuid.uuid4().hex[:8]}"
    schema_registry.register(f"{topic}-value", 'syntax = "proto3"; message {', "PROTOBUF")  # Apicurio accepts it
    config = SerializationConfig.from_mapping(
        {"registry": {"url": schema_registry.url}, "topics": [{"topic": topic, "serializer": "protobuf"}]}
    )
    row = (1, topic, "k", json.dumps({"id": 1}), None, None, None)
    with pytest.raises(
        RegistryUnavailable, match=r"does not compile: registry_schema\.proto:1:28: Expected message name"
    ):
        RowEncoder(config).encode([row])  # type: ignore[list-item]


@pytest.mark.integration
def test_pinned_ids_and_versions_encode_with_their_schema_and_latest_follows_new_versions(
    schema_registry: EmbeddedRegistry,
) -> None:
    from harvest_outbox.producer.encode.serialization import RowEncoder

    topic = f"evolving_{uuid.uuid4().hex[:8]}"
    id1 = schema_registry.register(f"{topic}-value", ORDER_PROTO, "PROTOBUF")
    with_lines = {"id": 1, "note": "n", "lines": [{"sku": "a", "qty": 2}]}
    row = (1, topic, "k", json.dumps(with_lines), None, None, None)

    def encoder(**entry: object) -> RowEncoder:
        return RowEncoder(
            SerializationConfig.from_mapping(
                {
                    "registry": {"url": schema_registry.url, "latestTtl": 0.2},
                    "topics": [{"topic": topic, "serializer": "protobuf", "recordName": "shop.Order", **entry}],
                }
            )
        )

    latest = encoder()
    assert "no field named" in str(latest.encode([row])[0][6])  # type: ignore[list-item]
    id2 = schema_registry.register(f"{topic}-value", ORDER_V2, "PROTOBUF")
    time.sleep(0.3)  # past latestTtl: the next row sees version 2
    assert int.from_bytes(latest.encode([row])[0][3][1:5], "big") == id2  # type: ignore[list-item,index]
    for pinned in ({"schemaId": id1}, {"schemaVersion": 1}):
        (out,) = encoder(**pinned).encode([row])  # type: ignore[list-item]
        assert out[6] is not None and 'no field named "lines"' in out[6], out
        (ok,) = encoder(**pinned).encode([(2, topic, "k", json.dumps({"id": 3}), None, None, None)])  # type: ignore[list-item]
        assert ok[6] is None and int.from_bytes(ok[3][1:5], "big") == id1  # type: ignore[index]


@pytest.mark.integration
def test_stash_time_validation_checks_protobuf_topics(
    schema_registry: EmbeddedRegistry, pg_dsn: str, pg_schema: str
) -> None:
    from harvest_outbox.producer.errors import RecordError
    from harvest_outbox.producer.stash.validation import StashValidator

    topic = f"stashed_{uuid.uuid4().hex[:8]}"
    schema_registry.register(f"{topic}-value", ORDER_PROTO, "PROTOBUF")
    config = SerializationConfig.from_mapping(
        {
            "registry": {"url": schema_registry.url},
            "topics": [{"topic": topic, "serializer": "protobuf", "recordName": "shop.Order"}],
        }
    )
    validator = StashValidator(config, refresh_interval=None)
    validator.refresh([topic])
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    st = Stasher(table, validate=validator)
    with psycopg.connect(pg_dsn) as conn:
        st.stash(conn, OutboxRecord(topic, "k", json.dumps({"id": 1, "note": "ok"})))
        with pytest.raises(RecordError, match="Failed to parse id field"):
            st.stash(conn, OutboxRecord(topic, "k", json.dumps({"id": "seven"})))
        count = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert count == (1,)


@pytest.mark.integration
def test_keys_encode_with_the_key_subjects_protobuf_schema(schema_registry: EmbeddedRegistry) -> None:
    from harvest_outbox.producer.encode.serialization import RowEncoder
    from harvest_outbox.protobuf_schema import ProtobufDictDecoder

    topic = f"keyed_{uuid.uuid4().hex[:8]}"
    key_proto = 'syntax = "proto3";\npackage shop;\nmessage OrderKey { string tenant = 1; int64 id = 2; }\n'
    key_id = schema_registry.register(f"{topic}-key", key_proto, "PROTOBUF")
    config = SerializationConfig.from_mapping(
        {
            "registry": {"url": schema_registry.url},
            # recordName names the value's message; the key takes its own subject's first message
            "topics": [{"topic": topic, "keySerializer": "protobuf", "recordName": "shop.Order"}],
        }
    )
    good, bad = RowEncoder(config).encode(
        [
            (1, topic, json.dumps({"tenant": "t1", "id": 9}), "as stored", None, None, None),
            (2, topic, json.dumps({"tenant": 5}), "as stored", None, None, None),
        ]  # type: ignore[list-item]
    )
    assert good[6] is None and good[3] == "as stored" and int.from_bytes(good[2][1:5], "big") == key_id
    from confluent_kafka.schema_registry import SchemaRegistryClient

    decode = ProtobufDictDecoder(SchemaRegistryClient({"url": schema_registry.url}))
    assert decode(good[2]) == {"tenant": "t1", "id": "9"}
    assert bad[6] is not None and bad[6].startswith("key does not match its schema: Failed to parse tenant field"), bad


@pytest.mark.integration
def test_direct_protobuf_bytes_equal_the_serializers_from_the_second_row_on(schema_registry: EmbeddedRegistry) -> None:
    """After a schema id's first row (the serializer's), rows are written as its header (magic byte, id,
    message indexes: here [1], the file's second message) plus the message: byte for byte the serializer's."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from harvest_outbox.producer.encode.serialization import RowEncoder
    from harvest_outbox.protobuf_schema import SerializedProtobufClient, parse_json

    topic = f"pdirect_{uuid.uuid4().hex[:8]}"
    schema_id = schema_registry.register(f"{topic}-value", ORDER_PROTO, "PROTOBUF")
    config = SerializationConfig.from_mapping(
        {
            "registry": {"url": schema_registry.url},
            "topics": [{"topic": topic, "serializer": "protobuf", "recordName": "shop.Order"}],
        }
    )
    values = [{}, {"id": 1, "note": "é"}, {"id": "-9", "at": "2026-11-25T23:30:00.5Z"}, {"note": ""}, {"id": 2**62}]
    rows = [(n, topic, b"k", json.dumps(v).encode(), None, None, None) for n, v in enumerate(values)]
    encoder = RowEncoder(config)
    out = encoder.encode(rows) + encoder.encode(rows)  # type: ignore[arg-type]
    client = SerializedProtobufClient(SchemaRegistryClient({"url": schema_registry.url}))
    cls = message_class(client.get_schema(schema_id).schema_str, "shop.Order")
    serializer = ProtobufSerializer(cls, client, {"auto.register.schemas": False, "use.schema.id": schema_id})
    ctx = SerializationContext(topic, MessageField.VALUE)
    expected = [serializer(parse_json(cls, v), ctx) for v in values] * 2
    assert [r[6] for r in out] == [None] * len(out)
    assert [r[3] for r in out] == expected
    header = encoder._topics[topic].value._by_id[schema_id].header  # type: ignore[union-attr]
    assert header == b"\x00" + schema_id.to_bytes(4, "big") + b"\x02\x02", header  # indexes [1], zigzag varints
