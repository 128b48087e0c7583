"""The Protobuf encoder's fast converter (producer/encode/_protobuf_encoder.py's ``fast_builder``) against
``json_format.ParseDict`` and confluent-kafka's ``ProtobufSerializer`` on a real Apicurio Registry: for
generated JSON values over a message with every kind of field, the fast converter builds a message
only when ParseDict accepts the value, and then the same message (the same bytes); it takes the plain
rows the relay sees; the relay's encoder writes every row with the serializer's bytes."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harvest_outbox.harvest_local.registry import EmbeddedRegistry
from harvest_outbox.producer.config.serialization import SerializationConfig
from harvest_outbox.producer.encode._protobuf_encoder import fast_builder
from harvest_outbox.producer.encode.serialization import RowEncoder
from harvest_outbox.protobuf_schema import message_class, parse_json

PROTO = """syntax = "proto3";
package shop;
enum Status { NEW = 0; PAID = 1; }
message Line { string sku = 1; int32 qty = 2; }
message Order {
  int32 i32 = 1;
  int64 order_id = 2;
  uint32 u32 = 3;
  uint64 u64 = 4;
  sint32 s32 = 5;
  fixed64 f64 = 6;
  double amount = 7;
  float ratio = 8;
  bool ok = 9;
  string note = 10;
  bytes raw = 11;
  Status status = 12;
  optional int32 maybe = 13;
  repeated int32 counts = 14;
  Line line = 15;
  oneof pick { string a = 16; int32 b = 17; }
  map<string, int32> attrs = 18;
}
"""
ORDER = message_class(PROTO, "shop.Order")
FIELDS = [f.name for f in ORDER.DESCRIPTOR.fields] + ["orderId", "nope"]
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, 1, -1, 2**31, -(2**31) - 1, 2**32, 2**63, -(2**63), 2**64, 10**400 // 10**390]),
    st.integers(-(2**65), 2**65),
    st.sampled_from([0.0, -0.0, 0.5, 1.0, 1e39, -1e39, 3.4e38, float("nan"), float("inf"), 1e300]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "x", "NEW", "PAID", "OTHER", "1", "2.0", " 3", "NaN", "Infinity", "\ud800", "é😀", "AQID"]),
    st.lists(st.integers(-3, 3) | st.sampled_from(["1", None]), max_size=3),
    st.fixed_dictionaries({"sku": st.text(max_size=3)}),
)

ints = st.integers(0, 2**31 - 1) | st.integers(-(2**64), 2**64)
floats = st.floats(-1e6, 1e6) | st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**60), 2**60)
#: values of the field's own kind (mostly in range), so that most generated rows take the fast path
TYPED: dict[str, st.SearchStrategy[Any]] = {
    "i32": ints,
    "order_id": ints,
    "orderId": ints,
    "u32": ints,
    "u64": ints,
    "s32": ints,
    "f64": ints,
    "amount": floats,
    "ratio": floats,
    "ok": st.booleans(),
    "note": st.text(max_size=4),
    "status": st.sampled_from(["NEW", "PAID", "OTHER"]),
    "maybe": st.integers(-3, 3),
}


def _row(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({k: TYPED[k] | TYPED[k] | TYPED[k] | VALUES if k in TYPED else VALUES for k in keys})


@settings(max_examples=300, deadline=None)
@given(
    st.tuples(st.lists(st.sampled_from(list(TYPED)), max_size=5), st.lists(st.sampled_from(FIELDS), max_size=1))
    .map(lambda keys: sorted(set(keys[0] + keys[1])))
    .flatmap(_row)
    | st.lists(st.integers(), max_size=2)
)
def test_the_fast_converter_builds_what_parsedict_builds_and_only_what_it_accepts(value: Any) -> None:
    build = fast_builder(ORDER)
    try:
        fast = build(value)
    except Exception:
        fast = None
    try:
        slow = parse_json(ORDER, value)
    except Exception:
        slow = None
    if fast is not None:
        assert slow is not None, value  # a fast "yes" is ParseDict's "yes"
        assert fast.SerializeToString() == slow.SerializeToString(), value
        assert fast == slow


def test_the_fast_converter_takes_the_plain_rows_the_relay_sees() -> None:
    build = fast_builder(ORDER)
    row = {"i32": -5, "orderId": 2**40, "u64": 2**64 - 1, "amount": 7, "ratio": 0.5, "ok": True, "note": "é😀"}
    row |= {"status": "PAID", "maybe": 0, "s32": -3, "f64": 9}
    assert build(row).SerializeToString() == parse_json(ORDER, row).SerializeToString()
    assert build(row).HasField("maybe")  # an explicit-presence zero is kept, as ParseDict keeps it


@pytest.mark.integration
def test_relay_encoder_writes_the_serializers_bytes(schema_registry: EmbeddedRegistry) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from harvest_outbox.protobuf_schema import SerializedProtobufClient

    topic = f"pfast-{uuid.uuid4().hex[:8]}"
    schema_registry.register(f"{topic}-value", PROTO, "PROTOBUF")
    encoder = RowEncoder(
        SerializationConfig.from_mapping(
            {
                "registry": {"url": schema_registry.url},
                "topics": [{"topic": topic, "serializer": "protobuf", "recordName": "shop.Order"}],
            }
        )
    )
    values: list[dict[str, Any]] = [
        {"orderId": n, "amount": n * 0.25, "note": f"n{n}", "status": ("NEW", "PAID")[n % 2], "ok": n % 3 == 0}
        for n in range(60)
    ]
    values[7] = {"orderId": "7", "line": {"sku": "a", "qty": 2}, "counts": [1, 2], "attrs": {"x": 1}}  # ParseDict's
    values[8] = {"orderId": 2**63}  # out of range: refused by ParseDict, naming the field
    rows = [
        (n, topic, b"k", json.dumps(v).encode(), None, None, None, None, None, None, 0.0) for n, v in enumerate(values)
    ]
    out = encoder.encode(rows)  # type: ignore[arg-type]
    client = SerializedProtobufClient(SchemaRegistryClient({"url": schema_registry.url}))
    serializer = ProtobufSerializer(ORDER, client, {"auto.register.schemas": False, "use.latest.version": True})
    ctx = SerializationContext(topic, MessageField.VALUE)
    for n, (value, got) in enumerate(zip(values, out, strict=True)):
        if n == 8:
            assert got[6] is not None and "orderId" in got[6] and got[3] == rows[8][3], got
        else:
            assert got[6] is None and got[3] == serializer(parse_json(ORDER, value), ctx), value
    encoder.close()
