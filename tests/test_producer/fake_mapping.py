"""A third table mapping, for tests: a table whose columns are none of goharvest's or Debezium's names
(``seq``, ``owner``, ``born``; the record from ``dest``, ``k``, ``body``). A statement that reads the outbox
through it and still names another mapping's column hard-codes that mapping instead of asking the
one it is given (tests/test_producer/mapping/test_mapping_protocol.py)."""

from __future__ import annotations

from collections.abc import Mapping

import psycopg
from psycopg import sql

from harvest_outbox.producer.errors import SchemaError
from harvest_outbox.producer.mapping.names import OutboxNames, Statement, ValueType
from harvest_outbox.producer.mapping.protocol import RecordSql, claimable, column

WRITERS = ("dest", "k", "body")


class FakeMapping:
    kind = "fake"
    described = "a fake table"
    id_column = "seq"
    leader_column = "owner"
    created_column = "born"
    sequence_suffix = "_fake_seq"
    partition_column: str | None = None
    event_id_source: str | None = None
    row_is_record = False
    adopts_existing_table = False

    def id(self, alias: str | None = None) -> sql.Identifier:
        return column(alias, self.id_column)

    def leader(self, alias: str | None = None) -> sql.Identifier:
        return column(alias, self.leader_column)

    def created(self, alias: str | None = None) -> sql.Identifier:
        return column(alias, self.created_column)

    def shard_key(self, alias: str | None = None) -> sql.Composable:
        return column(alias, "k")

    def relayed(self, alias: str | None = None) -> sql.Composable | None:
        return sql.SQL("{} IS NOT NULL").format(self.id(alias))

    def claimable(self, joiner: str = "WHERE", alias: str | None = None) -> sql.Composable:
        return claimable(self.relayed(alias), joiner)

    def record(self, alias: str, value_type: str) -> RecordSql:
        return RecordSql(
            topic=column(alias, "dest"),
            key=column(alias, "k"),
            value=column(alias, "body"),
            header_keys=sql.SQL("NULL::text[]"),
            header_values=sql.SQL("NULL::text[]"),
            bad=sql.SQL("CASE WHEN {} IS NULL THEN 'no dest' END").format(column(alias, "dest")),
        )

    def source_row(self, alias: str) -> sql.Composable | None:
        return sql.SQL("to_jsonb({})").format(sql.Identifier(alias))

    def _writers(self, value_type: str) -> list[sql.Composable]:
        body = "BYTEA" if value_type == "bytea" else "TEXT"
        return [sql.SQL("dest TEXT"), sql.SQL("k TEXT"), sql.SQL(f"body {body}")]

    def outbox_ddl(self, names: OutboxNames, value_type: ValueType, fillfactor: int) -> list[Statement]:
        cols = [
            sql.SQL("{} BIGSERIAL PRIMARY KEY").format(self.id()),
            sql.SQL("{} UUID").format(self.leader()),
            sql.SQL("{} TIMESTAMPTZ NOT NULL DEFAULT now()").format(self.created()),
            *self._writers(value_type),
        ]
        return [
            sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}) WITH (fillfactor = {})").format(
                names.outbox, sql.SQL(", ").join(cols), sql.Literal(fillfactor)
            )
        ]

    def cursor_columns(
        self, value_type: str, id_default: sql.Composable, mapped_columns: list[sql.Composable] | None
    ) -> sql.Composable:
        return sql.SQL(", ").join(
            [
                *(mapped_columns if mapped_columns is not None else self._writers(value_type)),
                sql.SQL("{} BIGINT NOT NULL DEFAULT {}").format(self.id(), id_default),
                sql.SQL("{} UUID").format(self.leader()),
                sql.SQL("{} TIMESTAMPTZ NOT NULL DEFAULT now()").format(self.created()),
            ]
        )

    def id_index(self, names: OutboxNames) -> str | None:
        return None

    def value_type(self, columns: Mapping[str, str]) -> ValueType:
        return "bytea" if columns.get("body") == "bytea" else "varchar"

    def check_columns(self, conn: psycopg.Connection, names: OutboxNames, columns: Mapping[str, str]) -> ValueType:
        missing = {*WRITERS, self.id_column, self.leader_column, self.created_column} - columns.keys()
        if missing:
            raise SchemaError(f"outbox table {names.display!r} lacks {', '.join(sorted(missing))}")
        return self.value_type(columns)

    def ready(self, value_type: str, companions: str) -> str:
        return f"ready as a fake outbox ({companions})"
