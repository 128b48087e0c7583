"""``outboxLayout: mark`` (goharvest's, the default): :class:`MarkLayout`, the
:class:`~producer.layouts.layout.OutboxLayout` of an outbox whose rows the relay claims by writing
``leader_id`` (the mark), then deletes once delivered (the purge) or gives up (the reset); docs/design.md,
"Outbox layouts".

Invariant: the table is the one the table mapping defines (goharvest's, or Debezium's with the relay's
columns added: producer/schema/ddl.py); this layout adds only its storage parameters (the half-empty pages
marks update in place).
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg import sql

from harvest_outbox.producer.db import StatementPool
from harvest_outbox.producer.errors import SchemaError
from harvest_outbox.producer.layouts.cursor.schema import is_cursor_table
from harvest_outbox.producer.layouts.layout import LayoutChecks, LayoutSettings, RelayDatabase, T_co
from harvest_outbox.producer.layouts.mark.database import MarkDatabase, backlog_by_shard
from harvest_outbox.producer.mapping.names import OutboxNames, Statement, ValueType
from harvest_outbox.producer.schema import missing_storage, packed_outbox_fix, storage_sql
from harvest_outbox.producer.schema.need import Need, schema_of

log = logging.getLogger(__name__)


class MarkLayout:
    """goharvest's mark/purge layout (module doc)."""

    @property
    def name(self) -> str:
        return "mark"

    def refuse(self, settings: LayoutSettings) -> None:
        """Every setting works on this layout."""

    # ------------------------------------------------------------------ init-db
    def check_partition_ids(self, partition_ids: int) -> None:
        """This layout has no id-range partitions."""

    def require_server(self, conn: psycopg.Connection) -> None:
        """Any Postgres the relay connects to will do."""

    def outbox_ddl(
        self,
        names: OutboxNames,
        value_type: ValueType,
        mapped_columns: list[sql.Composable] | None,
        companions: list[Statement],
    ) -> list[Statement] | None:
        """None: the table is the table mapping's (producer/schema/ddl.py)."""
        return None

    def finish_init(self, conn: psycopg.Connection, names: OutboxNames, shards: int, partition_ids: int) -> None:
        missing = missing_storage(conn, names)  # only what the table lacks: an owner's value is kept
        if missing:
            conn.execute(storage_sql(names, missing))

    def init_summary(self, names: OutboxNames, value_type: str, wake: str, sharded: str) -> str:
        return f"outbox {names.display} {names.mapping.ready(value_type, f'dead letters, {wake}{sharded}')}"

    def storage_note(self, conn: psycopg.Connection, names: OutboxNames) -> str | None:
        return packed_outbox_fix(conn, names)

    @property
    def migrates_into(self) -> bool:
        return False

    # ------------------------------------------------------------------ least privilege
    def grants(self, names: OutboxNames) -> list[Need]:
        """The relay claims, releases and deletes rows; it creates nothing (no CREATE on the schema)."""
        return [
            Need("relay", "SCHEMA", schema_of(names), ("USAGE",), ""),
            Need(
                "relay",
                "TABLE",
                names.outbox,
                ("SELECT", "UPDATE", "DELETE"),
                "the mark claims rows (UPDATE leader_id), a reset releases them, a purge deletes them",
            ),
        ]

    # ------------------------------------------------------------------ checks
    def require(self, conn: psycopg.Connection, names: OutboxNames) -> None:
        if not is_cursor_table(conn, names):  # None: no table yet
            return
        raise SchemaError(
            f"outbox {names.display!r} is the cursor layout's partitioned table (its rows are never marked); "
            f"set outboxLayout: cursor in the relay's config"
        )

    def check(self, checks: LayoutChecks[T_co]) -> T_co:
        return checks.mark_layout()

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
        db = MarkDatabase(dsn, names, shard_count, halt_keys=halt_keys, pool=pool)
        try:
            with db.session.lease():
                self.require(db.conn, names)
                fix = packed_outbox_fix(db.conn, names)
            if fix is not None:
                log.info("%s; `harvest init-db` creates new outboxes so", fix)
            # The mark commits without waiting for its WAL flush (~0.3 ms of every trickled row's latency,
            # more while fenced commits flush): a mark lost in a database crash only un-claims rows, as
            # if the leader had crashed before purging them, and the purge or fenced commit that
            # consumes a mark is synchronous, so flushing it flushes the mark too (WAL is flushed in
            # order). The mark connection writes nothing else (its other queries are metrics reads).
            mark_db = MarkDatabase(dsn, names, shard_count, async_commit=True, halt_keys=halt_keys, pool=pool)
            try:
                mark_db.prepare_mark()  # connected and parsed while a standby: an election's first mark is quick
            except BaseException:
                mark_db.close()
                raise
        except BaseException:
            db.close()
            raise
        return db, mark_db

    @property
    def holds_dropped_rows(self) -> bool:
        """No: they stay marked, and the next view's mark skips them."""
        return False

    def backlog_by_shard(
        self, conn: psycopg.Connection, names: OutboxNames, shards: int
    ) -> dict[int, tuple[int, float | None]]:
        return backlog_by_shard(conn, names, shards)

    def backlog(self, conn: psycopg.Connection, names: OutboxNames, up_to: int | None = None, shards: int = 1) -> int:
        """The rows left in the outbox (a delivered row is deleted)."""
        q = sql.SQL("SELECT count(*) FROM {}").format(names.outbox)
        if up_to is not None:
            q = sql.SQL("{} WHERE id <= %s").format(q)
        row = conn.execute(q, (up_to,) if up_to is not None else ()).fetchone()
        assert row is not None  # an aggregate
        return int(row[0])

    # ------------------------------------------------------------------ dead letters
    def waiting_table(self, names: OutboxNames) -> sql.Composable:
        return names.outbox

    def require_passed(
        self, conn: psycopg.Connection, names: OutboxNames, where: sql.Composable, params: Any, what: str
    ) -> None:
        """A dead letter's row left the outbox when it was dead-lettered: nothing to wait for."""

    def requeue_sql(self, names: OutboxNames, where: sql.Composable, keep_ids: bool) -> sql.Composed | None:
        return None

    @property
    def writer_columns(self) -> frozenset[str]:
        return frozenset()
