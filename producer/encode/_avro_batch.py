"""Avro values written as confluent-kafka's ``AvroSerializer`` writes them, without its per-call work.

The relay encodes a batch of marked rows at a time (producer/encode/serialization.py). Through the
serializer, every row paid for the subject's latest version again (a locked TTL-cache lookup), a
``BytesIO``, the serializer's rule machinery and the stdlib JSON parser: ~9 µs of the relay's one
interpreter per row, which halved the drain. Here the writer schema is resolved once per batch and
topic (:class:`AvroWriter`, one per schema id), and a row costs the JSON parse (orjson when
installed, ~0.4 µs) and one pass of code compiled from the schema that checks and writes it
(producer/encode/_avro_compiled.py, ~0.5 µs for a five-field record), where fastavro's strict validation
(~1.5 µs) and its ``schemaless_writer`` (~1.7 µs) each walked the schema again for every row. A
value the compiled code does not take (it does not fit, or is not a plain JSON value) goes through
fastavro's ``validate`` and ``schemaless_writer`` as before, so a refusal is fastavro's, word for word.

Invariants (tests/test_producer/encode/test_avro_batch.py, against confluent-kafka's own serde):
- :meth:`AvroWriter.encode` returns the Confluent wire format: magic byte 0, the schema id as 4 bytes
  big-endian, fastavro's schemaless body; byte for byte ``AvroSerializer``'s output for records with
  unions, nullables, nested records, enums, arrays, maps and logical types, and ``AvroDeserializer``
  reads it back. The relay still compares the two on each schema id's first row before trusting it
  (:attr:`AvroWriter.checked`), so a schema the serializer treats differently (a top-level ``bytes``
  schema, references, data-contract rules) keeps going through the serializer;
- nothing is coerced: a value is validated strictly before it is written (fastavro's writer alone
  writes 1.5 into a ``long`` as 1), and a value that does not fit raises fastavro's
  ``ValidationError``, naming the field; the compiled pass writes only what fastavro's validate
  accepts, with the bytes fastavro writes (tests/test_producer/encode/test_avro_compiled.py);
- :func:`loads` accepts exactly what ``json.loads`` accepts, with the same result: orjson first, the
  stdlib on whatever orjson refuses (NaN, lone surrogates, UTF-16) and on rows that may hold an
  integer beyond 64 bits (orjson reads one as a float: a top-level float of magnitude 2**63 or more, or,
  where values are nested, a run of 19 or more digits in the text), so the rows that are "not JSON"
  are the stdlib's, with its error message.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from harvest_outbox.producer.schema.reasons import not_json_reason, validation_reason

_fast_loads: Callable[[bytes], Any] | None
try:  # the registry extra installs it; without it, the stdlib parses (about 2 µs more per row)
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - depends on the environment
    _fast_loads = None

__all__ = ["AvroWriter", "encode_values", "loads", "wire_prefix"]

log = logging.getLogger(__name__)


#: Every digit as "0", everything else as " ": a run of 19 digits shows up as _LONG_RUN after translate.
_DIGITS = bytes(48 if 48 <= c <= 57 else 32 for c in range(256))
#: orjson turns an integer literal outside [-2**63, 2**64) into a float (json.loads keeps an int);
#: such a literal has at least 19 digits, so rows with a 19-digit run are left to the stdlib.
_LONG_RUN = b"0" * 19
#: ... and that float's magnitude is at least 2**63: a parse whose floats are all smaller held no such
#: literal.
_INT_FLOAT = float(2**63)


def loads(raw: bytes | str) -> Any:
    """``raw`` parsed as ``json.loads`` parses it (see the module's invariants); raises ValueError."""
    if _fast_loads is not None and type(raw) is bytes:
        try:
            value = _fast_loads(raw)
        except ValueError:
            return json.loads(raw)  # the stdlib decides (and words the error): it accepts NaN, lone surrogates, UTF-16
        exact = _no_int_floats(value)
        if exact or (exact is None and _LONG_RUN not in raw.translate(_DIGITS)):
            return value
    return json.loads(raw)


def _no_int_floats(value: Any) -> bool | None:
    """Whether orjson's parse ``value`` holds no float that could be an integer literal it turned into one:
    True when no top-level value is a float of magnitude 2**63 or more, False when one is, None when a
    nested object or array would need a walk (the caller then scans the text for a 19-digit run: ~0.5 µs
    for a row of ~100 bytes, against ~0.15 µs for this look at a flat row's values)."""
    values = value.values() if type(value) is dict else value if type(value) is list else (value,)
    for v in values:
        t = type(v)
        if t is float:
            if not -_INT_FLOAT < v < _INT_FLOAT:
                return False
        elif t is dict or t is list:
            return None
    return True


def _leave_to_fastavro(value: Any) -> bytes:
    raise ValueError("not compiled")


def wire_prefix(schema_id: int) -> bytes:
    """The Confluent wire format's 5-byte header: magic byte 0, the schema id big-endian."""
    return b"\x00" + schema_id.to_bytes(4, "big")


class AvroWriter:
    """The values of one registered Avro schema (by id), validated and written directly.

    ``checked`` is None until the relay has compared this writer's bytes with the serializer's on a
    real row, then True (they were equal: write directly) or False (use the serializer)."""

    __slots__ = ("_compiled", "_validate", "_write", "checked", "parsed", "prefix", "schema_id", "schema_str")

    def __init__(self, schema_id: int, schema_str: str) -> None:
        # fastavro comes with the `registry` extra: imported here, not at module level, because the
        # relay core imports this module whether or not a topic is encoded.
        from fastavro import parse_schema, schemaless_writer
        from fastavro.validation import validate

        from harvest_outbox.producer.encode._avro_compiled import compile_schema

        self._validate: Callable[..., Any] = validate
        self._write: Callable[..., Any] = schemaless_writer
        self.schema_id, self.schema_str = schema_id, schema_str
        named: dict[str, Any] = {}
        self.parsed: Any = parse_schema(json.loads(schema_str), named)
        #: the schema's fused check-and-write pass; raises when it leaves a value to fastavro
        self._compiled: Callable[[Any], bytes]
        try:
            self._compiled = compile_schema(self.parsed, named).write
        except Exception:  # a schema fastavro parsed but the compiler cannot take: fastavro writes all
            log.warning("schema id %d: not compiled, fastavro validates and writes its rows", schema_id, exc_info=True)
            self._compiled = _leave_to_fastavro
        self.prefix = wire_prefix(schema_id)
        self.checked: bool | None = None

    def __repr__(self) -> str:
        return f"AvroWriter(schema_id={self.schema_id}, checked={self.checked})"

    def validate(self, value: Any) -> None:
        """Raises fastavro's ValidationError (its ``errors`` name each field) if ``value`` does not fit."""
        self._validate(value, self.parsed, raise_errors=True)

    def write(self, value: Any) -> bytes:
        """``value`` (already validated) in the wire format, as :meth:`encode` writes it: the relay
        compares this with the serializer's bytes before it trusts the writer."""
        try:
            return self.prefix + self._compiled(value)
        except Exception:  # not a value the compiled pass takes: fastavro writes it
            pass
        buf = io.BytesIO()
        buf.write(self.prefix)
        self._write(buf, self.parsed, value)
        return buf.getvalue()

    def encode(self, value: Any) -> bytes:
        """``value`` validated strictly, then written in the wire format: by the compiled pass, or, for
        a value it leaves alone (does not fit, or is not a plain JSON value), by fastavro."""
        try:
            return self.prefix + self._compiled(value)
        except Exception:  # whatever it is, fastavro decides (and words the refusal)
            pass
        return self.encode_by_fastavro(value)

    def encode_by_fastavro(self, value: Any) -> bytes:
        """``value`` validated by fastavro's ``validate`` and written by its ``schemaless_writer``."""
        self._validate(value, self.parsed, raise_errors=True)
        buf = io.BytesIO()
        buf.write(self.prefix)
        self._write(buf, self.parsed, value)
        return buf.getvalue()


def encode_values(writer: AvroWriter, values: Sequence[bytes]) -> list[bytes | str]:
    """Each stored JSON value encoded by ``writer`` (a checked one), or the reason it cannot be (a str:
    not JSON, or does not fit the schema). Pure: the relay runs it in its mark worker or, with
    ``serialization.encodeWorker``, in a child process (producer/encode/worker.py)."""
    out: list[bytes | str] = []
    append, compiled, prefix, slow = out.append, writer._compiled, writer.prefix, writer.encode_by_fastavro
    for raw in values:
        try:
            value = loads(raw)
        except ValueError as exc:
            append(not_json_reason(exc, raw))
            continue
        try:  # AvroWriter.encode, inlined: this loop is the relay's per-row cost
            append(prefix + compiled(value))
            continue
        except Exception:  # fastavro decides
            pass
        try:
            append(slow(value))
        except Exception as exc:  # fastavro's ValidationError, or its writer's TypeError/ValueError
            append(validation_reason(exc, "value"))
    return out
