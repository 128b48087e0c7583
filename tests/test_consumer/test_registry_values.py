"""ReadCommittedIter(value_format=...) decodes registry-encoded values (consumer/registry_values.py)
on a real Apicurio Registry and Kafka: records the relay encoded and sequenced (--uuid-sequencing)
come back committed, in order and decoded; a tombstone stays None; a value not in the wire format
raises ValueDecodeError naming and carrying the record; value_format="raw" is unchanged."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql

from harvest_outbox.consumer import ReadCommittedIter
from harvest_outbox.consumer.errors import ConfigError
from harvest_outbox.consumer.registry_values import DecodedRecord, ValueDecodeError
from harvest_outbox.harvest_local.registry import EmbeddedRegistry
from harvest_outbox.producer.config import HarvestConfig, Limits
from harvest_outbox.producer.config.serialization import SerializationConfig
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "note", "type": "string"}],
}


def test_value_format_is_checked_before_anything_connects() -> None:
    with pytest.raises(ConfigError, match="value_format: 'xml' is not a format"):
        ReadCommittedIter({"bootstrap.servers": "127.0.0.1:1"}, topics=["t"], value_format="xml")
    with pytest.raises(ConfigError, match="schema_registry: value_format='avro' needs"):
        ReadCommittedIter({"bootstrap.servers": "127.0.0.1:1"}, topics=["t"], value_format="avro")


@pytest.mark.integration
def test_committed_records_come_back_decoded(
    schema_registry: EmbeddedRegistry,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
) -> None:
    topic = topic_factory(2, "orders")
    schema_registry.register(f"{topic}-value", json.dumps(ORDER))
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    orders = [{"id": i, "note": f"n{i}"} for i in range(60)]
    with psycopg.connect(pg_dsn) as conn:
        Stasher(table).stash_many(conn, [OutboxRecord(topic, f"k{o['id'] % 5}", json.dumps(o)) for o in orders])
        Stasher(table).stash(conn, OutboxRecord(topic, "k1", None))
    cfg = HarvestConfig(
        data_source=pg_dsn,
        outbox_table=table,
        base_kafka_config={"bootstrap.servers": kafka_bootstrap},
        leader_group_id=f"g-{uuid.uuid4().hex[:8]}",
        uuid_sequencing=True,
        limits=Limits(heartbeat_timeout=2.0, io_error_backoff=0.1),
        serialization=SerializationConfig.from_mapping(
            {"registry": {"url": schema_registry.url}, "topics": [{"topic": topic, "serializer": "avro"}]}
        ),
    )
    relay = Harvest(cfg).start()
    try:
        schema, name = table.split(".")
        deadline = time.monotonic() + 60
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            count = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, name))
            while conn.execute(count).fetchone()[0] and time.monotonic() < deadline:  # type: ignore[index]
                time.sleep(0.1)
    finally:
        relay.stop()
        relay.wait(30)
    # A value another writer put there, not in the wire format.
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": kafka_bootstrap})
    p.produce(topic, b"not avro", b"k0", partition=0)
    p.flush(10)

    got: list[DecodedRecord] = []
    foreign: list[ValueDecodeError] = []
    registry = {"url": schema_registry.url}
    with ReadCommittedIter(
        {"bootstrap.servers": kafka_bootstrap}, topics=[topic], value_format="avro", schema_registry=registry
    ) as it:
        deadline = time.monotonic() + 30
        while len(got) + len(foreign) < 62 and time.monotonic() < deadline:
            try:
                rec = it.poll(1.0)
            except ValueDecodeError as exc:
                foreign.append(exc)
                continue
            if rec is not None:
                got.append(rec)  # type: ignore[arg-type]
    assert all(isinstance(r, DecodedRecord) for r in got)
    values = [r.value for r in got]
    assert None in values and values.count(None) == 1  # the tombstone
    assert sorted((v for v in values if v is not None), key=lambda o: o["id"]) == orders  # type: ignore[index]
    per_key: dict[bytes, list[int]] = {}
    for r in got:
        assert r.uuid is not None, "sequenced: the relay's uuid header survives encoding"
        if r.value is not None:
            per_key.setdefault(r.key, []).append(r.value["id"])
    assert all(ids == sorted(ids) for ids in per_key.values())
    assert got[0].raw_value[0] == 0  # type: ignore[index]
    assert len(foreign) == 1 and "is not in the registry wire format" in str(foreign[0])
    assert foreign[0].record.value == b"not avro"

    with ReadCommittedIter({"bootstrap.servers": kafka_bootstrap}, topics=[topic], idle_timeout=3) as raw:
        first = next(iter(raw))
    assert isinstance(first.value, bytes) and not isinstance(first, DecodedRecord)
