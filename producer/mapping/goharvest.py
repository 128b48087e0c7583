"""goharvest's outbox table as it is (``id``, ``create_time``, ``kafka_topic``, ``kafka_key``,
``kafka_value``, ``kafka_header_keys``/``_values``, ``leader_id``): the default table mapping
(:class:`~producer.mapping.protocol.TableMapping`).

Invariant (tests/test_producer/mapping/test_table_mapping.py): :data:`GOHARVEST` produces exactly the SQL the relay
used before mappings existed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from psycopg import sql

from harvest_outbox.producer.errors import SchemaError
from harvest_outbox.producer.mapping.protocol import RecordSql, column

if TYPE_CHECKING:
    import psycopg

    from harvest_outbox.producer.mapping.names import OutboxNames, Statement, ValueType

#: The columns the relay reads and writes.
COLUMNS = frozenset(
    {
        "id",
        "create_time",
        "kafka_topic",
        "kafka_key",
        "kafka_value",
        "kafka_header_keys",
        "kafka_header_values",
        "leader_id",
    }
)

# Why a marked row can never be produced, decided in the mark statement. Its texts are the dead
# letters' errors (see producer.db: _HEADER_BAD checks header arrays on the returned rows).
_BAD = """CASE
  WHEN {o}.kafka_topic IS NULL OR {o}.kafka_topic = '' THEN
    'kafka_topic is NULL or empty: the row has nowhere to go; fix kafka_topic and requeue'
  WHEN {o}.kafka_key IS NULL THEN 'kafka_key is NULL: goharvest''s schema requires a key; set kafka_key and requeue'
  WHEN {o}.kafka_header_keys IS NULL OR {o}.kafka_header_values IS NULL THEN
    'kafka_header_keys/kafka_header_values is NULL: use empty arrays ''{{}}'' for no headers'
END"""


class GoharvestMapping:
    """goharvest's outbox table, unchanged."""

    kind = "goharvest"
    described = "goharvest's table"
    id_column = "id"
    leader_column = "leader_id"
    created_column = "create_time"
    sequence_suffix = "_id_seq"
    partition_column: str | None = None
    event_id_source: str | None = None
    row_is_record = True
    adopts_existing_table = False

    def __repr__(self) -> str:
        return "GOHARVEST"

    def id(self, alias: str | None = None) -> sql.Identifier:
        return column(alias, self.id_column)

    def leader(self, alias: str | None = None) -> sql.Identifier:
        return column(alias, self.leader_column)

    def created(self, alias: str | None = None) -> sql.Identifier:
        return column(alias, self.created_column)

    def shard_key(self, alias: str | None = None) -> sql.Composable:
        return column(alias, "kafka_key")

    def relayed(self, alias: str | None = None) -> sql.Composable | None:
        return None

    def claimable(self, joiner: str = "WHERE", alias: str | None = None) -> sql.Composable:
        return sql.SQL("")

    def record(self, alias: str, value_type: str) -> RecordSql:
        o = sql.Identifier(alias)

        def c(name: str) -> sql.Composable:
            return column(alias, name)

        value = c("kafka_value") if value_type == "bytea" else sql.SQL("{}::varchar").format(c("kafka_value"))
        return RecordSql(
            topic=sql.SQL("{}::text").format(c("kafka_topic")),
            key=sql.SQL("{}::varchar").format(c("kafka_key")),
            value=value,
            header_keys=sql.SQL("NULLIF({}::text[], '{{}}')").format(c("kafka_header_keys")),
            header_values=sql.SQL("NULLIF({}::text[], '{{}}')").format(c("kafka_header_values")),
            bad=sql.SQL(_BAD).format(o=o),
        )

    def source_row(self, alias: str) -> sql.Composable | None:
        return None

    def outbox_ddl(self, names: OutboxNames, value_type: ValueType, fillfactor: int) -> list[Statement]:
        # goharvest's DDL (sh/init-outbox.sh) with the length limits dropped (they only get in the way),
        # create_time defaulted so writers may omit it, and pages left half empty (OUTBOX_FILLFACTOR).
        vtype = sql.SQL("BYTEA" if value_type == "bytea" else "VARCHAR")
        return [
            sql.SQL("""
        CREATE TABLE IF NOT EXISTS {outbox} (
          id                  BIGSERIAL PRIMARY KEY,
          create_time         TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
          kafka_topic         VARCHAR NOT NULL,
          kafka_key           VARCHAR NOT NULL,
          kafka_value         {vtype},
          kafka_header_keys   TEXT[] NOT NULL,
          kafka_header_values TEXT[] NOT NULL,
          leader_id           UUID
        ) WITH (fillfactor = {ff})""").format(outbox=names.outbox, vtype=vtype, ff=sql.Literal(fillfactor))
        ]

    def cursor_columns(
        self, value_type: str, id_default: sql.Composable, mapped_columns: list[sql.Composable] | None
    ) -> sql.Composable:
        # goharvest's columns as init-db makes them for the mark layout, fillfactor 100 (rows are never updated)
        vtype = sql.SQL("BYTEA" if value_type == "bytea" else "VARCHAR")
        return sql.SQL("""
          id                  BIGINT NOT NULL DEFAULT {id_default},
          create_time         TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
          kafka_topic         VARCHAR NOT NULL,
          kafka_key           VARCHAR NOT NULL,
          kafka_value         {vtype},
          kafka_header_keys   TEXT[] NOT NULL,
          kafka_header_values TEXT[] NOT NULL,
          leader_id           UUID""").format(id_default=id_default, vtype=vtype)

    def id_index(self, names: OutboxNames) -> str | None:
        return None

    def value_type(self, columns: Mapping[str, str]) -> ValueType:
        return "bytea" if columns.get("kafka_value") == "bytea" else "varchar"

    def check_columns(self, conn: psycopg.Connection, names: OutboxNames, columns: Mapping[str, str]) -> ValueType:
        missing = COLUMNS - columns.keys()
        if missing:
            raise SchemaError(
                f"outbox table {names.display!r} lacks column(s) {', '.join(sorted(missing))}; "
                f"expected goharvest's schema ({', '.join(sorted(COLUMNS))})"
            )
        return self.value_type(columns)

    def ready(self, value_type: str, companions: str) -> str:
        return f"ready (value type {value_type}; {companions})"


GOHARVEST = GoharvestMapping()
