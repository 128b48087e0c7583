"""The compiled Avro pass (producer/encode/_avro_compiled.py) against the installed fastavro, over generated
schemas (primitives, logical types, enums, fixed, arrays, maps, unions, records with defaults, named
references, recursion) and generated values, valid ones and ones with the coercion traps mixed in:

- whenever the compiled pass writes a value, fastavro's ``validate`` accepts it and its
  ``schemaless_writer`` writes the same bytes (1.5 into a ``long``, "1" into a ``double``, ``True``
  into an ``int``, 2**31 into an ``int``: never written, fastavro refuses them);
- the compiled validator answers as ``fastavro.validation.validate(..., raise_errors=False)``;
- a valid value of plain JSON (and the logical types' Python values) is written by the compiled pass,
  not left to fastavro;
- ``AvroWriter.encode`` and ``encode_values`` give fastavro's bytes, or fastavro's refusal word for word.
"""

from __future__ import annotations

import datetime
import decimal
import io
import json
import struct
import uuid
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer
from fastavro.validation import ValidationError, validate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harvest_outbox.producer.encode._avro_batch import AvroWriter, encode_values
from harvest_outbox.producer.encode._avro_compiled import GiveUp, compile_schema
from harvest_outbox.producer.schema.reasons import validation_reason

PRIMITIVES = ["null", "boolean", "int", "long", "float", "double", "string", "bytes"]
LOGICAL = [
    {"type": "int", "logicalType": "date"},
    {"type": "int", "logicalType": "time-millis"},
    {"type": "long", "logicalType": "time-micros"},
    {"type": "long", "logicalType": "timestamp-millis"},
    {"type": "long", "logicalType": "timestamp-micros"},
    {"type": "long", "logicalType": "local-timestamp-millis"},
    {"type": "string", "logicalType": "uuid"},
    {"type": "bytes", "logicalType": "decimal", "precision": 8, "scale": 2},
    {"type": "long", "logicalType": "no-such-logical-type"},  # an unknown one: the plain long
]
#: values that fit some type and not another: what fastavro's writer alone would coerce or crash on
TRAPS: list[Any] = [
    1.5,
    "1",
    True,
    False,
    None,
    0,
    -1,
    1.0,
    2**31,
    -(2**31) - 1,
    2**31 - 1,
    2**63,
    -(2**63) - 1,
    2**63 - 1,
    2**64,
    10**400,
    float("nan"),
    float("inf"),
    3.5e38,
    "",
    "A",
    "é\u2603",
    "\ud800",
    "2026-11-25",
    str(uuid.UUID(int=5)),
    b"",
    b"\x00\x01",
    [],
    [1],
    {},
    {"a": 1},
    {"-type": "x"},
]
UTC = datetime.timezone.utc


class Names:
    """Fresh type and field names for one generated schema, and the named types defined so far."""

    def __init__(self) -> None:
        self.n = 0
        self.named: dict[str, dict[str, Any]] = {}  # name -> its schema (records: filled as they grow)
        self.open: set[str] = set()  # records whose fields are being generated: no plain reference to them

    def fresh(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"


@st.composite
def schemas(draw: st.DrawFn, names: Names, depth: int = 0, in_union: bool = False) -> Any:
    kinds = ["primitive", "logical", "enum", "fixed"]
    if depth < 3:
        kinds += ["array", "map", "record", "record"] + ([] if in_union else ["union", "union"])
    closed = sorted(set(names.named) - names.open)
    if closed:
        kinds.append("ref")
    kind = draw(st.sampled_from(kinds))
    if kind == "primitive":
        name = draw(st.sampled_from(PRIMITIVES))
        return draw(st.sampled_from([name, {"type": name}]))
    if kind == "logical":
        return dict(draw(st.sampled_from(LOGICAL)))
    if kind == "enum":
        symbols = draw(st.lists(st.sampled_from(["A", "B", "C", "D", "NaN"]), min_size=1, max_size=4, unique=True))
        schema = {"type": "enum", "name": names.fresh("E"), "symbols": symbols}
        names.named[schema["name"]] = schema
        return schema
    if kind == "fixed":
        schema = {"type": "fixed", "name": names.fresh("F"), "size": draw(st.integers(0, 3))}
        if draw(st.booleans()) and schema["size"]:
            schema.update(logicalType="decimal", precision=2 * schema["size"], scale=1)
        names.named[schema["name"]] = schema
        return schema
    if kind == "ref":
        return draw(st.sampled_from(closed))
    if kind == "array":
        return {"type": "array", "items": draw(schemas(names, depth + 1))}
    if kind == "map":
        return {"type": "map", "values": draw(schemas(names, depth + 1))}
    if kind == "union":
        return draw(unions(names, depth))
    return draw(records(names, depth))


@st.composite
def unions(draw: st.DrawFn, names: Names, depth: int) -> list[Any]:
    """Avro's rules: no union in a union, one branch per unnamed type; and at most one branch that
    takes a dict (a record or a map), where fastavro's writer would count fields to choose."""
    branches: list[Any] = []
    seen: set[str] = set()
    for _ in range(draw(st.integers(1, 4))):
        defined = dict(names.named)
        branch = draw(schemas(names, depth + 1, in_union=True))
        resolved = names.named.get(branch, branch) if isinstance(branch, str) else branch
        kind = resolved if isinstance(resolved, str) else resolved["type"]
        key = resolved["name"] if isinstance(resolved, dict) and "name" in resolved else kind
        if kind in ("record", "map"):
            key = "dict"
        if key in seen:
            names.named = defined  # the dropped branch's named types are not in the schema
            continue
        seen.add(key)
        branches.append(branch)
    if draw(st.booleans()) and "null" not in seen:
        branches.insert(draw(st.integers(0, len(branches))), "null")
    return branches


@st.composite
def records(draw: st.DrawFn, names: Names, depth: int) -> dict[str, Any]:
    name = names.fresh("R")
    schema: dict[str, Any] = {"type": "record", "name": name, "fields": []}
    names.named[name] = schema
    names.open.add(name)
    for field_name in draw(st.lists(st.sampled_from("abcdef"), max_size=5, unique=True)):
        if draw(st.integers(0, 9)) == 0:  # recursion: this record again, through a nullable union or an array
            ftype: Any = draw(st.sampled_from([["null", name], {"type": "array", "items": name}]))
        else:
            ftype = draw(schemas(names, depth + 1))
        field: dict[str, Any] = {"name": field_name, "type": ftype}
        if draw(st.integers(0, 3)) == 0:
            default = draw(json_defaults(ftype, names))
            if default is not _NO_DEFAULT:
                field["default"] = default
        schema["fields"].append(field)
    names.open.discard(name)
    return schema


_NO_DEFAULT = object()


@st.composite
def json_defaults(draw: st.DrawFn, schema: Any, names: Names) -> Any:
    """A default as a schema's JSON would hold it (a union's is its first branch's): simple types only."""
    target = schema[0] if isinstance(schema, list) else schema
    target = names.named.get(target, target) if isinstance(target, str) else target
    kind = target if isinstance(target, str) else target["type"]
    if isinstance(target, dict) and "logicalType" in target:
        return _NO_DEFAULT
    simple = {
        "null": st.none(),
        "boolean": st.booleans(),
        "int": st.integers(-(2**31), 2**31 - 1),
        "long": st.integers(-(2**63), 2**63 - 1),
        "double": st.floats(allow_nan=False),
        "float": st.floats(width=32, allow_nan=False, allow_infinity=False),
        "string": st.text(max_size=5),
    }
    if kind == "enum":
        return draw(st.sampled_from(target["symbols"]))
    if kind in simple:
        return draw(simple[kind])
    return _NO_DEFAULT


@st.composite
def values(draw: st.DrawFn, schema: Any, named: dict[str, Any], depth: int = 0) -> Any:
    """A value that fits ``schema`` (parsed names): plain JSON, or a logical type's Python value."""
    if isinstance(schema, str) and schema in named:
        schema = named[schema]
    if isinstance(schema, list):
        options = [b for b in schema if b == "null"] if depth > 4 and "null" in schema else schema
        return draw(values(draw(st.sampled_from(options)), named, depth + 1))
    kind = schema if isinstance(schema, str) else schema["type"]
    logical = schema.get("logicalType") if isinstance(schema, dict) else None
    if logical == "date":
        return draw(st.one_of(st.integers(-(2**20), 2**20), st.dates(), st.dates().map(lambda d: d.isoformat())))
    if logical in ("time-millis", "time-micros"):
        return draw(st.one_of(st.integers(0, 86_400_000), st.times()))
    if logical in ("timestamp-millis", "timestamp-micros", "local-timestamp-millis"):
        aware = st.datetimes(
            min_value=datetime.datetime(1971, 1, 1), max_value=datetime.datetime(2100, 1, 1), timezones=st.just(UTC)
        )
        return draw(st.one_of(st.integers(-(2**50), 2**50), aware))
    if logical == "uuid":
        return draw(st.one_of(st.uuids(), st.uuids().map(str)))
    if logical == "decimal":
        bound = 10 ** schema["precision"] - 1
        return decimal.Decimal(draw(st.integers(-bound, bound))).scaleb(-schema["scale"])
    if kind == "null":
        return None
    if kind == "boolean":
        return draw(st.booleans())
    if kind == "int":
        return draw(st.integers(-(2**31), 2**31 - 1))
    if kind == "long":
        return draw(st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-200, 200)))
    if kind == "float":
        return draw(st.one_of(st.floats(width=32), st.integers(-(2**24), 2**24)))
    if kind == "double":
        return draw(st.one_of(st.floats(), st.integers(-(2**63), 2**63)))
    if kind == "string":
        return draw(st.text(max_size=8))
    if kind == "bytes":
        return draw(st.binary(max_size=5))
    if kind == "fixed":
        return draw(st.binary(min_size=schema["size"], max_size=schema["size"]))
    if kind == "enum":
        return draw(st.sampled_from(schema["symbols"]))
    if kind == "array":
        return draw(st.lists(values(schema["items"], named, depth + 1), max_size=0 if depth > 4 else 3))
    if kind == "map":
        return draw(
            st.dictionaries(
                st.text(max_size=3), values(schema["values"], named, depth + 1), max_size=0 if depth > 4 else 3
            )
        )
    out: dict[str, Any] = {}
    for field in schema["fields"]:
        if "default" in field and draw(st.integers(0, 3)) == 0:
            continue  # left to its default
        out[field["name"]] = draw(values(field["type"], named, depth + 1))
    if draw(st.integers(0, 5)) == 0:
        out["extra"] = 1  # ignored by validate and the writer alike
    return out


@st.composite
def mutated(draw: st.DrawFn, value: Any) -> Any:
    """``value`` with one part replaced by a trap, or a record field dropped."""
    if isinstance(value, dict) and value and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(value)))
        if draw(st.booleans()):
            return {k: v for k, v in value.items() if k != key}
        return {**value, key: draw(mutated(value[key]))}
    if isinstance(value, list) and value and draw(st.booleans()):
        i = draw(st.integers(0, len(value) - 1))
        return [*value[:i], draw(mutated(value[i])), *value[i + 1 :]]
    return draw(st.sampled_from(TRAPS))


Case = tuple[Any, Any, dict[str, Any], Any, bool]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """(the schema's JSON, it parsed, its named types, a value, whether the value was generated to fit)."""
    names = Names()
    schema = draw(schemas(names))
    named: dict[str, Any] = {}
    try:
        parsed = parse_schema(schema, named)
    except Exception:  # e.g. a default fastavro does not take: not a schema a registry would hold
        schema, named = _strip_defaults(schema), {}
        parsed = parse_schema(schema, named)
    value = draw(values(parsed, named))
    fits = draw(st.integers(0, 2)) > 0
    if not fits:
        value = draw(mutated(value))
    return schema, parsed, named, value, fits


def _strip_defaults(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_strip_defaults(s) for s in schema]
    if isinstance(schema, dict):
        out = {k: _strip_defaults(v) for k, v in schema.items() if k != "default"}
        if "fields" in schema:
            out["fields"] = [
                {k: _strip_defaults(v) if k == "type" else v for k, v in f.items() if k != "default"}
                for f in schema["fields"]
            ]
        return out
    return schema


def fastavro_answer(parsed: Any, value: Any) -> tuple[str, Any]:
    """Today's path: fastavro's strict validation, then its writer (a logical type's writer may raise
    in either)."""
    try:
        validate(value, parsed, raise_errors=True)
        buf = io.BytesIO()
        schemaless_writer(buf, parsed, value)
    except ValidationError as exc:
        return "refused", str(exc)
    except Exception as exc:
        return "raised", f"{type(exc).__name__}: {exc}"
    return "bytes", buf.getvalue()


def _has_bytes(value: Any) -> bool:
    """Bytes are no JSON value (the relay never meets them), and fastavro takes them for an array in a
    union with one (bytes are a Sequence): the compiled pass may leave them to fastavro."""
    if isinstance(value, dict):
        return any(_has_bytes(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_bytes(v) for v in value)
    return isinstance(value, (bytes, bytearray))


def _ours(writer: AvroWriter, value: Any) -> tuple[str, Any]:
    try:
        return "bytes", writer.encode(value)[5:]
    except ValidationError as exc:
        return "refused", str(exc)
    except Exception as exc:
        return "raised", f"{type(exc).__name__}: {exc}"


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_the_compiled_pass_writes_only_what_fastavro_accepts_with_fastavro_bytes(case: Case) -> None:
    _schema, parsed, named, value, fits = case
    compiled = compile_schema(parsed, named)
    expected = fastavro_answer(parsed, value)
    try:
        got = compiled.write(value)
    except Exception:
        got = None
    if got is not None:
        assert expected == ("bytes", got), (value, compiled.source)
    elif fits and expected[0] == "bytes" and not _has_bytes(value):
        pytest.fail(f"a valid value was left to fastavro: {value!r}\n{compiled.source}")
    # the validator on its own: fastavro.validate's answer (a logical type's writer may raise in both)
    try:
        theirs: Any = validate(value, parsed, raise_errors=False)
    except Exception as exc:
        theirs = type(exc)
    try:
        ours: Any = compiled.valid(value)
    except Exception as exc:
        ours = type(exc)
    assert ours == theirs, value


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_the_writer_and_the_relays_batch_give_fastavros_bytes_or_its_refusal(case: Case) -> None:
    schema, _parsed, _named, value, _fits = case
    writer = AvroWriter(7, json.dumps(schema))
    assert _ours(writer, value) == fastavro_answer(writer.parsed, value)
    # encode_values: the relay's loop over stored JSON rows (the values that survive a JSON round trip)
    try:
        raw = json.dumps(value).encode()
    except (TypeError, ValueError):
        return
    value = json.loads(raw)
    [result] = encode_values(writer, [raw])
    try:
        writer.encode_by_fastavro(value)
    except Exception as exc:
        assert result == validation_reason(exc, "value")
    else:
        assert result == writer.prefix + fastavro_answer(writer.parsed, value)[1]


ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "count", "type": "int"},
        {"name": "ok", "type": "boolean"},
        {"name": "amount", "type": "double"},
        {"name": "ratio", "type": "float"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "either", "type": ["string", "long", "float", "double"]},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
        {"name": "next", "type": ["null", "Order"], "default": None},
        {"name": "tags", "type": {"type": "map", "values": {"type": "array", "items": "string"}}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    ],
}
GOOD = {
    "id": 7,
    "count": -3,
    "ok": True,
    "amount": 2,
    "ratio": 0.5,
    "either": 2.5,
    "status": "PAID",
    "next": {
        "id": 8,
        "count": 0,
        "ok": False,
        "amount": 1.5,
        "ratio": 1,
        "either": "s",
        "status": "NEW",
        "tags": {},
        "day": 1,
    },
    "tags": {"k": ["a", "é"]},
    "day": "2026-11-26",
}


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"id": 1.5}, "id"),
        ({"amount": "1"}, "amount"),
        ({"count": True}, "count"),
        ({"count": 2**31}, "count"),
        ({"id": 2**63}, "id"),
        ({"status": "LOST"}, "status"),
        ({"either": None}, "either"),
        ({"next": {"id": "x"}}, "next"),
        ({"tags": {"k": [1]}}, "tags"),
    ],
    ids=[
        "float-in-long",
        "string-in-double",
        "bool-in-int",
        "int-overflow",
        "long-overflow",
        "enum",
        "union",
        "nested",
        "map-of-arrays",
    ],
)
def test_a_trap_is_refused_with_fastavros_reason_naming_the_field(over: dict[str, Any], field: str) -> None:
    writer = AvroWriter(3, json.dumps(ORDER))
    bad = {**GOOD, **over}
    with pytest.raises(ValidationError) as ours:
        writer.encode(bad)
    with pytest.raises(ValidationError) as theirs:
        validate(bad, writer.parsed, raise_errors=True)
    assert str(ours.value) == str(theirs.value) and field in str(ours.value)
    [reason] = encode_values(writer, [json.dumps(bad).encode()])
    assert reason == validation_reason(theirs.value, "value") and field in str(reason)


def test_a_valid_record_with_recursion_unions_and_logical_types_is_written_by_the_compiled_pass() -> None:
    named: dict[str, Any] = {}
    parsed = parse_schema(ORDER, named)
    compiled = compile_schema(parsed, named)
    for value in (GOOD, {**GOOD, "either": 3}, {**GOOD, "either": "x", "note": "n", "next": None}):
        assert compiled.write(value) == fastavro_answer(parsed, value)[1]
    with pytest.raises(GiveUp):
        compiled.write({**GOOD, "-type": "shop.Order"})  # fastavro compares it with the name: its call
    # a float value: fastavro's writer prefers a later double to the float; an int takes the long
    union = compile_schema(parse_schema(["string", "long", "float", "double"]), {})
    assert (
        union.write(2.5)
        == b"\x06" + struct.pack("<d", 2.5)
        == fastavro_answer(["string", "long", "float", "double"], 2.5)[1]
    )
    assert union.write(3) == b"\x02\x06" and union.write("s") == b"\x00\x02s"


def test_an_uncompilable_schema_leaves_every_row_to_fastavro(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import harvest_outbox.producer.encode._avro_compiled as avro_compiled

    def broken(parsed: Any, named: dict[str, Any]) -> Any:
        raise RuntimeError("compiler bug")

    monkeypatch.setattr(avro_compiled, "compile_schema", broken)
    writer = AvroWriter(3, json.dumps(ORDER))
    assert "not compiled" in caplog.text
    assert writer.encode(GOOD) == writer.prefix + fastavro_answer(writer.parsed, GOOD)[1]
    with pytest.raises(ValidationError):
        writer.encode({**GOOD, "id": 1.5})


TRAP_SCHEMAS: list[Any] = [*PRIMITIVES, *LOGICAL, {"type": "enum", "name": "E", "symbols": ["A", "NaN"]}]
TRAP_SCHEMAS.append({"type": "fixed", "name": "F", "size": 2})


@pytest.mark.parametrize("wrap", ["plain", "nullable", "field", "array"], ids=["plain", "nullable", "field", "array"])
@pytest.mark.parametrize(
    "schema",
    TRAP_SCHEMAS,
    ids=[s if isinstance(s, str) else s.get("logicalType", s["type"]) for s in TRAP_SCHEMAS],
)
def test_every_trap_against_every_simple_type(schema: Any, wrap: str) -> None:
    """Each trap value (and a lone surrogate, 10**400 in a double, 3.5e38 in a float) in every simple
    type, as it is, in a nullable union, in a record field and in an array: the compiled pass writes
    fastavro's bytes or leaves the value to fastavro; AvroWriter answers as fastavro does."""
    if wrap == "nullable" and schema != "null":
        schema = ["null", schema]
    elif wrap == "field":
        schema = {"type": "record", "name": "W", "fields": [{"name": "f", "type": schema}]}
    elif wrap == "array":
        schema = {"type": "array", "items": schema}
    named: dict[str, Any] = {}
    parsed = parse_schema(schema, named)
    compiled = compile_schema(parsed, named)
    writer = AvroWriter(1, json.dumps(schema))
    for trap in TRAPS:
        value = {"f": trap} if wrap == "field" else [trap, trap] if wrap == "array" else trap
        expected = fastavro_answer(parsed, value)
        try:
            got = compiled.write(value)
        except Exception:
            got = None
        assert got is None or expected == ("bytes", got), trap
        assert _ours(writer, value) == expected, trap
