"""Where the writer schema comes from (producer/encode/serialization.py, real registry): a pinned version of
the topic's subject, a pinned schema id under the record strategy, and Avro keys from the key
subject; the records carry exactly those schema ids and decode to what was stashed."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import psycopg
import pytest
from relaylib import relay_config, wait_drained
from test_registry_encode import decode, read

from harvest_outbox.harvest_local.registry import EmbeddedRegistry
from harvest_outbox.producer.config.serialization import SerializationConfig
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.ops._deadletters import list_dead_letters
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

pytestmark = pytest.mark.integration

V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [{"name": "id", "type": "long"}]}
V2 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "note", "type": "string", "default": ""}],
}


def test_pinned_version_pinned_id_and_avro_keys(
    schema_registry: EmbeddedRegistry,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    pinned, by_record = topic_factory(1, "pinned"), topic_factory(1, "byrecord")
    v1_id = schema_registry.register(f"{pinned}-value", json.dumps(V1))
    v2_id = schema_registry.register(f"{pinned}-value", json.dumps(V2))  # the latest, not used
    key_id = schema_registry.register(f"{pinned}-key", json.dumps("string"))
    record_name = unique_name("rec")
    record_id = schema_registry.register(record_name, json.dumps(V2))
    assert len({v1_id, v2_id, key_id}) == 3
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    st = Stasher(table)
    with psycopg.connect(pg_dsn) as conn:
        st.stash_many(conn, [OutboxRecord(pinned, json.dumps(f"k{i}"), json.dumps({"id": i})) for i in range(5)])
        st.stash_many(conn, [OutboxRecord(by_record, "k", json.dumps({"id": i, "note": "n"})) for i in range(5)])
        bad_key = st.stash(conn, OutboxRecord(pinned, "not-json", json.dumps({"id": 9})))
    serialization = SerializationConfig.from_mapping(
        {
            "registry": {"url": schema_registry.url},
            "topics": [
                {"topic": pinned, "serializer": "avro", "schemaVersion": 1, "keySerializer": "avro"},
                {
                    "topic": by_record,
                    "serializer": "avro",
                    "subjectNameStrategy": "record",
                    "recordName": record_name,
                    "schemaId": record_id,
                },
            ],
        }
    )
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, f"g-{uuid.uuid4().hex[:8]}").replace(serialization=serialization)
    relay = Harvest(cfg).start()
    try:
        wait_drained(pg_dsn, table, 60)
        with psycopg.connect(pg_dsn) as conn:
            dead = {d.id: d.error for d in list_dead_letters(conn, table)}
    finally:
        relay.stop()
        relay.wait(30)
    assert list(dead) == [bad_key] and dead[bad_key].startswith("bad row: key is not JSON"), dead
    got = read(kafka_bootstrap, pinned, 5)
    assert {int.from_bytes(g.value[1:5], "big") for g in got} == {v1_id}  # type: ignore[index]
    assert [o["id"] for o in decode(schema_registry, pinned, [g.value for g in got])] == list(range(5))  # type: ignore[misc,index]
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"k-{uuid.uuid4()}", "enable.auto.commit": False})
    c.assign([TopicPartition(pinned, 0, 0)])
    keys = [m.key() for m in c.consume(5, 10)]
    c.close()
    assert {int.from_bytes(k[1:5], "big") for k in keys} == {key_id}
    assert [k[5:] for k in keys] == [b"\x04k" + str(i).encode() for i in range(5)]  # Avro string: length, bytes
    got = read(kafka_bootstrap, by_record, 5)
    assert {int.from_bytes(g.value[1:5], "big") for g in got} == {record_id}  # type: ignore[index]
    assert decode(schema_registry, by_record, [g.value for g in got]) == [{"id": i, "note": "n"} for i in range(5)]  # type: ignore[misc]
