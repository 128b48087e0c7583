"""Writing records into the outbox inside the caller's transaction.

``stash(conn, record)`` inserts one row; ``stash_many(conn, records)`` streams many through one
``COPY`` (one round trip for the lot; see ``tests/test_producer/test_stasher.py`` for the measured
speed-up over one INSERT each). Both run in whatever transaction ``conn`` is in, so the rows commit
or roll back with the caller's business writes — the whole point of an outbox.

Invariants:
- a record is validated before it reaches the database (:class:`~producer.errors.RecordError`
  naming the field), so a bad record fails the caller's transaction, not the relay;
- ``value=None`` is stored as SQL NULL and published as a tombstone;
- headers are ordered ``(key, value)`` pairs, stored as goharvest's two parallel TEXT[] columns;
- the relay is woken by the outbox's statement-level NOTIFY trigger (see :mod:`producer.schema`),
  which Postgres delivers at commit only — nothing to do here, and nothing if the tx rolls back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Union

import psycopg
from psycopg import sql

from producer.errors import RecordError
from producer.schema import OutboxNames, ValueType

Headers = Union[Sequence[tuple[str, "str | None"]], Mapping[str, "str | None"]]
_TOPIC = re.compile(r"^[a-zA-Z0-9._\-]{1,249}$")


@dataclass(frozen=True)
class OutboxRecord:
    """What an application stashes: topic, key, value (``None`` = tombstone) and headers."""

    topic: str
    key: str
    value: str | bytes | None = None
    headers: Headers = field(default_factory=tuple)


def _header_arrays(headers: Headers) -> tuple[list[str], list[str | None]]:
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
            raise RecordError(f"headers[{k!r}]: value must be a string or None (TEXT[] column), "
                              f"got {type(v).__name__}")
        keys.append(k)
        values.append(v)
    return keys, values


class Stasher:
    """Inserts :class:`OutboxRecord` rows into one outbox table."""

    def __init__(self, outbox_table: str = "outbox", value_type: ValueType = "varchar") -> None:
        self.names = OutboxNames.parse(outbox_table)
        self.value_type = value_type
        cols = sql.SQL("kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values")
        self._insert = sql.SQL("INSERT INTO {} ({}) VALUES (%s, %s, %s, %s, %s) RETURNING id").format(
            self.names.outbox, cols)
        self._copy = sql.SQL("COPY {} ({}) FROM STDIN").format(self.names.outbox, cols)

    def _row(self, record: OutboxRecord) -> tuple[str, str, str | bytes | None, list[str], list[str | None]]:
        if not isinstance(record.topic, str) or not _TOPIC.match(record.topic):
            raise RecordError(f"topic: {record.topic!r} is not a valid Kafka topic name "
                              f"(1-249 characters from [a-zA-Z0-9._-])")
        if not isinstance(record.key, str):
            raise RecordError(f"key: must be a string (outbox kafka_key is VARCHAR NOT NULL), got "
                              f"{type(record.key).__name__}")
        value = record.value
        if value is not None:
            if self.value_type == "bytea":
                if isinstance(value, str):
                    value = value.encode()
                elif not isinstance(value, (bytes, bytearray, memoryview)):
                    raise RecordError(f"value: must be bytes, str or None, got {type(value).__name__}")
                else:
                    value = bytes(value)
            else:
                if isinstance(value, (bytes, bytearray, memoryview)):
                    try:
                        value = bytes(value).decode("utf-8")
                    except UnicodeDecodeError:
                        raise RecordError("value: binary value is not UTF-8 but the outbox's kafka_value is "
                                          "VARCHAR; create the table with value type 'bytea'") from None
                elif not isinstance(value, str):
                    raise RecordError(f"value: must be str, bytes or None, got {type(value).__name__}")
                if "\x00" in value:
                    raise RecordError("value: contains NUL, which VARCHAR cannot hold; use a 'bytea' outbox")
        keys, values = _header_arrays(record.headers)
        return record.topic, record.key, value, keys, values

    def stash(self, conn: psycopg.Connection | psycopg.Cursor, record: OutboxRecord) -> int:
        """Insert one record in ``conn``'s current transaction; return its outbox id."""
        row = self._row(record)
        cur = conn.execute(self._insert, row)
        got = cur.fetchone()
        assert got is not None
        return int(got[0])

    def stash_many(self, conn: psycopg.Connection | psycopg.Cursor, records: Iterable[OutboxRecord]) -> int:
        """Insert many records with one COPY in ``conn``'s current transaction; return the count.
        Ids follow the iteration order."""
        rows = [self._row(r) for r in records]  # validate all before writing any
        if not rows:
            return 0
        cur = conn.cursor() if isinstance(conn, psycopg.Connection) else conn
        with cur.copy(self._copy) as copy:
            for row in rows:
                copy.write_row(row)
        return len(rows)


_default = Stasher()


def stash(conn: psycopg.Connection | psycopg.Cursor, record: OutboxRecord, outbox_table: str = "outbox",
          value_type: ValueType = "varchar") -> int:
    """Insert one record into ``outbox_table`` in ``conn``'s transaction; return its id."""
    s = _default if (outbox_table, value_type) == ("outbox", "varchar") else Stasher(outbox_table, value_type)
    return s.stash(conn, record)


def stash_many(conn: psycopg.Connection | psycopg.Cursor, records: Iterable[OutboxRecord],
               outbox_table: str = "outbox", value_type: ValueType = "varchar") -> int:
    """Insert many records (one COPY) into ``outbox_table`` in ``conn``'s transaction."""
    s = _default if (outbox_table, value_type) == ("outbox", "varchar") else Stasher(outbox_table, value_type)
    return s.stash_many(conn, records)
