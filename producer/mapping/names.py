"""The names of the outbox table and of the objects the relay adds next to it, as SQL fragments.

Invariants:
- identifiers are always passed through :class:`psycopg.sql.Identifier`; a table name is split into at
  most (schema, table) by :func:`parse_table_name` (Postgres' quoting rules) and never interpolated raw;
- every derived name (``<table>_dead_letters``, ...) fits Postgres' 63-byte identifier limit, and a
  truncated one stays distinct (a hash of the table's name).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal

from psycopg import sql

from harvest_outbox.producer.errors import ConfigError, shown
from harvest_outbox.producer.mapping.goharvest import GOHARVEST
from harvest_outbox.producer.mapping.protocol import TableMapping

ValueType = Literal["varchar", "bytea"]
#: A complete statement as harvest composes them (psycopg.sql): what execute() and mogrify() take.
Statement = sql.SQL | sql.Composed
_MAX_IDENT = 63  # NAMEDATALEN - 1


def parse_table_name(name: str) -> tuple[str | None, str]:
    """``"outbox"`` -> ``(None, "outbox")``; ``"app.outbox"`` -> ``("app", "outbox")``;
    ``'"My Schema"."Out.box"'`` -> ``("My Schema", "Out.box")`` (double quotes allow dots/case)."""
    parts: list[str] = []
    text = name.strip()
    i = 0
    while i < len(text):
        if text[i] == '"':
            j = i + 1
            buf = []
            while True:
                k = text.find('"', j)
                if k < 0:
                    raise ConfigError(f"outboxTable: {shown(name)} has an unterminated double quote")
                buf.append(text[j:k])
                if k + 1 < len(text) and text[k + 1] == '"':
                    buf.append('"')
                    j = k + 2
                    continue
                i = k + 1
                break
            parts.append("".join(buf))
        else:
            k = text.find(".", i)
            k = len(text) if k < 0 else k
            part = text[i:k]
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*", part):
                raise ConfigError(
                    f"outboxTable: {shown(name)}: {shown(part)} is not a plain identifier; quote it "
                    f"with double quotes, e.g. {shown(chr(34) + part + chr(34))}"
                )
            parts.append(part.lower())  # Postgres folds unquoted names to lower case
            i = k
        if i < len(text):
            if text[i] != ".":
                raise ConfigError(f"outboxTable: {shown(name)}: expected '.' between schema and table")
            i += 1
            if i == len(text):
                raise ConfigError(f"outboxTable: {shown(name)} ends with '.'")
    if not parts or len(parts) > 2 or any(not p for p in parts):
        raise ConfigError(f"outboxTable: {shown(name)} must be 'table' or 'schema.table'")
    for part in parts:
        if len(part.encode()) > _MAX_IDENT:
            raise ConfigError(f"outboxTable: {shown(part)} is longer than Postgres' {_MAX_IDENT}-byte identifier limit")
    return (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])


def derived_name(base: str, suffix: str) -> str:
    """``base + suffix`` kept within 63 bytes (a hash keeps truncated names distinct)."""
    name = base + suffix
    if len(name.encode()) <= _MAX_IDENT:
        return name
    digest = hashlib.sha1(base.encode()).hexdigest()[:8]
    return base.encode()[: _MAX_IDENT - len(suffix) - 9].decode(errors="ignore") + "_" + digest + suffix


@dataclass(frozen=True)
class OutboxNames:
    """Quoted SQL fragments for the outbox and its companions."""

    schema: str | None
    table: str
    #: Which columns make a record (goharvest's table, or Debezium's outbox: producer.mapping.protocol).
    mapping: TableMapping = GOHARVEST

    @classmethod
    def parse(cls, outbox_table: str, mapping: TableMapping = GOHARVEST) -> OutboxNames:
        schema, table = parse_table_name(outbox_table)
        return cls(schema, table, mapping)

    def _ident(self, name: str) -> sql.Identifier:
        return sql.Identifier(self.schema, name) if self.schema else sql.Identifier(name)

    @property
    def outbox(self) -> sql.Identifier:
        return self._ident(self.table)

    @property
    def dead_letters(self) -> sql.Identifier:
        return self._ident(derived_name(self.table, "_dead_letters"))

    @property
    def state(self) -> sql.Identifier:
        return self._ident(derived_name(self.table, "_harvest_state"))

    @property
    def ack_intents(self) -> sql.Identifier:
        return self._ident(derived_name(self.table, "_ack_intents"))

    @property
    def delivery_attempts(self) -> sql.Identifier:
        return self._ident(derived_name(self.table, "_delivery_attempts"))

    @property
    def layout(self) -> sql.Identifier:
        return self._ident(derived_name(self.table, "_harvest_layout"))

    @property
    def shard_state(self) -> sql.Identifier:
        return self._ident(derived_name(self.table, "_harvest_shards"))

    @property
    def cursor(self) -> sql.Identifier:
        """``outboxLayout: cursor``: the relay's position (producer/layouts/cursor/schema.py)."""
        return self._ident(derived_name(self.table, "_harvest_cursor"))

    @property
    def held(self) -> sql.Identifier:
        """``outboxLayout: cursor`` under ``haltKey``: a halted key's rows, copied (producer/layouts/cursor/held.py)."""
        return self._ident(derived_name(self.table, "_held"))

    @property
    def held_index_name(self) -> str:
        return derived_name(self.table, "_held_key_idx")

    @property
    def id_sequence(self) -> sql.Identifier:
        """``outboxLayout: cursor``: the sequence of the ordering column (``CACHE 1``; its default takes the xid
        first): ``id``'s, or a Debezium table's ``harvest_seq``'s (the mark layout's name for it: a table moved
        from that layout by hand keeps drawing above the ids its dead letters and attempt counts hold)."""
        return self._ident(derived_name(self.table, self.mapping.sequence_suffix))

    def partition_name(self, start: int) -> str:
        """``outboxLayout: cursor``: the id-range partition starting at id ``start``."""
        return derived_name(self.table, f"_p{start}")

    def shard_index_name(self, count: int) -> str:
        # _v2: the expression maps a NULL key to a shard (producer/relay/shards.py); an index is used only for
        # its own expression, so a new expression needs a name `init-db` has not created yet.
        return derived_name(self.table, f"_shard{count}_v2_idx")

    def old_shard_index_name(self, count: int) -> str:
        """The index an older harvest built, on the expression that left NULL-key rows in no shard."""
        return derived_name(self.table, f"_shard{count}_idx")

    @property
    def notify_function(self) -> sql.Identifier:
        return self._ident("harvest_notify")

    @property
    def notify_trigger(self) -> sql.Identifier:
        return sql.Identifier(self.notify_trigger_name)

    @property
    def notify_trigger_name(self) -> str:
        return derived_name(self.table, "_notify")

    def qualified(self, name: str) -> sql.Identifier:
        """``name`` (an index, a table) in the outbox's schema."""
        return self._ident(name)

    @property
    def dead_time_index_name(self) -> str:
        return derived_name(self.table, "_dead_letters_time_idx")

    @property
    def dead_key_index_name(self) -> str:
        return derived_name(self.table, "_dead_letters_key_idx")

    @property
    def id_index_name(self) -> sql.Identifier:
        return sql.Identifier(derived_name(self.table, "_leader_id_idx"))

    @property
    def channel(self) -> str:
        """LISTEN/NOTIFY channel: ``harvest_<schema>_<table>``, hashed if too long."""
        return derived_name("harvest_" + (f"{self.schema}_" if self.schema else "") + self.table, "")

    @property
    def display(self) -> str:
        return f"{self.schema}.{self.table}" if self.schema else self.table
