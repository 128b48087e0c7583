"""JSON Schema values written as confluent-kafka's ``JSONSerializer`` writes them, without its per-call work.

Through the serializer a row cost ~38 µs of the relay's one interpreter (profiled, docs/relay-cost.md):
jsonschema's validator walking the schema with an ``evolve``/``descend`` per property, plus the
serializer's per-call subject, reader-schema, rule and ``BytesIO`` work; the drain ran at 0.2 of the
unencoded one. Here, per schema id (:class:`JsonSchemaWriter`), a row costs the JSON parse, one call
of a validator compiled once from the schema into a single Python function (~0.4 µs for a
five-property object) and the serializer's own ``json.dumps`` (confluent-kafka's ``_json_dumps``:
orjson when installed).

The compiled validator covers the keywords whose meaning is the same in the drafts the registry
serves (:data:`FAST_KEYWORDS`: drafts 6, 7, 2019-09 and 2020-12, or no ``$schema``, which jsonschema
reads as 2020-12) and implements them as jsonschema does: its type checks (``1.0`` is an integer, a
bool is no number), its ``equal`` for ``enum``/``const`` (a bool equals only itself), ``re.search``
for ``pattern``, ``format`` as an annotation (the serializer builds jsonschema's validator without a
format checker). A schema with any other keyword (``$ref``, ``uniqueItems``, ``if``, ...) is checked by
the jsonschema validator the serializer builds (``validator_for``, built once per schema id here, not
looked up per row). fastjsonschema was measured and not taken: 1.4 µs a row, and it differs from
jsonschema where this must not (it asserts ``format`` and fills in ``default`` values unless told
not to, reads ``$`` in a pattern as end of string only, and refuses to compile a schema with
``required`` next to ``additionalProperties: {}``).

Verdicts stay jsonschema's either way: a value the compiled validator refuses (or any error on the
direct path) is left to the serializer, which validates with jsonschema and words the refusal (the
reason names the field and the rule, producer/schema/reasons.py).

Invariants (tests/test_producer/encode/test_json_schema_writer.py, against confluent-kafka's
serializer and jsonschema):
- the compiled validator's verdict is jsonschema's, for generated schemas of :data:`FAST_KEYWORDS`
  and generated values;
- :meth:`JsonSchemaWriter.write` returns the serializer's bytes (magic byte 0, the 4-byte schema id,
  the serializer's JSON text) for every value the serializer accepts; the relay still compares the
  two on each schema id's first row before trusting the writer (:attr:`JsonSchemaWriter.checked`);
- :meth:`JsonSchemaWriter.encode` returns bytes only for a value jsonschema accepts, else None
  (the relay then asks the serializer, which refuses it with jsonschema's words).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from harvest_outbox.producer.encode._avro_batch import loads, wire_prefix

__all__ = ["FAST_KEYWORDS", "JsonSchemaWriter", "encode_values", "fast_validator"]

log = logging.getLogger(__name__)

#: ``$schema`` values the compiled validator takes (with or without the trailing ``#``); absent too.
_DRAFTS = {
    "http://json-schema.org/draft-06/schema",
    "http://json-schema.org/draft-07/schema",
    "https://json-schema.org/draft/2019-09/schema",
    "https://json-schema.org/draft/2020-12/schema",
}
_TYPES = {"null", "boolean", "object", "array", "number", "integer", "string"}
_SCALARS = (str, int, float, bool, type(None))


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _count(v: Any) -> bool:
    return type(v) is int and v >= 0


def _sub(v: Any) -> bool:
    return isinstance(v, bool) or _fast_schema(v)


def _subs(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(_sub(s) for s in v)


def _type(v: Any) -> bool:
    if isinstance(v, str):
        return v in _TYPES
    return isinstance(v, list) and bool(v) and all(isinstance(t, str) and t in _TYPES for t in v)


def _annotation(_v: Any) -> bool:
    return True


#: The keywords the compiled validator takes (their meaning is the same in drafts 6 to 2020-12), each
#: with the shape of value it takes; a schema with any other keyword (``$ref``, ``items`` as a list,
#: ``uniqueItems``, ``multipleOf``, ``patternProperties``, ``if``, ...) is validated by jsonschema.
FAST_KEYWORDS: dict[str, Callable[[Any], bool]] = {
    "type": _type,
    "properties": lambda v: isinstance(v, dict) and all(_sub(s) for s in v.values()),
    "required": lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v),
    "additionalProperties": _sub,
    "items": _sub,
    "enum": lambda v: isinstance(v, list) and bool(v) and all(isinstance(x, _SCALARS) for x in v),
    "const": lambda v: isinstance(v, _SCALARS),
    "minimum": _number,
    "maximum": _number,
    "exclusiveMinimum": _number,
    "exclusiveMaximum": _number,
    "minLength": _count,
    "maxLength": _count,
    "minItems": _count,
    "maxItems": _count,
    "minProperties": _count,
    "maxProperties": _count,
    "pattern": lambda v: isinstance(v, str),
    "allOf": _subs,
    "anyOf": _subs,
    "oneOf": _subs,
    "not": _sub,
    # annotations only: jsonschema, as the serializer builds it, asserts none (format has no checker)
    "format": lambda v: isinstance(v, str),
    "title": _annotation,
    "description": _annotation,
    "$comment": _annotation,
    "default": _annotation,
    "examples": _annotation,
    "readOnly": _annotation,
    "writeOnly": _annotation,
    "deprecated": _annotation,
}


def _fast_schema(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return False
    for keyword, value in schema.items():
        ok = FAST_KEYWORDS.get(keyword)
        if ok is None or not ok(value):
            return False
    return True


_TYPE_TEST = {
    "null": "{v} is None",
    "boolean": "{t} is bool",
    "object": "{t} is dict",
    "array": "{t} is list",
    "string": "{t} is str",
    "number": "({t} is int or {t} is float)",
    "integer": "({t} is int or ({t} is float and {v}.is_integer()))",
}


def _in(value: Any, allowed: tuple[Any, ...]) -> bool:
    """jsonschema's ``equal`` for scalar ``allowed`` values: a bool equals only itself."""
    for e in allowed:
        if value is True or value is False or e is True or e is False:
            if value is e:
                return True
        elif type(value) is not list and type(value) is not dict and value == e:
            return True
    return False


class _Compiler:
    """Python source for a schema of :data:`FAST_KEYWORDS`: one function whose checks return False at the
    first one that fails (subschemas inlined; ``allOf``/``anyOf``/``oneOf``/``not`` branches are functions of
    their own), each check written as jsonschema's keyword function tests it (the same comparison, so NaN
    and bounds behave alike); the schema's values are constants of the function's namespace, never source."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.consts: dict[str, Any] = {"_in": _in}
        self.n = 0

    def const(self, value: Any) -> str:
        self.n += 1
        name = f"_c{self.n}"
        self.consts[name] = value
        return name

    def var(self) -> str:
        self.n += 1
        return f"_v{self.n}"

    def function(self, schema: Any) -> str:
        """A function of its own (for allOf/anyOf/oneOf/not): returns True when the value is valid."""
        saved, self.lines = self.lines, []
        name = f"_f{self.n + 1}"
        self.n += 1
        self.lines.append(f"def {name}(_v0):")
        self.check(schema, "_v0", 1)
        self.lines.append("    return True")
        body, self.lines = self.lines, saved
        self.lines[:0] = body  # functions first
        return name

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def counts(self, schema: Any, v: str, d: int, low: str, high: str) -> None:
        """Lines that return False unless ``len(v)`` is within the schema's ``low`` / ``high`` keywords (counts,
        checked by FAST_KEYWORDS to be non-negative ints, so the source holds numbers only)."""
        for k, op in ((low, "<"), (high, ">")):
            if k in schema:
                self.emit(d, f"if len({v}) {op} {schema[k]}:")
                self.emit(d + 1, "return False")

    def check(self, schema: Any, v: str, d: int) -> None:
        """Lines that return False unless ``v`` is valid against ``schema``."""
        if schema is True:
            return
        if schema is False:
            self.emit(d, "return False")
            return
        t = self.var()
        self.emit(d, f"{t} = type({v})")
        types = schema.get("type")
        if types is not None:
            names = [types] if isinstance(types, str) else types
            test = " or ".join(_TYPE_TEST[n].format(v=v, t=t) for n in names)
            self.emit(d, f"if not ({test}):")
            self.emit(d + 1, "return False")
        if "enum" in schema:
            self.emit(d, f"if not _in({v}, {self.const(tuple(schema['enum']))}):")
            self.emit(d + 1, "return False")
        if "const" in schema:
            self.emit(d, f"if not _in({v}, {self.const((schema['const'],))}):")
            self.emit(d + 1, "return False")
        num = [
            (k, op)
            for k, op in (("minimum", "<"), ("maximum", ">"), ("exclusiveMinimum", "<="), ("exclusiveMaximum", ">="))
            if k in schema
        ]
        if num:
            self.emit(d, f"if {t} is int or {t} is float:")
            for k, op in num:
                self.emit(d + 1, f"if {v} {op} {self.const(schema[k])}:")
                self.emit(d + 2, "return False")
        strs = [k for k in ("minLength", "maxLength", "pattern") if k in schema]
        if strs:
            self.emit(d, f"if {t} is str:")
            for k in strs:
                if k == "pattern":
                    self.emit(d + 1, f"if not {self.const(re.compile(schema[k]).search)}({v}):")
                else:
                    self.emit(d + 1, f"if len({v}) {'<' if k == 'minLength' else '>'} {schema[k]}:")
                self.emit(d + 2, "return False")
        arr = [k for k in ("items", "minItems", "maxItems") if k in schema]
        if arr:
            self.emit(d, f"if {t} is list:")
            self.emit(d + 1, "pass")
            self.counts(schema, v, d + 1, "minItems", "maxItems")
            if "items" in schema and schema["items"] is not True:
                x = self.var()
                self.emit(d + 1, f"for {x} in {v}:")
                self.check(schema["items"], x, d + 2)
        obj = [
            k
            for k in ("properties", "required", "additionalProperties", "minProperties", "maxProperties")
            if k in schema
        ]
        if obj:
            self.emit(d, f"if {t} is dict:")
            self.emit(d + 1, "pass")
            self.counts(schema, v, d + 1, "minProperties", "maxProperties")
            if schema.get("required"):
                self.emit(d + 1, f"if not {self.const(frozenset(schema['required']))} <= {v}.keys():")
                self.emit(d + 2, "return False")
            props = schema.get("properties", {})
            for name, sub in props.items():
                if sub is True:
                    continue
                x = self.var()
                self.emit(d + 1, f"if {name!r} in {v}:")
                self.emit(d + 2, f"{x} = {v}[{name!r}]")
                self.check(sub, x, d + 2)
            extra = schema.get("additionalProperties", True)
            if extra is not True:
                known = self.const(frozenset(props))
                if extra is False:
                    self.emit(d + 1, f"if not {v}.keys() <= {known}:")
                    self.emit(d + 2, "return False")
                else:
                    k, x = self.var(), self.var()
                    self.emit(d + 1, f"for {k}, {x} in {v}.items():")
                    self.emit(d + 2, f"if {k} not in {known}:")
                    self.check(extra, x, d + 3)
        for k in ("allOf", "anyOf", "oneOf"):
            if k in schema:
                fs = ", ".join(self.function(s) for s in schema[k])
                agg = {"allOf": "all", "anyOf": "any", "oneOf": "sum"}[k]
                cond = f"{agg}(f({v}) for f in ({fs},))" + (" == 1" if k == "oneOf" else "")
                self.emit(d, f"if not {cond}:")
                self.emit(d + 1, "return False")
        if "not" in schema:
            self.emit(d, f"if {self.function(schema['not'])}({v}):")
            self.emit(d + 1, "return False")


def _compile(schema: Any) -> Callable[[Any], bool]:
    """``schema`` (of :data:`FAST_KEYWORDS` only) as one Python function: True when a value is valid."""
    c = _Compiler()
    c.lines = ["def validate(_v0):"]
    c.check(schema, "_v0", 1)
    c.lines.append("    return True")
    namespace = dict(c.consts)
    exec(compile("\n".join(c.lines), "<json-schema>", "exec"), namespace)
    validate: Callable[[Any], bool] = namespace["validate"]
    return validate


def fast_validator(schema: Any) -> Callable[[Any], bool] | None:
    """``schema``'s compiled validator (True: the value is valid), or None when the schema uses a
    keyword outside :data:`FAST_KEYWORDS` (or a ``$schema`` other than drafts 6 to 2020-12)."""
    if not isinstance(schema, dict):
        return None
    top = dict(schema)
    draft = top.pop("$schema", None)
    if draft is not None and (not isinstance(draft, str) or draft.rstrip("#") not in _DRAFTS):
        return None
    if isinstance(top.get("$id"), str):  # names the schema for $ref, which the fast path never has
        top.pop("$id")
    try:
        return _compile(top) if _fast_schema(top) else None
    except Exception:  # a pattern re does not take, a schema nested too deep: jsonschema validates
        log.debug("JSON Schema not compiled; jsonschema validates its rows", exc_info=True)
        return None


class JsonSchemaWriter:
    """The values of one registered JSON Schema (by id), validated and written directly.

    ``checked`` is None until the relay has compared this writer's bytes with the serializer's on a
    real row, then True (they were equal: write directly) or False (use the serializer)."""

    __slots__ = ("_dumps", "_fast", "_validator", "checked", "fast", "prefix", "schema_id")

    def __init__(self, schema_id: int, schema_str: str, ref_registry: Any) -> None:
        # the serializer's own dumps (orjson when installed, else the stdlib's compact form)
        from confluent_kafka.schema_registry.common.json_schema import _json_dumps
        from jsonschema.validators import validator_for

        self.schema_id = schema_id
        self.prefix = wire_prefix(schema_id)
        self._dumps: Callable[[Any], str] = _json_dumps
        parsed = json.loads(schema_str)
        cls = validator_for(parsed)
        cls.check_schema(parsed)  # raises for a schema the serializer refuses too
        #: the validator the serializer builds for this schema (jsonschema's), built once here
        self._validator: Any = cls(parsed, registry=ref_registry)
        self._fast = fast_validator(parsed)
        self.fast = self._fast is not None
        self.checked: bool | None = None

    def __repr__(self) -> str:
        return f"JsonSchemaWriter(schema_id={self.schema_id}, fast={self.fast}, checked={self.checked})"

    def accepts(self, value: Any) -> bool:
        """Whether jsonschema accepts ``value``: the compiled validator's yes, else jsonschema's verdict."""
        fast = self._fast
        if fast is not None and fast(value):
            return True
        return bool(self._validator.is_valid(value))

    def write(self, value: Any) -> bytes:
        """``value`` (already validated) in the wire format, as the serializer writes it."""
        return self.prefix + self._dumps(value).encode("utf-8")

    def encode(self, value: Any) -> bytes | None:
        """``value`` in the wire format if jsonschema accepts it, else None (the serializer refuses it,
        naming the field and the rule); None too when the direct write fails (the serializer decides)."""
        try:
            if self.accepts(value):
                return self.write(value)
        except Exception:  # the serializer raises it again, and words it
            pass
        return None

    def encode_values(self, values: Sequence[bytes]) -> list[bytes | None]:
        """Each stored JSON value encoded (by a checked writer), or None: not JSON, refused, or anything
        unusual, which the relay hands to the serializer (its words, its exceptions)."""
        return encode_values(self, values)


def encode_values(writer: JsonSchemaWriter, values: Sequence[bytes]) -> list[bytes | None]:
    """:meth:`JsonSchemaWriter.encode_values`."""
    out: list[bytes | None] = []
    append, fast, prefix, dumps, slow = out.append, writer._fast, writer.prefix, writer._dumps, writer.encode
    for raw in values:
        try:
            value = loads(raw)
        except ValueError:
            append(None)
            continue
        if fast is not None and fast(value):
            try:  # JsonSchemaWriter.encode, inlined: this loop is the relay's per-row cost
                append(prefix + dumps(value).encode("utf-8"))
                continue
            except Exception:  # the serializer raises it again, and words it
                pass
        append(slow(value))
    return out
