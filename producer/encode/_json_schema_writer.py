"""JSON Schema values written as confluent-kafka's ``JSONSerializer`` writes them, without its per-call work.

Through the serializer a row cost ~38 µs of the relay's one interpreter (profiled, docs/relay-cost.md):
jsonschema's validator walking the schema with an ``evolve``/``descend`` per property, plus the
serializer's per-call subject, reader-schema, rule and ``BytesIO`` work; the drain ran at 0.2 of the
unencoded one. Here, per schema id (:class:`JsonSchemaWriter`), a row costs the JSON parse, one call
of a validator compiled once from the schema (``fastjsonschema``, ~1 µs for a five-property object)
and the serializer's own ``json.dumps`` (confluent-kafka's ``_json_dumps``: orjson when installed).

Verdicts stay jsonschema's: the compiled validator only ever *accepts* a value directly. A value it
refuses (or any error on the direct path) is left to the serializer, which validates with jsonschema
and words the refusal (the reason names the field and the rule, producer/schema/reasons.py); so a
value the two validators disagree on gets the serializer's verdict. The compiled validator is used
only for schemas made of keywords whose meaning fastjsonschema and jsonschema share for the drafts the
registry serves (:data:`FAST_KEYWORDS`; drafts 6, 7, 2019-09, 2020-12, or no ``$schema``, which
jsonschema reads as 2020-12 and fastjsonschema as 2019-09: they agree on those keywords); other
schemas are checked by the jsonschema validator the serializer builds (``validator_for``, built
once per schema id here, not looked up per row). Known differences kept off the fast path:
fastjsonschema asserts ``format`` by default (jsonschema, as the serializer builds it, does not:
compiled with ``use_formats=False``), fills in ``default`` values (``use_default=False``), reads
``$`` in a ``pattern`` as end of string only (a stricter match: it can only refuse more, and its
refusals go to jsonschema), and compares ``enum``/``const`` containers loosely (only scalar values
take the fast path).

Invariants (tests/test_producer/encode/test_json_schema_writer.py, against confluent-kafka's
serializer and jsonschema):
- :meth:`JsonSchemaWriter.write` returns the serializer's bytes (magic byte 0, the 4-byte schema id,
  the serializer's JSON text) for every value the serializer accepts; the relay still compares the
  two on each schema id's first row before trusting the writer (:attr:`JsonSchemaWriter.checked`);
- :meth:`JsonSchemaWriter.encode` returns bytes only for a value jsonschema accepts, else None
  (the relay then asks the serializer, which refuses it with jsonschema's words).
"""

from __future__ import annotations

import json
import logging
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


#: The keywords whose meaning fastjsonschema and jsonschema share (drafts 6 to 2020-12), each with
#: the shape of value that keeps it so; a schema with any other keyword (``$ref``, ``items`` as a
#: list, ``uniqueItems``, ``multipleOf``, ``patternProperties``, ``if``, ...) is validated by jsonschema.
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
    # annotations only: neither validator asserts them (format: as the serializer builds jsonschema's)
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


def fast_validator(schema: Any) -> Callable[[Any], Any] | None:
    """``schema``'s compiled validator (raises on a value it refuses), or None when the schema uses a
    keyword outside :data:`FAST_KEYWORDS` (or a ``$schema`` other than drafts 6 to 2020-12)."""
    if not isinstance(schema, dict):
        return None
    top = dict(schema)
    draft = top.pop("$schema", None)
    if draft is not None and (not isinstance(draft, str) or draft.rstrip("#") not in _DRAFTS):
        return None
    if isinstance(top.get("$id"), str):  # names the schema for $ref, which the fast path never has
        top.pop("$id")
    if not _fast_schema(top):
        return None
    import fastjsonschema  # type: ignore[import-untyped,unused-ignore]

    try:
        validate: Callable[[Any], Any] = fastjsonschema.compile(schema, use_default=False, use_formats=False)
    except Exception:  # e.g. a pattern its "$" rewrite breaks: jsonschema validates
        log.debug("JSON Schema not compiled by fastjsonschema; jsonschema validates its rows", exc_info=True)
        return None
    return validate


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
        if self._fast is not None:
            try:
                self._fast(value)
                return True
            except Exception:  # refused (or could not tell): jsonschema decides
                pass
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
        if fast is not None:
            try:  # JsonSchemaWriter.encode, inlined: this loop is the relay's per-row cost
                fast(value)
                append(prefix + dumps(value).encode("utf-8"))
                continue
            except Exception:  # jsonschema decides
                pass
        append(slow(value))
    return out
