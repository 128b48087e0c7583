"""harvest's records of a Debezium outbox equal Debezium's own, byte for byte (issue #31).

Debezium 3.6.1 (Postgres connector, pgoutput, the outbox EventRouter on Kafka Connect standalone:
harvest_local/debezium.py) and harvest (``tableMapping: debezium`` with the same router options) each
read the same rows of one outbox table per case; Debezium routes into ``dbz-<case>.…``, harvest into
``hv-<case>.…`` (only ``route.topic.replacement`` differs). For every row: the topic (less that
prefix), key bytes, value bytes (``None`` for a tombstone), the headers the router sets (``id``, then
the placed columns, in order, values as bytes or null) and, with a partition placement, the
partition, are equal. Debezium's connector also sets four ``__debezium.context.*`` headers (not the
router's; ``extended.headers.enabled=false`` drops them): they are left out of the comparison, as is
harvest's ``uuid`` header in sequenced mode.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from psycopg import sql

from harvest_outbox.harvest_local.debezium import BYTE_ARRAY_CONVERTER, DebeziumOutbox, OutboxConnector
from harvest_outbox.harvest_local.kafka import create_topic, read_to_end
from harvest_outbox.producer.config import HarvestConfig, Limits
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.mapping.table import table_mapping
from harvest_outbox.producer.schema.ddl import init_db

pytestmark = pytest.mark.integration

TAG = uuid.uuid4().hex[:6]
AGGREGATES = (f"Order{TAG}", f"Customer{TAG}", f"Ship{TAG}")
PAYLOADS = [
    '{"b": 1, "a": [1, 2.5, "x"], "n": null}',
    '{"name": "Zoë", "tags": ["a", "b"], "o": {"k": true}, "f": 1.50, "i": 3}',
    '{"big": 12345678901234567890, "exp": 1e3, "neg": -0.0, "esc": "quote \\" back \\\\ tab \\t"}',
    '[1, {"nested": [[], {}]}, "☃", "𝄞"]',
    '"just a string"',
    "42",
    None,
]
TEXT_PAYLOADS = [*PAYLOADS, "", "   ", "\t\n", "not json at all", " padded "]
CONTEXT = "__debezium.context."


@dataclass(frozen=True)
class Case:
    name: str
    payload_type: str = "jsonb"
    router: dict[str, str] = field(default_factory=dict)
    converters: dict[str, str] = field(default_factory=dict)
    partitions: int = 1
    sequenced: bool = False
    payloads: tuple[str | None, ...] = tuple(PAYLOADS)

    @property
    def table(self) -> str:
        return f"dbzp_{TAG}.outbox_{self.name.replace('-', '_')}"

    def options(self, prefix: str) -> dict[str, str]:
        return {**self.router, "route.topic.replacement": f"{prefix}-{self.name}.${{routedByValue}}"}


PLACEMENT = {"table.fields.additional.placement": "type:header:eventType,tenant:header,seq:header,shard:partition"}
CASES = (
    Case("jsonb"),
    Case("jsonb-seq", sequenced=True),
    Case("placement", router=PLACEMENT, partitions=4),
    Case("json", payload_type="json"),
    Case("text", payload_type="text", payloads=tuple(TEXT_PAYLOADS)),
    Case(
        "tombstone",
        payload_type="text",
        router={"route.tombstone.on.empty.payload": "true"},
        payloads=tuple(TEXT_PAYLOADS),
    ),
    Case("bytea", payload_type="bytea", converters={"value.converter": BYTE_ARRAY_CONVERTER}),
)


@dataclass(frozen=True)
class Rec:
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def _rows(case: Case) -> list[tuple[Any, ...]]:
    rows = []
    for i in range(60):
        payload = case.payloads[i % len(case.payloads)]
        value: Any = payload.encode() if payload is not None and case.payload_type == "bytea" else payload
        rows.append(
            (
                uuid.uuid4(),
                AGGREGATES[i % 3],
                f"agg-{i % 7}",
                f"Type{i % 4}",
                value,
                None if i % 5 == 0 else f"tenant-{i % 3}",
                None if i % 6 == 0 else i - 20,
                (i % 7) % 4,
            )
        )
    return rows


@pytest.fixture(scope="module")
def published(logical_pg_dsn: str, kafka_bootstrap: str) -> Iterator[dict[str, dict[str, list[Rec]]]]:
    """Per case: ``{"dbz": records, "hv": records}`` of the same rows."""
    schema = f"dbzp_{TAG}"
    with psycopg.connect(logical_pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        for case in CASES:
            s, t = case.table.split(".")
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {} (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) "
                    "NOT NULL, type varchar(255) NOT NULL, payload {}, tenant text, seq integer, shard integer)"
                ).format(sql.Identifier(s, t), sql.SQL(case.payload_type))
            )
    mappings = {case.name: table_mapping("debezium", case.options("hv")) for case in CASES}
    for case in CASES:
        init_db(logical_pg_dsn, case.table, mapping=mappings[case.name])
        for agg in AGGREGATES:
            create_topic(kafka_bootstrap, f"hv-{case.name}.{agg}", case.partitions)
    worker = DebeziumOutbox(
        logical_pg_dsn,
        kafka_bootstrap,
        connectors=[
            OutboxConnector(
                f"p_{case.name.replace('-', '_')}_{TAG}",
                case.table,
                case.options("dbz"),
                case.converters,
                topic_partitions=case.partitions,
            )
            for case in CASES
        ],
    ).start()
    relays: list[Harvest] = []
    try:
        for case in CASES:
            worker.wait_streaming(f"p_{case.name.replace('-', '_')}_{TAG}")
        expected = 0
        with psycopg.connect(logical_pg_dsn, autocommit=True) as conn:
            for case in CASES:
                s, t = case.table.split(".")
                rows = _rows(case)
                expected += len(rows)
                with conn.cursor() as cur:
                    cur.executemany(
                        sql.SQL(
                            "INSERT INTO {} (id, aggregatetype, aggregateid, type, payload, tenant, "
                            "seq, shard) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                        ).format(sql.Identifier(s, t)),
                        rows,
                    )
        for case in CASES:
            cfg = HarvestConfig(
                data_source=logical_pg_dsn,
                outbox_table=case.table,
                base_kafka_config={"bootstrap.servers": kafka_bootstrap},
                producer_kafka_config={"linger.ms": 5},
                leader_election="postgres",
                leader_lock_check_interval=0.2,
                name=f"hv-{case.name}",
                uuid_sequencing=case.sequenced,
                table_mapping=mappings[case.name],
                limits=Limits(min_metrics_interval=0.5, idle_poll_interval=0.5),
            )
            relays.append(Harvest(cfg).start())
        topics = {p: [f"{p}-{case.name}.{agg}" for case in CASES for agg in AGGREGATES] for p in ("dbz", "hv")}
        worker.wait_for_records(topics["dbz"], expected, timeout=120)
        deadline = time.monotonic() + 120
        with psycopg.connect(logical_pg_dsn, autocommit=True) as conn:
            while True:
                left = sum(
                    conn.execute(
                        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(*case.table.split(".")))
                    ).fetchone()[0]
                    for case in CASES
                )  # type: ignore[index]
                if not left:
                    break
                assert time.monotonic() < deadline, f"harvest left {left} row(s)"
                time.sleep(0.2)
        out: dict[str, dict[str, list[Rec]]] = {case.name: {"dbz": [], "hv": []} for case in CASES}
        for prefix in ("dbz", "hv"):
            for rec in _read(kafka_bootstrap, topics[prefix]):
                name = rec.topic.split(".", 1)[0][len(prefix) + 1 :]
                out[name][prefix].append(rec)
        yield out
    finally:
        for relay in relays:
            relay.stop()
        worker.destroy()
        with psycopg.connect(logical_pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def _read(bootstrap: str, topics: list[str]) -> list[Rec]:
    """The topics' records (harvest's ACK records, value b'' and no id header, are dropped)."""
    return [
        Rec(r.topic, r.partition, r.key, r.value, r.headers)
        for r in read_to_end(bootstrap, topics)
        if any(h == "id" for h, _ in r.headers)
    ]


def _router_headers(rec: Rec) -> list[tuple[str, bytes | None]]:
    return [(h, v) for h, v in rec.headers if not h.startswith(CONTEXT) and h != "uuid"]


def _event_id(rec: Rec) -> bytes | None:
    return dict(rec.headers)["id"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_harvest_publishes_what_debezium_publishes(case: Case, published: dict[str, dict[str, list[Rec]]]) -> None:
    dbz = {_event_id(r): r for r in published[case.name]["dbz"]}
    hv = {_event_id(r): r for r in published[case.name]["hv"]}
    assert len(dbz) == len(published[case.name]["dbz"]) == 60, "Debezium: one record per row"
    assert len(hv) == len(published[case.name]["hv"]) == 60, "harvest: one record per row"
    assert set(hv) == set(dbz)
    for eid, d in dbz.items():
        h = hv[eid]
        assert h.topic.split(".", 1)[1] == d.topic.split(".", 1)[1], eid
        assert h.key == d.key, eid
        assert h.value == d.value, (eid, d.value, h.value)
        assert _router_headers(h) == _router_headers(d), eid
        if case.partitions > 1:
            assert h.partition == d.partition, eid
    if case.name == "tombstone":
        assert sum(1 for d in dbz.values() if d.value is None) > sum(1 for p in case.payloads if p is None)
