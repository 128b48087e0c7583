"""What every stasher shares: the record type, its validation into an outbox row, and the SQL.

The synchronous stasher (:mod:`producer.stash.stasher`), the asyncio one (:mod:`producer.stash.async_stasher`)
and the SQLAlchemy binding (:mod:`producer.stash.sqlalchemy`) only differ in how they run the two
statements built here; everything that decides *what* is written lives in :class:`StashPlan`.

Invariants:
- a record is validated before it reaches the database (:class:`~producer.errors.RecordError`
  naming the field), so a bad record fails the caller's transaction, not the relay; a batch is
  validated whole before any of it is written;
- ``value=None`` is stored as SQL NULL and published as a tombstone;
- headers are ordered ``(key, value)`` pairs, stored as goharvest's two parallel TEXT[] columns;
- with ``trace_context`` on and OpenTelemetry installed, the current W3C ``traceparent`` /
  ``tracestate`` are appended as headers, unless the record already carries a ``traceparent``
  (an explicit one wins); a batch is stashed in one context, so its trace headers are computed once;
- identifiers are composed with :mod:`psycopg.sql` (never interpolated).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from psycopg import sql

if TYPE_CHECKING:
    from harvest_outbox.producer.stash.validation import StashValidator

from harvest_outbox.producer._kafka_names import LEGAL_NAME, NAME_RULE
from harvest_outbox.producer.errors import ConfigError, RecordError
from harvest_outbox.producer.observe.tracing import TRACEPARENT, current_trace_headers
from harvest_outbox.producer.schema import OutboxNames, ValueType
from harvest_outbox.producer.stash._text_array import LiteralCache

Headers = Sequence[tuple[str, "str | None"]] | Mapping[str, "str | None"]
#: One outbox row as both statements take it: topic, key, value, header keys, header values.
Row = tuple[str, str, "str | bytes | None", list[str], "list[str | None]"]
#: One outbox row as COPY takes it: the header arrays as array literals (producer.stash._text_array).
CopyRow = tuple[str, str, "str | bytes | None", str, str]
_COLUMNS = sql.SQL("kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values")


@dataclass(frozen=True)
class OutboxRecord:
    """What an application stashes: topic, key, value (``None`` = tombstone) and headers
    (``None`` = no headers, as the default ``()``)."""

    topic: str
    key: str
    value: str | bytes | None = None
    headers: Headers | None = field(default_factory=tuple)


def require_unicode(field: str, text: str) -> None:
    """Refuse text Postgres cannot store (a lone surrogate, e.g. left by a ``surrogateescape`` decode): psycopg
    would fail the write midway with the codec's error, naming neither the record nor the field."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RecordError(
            f"{field}: U+{ord(text[exc.start]):04X} at position {exc.start} is a lone surrogate, not a character "
            "UTF-8 can store; fix the decoding that produced the text (e.g. errors='surrogateescape')"
        ) from None


def header_arrays(headers: Headers | None) -> tuple[list[str], list[str | None]]:
    if headers is None:
        return [], []
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    keys: list[str] = []
    values: list[str | None] = []
    for pair in pairs:
        try:
            k, v = pair
        except (TypeError, ValueError):
            raise RecordError(f"headers: {pair!r} is not a (key, value) pair") from None
        if not isinstance(k, str):
            raise RecordError(f"headers: key {k!r} must be a string")
        if v is not None and not isinstance(v, str):
            raise RecordError(f"headers[{k!r}]: value must be a string or None (TEXT[] column), got {type(v).__name__}")
        require_unicode("headers: a key", k)
        if "\x00" in k:
            raise RecordError(f"headers: key {k!r} contains NUL, which TEXT cannot hold")
        if v is not None:
            require_unicode(f"headers[{k!r}]", v)
            if "\x00" in v:
                raise RecordError(f"headers[{k!r}]: value contains NUL, which TEXT cannot hold")
        keys.append(k)
        values.append(v)
    return keys, values


class StashPlan:
    """The validated rows and the two statements (INSERT … RETURNING id, COPY) for one outbox table."""

    def __init__(
        self,
        outbox_table: str = "outbox",
        value_type: ValueType = "varchar",
        *,
        trace_context: bool = True,
        validate: StashValidator | None = None,
    ) -> None:
        #: Optional check against cached registry schemas (producer.stash.validation); None: none.
        self.validate = validate
        if value_type not in ("varchar", "bytea"):
            raise ConfigError(
                f"value_type: {value_type!r} is not an outbox value type; use 'varchar' or 'bytea' "
                f"(as the table was created by init_db)"
            )
        self.names = OutboxNames.parse(outbox_table)
        self.value_type: ValueType = value_type
        self.trace_context = trace_context
        self.insert = sql.SQL("INSERT INTO {} ({}) VALUES (%s, %s, %s, %s, %s) RETURNING id").format(
            self.names.outbox, _COLUMNS
        )
        self.copy = sql.SQL("COPY {} ({}) FROM STDIN").format(self.names.outbox, _COLUMNS)
        #: How COPY dumps :meth:`rows`' columns (``Copy.set_types``): fixed per column, not looked up per
        #: value, and the header arrays as the text of their literals (the server parses them as TEXT[]).
        self.copy_types = ("text", "text", "bytea" if value_type == "bytea" else "text", "text", "text")

    def _value(self, value: object) -> str | bytes | None:
        if value is None:
            return None
        if self.value_type == "bytea":
            if isinstance(value, str):
                require_unicode("value", value)
                return value.encode()
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise RecordError(f"value: must be bytes, str or None, got {type(value).__name__}")
            return bytes(value)
        if isinstance(value, (bytes, bytearray, memoryview)):
            try:
                value = bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                raise RecordError(
                    "value: binary value is not UTF-8 but the outbox's kafka_value is "
                    "VARCHAR; create the table with value type 'bytea'"
                ) from None
        elif not isinstance(value, str):
            raise RecordError(f"value: must be str, bytes or None, got {type(value).__name__}")
        if "\x00" in value:
            raise RecordError("value: contains NUL, which VARCHAR cannot hold; use a 'bytea' outbox")
        require_unicode("value", value)
        return value

    def _row(self, record: OutboxRecord, trace: list[tuple[str, str]]) -> Row:
        if not isinstance(record, OutboxRecord):
            raise RecordError(f"record: expected a producer.OutboxRecord, got {type(record).__name__}")
        if not isinstance(record.topic, str) or not LEGAL_NAME.match(record.topic):
            raise RecordError(f"topic: {record.topic!r} is not a valid Kafka topic name ({NAME_RULE})")
        if not isinstance(record.key, str):
            raise RecordError(
                f"key: must be a string (outbox kafka_key is VARCHAR NOT NULL), got {type(record.key).__name__}"
            )
        require_unicode("key", record.key)
        if "\x00" in record.key:
            raise RecordError("key: contains NUL, which VARCHAR cannot hold")
        value = self._value(record.value)
        if self.validate is not None:
            self.validate.check(record.topic, value)  # a local cache only: no network in the transaction
        keys, values = header_arrays(record.headers)
        if trace and TRACEPARENT not in keys:
            for k, v in trace:
                keys.append(k)
                values.append(v)
        return record.topic, record.key, value, keys, values

    def _trace(self) -> list[tuple[str, str]]:
        return current_trace_headers() if self.trace_context else []

    def row(self, record: OutboxRecord) -> Row:
        """``record`` validated into the INSERT's parameters (plus the current trace context)."""
        return self._row(record, self._trace())

    def rows(self, records: Iterable[OutboxRecord]) -> list[CopyRow]:
        """All ``records`` validated (the first bad one raises) into COPY rows (:attr:`copy_types`)."""
        trace = self._trace()
        literal = LiteralCache().literal
        rows: list[CopyRow] = []
        for r in records:
            topic, key, value, keys, values = self._row(r, trace)
            rows.append((topic, key, value, literal(keys), literal(values)))
        return rows
