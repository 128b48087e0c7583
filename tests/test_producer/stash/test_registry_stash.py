"""Stash-time validation (producer/stash/validation.py) on a real Apicurio Registry and Postgres: a
writer whose record does not fit its topic's schema fails in its own transaction, naming the field
and the rule, and nothing is written; the check reads the local cache only (no registry request
inside the transaction); uncached topics pass until the next refresh caches them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from harvest_outbox.harvest_local.registry import EmbeddedRegistry
from harvest_outbox.producer.config.serialization import SerializationConfig
from harvest_outbox.producer.errors import RecordError
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher
from harvest_outbox.producer.stash.validation import StashValidator

pytestmark = pytest.mark.integration

ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "note", "type": "string"}],
}
PAYMENT = {"type": "object", "properties": {"amount": {"type": "number", "minimum": 0}}, "required": ["amount"]}


def counting_client(requests: list[str]) -> Callable[[dict[str, Any]], Any]:
    """The real registry client, its HTTP requests counted."""

    def make(conf: dict[str, Any]) -> Any:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        client = SchemaRegistryClient(conf)
        rest = client._rest_client
        send = rest.send_request

        def counted(url: str, method: str, *a: Any, **kw: Any) -> Any:
            requests.append(f"{method} {url}")
            return send(url, method, *a, **kw)

        rest.send_request = counted
        return client

    return make


def test_writers_fail_fast_without_a_registry_call_in_the_transaction(
    schema_registry: EmbeddedRegistry, pg_dsn: str, pg_schema: str, unique_name: Callable[[str], str]
) -> None:
    orders, payments, later, plain = (unique_name(p) for p in ("orders", "payments", "later", "plain"))
    schema_registry.register(f"{orders}-value", json.dumps(ORDER))
    schema_registry.register(f"{payments}-value", json.dumps(PAYMENT), "JSON")
    schema_registry.register(f"{later}-value", json.dumps(ORDER))
    serialization = SerializationConfig.from_mapping(
        {
            "registry": {"url": schema_registry.url},
            "topics": [
                {"topic": orders, "serializer": "avro"},
                {"topic": payments, "serializer": "jsonSchema"},
                {"topicPattern": "later_.*", "serializer": "avro"},
            ],
        }
    )
    requests: list[str] = []
    validator = StashValidator(serialization, refresh_interval=None, client_factory=counting_client(requests))
    validator.refresh()  # outside any transaction: the configured topics' schemas
    assert len(requests) >= 2
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    st = Stasher(table, validate=validator)
    before = len(requests)
    with psycopg.connect(pg_dsn) as conn:
        st.stash(conn, OutboxRecord(orders, "k", json.dumps({"id": 1, "note": "ok"})))
        st.stash(conn, OutboxRecord(orders, "k", None))  # tombstone
        st.stash(conn, OutboxRecord(plain, "k", "not json, not encoded"))
        st.stash_many(conn, [OutboxRecord(payments, "p", json.dumps({"amount": 3}))])
        # a topic the pattern matches but not cached yet: passes (the relay checks it), fetched next refresh
        st.stash(conn, OutboxRecord(later, "k", json.dumps({"id": "x"})))
    with pytest.raises(RecordError, match=r"shop\.Order\.id is <1\.5> of type <class 'float'> expected long"):
        with psycopg.connect(pg_dsn) as conn:
            st.stash(conn, OutboxRecord(orders, "k", json.dumps({"id": 1.5, "note": "x"})))
    with pytest.raises(RecordError, match=r"field \$\.amount: -1 is less than the minimum of 0 \(rule: minimum\)"):
        with psycopg.connect(pg_dsn) as conn:
            st.stash_many(
                conn,
                [OutboxRecord(payments, "p", json.dumps({"amount": 2}))] * 3
                + [OutboxRecord(payments, "p", json.dumps({"amount": -1}))],
            )
    with pytest.raises(RecordError, match="not JSON"):
        with psycopg.connect(pg_dsn) as conn:
            st.stash(conn, OutboxRecord(orders, "k", "id=1"))
    assert len(requests) == before, f"the check called the registry: {requests[before:]}"
    schema, name = table.split(".")
    with psycopg.connect(pg_dsn) as conn:
        count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, name))).fetchone()
    assert count == (5,), "only the stashes that passed were written (a failed batch writes none of it)"

    validator.refresh()
    assert len(requests) > before
    with pytest.raises(RecordError, match="later"):
        with psycopg.connect(pg_dsn) as conn:
            st.stash(conn, OutboxRecord(later, "k", json.dumps({"id": "x"})))
