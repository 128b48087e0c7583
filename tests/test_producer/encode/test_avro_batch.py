"""The relay's direct Avro writer (producer/encode/_avro_batch.py) against confluent-kafka's own serde on a real
Apicurio Registry: byte for byte ``AvroSerializer``'s output for records with unions, nullables,
nested records, enums, arrays, maps, fixed and logical types, read back by ``AvroDeserializer``; a
value that does not fit is refused naming the field, never coerced; the relay's encoder
(producer/encode/serialization.py) resolves the schema once per batch, writes directly once the serializer's
bytes matched, and still dead-letters poison; ``loads`` parses exactly as ``json.loads`` does."""

from __future__ import annotations

import datetime
import decimal
import json
import math
import uuid
from typing import Any

import pytest

from harvest_outbox.harvest_local.registry import EmbeddedRegistry
from harvest_outbox.producer.config.serialization import SerializationConfig
from harvest_outbox.producer.encode._avro_batch import AvroWriter, loads
from harvest_outbox.producer.encode.serialization import RowEncoder

ADDRESS = {
    "type": "record",
    "name": "Address",
    "fields": [{"name": "city", "type": "string"}, {"name": "zip", "type": ["null", "string"], "default": None}],
}
SCHEMA = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "count", "type": "int"},
        {"name": "ok", "type": "boolean"},
        {"name": "ratio", "type": "float"},
        {"name": "amount", "type": "double"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "either", "type": ["string", "long", "double"]},
        {"name": "ship_to", "type": ADDRESS},
        {"name": "bill_to", "type": ["null", "Address"], "default": None},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": ["null", "long"]}},
        {"name": "raw", "type": "bytes"},
        {"name": "digest", "type": {"type": "fixed", "name": "Digest", "size": 4}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "time_ms", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
    ],
}
UTC = datetime.timezone.utc


def record(n: int, **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": n * 1_000_000_007,
        "count": -n,
        "ok": n % 2 == 0,
        "ratio": 0.5,
        "amount": n * 0.25,
        "note": None if n % 3 else f"note {n} é",
        "either": ("s", n, n + 0.5)[n % 3],
        "ship_to": {"city": "Bern", "zip": None},
        "bill_to": None if n % 2 else {"city": "Köln", "zip": "50667"},
        "status": ("NEW", "PAID", "SHIPPED")[n % 3],
        "tags": [f"t{i}" for i in range(n % 4)],
        "attrs": {"a": n, "b": None},
        "raw": bytes(range(n % 7)),
        "digest": b"\x00\x01\x02\x03",
        "day": datetime.date(2026, 11, 25) + datetime.timedelta(days=n),
        "at_ms": datetime.datetime(2026, 11, 25, 23, 30, n % 60, 123000, tzinfo=UTC),
        "at_us": datetime.datetime(2026, 11, 25, 23, 30, n % 60, 123456, tzinfo=UTC),
        "time_ms": datetime.time(12, 34, n % 60, 500000),
        "price": decimal.Decimal(f"{n}.25"),
        "ref": uuid.UUID(int=n),
    }
    base.update(over)
    return base


RECORDS = [record(n) for n in range(12)] + [
    record(99, at_ms=1_764_113_400_123, day=20417, price=decimal.Decimal("-0.01"), ref=str(uuid.UUID(int=7))),
    record(100, either=-(2**63), id=2**63 - 1, tags=[], attrs={}, raw=b""),
]


def _serde(registry: EmbeddedRegistry, subject: str) -> tuple[Any, Any, Any, int]:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    schema_id = registry.register(subject, json.dumps(SCHEMA))
    client = SchemaRegistryClient({"url": registry.url})
    conf = {"auto.register.schemas": False, "use.latest.version": True, "subject.name.strategy": lambda *_: subject}
    ctx = SerializationContext(subject.removesuffix("-value"), MessageField.VALUE)
    return (
        lambda v: AvroSerializer(client, None, None, conf)(v, ctx),
        lambda b: AvroDeserializer(client)(b, ctx),
        client,
        schema_id,
    )


def _logical(value: Any) -> Any:
    """What AvroDeserializer gives back for a written logical value (dates, times, decimals, uuids)."""
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            return value
    return value


@pytest.mark.integration
def test_direct_bytes_equal_the_serializers_and_its_deserializer_reads_them(schema_registry: EmbeddedRegistry) -> None:
    serialize, deserialize, client, schema_id = _serde(schema_registry, f"abatch-{uuid.uuid4().hex[:8]}-value")
    writer = AvroWriter(schema_id, client.get_schema(schema_id).schema_str)
    assert writer.prefix == b"\x00" + schema_id.to_bytes(4, "big")
    for rec in RECORDS:
        direct = writer.encode(rec)
        assert direct == serialize(rec), rec
        back = deserialize(direct)
        assert back["id"] == rec["id"] and back["status"] == rec["status"] and back["bill_to"] == rec["bill_to"]
        assert back["price"] == rec["price"] and back["tags"] == rec["tags"] and back["attrs"] == rec["attrs"]
        assert back["day"] == (
            rec["day"]
            if isinstance(rec["day"], datetime.date)
            else datetime.date(1970, 1, 1) + datetime.timedelta(rec["day"])
        )
        assert back["at_us"] == rec["at_us"] and back["ref"] == _logical(rec["ref"])
        if isinstance(rec["either"], float):
            assert math.isclose(back["either"], rec["either"])
        else:
            assert back["either"] == rec["either"]


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"id": 1.5}, "id"),  # fastavro's writer alone writes 1 and publishes a changed value
        ({"count": 2**31}, "count"),
        ({"status": "LOST"}, "status"),
        ({"ship_to": {"zip": "3000"}}, "city"),
        ({"either": None}, "either"),
        ({"digest": b"\x00"}, "digest"),
    ],
    ids=["float-in-long", "int-overflow", "enum-symbol", "nested-missing", "union-branch", "fixed-size"],
)
def test_a_value_that_does_not_fit_is_refused_naming_the_field(over: dict[str, Any], field: str) -> None:
    from fastavro.validation import ValidationError

    writer = AvroWriter(1, json.dumps(SCHEMA))
    with pytest.raises(ValidationError) as info:
        writer.encode(record(1, **over))
    assert field in str(info.value.errors), info.value.errors


def _row(n: int, topic: str, value: bytes | None) -> tuple[Any, ...]:
    return (n, topic, f"k{n}".encode(), value, None, None, None, None, None, None, 0.0)


@pytest.mark.integration
@pytest.mark.parametrize("worker", [False, True], ids=["in-process", "encode-worker"])
def test_relay_encoder_resolves_once_per_batch_writes_directly_and_parks_poison(
    schema_registry: EmbeddedRegistry, worker: bool
) -> None:
    schema = {
        "type": "record",
        "name": "P",
        "fields": [{"name": "id", "type": "long"}, {"name": "n", "type": "string"}],
    }
    topic = f"abatch-{uuid.uuid4().hex[:8]}"
    schema_id = schema_registry.register(f"{topic}-value", json.dumps(schema))
    encoder = RowEncoder(
        SerializationConfig.from_mapping(
            {
                "registry": {"url": schema_registry.url},
                "topics": [{"topic": topic, "serializer": "avro"}],
                "encodeWorker": worker,
            }
        )
    )
    calls = {"latest": 0}
    latest = encoder.client.get_latest_version

    def counted(subject: str, *a: Any, **kw: Any) -> Any:
        calls["latest"] += 1
        return latest(subject, *a, **kw)

    encoder.client.get_latest_version = counted
    rows = [_row(n, topic, json.dumps({"id": n, "n": f"v{n}"}).encode()) for n in range(300)]
    rows[5] = _row(5, topic, b'{"id": 1.5, "n": "x"}')
    rows[6] = _row(6, topic, b"{not json")
    rows[7] = _row(7, topic, None)  # a tombstone stays one
    rows[8] = _row(8, "other", b'{"id": "kept"}')  # no serializer: as stored
    out = encoder.encode(rows)
    writer = encoder._topics[topic]._writers[schema_id]  # type: ignore[union-attr]
    assert writer.checked is True  # the serializer's first bytes matched: the rest were written directly
    # one lookup for this batch's writer schema, one by the serializer for the row that was compared
    assert calls["latest"] == 2, calls
    assert "id" in (out[5][6] or "") and "does not match its schema" in (out[5][6] or ""), out[5][6]
    assert (out[6][6] or "").startswith("value is not JSON"), out[6][6]
    assert out[7] == rows[7] and out[8] == rows[8]
    good = [r for i, r in enumerate(out) if i not in (5, 6, 7, 8)]
    assert all(r[6] is None and r[3] == writer.encode(json.loads(rows[r[0]][3])) for r in good)
    assert encoder.encoded == len(good) and encoder.refused == 2
    assert out == encoder.encode(rows)  # the next batch: the same answer
    assert calls["latest"] == 3  # resolved once again (the client's TTL cache decides)
    encoder.close()


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": 1, "b": [1.5, -2e3, true, null], "c": "\\u00e9\\ud83d\\ude00"}',
        b'{"a": NaN, "b": Infinity}',
        b'{"big": 123456789012345678901234567890}',
        b'{"below": -9223372036854775809, "above": 18446744073709551616, "u64": 18446744073709551615}',
        b'{"digits": "1234567890123456789012", "x": 1e400}',
        b'{"lone": "\\ud800"}',
        b'{"dup": 1, "dup": 2}',
        b"\xef\xbb\xbf" + b'{"bom": 1}',
        '{"utf16": 1}'.encode("utf-16"),
        b'  {"ws": 1}  \n',
        b"[1, 2]",
        b'"just a string"',
        b'{"nested": {"big": 99999999999999999999}, "f": 1.5}',
        b"[1, 18446744073709551616, 2.5]",
        b'{"float": 1e19, "neg": -9.3e18, "small": 9.2e18}',
        b"-9223372036854775809",
    ],
    ids=[
        "plain",
        "nan",
        "big-int",
        "beyond-64-bit",
        "digit-string",
        "lone-surrogate",
        "duplicate-key",
        "bom",
        "utf-16",
        "whitespace",
        "array",
        "string",
        "nested-big-int",
        "array-big-int",
        "big-float-literals",
        "scalar-big-int",
    ],
)
def test_loads_parses_what_json_loads_parses(raw: bytes) -> None:
    expected = json.loads(raw)
    got = loads(raw)
    assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)


@pytest.mark.parametrize(
    "raw", [b"{not json", b'{"a": 1} trailing', b"", b"\xff\xfe\xfa"], ids=["bad", "trail", "empty", "bytes"]
)
def test_loads_refuses_what_json_loads_refuses_with_its_message(raw: bytes) -> None:
    with pytest.raises(ValueError) as stdlib:
        json.loads(raw)
    with pytest.raises(ValueError) as ours:
        loads(raw)
    assert str(ours.value) == str(stdlib.value)
