"""A schema registry outage is an outage, not poison (producer/encode/serialization.py): with the real
registry stopped mid-drain, the rows that need it wait in the outbox (nothing is dead-lettered, the
relay keeps running) and go out, encoded, once the registry is back. Both modes."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable

import psycopg
import pytest
from relaylib import outbox_count, relay_config, wait_drained
from test_registry_encode import ORDER, decode, read

from harvest_outbox.harvest_local.registry import EmbeddedRegistry
from harvest_outbox.producer.config.serialization import SerializationConfig
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.ops._deadletters import list_dead_letters
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("sequenced", [False, True], ids=["at-least-once", "uuid-sequencing"])
def test_rows_wait_out_a_registry_outage_and_flow_when_it_returns(
    sequenced: bool,
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
    st = Stasher(table)
    before = [{"id": i, "note": f"n{i}"} for i in range(40)]
    during = [{"id": i, "note": f"n{i}"} for i in range(40, 100)]
    # latestTtl 1 s: the relay asks the registry for the subject's latest schema again within the
    # outage (with the default 5 min, rows of a topic already seen flow on from the cache)
    serialization = SerializationConfig.from_mapping(
        {"registry": {"url": schema_registry.url, "latestTtl": 1}, "topics": [{"topic": topic, "serializer": "avro"}]}
    )
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, f"g-{uuid.uuid4().hex[:8]}").replace(
        uuid_sequencing=sequenced, serialization=serialization
    )
    relay = Harvest(cfg).start()
    try:
        with psycopg.connect(pg_dsn) as conn:
            st.stash_many(conn, [OutboxRecord(topic, f"k{o['id'] % 7}", json.dumps(o)) for o in before])
        wait_drained(pg_dsn, table, 60)
        first = read(kafka_bootstrap, topic, len(before))
        assert sorted(decode(schema_registry, topic, [g.value for g in first]), key=lambda o: o["id"]) == before  # type: ignore[misc,index]

        schema_registry.stop()
        try:
            time.sleep(1.5)  # past latestTtl
            with psycopg.connect(pg_dsn) as conn:
                st.stash_many(conn, [OutboxRecord(topic, f"k{o['id'] % 7}", json.dumps(o)) for o in during])
            time.sleep(5)
            assert relay.state.value == "running"
            assert outbox_count(pg_dsn, table) == len(during), "rows went out (or away) without the registry"
            with psycopg.connect(pg_dsn) as conn:
                assert list_dead_letters(conn, table) == [], "a registry outage dead-lettered rows"
        finally:
            schema_registry.start()
        # in-memory storage: the registry comes back empty; the schema is registered again
        schema_registry.register(f"{topic}-value", json.dumps(ORDER))
        took = wait_drained(pg_dsn, table, 60)
        with psycopg.connect(pg_dsn) as conn:
            assert list_dead_letters(conn, table) == []
    finally:
        relay.stop()
        relay.wait(30)
    got = read(kafka_bootstrap, topic, len(before) + len(during), 60)
    after = [g for g in got if g not in first]
    decoded = decode(schema_registry, topic, [g.value for g in after])  # type: ignore[misc]
    assert sorted(decoded, key=lambda o: o["id"]) == during  # type: ignore[index]
    print(
        f"{'sequenced' if sequenced else 'at-least-once'}: drained {len(during)} rows {took:.1f}s after the registry returned"
    )
