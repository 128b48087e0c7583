"""``outboxLayout: cursor``: :class:`CursorLayout`, the :class:`~producer.layouts.layout.OutboxLayout` of a
partitioned outbox the relay never writes to: it reads rows by snapshot and moves a committed cursor past
them (docs/design.md, "Outbox layouts"; the table: :mod:`~producer.layouts.cursor.schema`; the relay's
database: :mod:`~producer.layouts.cursor.database`).

Invariant: a setting this layout cannot keep without losing a row is refused with the config
(:meth:`CursorLayout.refuse`), never run.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from harvest_outbox.producer.db import StatementPool
from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.producer.layouts.cursor.database import CursorDatabase, backlog_sql, cursor_backlog
from harvest_outbox.producer.layouts.cursor.held import held_table, requeue_into_held_sql, require_passed
from harvest_outbox.producer.layouts.cursor.partitions import PartitionKeeper
from harvest_outbox.producer.layouts.cursor.schema import (
    PARTITIONS_AHEAD,
    add_shard_cursors,
    create_partition,
    cursor_outbox_ddl,
    range_partitions,
    require_cursor_table,
    require_server,
)
from harvest_outbox.producer.layouts.cursor.views import CursorViews
from harvest_outbox.producer.layouts.layout import LayoutChecks, LayoutSettings, RelayDatabase, T_co
from harvest_outbox.producer.mapping.names import OutboxNames, Statement, ValueType
from harvest_outbox.producer.schema.need import Need, schema_of


class CursorLayout:
    """The cursor layout (module doc)."""

    @property
    def name(self) -> str:
        return "cursor"

    def refuse(self, settings: LayoutSettings) -> None:
        unsupported = [
            (
                settings.missing_topic_policy == "hold",
                "missingTopicPolicy: hold",
                "its cursor cannot skip rows and come back to them",
                "missingTopicPolicy: deadLetter",
            ),
            (
                not settings.table_mapping.row_is_record and settings.dead_letter_policy == "haltKey",
                f"deadLetterPolicy: haltKey with tableMapping: {settings.table_mapping.kind}",
                "its held rows are kept in goharvest's columns, not the mapped table's",
                "deadLetterPolicy: skip",
            ),
        ]
        for bad, what, why, fix in unsupported:
            if bad:
                raise ConfigError(
                    f"outboxLayout: cursor does not support {what} yet ({why}; docs/limitations.md); use {fix}, "
                    f"or outboxLayout: mark"
                )

    # ------------------------------------------------------------------ init-db
    def check_partition_ids(self, partition_ids: int) -> None:
        if partition_ids < 1:
            raise ConfigError(f"outboxLayout: cursor needs partitions of at least 1 id (got {partition_ids})")

    def require_server(self, conn: psycopg.Connection) -> None:
        require_server(conn)

    def outbox_ddl(
        self,
        names: OutboxNames,
        value_type: ValueType,
        mapped_columns: list[sql.Composable] | None,
        companions: list[Statement],
    ) -> list[Statement] | None:
        """The partitioned outbox and its cursor table, the companions, and ``_held`` (producer/layouts/cursor/held.py:
        haltKey's held rows; empty unless that policy holds a key)."""
        return cursor_outbox_ddl(names, value_type, mapped_columns) + companions + held_table(names, value_type)

    def finish_init(self, conn: psycopg.Connection, names: OutboxNames, shards: int, partition_ids: int) -> None:
        add_shard_cursors(conn, names, shards)
        if not range_partitions(conn, names):
            # from the sequence's head: a sequence kept from a table moved by hand (docs/debezium.md)
            # draws above its old ids, which would otherwise all land in the DEFAULT partition
            head = conn.execute(sql.SQL("SELECT last_value FROM {}").format(names.id_sequence)).fetchone()
            first = (int(head[0]) // partition_ids) * partition_ids if head else 0
            for p in range(PARTITIONS_AHEAD):
                start = first + p * partition_ids
                conn.execute(create_partition(names, start, start + partition_ids))

    def init_summary(self, names: OutboxNames, value_type: str, wake: str, sharded: str) -> str:
        return (
            f"outbox {names.display} ready in the cursor layout ({names.mapping.kind} table partitioned by "
            f"{names.mapping.id_column}, value type {value_type}; "
            f"cursor, dead letters, {wake}{sharded})"
        )

    def storage_note(self, conn: psycopg.Connection, names: OutboxNames) -> str | None:
        """None: rows are never updated, so no fillfactor makes them cheaper."""
        return None

    @property
    def migrates_into(self) -> bool:
        return True

    # ------------------------------------------------------------------ least privilege
    def grants(self, names: OutboxNames) -> list[Need]:
        """The relay never writes a row, but its partition maintenance (partitions.py) creates tables in the
        schema and ATTACHes and DROPs partitions, which Postgres allows only to the outbox's owner."""
        return [
            Need("relay", "SCHEMA", schema_of(names), ("USAGE", "CREATE"), "partition maintenance creates partitions"),
            Need(
                "relay",
                "OWNER",
                names.outbox,
                (),
                "partition maintenance ATTACHes new partitions and DROPs retired ones: only an owner may "
                "(the id sequence follows the table)",
            ),
            Need(
                "owner",
                "MEMBER",
                names.outbox,
                (),
                "init-db, run again (an upgrade), alters the outbox the relay owns",
                member_of="relay",
            ),
            Need("relay", "TABLE", names.cursor, ("SELECT", "UPDATE"), "the committed cursor (FOR SHARE)"),
            Need("relay", "TABLE", names.held, ("SELECT", "INSERT", "DELETE"), "haltKey's held rows"),
            Need("admin", "TABLE", names.cursor, ("SELECT",), "requeue waits until the relay passed the rows"),
            Need("admin", "TABLE", names.held, ("SELECT", "INSERT"), "haltKey: requeue into the held rows"),
        ]

    # ------------------------------------------------------------------ checks
    def require(self, conn: psycopg.Connection, names: OutboxNames) -> None:
        """The outbox is the cursor layout's partitioned table and keeps A1 (:func:`require_cursor_table`)."""
        require_cursor_table(conn, names)

    def check(self, checks: LayoutChecks[T_co]) -> T_co:
        return checks.cursor_layout()

    # ------------------------------------------------------------------ the relay
    def open_databases(
        self,
        dsn: str,
        names: OutboxNames,
        shard_count: int | None,
        *,
        halt_keys: bool,
        sequenced: bool,
        pool: StatementPool | None = None,
    ) -> tuple[RelayDatabase, RelayDatabase]:
        """Both connections read and commit through one cursor view; the write connection maintains the
        partitions."""
        views = CursorViews(sequenced=sequenced)
        keeper = PartitionKeeper(names, shard_count=shard_count)
        db = CursorDatabase(dsn, names, views, keeper=keeper, halt_keys=halt_keys, shard_count=shard_count, pool=pool)
        try:
            with db.session.lease():
                db.conn  # noqa: B018 -- fail fast: connection, layout and schema checks
            read_db = CursorDatabase(
                dsn,
                names,
                views,
                async_commit=True,
                keeper=keeper,
                halt_keys=halt_keys,
                shard_count=shard_count,
                pool=pool,
            )
            try:
                read_db.prepare_mark()
            except BaseException:
                read_db.close()
                raise
        except BaseException:
            db.close()
            raise
        return db, read_db

    @property
    def holds_dropped_rows(self) -> bool:
        """Yes: copied to ``_held``, so the cursor passes them (producer/layouts/cursor/held.py)."""
        return True

    def backlog_by_shard(
        self, conn: psycopg.Connection, names: OutboxNames, shards: int
    ) -> dict[int, tuple[int, float | None]]:
        """Its rows stay until retired: each shard's committed cursor tells what waits."""
        per_shard = conn.execute(
            backlog_sql(names, shards if shards > 1 else None), {"shards": list(range(shards))}
        ).fetchall()
        return {int(k): (int(n), None if age is None else float(age)) for k, n, age in per_shard}

    def backlog(self, conn: psycopg.Connection, names: OutboxNames, up_to: int | None = None, shards: int = 1) -> int:
        """The rows the committed cursors have not passed (it deletes none)."""
        return cursor_backlog(conn, names, up_to, shards)

    # ------------------------------------------------------------------ dead letters
    def waiting_table(self, names: OutboxNames) -> sql.Composable:
        """``_held`` (producer/layouts/cursor/held.py): the outbox's rows stay where the cursor passed them."""
        return names.held

    def require_passed(
        self, conn: psycopg.Connection, names: OutboxNames, where: sql.Composable, params: Any, what: str
    ) -> None:
        require_passed(conn, names, where, params, what)

    def requeue_sql(self, names: OutboxNames, where: sql.Composable, keep_ids: bool) -> sql.Composed | None:
        """haltKey (``keep_ids``): into ``_held``, ahead of their keys' held rows, with their ids."""
        return requeue_into_held_sql(names, where) if keep_ids else None

    @property
    def writer_columns(self) -> frozenset[str]:
        """``txid``: the writer's transaction, taken by the default (an old txid would hide the row from the cursor)."""
        return frozenset({"txid"})
