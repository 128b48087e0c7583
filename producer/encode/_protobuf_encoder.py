"""JSON rows as the registered Protobuf message, in the Confluent wire format (``serializer: protobuf``).

Used by producer/encode/serialization.py's RowEncoder for a topic (or key) whose serializer is ``protobuf``.
The message class is built at run time from the registered ``.proto`` (harvest_outbox/protobuf_schema.py),
since a JSON row names no generated class.

A row is turned into its message by :func:`fast_builder`'s converter where it can be: a JSON object
whose keys are the message's singular scalar, string and enum fields (by name or JSON name), each
value of exactly the type proto3's JSON mapping reads without conversion (an int for an integer field,
a finite float or an int for a double, a str, a bool, an enum's name), built as ``cls(**fields)`` in
protobuf's C code (~1 µs for five fields). Anything else (nested messages, repeated and map fields,
oneofs, bytes, nulls, strings for numbers, a value out of range) goes through ``json_format.ParseDict``,
pure Python, ~20 µs a row (profiled, docs/relay-cost.md), which also words every refusal.

Invariants (tests/test_producer/encode/test_registry_protobuf.py, test_protobuf_fast.py): a value's bytes are
confluent-kafka's ``ProtobufSerializer``'s for the same message, byte for byte (the direct path starts only
after a schema id's first row was written by the serializer and is never used for a schema with data-contract
rules); the fast converter builds exactly the message ``ParseDict`` builds, and only for values ``ParseDict``
accepts; a value that does not fit the message raises ValueError naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from math import isfinite
from typing import Any

from harvest_outbox.errors import HarvestOutboxError
from harvest_outbox.producer.encode._avro_batch import loads, wire_prefix

__all__ = ["ProtobufEncoder", "ProtobufWriter", "fast_builder"]

# How fast_builder's converter takes a field's JSON value (anything else: ParseDict).
_INT, _DOUBLE, _FLOAT, _BOOL, _STR, _ENUM = range(6)
#: float (32-bit) fields: ParseDict refuses a JSON number beyond this (type_checkers._FLOAT_MAX)
_FLOAT_MAX = 3.4028234663852886e38


class _Slow(HarvestOutboxError):
    """The value is ParseDict's to convert (and, if it does not fit, to refuse); never leaves this module."""


def fast_builder(cls: Any) -> Callable[[Any], Any]:
    """A converter of a parsed JSON value to a ``cls`` message, for the values whose fields it takes
    (see the module docstring); raises for any other value (ParseDict's to convert or refuse)."""
    from google.protobuf.descriptor import FieldDescriptor  # type: ignore[import-untyped,unused-ignore]

    kinds = {
        FieldDescriptor.CPPTYPE_INT32: _INT,
        FieldDescriptor.CPPTYPE_INT64: _INT,
        FieldDescriptor.CPPTYPE_UINT32: _INT,
        FieldDescriptor.CPPTYPE_UINT64: _INT,
        FieldDescriptor.CPPTYPE_DOUBLE: _DOUBLE,
        FieldDescriptor.CPPTYPE_FLOAT: _FLOAT,
        FieldDescriptor.CPPTYPE_BOOL: _BOOL,
        FieldDescriptor.CPPTYPE_ENUM: _ENUM,
    }
    taken: dict[str, tuple[str, int, dict[str, int] | None]] = {}
    by_json: dict[str, tuple[str, int, dict[str, int] | None]] = {}
    for field in cls.DESCRIPTOR.fields:
        oneof = field.containing_oneof
        # (protobuf 6.32 has is_repeated and deprecates label)
        repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == FieldDescriptor.LABEL_REPEATED
        if repeated or (oneof is not None and len(oneof.fields) > 1):
            continue
        if field.type == FieldDescriptor.TYPE_STRING:
            kind = _STR
        elif field.cpp_type in kinds:
            kind = kinds[field.cpp_type]
        else:  # messages, bytes
            continue
        names = None
        if kind == _ENUM:
            names = {v.name: v.number for v in field.enum_type.values}
        taken[field.name] = (field.name, kind, names)
        by_json[field.json_name] = (field.name, kind, names)
    taken.update(by_json)  # ParseDict looks a key up by JSON name first
    # the common row in one pass: every key a field's own name (no other field's JSON name), every
    # value of the one type the field takes as it is: the row is the constructor's keywords
    plain = {_INT: int, _STR: str, _BOOL: bool, _DOUBLE: float}
    quick: dict[str, type] = {
        key: plain[kind] for key, (name, kind, _) in taken.items() if key == name and kind in plain
    }

    def build(value: Any) -> Any:
        if type(value) is not dict:
            raise _Slow
        for key, v in value.items():
            t = quick.get(key)
            # NaN, infinities: ParseDict refuses them unquoted (mypy reads v as object after the type test)
            if t is not type(v) or (t is float and not isfinite(v)):  # type: ignore[arg-type]
                break
        else:
            return cls(**value)
        fields: dict[str, Any] = {}
        for key, v in value.items():
            spec = taken.get(key)
            if spec is None:
                raise _Slow
            name, kind, names = spec
            t = type(v)
            if kind == _INT or kind == _STR or kind == _BOOL:
                if t is not (int if kind == _INT else str if kind == _STR else bool):
                    raise _Slow
            elif kind == _DOUBLE:
                if t is int:
                    v = float(v)
                elif t is not float or v - v != 0.0:  # NaN, infinities: ParseDict refuses them unquoted
                    raise _Slow
            elif kind == _FLOAT:
                if t is not float or not -_FLOAT_MAX <= v <= _FLOAT_MAX:
                    raise _Slow
            else:
                v = names.get(v) if t is str and names is not None else None
                if v is None:
                    raise _Slow
            if name in fields:  # one field under its name and its JSON name: ParseDict decides
                raise _Slow
            fields[name] = v
        return cls(**fields)  # protobuf's own range and UTF-8 checks raise: ParseDict decides

    return build


class ProtobufWriter:
    """The rows of one registered Protobuf schema (by id): its message class, confluent-kafka's
    serializer for it, and the serializer's header (magic byte, id, message indexes) once seen.

    ``checked``: the serializer's header is known (its first row's bytes were the header plus
    ``SerializeToString()``), so rows are written directly; never for a schema with data-contract rules."""

    __slots__ = ("checked", "cls", "fast", "header", "schema_id", "serializer")

    def __init__(self, schema_id: int, cls: Any, serializer: Any, rules: bool) -> None:
        self.schema_id, self.cls, self.serializer = schema_id, cls, serializer
        #: None until the serializer's first bytes are seen; b"" when never direct
        self.header: bytes | None = b"" if rules else None
        self.checked = False
        self.fast = fast_builder(cls)

    def __repr__(self) -> str:
        return f"ProtobufWriter(schema_id={self.schema_id}, checked={self.checked})"

    def message(self, value: Any) -> Any:
        """``value`` as the message: the fast converter's, else ParseDict's (ValueError naming the field)."""
        from harvest_outbox.protobuf_schema import parse_json

        try:
            return self.fast(value)
        except Exception:  # not a value the fast converter takes: ParseDict converts it, or refuses
            return parse_json(self.cls, value)

    def encode(self, value: Any, ctx: Any) -> bytes:
        message = self.message(value)
        header = self.header
        if header:
            framed: bytes = header + message.SerializeToString()  # (a class built at run time: untyped)
            return framed
        encoded: bytes = self.serializer(message, ctx)
        if header is None:
            body = message.SerializeToString()
            direct = encoded.endswith(body) and encoded[:5] == wire_prefix(self.schema_id)
            self.header = encoded[: len(encoded) - len(body)] if direct else b""
            self.checked = bool(self.header)
        return encoded

    def encode_values(self, values: list[bytes]) -> list[bytes | None]:
        """Each stored JSON value written directly (a checked writer), or None: not JSON, or not a value
        the fast converter takes; the relay hands those to the serializer path (ParseDict, its words)."""
        out: list[bytes | None] = []
        append, fast, header = out.append, self.fast, self.header or b""
        for raw in values:
            try:
                append(header + fast(loads(raw)).SerializeToString())
            except Exception:
                append(None)
        return out


class ProtobufEncoder:
    """A JSON value as the registered Protobuf message: the message class is built from the schema the
    serializer encodes with (the subject's latest, or the pinned id), so a new latest version brings its
    own class; ``json_format.ParseDict`` refuses a value that does not fit (naming the field), and
    confluent-kafka's ProtobufSerializer writes the wire format (magic byte, schema id, message indexes).

    The schema is resolved once per batch (:meth:`start_batch`). The serializer's header (magic byte,
    id, the message's indexes) depends on the schema id and message class only, so once the serializer
    has written a schema id's first row, later rows are that header plus ``SerializeToString()``, what
    the serializer writes, without its per-call lookups (not for a schema with data-contract rules)."""

    def __init__(self, client: Any, subject: str, record_name: str, conf: dict[str, Any]) -> None:
        from harvest_outbox.protobuf_schema import SerializedProtobufClient

        self.client = SerializedProtobufClient(client)
        self.subject, self.record_name, self.conf = subject, record_name, conf
        self._by_id: dict[int, ProtobufWriter] = {}
        self._batch: int | None = None  # this batch's schema id

    def start_batch(self) -> ProtobufWriter:
        """Resolve the schema of the rows of the batch about to be encoded, once; its writer."""
        self._batch = None
        self._batch = self._resolve()
        return self._by_id[self._batch]

    def _resolve(self) -> int:
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

        from harvest_outbox.protobuf_schema import message_class

        schema_id, schema = self.conf.get("use.schema.id"), None
        if schema_id is None:  # the subject's latest, cached by the client for registry.latestTtl
            registered = self.client.get_latest_version(self.subject)
            schema_id, schema = registered.schema_id, registered.schema
        if schema_id not in self._by_id:
            if schema is None:
                schema = self.client.get_schema(schema_id)
            cls = message_class(schema.schema_str, self.record_name)
            conf = {**self.conf, "use.schema.id": schema_id}
            conf.pop("use.latest.version", None)
            serializer = ProtobufSerializer(cls, self.client, conf)
            self._by_id[schema_id] = ProtobufWriter(int(schema_id), cls, serializer, bool(schema.rule_set))
        return int(schema_id)  # (the registry client's answers are untyped: its ids are ints)

    def __call__(self, value: Any, ctx: Any) -> bytes:
        schema_id = self._batch if self._batch is not None else self._resolve()
        return self._by_id[schema_id].encode(value, ctx)
