"""The relay's direct JSON Schema writer (producer/encode/_json_schema_writer.py) against jsonschema and
confluent-kafka's ``JSONSerializer`` on a real Apicurio Registry: the compiled validator's verdict is
jsonschema's (generated schemas and values, and the cases where validators are known to differ); the
relay's encoder writes a schema id's rows with the serializer's bytes once its first row matched, for
schemas the compiled validator takes and for those it leaves to jsonschema; a refused row's reason is
the serializer's, naming the field and the rule."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema.validators import validator_for
from referencing import Registry

from harvest_outbox.harvest_local.registry import EmbeddedRegistry
from harvest_outbox.producer.config.serialization import SerializationConfig
from harvest_outbox.producer.encode._json_schema_writer import JsonSchemaWriter, fast_validator
from harvest_outbox.producer.encode.serialization import RowEncoder
from harvest_outbox.producer.schema.reasons import validation_reason

KEYS = ["a", "b", "c"]
PATTERNS = ["^a", "b$", "^[ab]*$", "a|c", "^$"]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.sampled_from([0, 1, -1, 2, 1.0, 0.5, -0.0, 2.5, 10**20, 1e300])
    | st.integers(-3, 3)
    | st.sampled_from(["", "a", "b", "ab", "ba\n", "a\n", "é", "c", "aa"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=3),
    max_leaves=6,
)
numbers = st.sampled_from([0, 1, -1, 2, 0.5, 1.0, 2.5])
counts = st.integers(0, 3)
types = st.sampled_from(["null", "boolean", "object", "array", "number", "integer", "string"])
scalars = st.none() | st.booleans() | numbers | st.sampled_from(["", "a", "b"])


def _schemas(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keyword = st.one_of(
        st.tuples(st.just("type"), types | st.lists(types, min_size=1, max_size=3, unique=True)),
        st.tuples(st.just("properties"), st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)),
        st.tuples(st.just("required"), st.lists(st.sampled_from(KEYS), max_size=3, unique=True)),
        st.tuples(st.just("additionalProperties"), inner),
        st.tuples(st.just("items"), inner),
        st.tuples(st.just("enum"), st.lists(scalars, min_size=1, max_size=3)),
        st.tuples(st.just("const"), scalars),
        *(st.tuples(st.just(k), numbers) for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")),
        *(
            st.tuples(st.just(k), counts)
            for k in ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
        ),
        st.tuples(st.just("pattern"), st.sampled_from(PATTERNS)),
        *(st.tuples(st.just(k), st.lists(inner, min_size=1, max_size=3)) for k in ("allOf", "anyOf", "oneOf")),
        st.tuples(st.just("not"), inner),
        st.tuples(st.just("format"), st.sampled_from(["email", "date-time", "ipv4", "uuid"])),
        st.tuples(st.just("default"), json_values),
    )
    return st.lists(keyword, max_size=5).map(dict) | st.booleans()


schemas = st.recursive(st.lists(st.tuples(st.just("type"), types), max_size=1).map(dict), _schemas, max_leaves=5)


def _near(schema: Any) -> list[Any]:
    """The schema's own numbers and strings, and values just beside them: where verdicts turn."""
    out: list[Any] = []
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key in ("default", "format"):
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out += [value, value + 1, value - 1, value + 0.5, float(value), "x" * max(0, min(int(value), 4))]
                out += [[0] * max(0, min(int(value), 4)), dict.fromkeys(KEYS[: max(0, min(int(value), 3))], 0)]
            elif isinstance(value, str):
                out += [value, value + "a", value + "\n"]
            elif isinstance(value, (list, dict)):
                for item in value.values() if isinstance(value, dict) else value:
                    out += _near(item) if isinstance(item, dict) else [item]
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    schemas.filter(lambda s: isinstance(s, dict)),
    st.sampled_from([None, "http://json-schema.org/draft-07/schema#", "https://json-schema.org/draft/2020-12/schema"]),
    st.data(),
)
def test_the_compiled_validators_verdict_is_jsonschemas(
    schema: dict[str, Any], draft: str | None, data: st.DataObject
) -> None:
    near = _near(schema)
    parts = json_values if not near else json_values | st.sampled_from(near)
    nested = st.dictionaries(st.sampled_from(KEYS), parts, max_size=3) | st.lists(parts, max_size=3)
    values = data.draw(st.lists(parts | nested, min_size=1, max_size=8))
    if draft is not None:
        schema = {"$schema": draft, **schema}
    cls = validator_for(schema)
    cls.check_schema(schema)
    fast = fast_validator(schema)
    assert fast is not None, schema  # every generated keyword is one the compiled validator takes
    reference = cls(schema)
    for value in values:
        before = json.dumps(value)
        assert fast(value) is reference.is_valid(value), (schema, value)
        assert json.dumps(value) == before  # nothing filled in (a default is an annotation)


@pytest.mark.parametrize(
    ("schema", "value", "valid", "fast"),
    [
        ({"type": "string", "format": "email"}, "not an email", True, True),  # format: an annotation
        ({"type": "object", "properties": {"a": {"default": 1}}}, {}, True, True),  # no default filled in
        ({"type": "string", "pattern": "a$"}, "a\n", True, True),  # re.search's "$", as jsonschema's
        ({"enum": [1]}, True, False, True),  # a bool is no number in either
        ({"type": "integer"}, 1.0, True, True),  # drafts 6 and later: 1.0 is an integer
        ({"const": [1]}, [True], False, False),  # container constants: jsonschema's deep equality
        ({"type": "array", "uniqueItems": True}, [1, True], True, False),  # outside the compiled keywords
        ({"$defs": {"n": {"type": "number"}}, "$ref": "#/$defs/n"}, "x", False, False),
        (
            {"$schema": "http://json-schema.org/draft-04/schema#", "minimum": 1, "exclusiveMinimum": True},
            1,
            False,
            False,
        ),
        ({"required": ["a"], "additionalProperties": {}}, {"a": 1}, True, True),  # fastjsonschema refuses it
        ({"enum": [True, "a"]}, 1, False, True),
        ({"properties": {"a": {}}, "additionalProperties": False}, {"b": 1}, False, True),
        ({"minLength": 2, "maxLength": 2}, "éé", True, True),  # characters, not bytes
        ({"oneOf": [{"type": "number"}, {"type": "integer"}]}, 1, False, True),
        ({"type": "number", "maximum": 1, "exclusiveMinimum": 0}, 0, False, True),
        ({"minimum": 1, "maximum": 1}, 1.0, True, True),
    ],
    ids=[
        "format-ignored",
        "default-not-filled",
        "dollar-newline",
        "enum-bool",
        "integer-float",
        "const-container",
        "unique-items",
        "ref",
        "draft-04",
        "required-any-additional",
        "enum-true-vs-1",
        "no-additional",
        "length-in-characters",
        "one-of-two",
        "exclusive-minimum",
        "inclusive-bounds",
    ],
)
def test_where_validators_differ_the_verdict_is_jsonschemas(
    schema: dict[str, Any], value: Any, valid: bool, fast: bool
) -> None:
    writer = JsonSchemaWriter(7, json.dumps(schema), Registry())
    assert writer.fast is fast
    compiled = fast_validator(schema)
    assert compiled is None or compiled(value) is valid
    assert validator_for(schema)(schema).is_valid(value) is valid
    got = writer.encode(value)
    assert (got is not None) is valid
    if got is not None:
        assert got == b"\x00\x00\x00\x00\x07" + json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


PAYMENT = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Payment",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "amount": {"type": "number", "minimum": 0},
        "currency": {"type": "string", "enum": ["EUR", "CHF"]},
        "note": {"type": ["string", "null"], "maxLength": 40, "format": "email"},
        "lines": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string"}}}},
    },
    "required": ["id", "amount", "currency"],
    "additionalProperties": False,
}
#: outside the compiled keywords ($ref, uniqueItems): jsonschema's validator, built once, checks its rows
TAGGED = {
    "type": "object",
    "$defs": {"tag": {"type": "string", "minLength": 1}},
    "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}}},
    "required": ["id"],
}


def _row(n: int, topic: str, value: bytes | None) -> tuple[Any, ...]:
    return (n, topic, f"k{n}".encode(), value, None, None, None, None, None, None, 0.0)


def _payment(n: int) -> dict[str, Any]:
    return {
        "id": n * 1_000_000_007,
        "amount": n * 0.25 if n % 3 else n,
        "currency": ("EUR", "CHF")[n % 2],
        "note": None if n % 4 else f"Grüße {n} 😀",
        "lines": [{"sku": f"s{i}"} for i in range(n % 3)],
    }


@pytest.mark.integration
def test_relay_encoder_writes_json_schema_rows_as_the_serializer_and_refuses_with_its_reasons(
    schema_registry: EmbeddedRegistry,
) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    run = uuid.uuid4().hex[:8]
    payments, tagged = f"jpay-{run}", f"jtag-{run}"
    pay_id = schema_registry.register(f"{payments}-value", json.dumps(PAYMENT), "JSON")
    tag_id = schema_registry.register(f"{tagged}-value", json.dumps(TAGGED), "JSON")
    encoder = RowEncoder(
        SerializationConfig.from_mapping(
            {
                "registry": {"url": schema_registry.url},
                "topics": [
                    {"topic": payments, "serializer": "jsonSchema"},
                    {"topic": tagged, "serializer": "jsonSchema"},
                ],
            }
        )
    )
    rows = [_row(n, payments, json.dumps(_payment(n)).encode()) for n in range(200)]
    rows += [_row(n, tagged, json.dumps({"id": n, "tags": ["x", "y"][: n % 3]}).encode()) for n in range(200, 300)]
    poison = {
        5: b'{"id": 5, "amount": -1, "currency": "EUR"}',
        6: b"{not json",
        9: b'{"id": 9, "amount": 1, "currency": "USD"}',
        10: b'{"id": 10, "amount": 1, "currency": "EUR", "extra": true}',
        250: b'{"id": 250, "tags": [""]}',
    }
    for n, raw in poison.items():
        rows[n] = _row(n, rows[n][1], raw)
    rows[7] = _row(7, payments, None)  # a tombstone stays one
    out = encoder.encode(rows)

    pay_writer = encoder._topics[payments]._writers[pay_id]  # type: ignore[union-attr]
    tag_writer = encoder._topics[tagged]._writers[tag_id]  # type: ignore[union-attr]
    assert isinstance(pay_writer, JsonSchemaWriter) and isinstance(tag_writer, JsonSchemaWriter)
    assert (pay_writer.fast, tag_writer.fast) == (True, False)
    assert pay_writer.checked is True and tag_writer.checked is True  # the first rows' bytes matched

    client = SchemaRegistryClient({"url": schema_registry.url})
    conf = {"auto.register.schemas": False, "use.latest.version": True}
    serializers = {
        topic: JSONSerializer(client.get_latest_version(f"{topic}-value").schema, client, None, conf)
        for topic in (payments, tagged)
    }

    def serialized(topic: str, raw: bytes) -> bytes | str:
        try:
            return serializers[topic](json.loads(raw), SerializationContext(topic, MessageField.VALUE))  # type: ignore[return-value]
        except Exception as exc:
            return validation_reason(exc, "value")

    for row, got in zip(rows, out, strict=True):
        if row[0] == 7:
            assert got == row
        elif row[0] == 6:
            assert (got[6] or "").startswith("value is not JSON"), got
        elif row[0] in poison:
            assert got[3] == row[3] and got[6] == serialized(row[1], row[3]), got  # the serializer's words
        else:
            assert got[6] is None and got[3] == serialized(row[1], row[3]), row  # its bytes
    assert (
        out[5][6] == "value does not match its schema: field $.amount: -1 is less than the minimum of 0 (rule: minimum)"
    )
    assert "$.tags[0]" in (out[250][6] or "") and "(rule: minLength)" in (out[250][6] or ""), out[250][6]
    assert encoder.encoded == 300 - 6 and encoder.refused == 5
    assert encoder.encode(rows) == out  # the next batch: the same answer
    encoder.close()
