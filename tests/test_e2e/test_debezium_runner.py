"""Debezium itself (3.6.1.Final: Postgres connector, pgoutput, outbox EventRouter on Kafka Connect
4.3.0 standalone) over a Debezium-convention outbox table: what it publishes, byte for byte.

These are the reference for harvest's Debezium table mapping (issue #31). One worker runs one
connector per case below, all on the same table, so the same three rows go through every case:

- R1 ``order``    ``o-1`` ``OrderCreated`` payload ``{"b": 1, "a": [1, 2.5, "x"], "n": null}``,
  tenant ``t1``, seq ``7``, shard ``2``
- R2 ``customer`` ``c-1`` ``CustomerSeen`` payload
  ``{"name": "Zoë", "tags": ["a", "b"], "n": null, "o": {"k": true}, "f": 1.50, "i": 3}``,
  tenant ``t2``, seq ``-3``, shard ``1``
- R3 ``order``    ``o-2`` ``OrderGone`` payload NULL, tenant NULL, seq NULL, shard ``3``

Every case, every row:

- topic ``outbox.event.<aggregatetype>`` (``route.topic.replacement`` default), else the replacement
  with ``${routedByValue}`` = aggregatetype;
- key = aggregateid's UTF-8 bytes (``o-1``); partition 0 on a one-partition topic;
- header ``id`` = the row's uuid as 36 lower-case ASCII bytes; it follows the connector's four
  context headers ``__debezium.context.connectorLogicalName`` (= topic.prefix),
  ``__debezium.context.taskId`` (``0``), ``__debezium.context.connectorName`` (``postgresql``),
  ``__debezium.context.runId`` (a uuid per task run) — these are not the router's: the connector
  sets them, and ``extended.headers.enabled=false`` drops them;
- timestamp: CreateTime, Debezium's processing time (not the commit time: it differs per connector
  for the same row).

Values (``JSONB(R)`` = Postgres's jsonb text of the payload: keys sorted (shorter first), one space
after ``:`` and ``,``, numbers as written, e.g. R1 ``{"a": [1, 2.5, "x"], "b": 1, "n": null}``,
R2 ``{"f": 1.50, "i": 3, "n": null, "o": {"k": true}, "name": "Zoë", "tags": ["a", "b"]}``):

=================  ==============================  =============================  ===================  ==========
case               payload column / converter      R1, R2 value bytes             R3 (NULL payload)    notes
=================  ==============================  =============================  ===================  ==========
default            jsonb / String                  JSONB(R) as UTF-8              null value           topic
                                                                                                       outbox.event.*
placement          jsonb / String                  JSONB(R)                       null value           headers, see
                                                                                                       below
json               json / String                   the inserted text verbatim     null value
text               text / String                   the inserted text verbatim     null value
bytea-string       bytea / String                  ``java.nio.HeapByteBuffer      null value           junk: never
                                                   [pos=0 lim=N cap=N]``, N=len                        use
bytea-bytes        bytea / ByteArray               the bytes verbatim             null value
tombstone          jsonb / String, tombstone.on.   JSONB(R)                       null value           = default
                   empty.payload=true
json-conv          jsonb / Json schemas off        JSONB(R) as a JSON string      ``null`` (4 bytes)
                                                   literal: ``"{\\"a\\": ...}"``,
                                                   non-ASCII raw UTF-8
json-conv-tomb     as json-conv + tombstone.on.    as json-conv                   null value
                   empty.payload=true
expand-json        jsonb / Json schemas off,       R1: as json-conv (expansion    ``null`` (4 bytes)   WARN "JSON
                   table.expand.json.payload=true  fails: mixed-type array);                           expansion
                                                   R2: ``{"f":1.5,"i":3,"o":{"k":                      failed"
                                                   true},"name":"Zoë","tags":
                                                   ["a","b"]}`` (compact, jsonb
                                                   key order, null fields
                                                   dropped, 1.50 -> 1.5)
expand-string      jsonb / String, expand          R1: JSONB(R1); R2:             null value
                                                   ``Struct{f=1.5,i=3,o=Struct{k=
                                                   true},name=Zoë,tags=[a, b]}``
no-ext-headers     jsonb / String,                 JSONB(R)                       null value           headers: only
                   extended.headers.enabled=false                                                      ``id``
=================  ==============================  =============================  ===================  ==========

``placement`` (``table.fields.additional.placement=type:header:eventType,tenant:header,seq:header,
shard:partition`` on a 4-partition topic): headers after ``id``, in the listed order: ``eventType``
= type (``OrderCreated``), ``tenant`` = ``t1``, ``seq`` = the int as decimal text (``7``, ``-3``); a
NULL column still gives its header, with a null value (R3: ``tenant`` None, ``seq`` None). The
record's partition is the ``shard`` column's value (R1 2, R2 1, R3 3).

Also seen, outside the table: a payload the expansion cannot type (R1) makes the JsonConverter case
kill its task when the *next* row expands but its data then fails (a number beyond a long, e.g.
``12345678901234567890``): "Invalid type for STRUCT: class java.lang.String". The rows here avoid it.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from psycopg import sql

from harvest_outbox.harvest_local.debezium import (
    BYTE_ARRAY_CONVERTER,
    JSON_CONVERTER,
    DebeziumOutbox,
    OutboxConnector,
)
from harvest_outbox.harvest_local.errors import HarvestLocalError, ServiceError
from harvest_outbox.harvest_local.kafka import ReadRecord

pytestmark = pytest.mark.integration

TAG = uuid.uuid4().hex[:6]
ORDER, CUSTOMER = f"order{TAG}", f"customer{TAG}"


@dataclass(frozen=True)
class Row:
    aggregatetype: str
    aggregateid: str
    type: str
    payload: str | None
    tenant: str | None
    seq: int | None
    shard: int
    id: uuid.UUID = field(default_factory=uuid.uuid4)


P1 = '{"b": 1, "a": [1, 2.5, "x"], "n": null}'
P2 = '{"name": "Zoë", "tags": ["a", "b"], "n": null, "o": {"k": true}, "f": 1.50, "i": 3}'
ROWS = (
    Row(ORDER, "o-1", "OrderCreated", P1, "t1", 7, 2),
    Row(CUSTOMER, "c-1", "CustomerSeen", P2, "t2", -3, 1),
    Row(ORDER, "o-2", "OrderGone", None, None, None, 3),
)
JSONB1 = b'{"a": [1, 2.5, "x"], "b": 1, "n": null}'
JSONB2 = '{"f": 1.50, "i": 3, "n": null, "o": {"k": true}, "name": "Zoë", "tags": ["a", "b"]}'.encode()
AS_JSON_STRING1 = b'"{\\"a\\": [1, 2.5, \\"x\\"], \\"b\\": 1, \\"n\\": null}"'
AS_JSON_STRING2 = (
    '"{\\"f\\": 1.50, \\"i\\": 3, \\"n\\": null, \\"o\\": {\\"k\\": true}, \\"name\\": \\"Zoë\\", '
    '\\"tags\\": [\\"a\\", \\"b\\"]}"'
).encode()
JSON_OFF = {"value.converter": JSON_CONVERTER, "value.converter.schemas.enable": "false"}
TOMBSTONE = {"route.tombstone.on.empty.payload": "true"}
EXPAND = {"table.expand.json.payload": "true"}
PLACEMENT = {"table.fields.additional.placement": "type:header:eventType,tenant:header,seq:header,shard:partition"}


@dataclass(frozen=True)
class Case:
    name: str
    values: tuple[bytes | None, bytes | None, bytes | None]  # R1, R2, R3
    payload_column: str = "payload"
    router: dict[str, str] = field(default_factory=dict)
    converters: dict[str, str] = field(default_factory=dict)
    options: dict[str, str] = field(default_factory=dict)
    partitions: int = 1

    @property
    def connector_name(self) -> str:
        return f"{self.name.replace('-', '_')}_{TAG}"

    def connector(self, table: str) -> OutboxConnector:
        router = dict(self.router)
        if self.payload_column != "payload":
            router["table.field.event.payload"] = self.payload_column
        if self.name != "default":
            router["route.topic.replacement"] = f"dbz-{self.name}.${{routedByValue}}"
        return OutboxConnector(
            self.connector_name, table, router, self.converters, options=self.options, topic_partitions=self.partitions
        )

    def topic(self, aggregatetype: str) -> str:
        return f"outbox.event.{aggregatetype}" if self.name == "default" else f"dbz-{self.name}.{aggregatetype}"


def _buffer(text: str) -> bytes:
    size = len(text.encode())
    return f"java.nio.HeapByteBuffer[pos=0 lim={size} cap={size}]".encode()


CASES = (
    Case("default", (JSONB1, JSONB2, None)),
    Case("placement", (JSONB1, JSONB2, None), router=PLACEMENT, partitions=4),
    Case("json", (P1.encode(), P2.encode(), None), payload_column="payload_json"),
    Case("text", (P1.encode(), P2.encode(), None), payload_column="payload_text"),
    Case("bytea-string", (_buffer(P1), _buffer(P2), None), payload_column="payload_bytea"),
    Case(
        "bytea-bytes",
        (P1.encode(), P2.encode(), None),
        payload_column="payload_bytea",
        converters={"value.converter": BYTE_ARRAY_CONVERTER},
    ),
    Case("tombstone", (JSONB1, JSONB2, None), router=TOMBSTONE),
    Case("json-conv", (AS_JSON_STRING1, AS_JSON_STRING2, b"null"), converters=JSON_OFF),
    Case("json-conv-tomb", (AS_JSON_STRING1, AS_JSON_STRING2, None), router=TOMBSTONE, converters=JSON_OFF),
    Case(
        "expand-json",
        (AS_JSON_STRING1, '{"f":1.5,"i":3,"o":{"k":true},"name":"Zoë","tags":["a","b"]}'.encode(), b"null"),
        router=EXPAND,
        converters=JSON_OFF,
    ),
    Case(
        "expand-string",
        (JSONB1, "Struct{f=1.5,i=3,o=Struct{k=true},name=Zoë,tags=[a, b]}".encode(), None),
        router=EXPAND,
    ),
    Case("no-ext-headers", (JSONB1, JSONB2, None), options={"extended.headers.enabled": "false"}),
)
CONTEXT = "__debezium.context."


@pytest.fixture(scope="module")
def outbox_table(logical_pg_dsn: str) -> Iterator[str]:
    schema = f"dbz_{TAG}"
    with psycopg.connect(logical_pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) "
                "NOT NULL, type varchar(255) NOT NULL, payload jsonb, payload_json json, payload_text text, "
                "payload_bytea bytea, tenant text, seq int, shard int)"
            ).format(sql.Identifier(schema, "outbox"))
        )
    yield f"{schema}.outbox"
    with psycopg.connect(logical_pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture(scope="module")
def debezium(logical_pg_dsn: str, kafka_bootstrap: str, outbox_table: str) -> Iterator[DebeziumOutbox]:
    connectors = [case.connector(outbox_table) for case in CASES]
    started = time.monotonic()
    worker = DebeziumOutbox(logical_pg_dsn, kafka_bootstrap, connectors=connectors[:1]).start()
    print(f"\nConnect worker + first connector streaming in {time.monotonic() - started:.1f}s")
    started = time.monotonic()
    for connector in connectors[1:]:
        worker.add(connector, wait=False)
    for connector in connectors[1:]:
        worker.wait_streaming(connector.name)
    print(f"{len(connectors) - 1} more connectors streaming in {time.monotonic() - started:.1f}s")
    yield worker
    worker.destroy()


@pytest.fixture(scope="module")
def emitted(debezium: DebeziumOutbox, logical_pg_dsn: str, outbox_table: str) -> dict[str, list[ReadRecord]]:
    """Every case's records of the three rows, by case name, in row order."""
    insert(logical_pg_dsn, outbox_table, ROWS)
    topics = sorted({case.topic(row.aggregatetype) for case in CASES for row in ROWS})
    debezium.wait_for_records(topics, len(CASES) * len(ROWS), timeout=90)
    got = consume(debezium.kafka_bootstrap, topics, lambda got: len(got) >= len(CASES) * len(ROWS))
    order = {row.aggregateid: i for i, row in enumerate(ROWS)}
    return {
        case.name: sorted(
            (g for g in got if g.topic in {case.topic(r.aggregatetype) for r in ROWS}),
            key=lambda g: order[(g.key or b"").decode()],
        )
        for case in CASES
    }


def insert(dsn: str, table: str, rows: tuple[Row, ...]) -> None:
    schema, name = table.split(".")
    with psycopg.connect(dsn, autocommit=True) as conn:
        for row in rows:
            payload = row.payload
            conn.execute(
                sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s::jsonb, %s::json, %s, %s, %s, %s, %s)").format(
                    sql.Identifier(schema, name)
                ),
                (
                    row.id,
                    row.aggregatetype,
                    row.aggregateid,
                    row.type,
                    payload,
                    payload,
                    payload,
                    payload.encode() if payload is not None else None,
                    row.tenant,
                    row.seq,
                    row.shard,
                ),
            )


def consume(
    bootstrap: str, topics: list[str], done: Callable[[list[ReadRecord]], bool], timeout: float = 60.0
) -> list[ReadRecord]:
    """Read ``topics`` from the start until ``done(records)`` holds or ``timeout`` passes."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"dbz-check-{uuid.uuid4()}", "enable.auto.commit": False}
    )
    try:
        meta = consumer.list_topics(timeout=10).topics
        consumer.assign([TopicPartition(t, p, 0) for t in topics if t in meta for p in meta[t].partitions])
        out: list[ReadRecord] = []
        deadline = time.monotonic() + timeout
        while not done(out) and time.monotonic() < deadline:
            for msg in consumer.consume(100, 0.5):
                if msg.error() is None:
                    out.append(
                        ReadRecord(
                            msg.topic(),
                            msg.partition(),
                            msg.offset(),
                            msg.key(),
                            msg.value(),
                            list(msg.headers() or []),
                        )
                    )
        return out
    finally:
        consumer.close()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_what_debezium_publishes(case: Case, emitted: dict[str, list[ReadRecord]]) -> None:
    got = emitted[case.name]
    assert [(g.topic, g.key) for g in got] == [(case.topic(r.aggregatetype), r.aggregateid.encode()) for r in ROWS]
    assert [g.value for g in got] == list(case.values)
    for record, row in zip(got, ROWS, strict=True):
        context = [(k, v) for k, v in record.headers if k.startswith(CONTEXT)]
        router = [(k, v) for k, v in record.headers if not k.startswith(CONTEXT)]
        if case.name == "no-ext-headers":
            assert context == []
        else:
            assert [k for k, _ in context] == [
                f"{CONTEXT}{k}" for k in ("connectorLogicalName", "taskId", "connectorName", "runId")
            ]
            assert context[:3] == [
                (f"{CONTEXT}connectorLogicalName", case.connector_name.encode()),
                (f"{CONTEXT}taskId", b"0"),
                (f"{CONTEXT}connectorName", b"postgresql"),
            ]
            assert record.headers[:4] == context  # the connector's headers come first
        expected = [("id", str(row.id).encode())]
        if case.name == "placement":
            expected += [
                ("eventType", row.type.encode()),
                ("tenant", row.tenant.encode() if row.tenant is not None else None),
                ("seq", str(row.seq).encode() if row.seq is not None else None),
            ]
        assert router == expected
        assert record.partition == (row.shard if case.name == "placement" else 0)


def test_a_failing_connector_is_reported_with_its_cause_and_no_password(
    debezium: DebeziumOutbox, outbox_table: str, logical_pg_dsn: str
) -> None:
    wrong = OutboxConnector(f"badauth_{TAG}", outbox_table, options={"database.password": "not-the-password"})
    with pytest.raises(ServiceError, match=r"connector 'badauth_\w+' failed: .*password authentication failed") as exc:
        debezium.add(wrong, timeout=60)
    password = psycopg.conninfo.conninfo_to_dict(logical_pg_dsn)["password"]
    assert str(password) not in str(exc.value)
    assert wrong.name not in debezium.connectors


def test_a_connector_failing_on_a_row_is_reported_while_waiting_for_records(
    debezium: DebeziumOutbox, logical_pg_dsn: str, outbox_table: str
) -> None:
    """A router option naming no column passes validation and fails the task on the first row: the
    wait says so at once, instead of running out its timeout with "0 of 1 records"."""
    table = outbox_table.replace(".outbox", ".outbox_badroute")
    with psycopg.connect(logical_pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (LIKE {})").format(
                sql.Identifier(*table.split(".")), sql.Identifier(*outbox_table.split("."))
            )
        )
    broken = OutboxConnector(
        f"badroute_{TAG}",
        table,
        {"route.by.field": "nosuchcolumn", "route.topic.replacement": "dbz-badroute.${routedByValue}"},
    )
    debezium.add(broken)
    insert(logical_pg_dsn, table, ROWS[:1])
    started = time.monotonic()
    with pytest.raises(ServiceError, match=rf"connector 'badroute_{TAG}' failed: .*nosuchcolumn"):
        debezium.wait_for_records([f"dbz-badroute.{ORDER}"], 1, timeout=30)
    assert time.monotonic() - started < 20
    debezium.remove(broken.name)


def test_a_restarted_worker_resumes_from_its_slots(
    debezium: DebeziumOutbox, emitted: dict[str, list[ReadRecord]], logical_pg_dsn: str, outbox_table: str
) -> None:
    """kill() crashes the JVM; rows committed while it is down are published once it is back."""
    default = CASES[0]
    debezium.kill()
    late = Row(ORDER, "o-3", "OrderLate", '{"late": true}', None, None, 0)
    insert(logical_pg_dsn, outbox_table, (late,))
    debezium.start()
    got = consume(debezium.kafka_bootstrap, [default.topic(ORDER)], lambda got: any(g.key == b"o-3" for g in got))
    # At least once: a crash before Connect committed its offsets may publish earlier rows again.
    assert {g.key for g in got} == {b"o-1", b"o-2", b"o-3"}
    late_record = next(g for g in got if g.key == b"o-3")
    assert (late_record.value, late_record.headers[-1]) == (b'{"late": true}', ("id", str(late.id).encode()))


@pytest.mark.parametrize(
    ("kwargs", "dsn", "message"),
    [
        (dict(name="has space", table="s.t"), "host=127.0.0.1", r"name 'has space': use letters"),
        (dict(name="ok", table="no_schema"), "host=127.0.0.1", r"table 'no_schema': give it as 'schema.table'"),
        (dict(name="ok", table="a.b.c"), "host=127.0.0.1", r"table 'a.b.c': give it as 'schema.table'"),
        (
            dict(name="ok", table="s.t"),
            "host=/var/run/postgresql",
            r"over TCP: the DSN's host is '/var/run/postgresql'",
        ),
        (dict(name="ok", table="s.t"), "dbname=x", r"over TCP: the DSN's host is 'unset'"),
    ],
)
def test_bad_connector_settings_are_refused_by_name(kwargs: dict[str, str], dsn: str, message: str) -> None:
    with pytest.raises(HarvestLocalError, match=message):
        OutboxConnector(**kwargs).config(dsn)


def test_connector_config_maps_the_dsn_and_router_options() -> None:
    config = OutboxConnector(
        "c1",
        "my_schema.outbox",
        {"route.by.field": "kind"},
        {"value.converter": JSON_CONVERTER},
        options={"extended.headers.enabled": "false"},
    ).config("host=127.0.0.1 port=6543 user=u password=secret dbname=d connect_timeout=5")
    assert {
        k: config[k]
        for k in (
            "database.hostname",
            "database.port",
            "database.user",
            "database.password",
            "database.dbname",
            "table.include.list",
            "slot.name",
            "publication.name",
            "transforms.outbox.route.by.field",
            "value.converter",
            "extended.headers.enabled",
        )
    } == {
        "database.hostname": "127.0.0.1",
        "database.port": "6543",
        "database.user": "u",
        "database.password": "secret",
        "database.dbname": "d",
        "table.include.list": re.escape("my_schema.outbox"),
        "slot.name": "dbz_c1",
        "publication.name": "dbz_c1",
        "transforms.outbox.route.by.field": "kind",
        "value.converter": JSON_CONVERTER,
        "extended.headers.enabled": "false",
    }
