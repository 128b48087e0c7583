"""Table mappings (producer/mapping/table.py): the router's options, and a relay draining a Debezium outbox.

The byte-for-byte comparison with Debezium itself is tests/test_e2e/test_debezium_parity.py; here the
expected records are written down from the router's rules (EventRouterDelegate: topic from
route.by.field through route.topic.regex/replacement, key from table.field.event.key, value the
payload's text, an ``id`` header, additional columns as headers).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from relaylib import consume_all, relay_config
from seqcheck import Expected, check_exactly_once

from harvest_outbox.harvest_local.kafka import create_topic, read_to_end
from harvest_outbox.producer.config import HarvestConfig, from_mapping
from harvest_outbox.producer.errors import ConfigError, SchemaError
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.mapping.table import GOHARVEST, DebeziumMapping, EventRouter, table_mapping
from harvest_outbox.producer.ops._deadletters import list_dead_letters, requeue
from harvest_outbox.producer.schema import OutboxNames, inspect_outbox
from harvest_outbox.producer.schema.ddl import init_db

# ---------------------------------------------------------------------------------------- options


def test_router_defaults_are_debeziums() -> None:
    r = EventRouter.from_options({})
    assert (r.field_event_id, r.field_event_key, r.field_event_payload, r.route_by_field) == (
        "id",
        "aggregateid",
        "payload",
        "aggregatetype",
    )
    assert r.route_topic_replacement == "outbox.event.${routedByValue}"
    assert not r.tombstone_on_empty_payload and r.additional == ()


def test_a_connectors_settings_copy_as_they_are() -> None:
    r = EventRouter.from_options(
        {
            "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
            "transforms.outbox.route.by.field": "kind",
            "transforms.outbox.table.fields.additional.placement": "type:header:eventType,tenant:header",
            "transforms.outbox.route.tombstone.on.empty.payload": "true",
        }
    )
    assert r.route_by_field == "kind" and r.tombstone_on_empty_payload
    assert [(a.column, a.alias) for a in r.additional] == [("type", "eventType"), ("tenant", "tenant")]


@pytest.mark.parametrize(
    "options, says",
    [
        ({"route.by.feild": "x"}, "eventRouter.route.by.feild: unknown option"),
        ({"table.field.event.timestamp": "ts"}, "not supported by harvest"),
        ({"table.expand.json.payload": True}, "table.expand.json.payload: true is not supported"),
        ({"table.fields.additional.placement": "type:envelope"}, "placement 'envelope' is not supported"),
        ({"table.fields.additional.placement": "p:partition,q:partition"}, "a second partition placement"),
        ({"table.fields.additional.placement": "type:nowhere"}, "unknown placement"),
        ({"table.fields.additional.placement": "type"}, "must be column:placement"),
        ({"table.fields.additional.placement": "type:header:id"}, "second 'id' header"),
        ({"route.tombstone.on.empty.payload": "yes"}, "must be true or false"),
        ({"route.by.field": "a-b"}, "is not a column name"),
        ({"route.topic.replacement": "x.${nope}"}, "names group 'nope'"),
        ({"route.topic.replacement": "x.$"}, "'$' must name a group"),
        ({"route.topic.regex": "(?=x).*"}, "the group '(?=x'… (at offset 0) is not accepted"),
        ({"route.topic.regex": "(unclosed"}, "the group is not closed"),
        ({"type": "io.debezium.transforms.ExtractNewRecordState"}, "is not Debezium's outbox event router"),
        ({"table.op.invalid.behavior": "fatal"}, "only 'warn' is supported"),
        ("route.by.field", "expected a mapping"),
    ],
)
def test_bad_router_options_are_named(options: Any, says: str) -> None:
    with pytest.raises(ConfigError, match="eventRouter") as err:
        EventRouter.from_options(options)
    assert says in str(err.value)


@pytest.mark.parametrize(
    "data, says",
    [
        ({"tableMapping": "debzium"}, "tableMapping: 'debzium' is not a table mapping"),
        ({"eventRouter": {"route.by.field": "x"}}, "only applies to tableMapping: debezium"),
        ({"tableMapping": "debezium", "eventRouter": {"nope": 1}}, "harvest.eventRouter.nope: unknown option"),
    ],
)
def test_config_keys(data: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_mapping({"harvest": data})
    assert says in str(err.value)


def test_config_builds_the_mapping() -> None:
    cfg = from_mapping({"harvest": {"tableMapping": "debezium", "eventRouter": {"route.by.field": "kind"}}}).harvest
    assert isinstance(cfg.table_mapping, DebeziumMapping) and cfg.table_mapping.router.route_by_field == "kind"
    assert HarvestConfig().table_mapping is GOHARVEST
    assert "route_by_field='kind'" in repr(cfg)


def _topic_sql(options: dict[str, Any]) -> str:
    m = table_mapping("debezium", options)
    assert isinstance(m, DebeziumMapping)
    return m.topic("o").as_string(None)


def test_default_routing_is_a_concatenation_not_a_regex() -> None:
    v = '"o"."aggregatetype"::text COLLATE "C"'
    assert _topic_sql({}) == (
        f"CASE WHEN {v} ~  E'[\\\\u000a\\\\u000d\\\\u0085\\\\u2028\\\\u2029]' THEN {v} "
        f"ELSE 'outbox.event.' || {v} || '' END"
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    "regex, replacement, routed, topic",
    [
        ("(?<routedByValue>.*)", "outbox.event.${routedByValue}", "Order", "outbox.event.Order"),
        ("(?<routedByValue>.*)", "${routedByValue}.events", "Order", "Order.events"),
        ("(?<svc>[a-z]+)\\.(?<kind>.*)", "${kind}-$1", "orders.Created", "Created-orders"),
        ("(?<svc>[a-z]+)\\.(?<kind>.*)", "${kind}-$1", "NoDot", "NoDot"),  # no whole match: the value as is
        ("(.*)", "cost\\$.$1", "x", "cost$.x"),
        ("(.*)", "p.$1", "a\nb", "a\nb"),  # Java's "." stops at a line terminator: no whole match
        ("\\b(?<routedByValue>\\w+)\\b", "p.${routedByValue}", "orders", "p.orders"),  # \b is not backspace
    ],
)
def test_routing_matches_kafkas_regex_router(
    regex: str, replacement: str, routed: str, topic: str, pg_dsn: str
) -> None:
    """RegexRouter: the regex must match the whole value; then the replacement's groups fill in."""
    m = table_mapping("debezium", {"route.topic.regex": regex, "route.topic.replacement": replacement})
    assert isinstance(m, DebeziumMapping)
    with psycopg.connect(pg_dsn) as conn:
        got = conn.execute(
            sql.SQL("SELECT {} FROM (SELECT %s::text AS aggregatetype) AS o").format(m.topic("o")), (routed,)
        ).fetchone()
    assert got is not None and got[0] == topic


# ---------------------------------------------------------------------------------------- the relay

_CREATE = """
    CREATE TABLE {t} (
      id            UUID PRIMARY KEY,
      aggregatetype VARCHAR(255),
      aggregateid   VARCHAR(255),
      type          VARCHAR(255) NOT NULL,
      payload       {payload},
      tenant        TEXT,
      version       INTEGER,
      part          INTEGER
    )"""


def _insert(conn: psycopg.Connection, table: sql.Composable, rows: list[tuple[Any, ...]]) -> None:
    with conn.cursor() as cur:
        cur.executemany(
            sql.SQL(
                "INSERT INTO {} (id, aggregatetype, aggregateid, type, payload, tenant, version, part) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
            ).format(table),
            rows,
        )


def _headers_by_value(bootstrap: str, topic: str) -> dict[bytes, list[tuple[str, bytes | None]]]:
    """Every record's headers by its value, the whole topic read."""
    return {r.value: r.headers for r in read_to_end(bootstrap, [topic]) if r.value is not None}


def _documented_ack_filter() -> Callable[[Any], bool]:
    """``is_ack`` as docs/debezium.md ("ACK records") writes it: the doc's code, run."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[3] / "docs" / "debezium.md").read_text()
    section = doc[doc.index("### ACK records") :]
    code = section[
        section.index("```python\n") + len("```python\n") : section.index("```\n", section.index("```python"))
    ]
    scope: dict[str, Any] = {}
    exec(code, scope)  # the project's own documentation, tested as written
    return scope["is_ack"]  # type: ignore[no-any-return]


def _read_messages(bootstrap: str, topic: str) -> list[Any]:
    """Every record of ``topic`` as confluent-kafka's ``Message``, up to the high watermarks."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"plain-{uuid.uuid4()}", "enable.auto.commit": False})
    try:
        parts = [TopicPartition(topic, p, 0) for p in c.list_topics(topic, timeout=10).topics[topic].partitions]
        ends = {tp.partition: c.get_watermark_offsets(tp, timeout=10)[1] for tp in parts}
        c.assign(parts)
        out: list[Any] = []
        deadline = time.monotonic() + 30
        while len(out) < sum(ends.values()):
            assert time.monotonic() < deadline, f"read {len(out)} of {sum(ends.values())} records"
            out += [m for m in c.consume(1000, 0.5) if m.error() is None]
        return out
    finally:
        c.close()


def _relayed_left(pg_dsn: str, names: OutboxNames) -> int:
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE harvest_seq IS NOT NULL").format(names.outbox)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _wait(pg_dsn: str, names: OutboxNames, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while _relayed_left(pg_dsn, names):
        assert time.monotonic() < deadline, f"{_relayed_left(pg_dsn, names)} row(s) not relayed in {timeout}s"
        time.sleep(0.1)


@pytest.mark.integration
@pytest.mark.parametrize("sequenced", [False, True], ids=["at-least-once", "uuid-sequencing"])
def test_relay_drains_a_debezium_outbox_as_the_router_would(
    sequenced: bool, pg_dsn: str, kafka_bootstrap: str, pg_schema: str, unique_name: Callable[[str], str]
) -> None:
    prefix = unique_name("ev")
    options = {
        "route.topic.replacement": prefix + ".${routedByValue}",
        "table.fields.additional.placement": "type:header:eventType,tenant:header,version:header:v,part:partition",
    }
    mapping = table_mapping("debezium", options)
    table = f"{pg_schema}.outbox_event"
    names = OutboxNames.parse(table, mapping)
    for agg in ("Order", "Customer"):
        create_topic(kafka_bootstrap, f"{prefix}.{agg}", 2)
    before = uuid.uuid4()
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(sql.SQL(_CREATE).format(t=names.outbox, payload=sql.SQL("JSONB")))
        # A row relayed by Debezium before the switch: init-db leaves it to Debezium.
        _insert(conn, names.outbox, [(before, "Order", "o-0", "Old", '{"old": true}', None, None, None)])
    init_db(pg_dsn, table, mapping=mapping)
    with pytest.raises(SchemaError, match="has no column 'nope'"):
        with psycopg.connect(pg_dsn) as conn:
            inspect_outbox(conn, OutboxNames.parse(table, table_mapping("debezium", {"route.by.field": "nope"})))

    rows: list[tuple[Any, ...]] = []
    want: list[tuple[str, str, bytes | None, list[tuple[str, bytes | None]]]] = []
    partition: dict[bytes, int] = {}
    for i in range(60):
        agg = ("Order", "Customer")[i % 2]
        eid = uuid.uuid4()
        payload = json.dumps({"n": i, "agg": agg, "items": [1, 2.5, "x"], "nested": {"b": None}})
        tenant = None if i % 5 == 0 else f"t{i % 3}"
        rows.append((eid, agg, f"{agg[0]}-{i % 4}", f"{agg}Created", payload, tenant, i, (i // 2) % 2))
    poison = (uuid.uuid4(), None, "o-9", "Lost", '{"where": null}', None, None, None)
    with psycopg.connect(pg_dsn) as conn:
        _insert(conn, names.outbox, [*rows[:30], poison, *rows[30:]])
        # jsonb as Postgres prints it: what the router emits with a StringConverter.
        printed = dict(conn.execute(sql.SQL("SELECT id, payload::text FROM {}").format(names.outbox)).fetchall())
    for eid, agg, key, typ, _payload, tenant, version, part in rows:
        partition[printed[eid].encode()] = part
        headers = [
            ("id", str(eid).encode()),
            ("eventType", typ.encode()),
            ("tenant", None if tenant is None else tenant.encode()),
            ("v", str(version).encode()),
        ]
        want.append((f"{prefix}.{agg}", key, printed[eid].encode(), headers))

    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(
        uuid_sequencing=sequenced, table_mapping=mapping
    )
    relay = Harvest(cfg).start()
    try:
        _wait(pg_dsn, names)
    finally:
        relay.stop()
    with psycopg.connect(pg_dsn) as conn:
        dead = list_dead_letters(conn, table)
        left = conn.execute(sql.SQL("SELECT id FROM {}").format(names.outbox)).fetchall()
        source = conn.execute(sql.SQL("SELECT source_row FROM {}").format(names.dead_letters)).fetchall()
    assert [d.error for d in dead] == [
        "bad row: aggregatetype (route.by.field) is NULL or empty: the row has nowhere "
        "to go; fix aggregatetype and requeue"
    ]
    assert source[0][0]["id"] == str(poison[0]) and source[0][0]["type"] == "Lost"
    assert left == [(before,)], "the row written before init-db is Debezium's: harvest leaves it"
    with psycopg.connect(pg_dsn) as conn:  # a requeue restores the row as the writer wrote it
        assert requeue(conn, table, None, mapping) == 1
        back = conn.execute(
            sql.SQL(
                "SELECT id, aggregateid, type, payload, harvest_seq IS NOT NULL, harvest_leader FROM {} WHERE id = %s"
            ).format(names.outbox),
            (poison[0],),
        ).fetchone()
    assert back == (poison[0], "o-9", "Lost", {"where": None}, True, None)

    for agg in ("Order", "Customer"):
        topic = f"{prefix}.{agg}"
        expected = [w for w in want if w[0] == topic]
        if sequenced:
            exp = Expected()
            for _t, key, value, _h in expected:
                assert value is not None
                exp.by_key.setdefault(key, []).append(value)
            result = check_exactly_once(kafka_bootstrap, topic, 2, exp)
            assert result.committed == len(expected)
            headers = _headers_by_value(kafka_bootstrap, topic)
            for _t, _key, value, hs in expected:
                assert [h for h in headers[value] if h[0] != "uuid"] == hs
            # A plain consumer (docs/debezium.md, "ACK records"): the topic also holds the protocol's ACK
            # records, empty key and value and one `uuid` header; the documented filter drops exactly those.
            is_ack = _documented_ack_filter()
            records = _read_messages(kafka_bootstrap, topic)
            acks = [m for m in records if is_ack(m)]
            assert acks and {(m.key(), m.value(), len(m.headers())) for m in acks} == {(b"", b"", 1)}
            events = [m for m in records if not is_ack(m)]
            assert all(any(k == "id" for k, _v in m.headers()) for m in events), "every other record is an event"
            assert {m.value() for m in events} == {v for _t, _k, v, _h in expected}
        else:
            got_plain = consume_all(kafka_bootstrap, topic, lambda g, n=len(expected): len(g) >= n)  # noqa: B008 - binds this topic's count
            by_value = {g.value: g for g in got_plain}
            assert len(got_plain) == len(expected)
            for _t, key, value, hs in expected:
                g = by_value[value]
                assert g.key == key
                assert g.headers == hs
                assert g.partition == partition[value], "part:partition places the record"


@pytest.mark.integration
@pytest.mark.parametrize(
    ("layout", "sequenced"),
    [("mark", False), ("mark", True), ("cursor", False), ("cursor", True)],
    ids=["mark-at-least-once", "mark-sequenced", "cursor-at-least-once", "cursor-sequenced"],
)
def test_a_partition_column_no_partition_of_the_topic_is_a_dead_letter_at_once(
    layout: str,
    sequenced: bool,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    unique_name: Callable[[str], str],
) -> None:
    """``part:partition`` (issue #44, defect 5): a negative value is never the partitioner's choice (-1 is
    librdkafka's "unassigned"; Debezium's producer refuses any negative) and a value at or above the topic's
    partition count never becomes deliverable: both are dead letters at once (0 attempts), naming the value
    (and the count), while the row's neighbours go to their partitions."""
    from harvest_outbox.producer.layouts.cursor.database import cursor_backlog

    prefix = unique_name("pp")
    topic = f"{prefix}.Order"
    create_topic(kafka_bootstrap, topic, 2)
    route = {"route.topic.replacement": prefix + ".${routedByValue}"}
    mapping = table_mapping("debezium", {**route, "table.fields.additional.placement": "part:partition"})
    table = f"{pg_schema}.outbox_event"
    names = OutboxNames.parse(table, mapping)
    with psycopg.connect(pg_dsn) as conn:
        if layout == "mark":
            conn.execute(sql.SQL(_CREATE).format(t=names.outbox, payload=sql.SQL("JSONB")))
    # the cursor layout's table is init-db's, with Debezium's columns only: `part` is added after
    init_db(pg_dsn, table, mapping=mapping if layout == "mark" else table_mapping("debezium", route), layout=layout)
    parts = {"p0": 0, "p1": 1, "pnull": None, "minus1": -1, "minus7": -7, "p2": 2, "p9": 9}
    with psycopg.connect(pg_dsn) as conn:
        if layout == "cursor":  # Debezium's columns from init-db, and the partition column the router reads
            conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN part INTEGER").format(names.outbox))
        conn.cursor().executemany(
            sql.SQL(
                "INSERT INTO {} (id, aggregatetype, aggregateid, type, payload, part) VALUES (%s, %s, %s, %s, %s, %s)"
            ).format(names.outbox),
            [
                (uuid.uuid4(), "Order", f"k-{name}", "Made", json.dumps({"n": name}), part)
                for name, part in parts.items()
            ],
        )
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(
        uuid_sequencing=sequenced,
        table_mapping=mapping,
        outbox_layout=layout,
        leader_election="postgres",
        leader_lock_check_interval=0.2,
    )
    relay = Harvest(cfg).start()
    try:
        deadline = time.monotonic() + 60
        while True:
            with psycopg.connect(pg_dsn) as conn:
                left = cursor_backlog(conn, names) if layout == "cursor" else _relayed_left(pg_dsn, names)
                dead = list_dead_letters(conn, table)
            if not left and len(dead) == 4:
                break
            assert time.monotonic() < deadline, f"{left} row(s) left, dead letters {dead}"
            time.sleep(0.1)
    finally:
        relay.stop()
    records = consume_all(kafka_bootstrap, topic, lambda g: len([r for r in g if r.value]) >= 3, timeout=30)
    got = {g.key: g.partition for g in records if g.value}  # (sequenced: past the ACK records, empty)
    assert got == {"k-p0": 0, "k-p1": 1, "k-pnull": got.get("k-pnull")} and got["k-pnull"] in (0, 1), got
    by_key = {d.kafka_key: d for d in dead}
    assert set(by_key) == {"k-minus1", "k-minus7", "k-p2", "k-p9"}, dead
    assert all(d.attempts == 0 for d in dead), [(d.kafka_key, d.attempts) for d in dead]
    for name in ("minus1", "minus7"):
        assert by_key[f"k-{name}"].error == (
            f"bad row: part (table.fields.additional.placement part:partition) is {parts[name]}: a negative "
            "partition, which Debezium's producer refuses (-1 is not 'any partition' here); set part to a "
            "partition of the topic (0 or more) or NULL (the partitioner, by key), and requeue"
        )
    for name in ("p2", "p9"):
        assert by_key[f"k-{name}"].error == (
            f"cannot be sent: part (table.fields.additional.placement part:partition) is {parts[name]}, but topic "
            f"{topic!r} has 2 partition(s) (0-1); set part below 2 or NULL (the partitioner, by key), or add "
            "partitions to the topic, and requeue"
        )


@pytest.mark.integration
def test_sharded_relays_split_a_debezium_outbox_by_aggregateid(
    pg_dsn: str, kafka_bootstrap: str, pg_schema: str, unique_name: Callable[[str], str]
) -> None:
    prefix = unique_name("ev")
    mapping = table_mapping("debezium", {"route.topic.replacement": prefix + ".${routedByValue}"})
    table = f"{pg_schema}.outbox_event"
    names = OutboxNames.parse(table, mapping)
    create_topic(kafka_bootstrap, f"{prefix}.Order", 2)
    init_db(pg_dsn, table, shards=2, mapping=mapping)  # creates the table in Debezium's convention
    with psycopg.connect(pg_dsn) as conn:
        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL(
                    "INSERT INTO {} (id, aggregatetype, aggregateid, type, payload) "
                    "VALUES (%s, 'Order', %s, 'Created', %s)"
                ).format(names.outbox),
                [(uuid.uuid4(), f"k{i % 9}", json.dumps({"i": i})) for i in range(200)],
            )
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(
        table_mapping=mapping, shards=2, leader_election="postgres", leader_lock_check_interval=0.2
    )
    from harvest_outbox.producer.relay.sharded import ShardedHarvest

    relays = [ShardedHarvest(cfg.replace(name=f"r{i}")).start() for i in range(2)]
    try:
        _wait(pg_dsn, names)
    finally:
        for r in relays:
            r.stop()
    got = consume_all(kafka_bootstrap, f"{prefix}.Order", lambda g: len(g) >= 200)
    assert len(got) == 200
    per_key: dict[str, list[int]] = {}
    for g in sorted(got, key=lambda g: (g.partition, g.offset)):
        assert g.value is not None
        per_key.setdefault(g.key, []).append(json.loads(g.value)["i"])
    assert all(v == sorted(v) for v in per_key.values()), "per-key order"


# ---------------------------------------------------------------------------------------- event ids


@pytest.mark.parametrize(
    "value, says",
    [
        ("uuid", "a header harvest or its readers use"),
        ("a\nb", "printable"),
        ("x" * 65, "1-64 printable"),
        (7, "must be a header name"),
    ],
)
def test_event_id_header_names_are_checked(value: Any, says: str) -> None:
    with pytest.raises(ConfigError, match="eventIdHeader") as err:
        HarvestConfig(event_id_header=value)
    assert says in str(err.value)


def test_a_debezium_table_has_the_routers_id_header_already() -> None:
    with pytest.raises(ConfigError, match="carry the event router's 'id' header"):
        from_mapping({"harvest": {"tableMapping": "debezium", "eventIdHeader": "harvest.event.id"}})


@pytest.mark.integration
@pytest.mark.parametrize("sequenced", [False, True], ids=["at-least-once", "uuid-sequencing"])
def test_a_goharvest_record_carries_its_event_id_on_every_send(
    sequenced: bool,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    """``eventIdHeader``: ``<outbox>/<row id>`` on every record, first (after ``uuid`` when sequenced),
    the row's own headers after it; re-sends (injected delivery failures, at-least-once) carry the same
    id, so deduping by it leaves each row once."""
    from harvest_outbox.producer.kafka import FaultInjector
    from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

    topic = topic_factory(partitions=2)
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    with psycopg.connect(pg_dsn) as conn:
        Stasher(table).stash_many(
            conn, [OutboxRecord(topic, f"k{i % 9}", f"v{i}", [("i", str(i))] if i % 2 else []) for i in range(600)]
        )
        ids = {
            v.encode(): i
            for i, v in conn.execute(
                sql.SQL("SELECT id, kafka_value FROM {}").format(sql.Identifier(pg_schema, "outbox"))
            ).fetchall()
        }
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g"), max_delivery_attempts=1000).replace(
        uuid_sequencing=sequenced, event_id_header="harvest.event.id"
    )
    faults = None if sequenced else FaultInjector(delivery_failure_rate=0.03, seed=3)
    relay = Harvest(cfg, producer_factory=faults).start() if faults else Harvest(cfg).start()
    try:
        deadline = time.monotonic() + 60
        while True:
            with psycopg.connect(pg_dsn) as conn:
                left = conn.execute(
                    sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(pg_schema, "outbox"))
                ).fetchone()
            if left == (0,):
                break
            assert time.monotonic() < deadline, "not drained"
            time.sleep(0.1)
    finally:
        relay.stop()
    headers = _all_records(kafka_bootstrap, topic)
    assert {v for v, _h in headers} == set(ids)
    seen: dict[bytes, set[bytes | None]] = {}
    for value, hs in headers:
        own = [h for h in hs if h[0] != "uuid"]
        assert own[0] == ("harvest.event.id", f"{table}/{ids[value]}".encode())
        i = int(value[1:])
        assert own[1:] == ([("i", str(i).encode())] if i % 2 else [])
        seen.setdefault(value, set()).add(own[0][1])
    assert all(len(v) == 1 for v in seen.values()), "a re-send carried another event id"
    if faults is not None:
        assert faults.counters["delivery"] > 0
        assert len(headers) > len(ids), "the injected failures re-sent rows"


def _all_records(bootstrap: str, topic: str) -> list[tuple[bytes, list[tuple[str, bytes | None]]]]:
    """(value, headers) of every record but ACKs (whose value is empty)."""
    return [(r.value, r.headers) for r in read_to_end(bootstrap, [topic]) if r.value]


@pytest.mark.integration
@pytest.mark.parametrize("value_type", ["varchar", "bytea"])
def test_a_dead_letter_as_a_connections_first_statement_keeps_the_value(
    value_type: str, pg_dsn: str, pg_schema: str
) -> None:
    """The dead-letter statements read the value column as its type, which the connection learns
    when it opens: a dead letter that is a fresh connection's first statement (the relay's write
    connection's can be) must already use it."""
    from harvest_outbox.producer.layouts.mark.database import MarkDatabase

    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, value_type)  # type: ignore[arg-type]
    value: Any = b"\x00\xffraw" if value_type == "bytea" else "text"
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(
            sql.SQL(
                "INSERT INTO {} (kafka_topic, kafka_key, kafka_value, kafka_header_keys, "
                "kafka_header_values) VALUES ('t', 'k', %s, '{{}}', '{{}}') RETURNING id"
            ).format(names.outbox),
            (value,),
        ).fetchone()
    assert row is not None
    db = MarkDatabase(pg_dsn, names)
    try:
        assert db.dead_letter([(row[0], "boom", 1)]) == 1
    finally:
        db.close()
    with psycopg.connect(pg_dsn) as conn:
        kept = conn.execute(sql.SQL("SELECT kafka_value FROM {}").format(names.dead_letters)).fetchone()
    assert kept == (value,)
