"""What an outbox layout is (``outboxLayout``; docs/design.md, "Outbox layouts"): :class:`OutboxLayout`, a
strategy chosen once (:func:`~producer.layouts.choice.layout_for`), like the delivery modes, and the
:class:`RelayDatabase` it opens for the relay.

A layout is how the relay keeps track of the rows it has sent: the mark layout (goharvest's table;
:class:`~producer.layouts.mark.layout.MarkLayout`) claims rows by writing ``leader_id`` and deletes them once
delivered; the cursor layout (a partitioned table; :class:`~producer.layouts.cursor.layout.CursorLayout`) never
writes a row and moves a committed cursor past them instead. Everything that differs between the two is a
member here, each implemented once per layout, in the layout's folder.

Invariants (tests/test_foundation/test_layouts.py):
- only :mod:`producer.layouts.choice` tells the layouts apart by name; every other module asks the
  strategy it chose (no ``== "cursor"``, no ``isinstance`` of a layout);
- no layout inherits another: a layout's relay database composes the session, fence and books of
  producer/db/ (:class:`~producer.db.OutboxSession`, :class:`~producer.db.Fence`, :class:`~producer.db.Attempts`,
  :class:`~producer.db.DeadLetters`), and builds only its own statements.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg import sql

from harvest_outbox.producer.db import MarkedAttempts, MarkedRow, StatementPool, TxnCommit
from harvest_outbox.producer.mapping.names import OutboxNames, Statement, ValueType
from harvest_outbox.producer.mapping.table import TableMapping
from harvest_outbox.producer.schema.need import Need

T_co = TypeVar("T_co", covariant=True)


class RelayDatabase(Protocol):
    """What the relay (its core, its two modes, the meter) asks of a layout's database: one autocommit
    connection (made on first use, checked, remade after a failure) running the relay's statements on one
    outbox or a set of its shards. The sequenced mode's part of it is
    :class:`~producer.relay.sequenced._store.SequencedStore`, whose invariants both layouts keep."""

    halted_keys: int
    shard_stats: dict[int, tuple[int, float | None]]
    #: The cursor layout's scan gauge (ids the led shards' last complete batch spanned, rows it returned).
    scan: tuple[int, int] | None

    @property
    def conn(self) -> psycopg.Connection:
        """The connection (made on first use: the layout and the outbox checked)."""
        ...

    def set_shards(self, shards: frozenset[int]) -> None: ...

    def close(self) -> None: ...

    def prepare_mark(self) -> None:
        """Connect before the first read, so an election's first read is quick."""
        ...

    def mark_with_attempts(self, leader_id: uuid.UUID, limit: int) -> tuple[list[MarkedRow], MarkedAttempts]:
        """The next rows for ``leader_id`` (id order), with their persisted attempt counts."""
        ...

    # at-least-once
    def purge(self, ids: Sequence[int]) -> int: ...

    def reset(self, ids: Sequence[int]) -> int: ...

    def hold(self, ids: Sequence[int]) -> int: ...

    def dead_letter(self, items: Sequence[tuple[int, str, int]]) -> int: ...

    def record_attempts(self, items: Sequence[tuple[int, int, str]]) -> int: ...

    def forget_attempts(self, ids: Sequence[int]) -> int: ...

    # --uuid-sequencing
    def start_view_with_floor(
        self, leader_id: uuid.UUID, name: str
    ) -> tuple[int, list[tuple[int, bytes, int, str, int]], int]: ...

    def commit_txns(self, epoch: int, leader_id: uuid.UUID, txns: Sequence[TxnCommit]) -> None: ...

    def confirm_acks(self, items: Sequence[tuple[bytes, int]]) -> int: ...

    # the meter and the retention
    def stats(self) -> tuple[int, float | None, int]:
        """(backlog rows, age of the oldest, dead letters); sets :attr:`halted_keys`, :attr:`shard_stats`."""
        ...

    def expire_dead_letters(self, retention: float, limit: int) -> int: ...


class LayoutSettings(Protocol):
    """The settings a layout may refuse (:class:`~producer.config.HarvestConfig` has them)."""

    @property
    def missing_topic_policy(self) -> str: ...

    @property
    def dead_letter_policy(self) -> str: ...

    @property
    def table_mapping(self) -> TableMapping: ...


class LayoutChecks(Protocol[T_co]):
    """``harvest check``'s findings for each layout (producer/ops/_check.py): a layout picks its own."""

    def mark_layout(self) -> T_co: ...

    def cursor_layout(self) -> T_co: ...


class OutboxLayout(Protocol):
    """One outbox layout (module doc): its DDL, its checks, the relay's database on it, its backlog, and
    where its dead letters' keys wait."""

    @property
    def name(self) -> str:
        """``outboxLayout``'s value (for messages)."""
        ...

    # ------------------------------------------------------------------ the config
    def refuse(self, settings: LayoutSettings) -> None:
        """Raise :class:`~producer.errors.ConfigError` for a setting this layout does not support (yet)."""
        ...

    # ------------------------------------------------------------------ init-db
    def check_partition_ids(self, partition_ids: int) -> None:
        """Raise :class:`~producer.errors.ConfigError` for an id-range partition width this layout cannot use."""
        ...

    def require_server(self, conn: psycopg.Connection) -> None:
        """Raise :class:`~producer.errors.SchemaError` for a Postgres too old for this layout."""
        ...

    def outbox_ddl(
        self,
        names: OutboxNames,
        value_type: ValueType,
        mapped_columns: list[sql.Composable] | None,
        companions: list[Statement],
    ) -> list[Statement] | None:
        """This layout's own outbox table, the companions (the tables and trigger both layouts keep) and what
        else it keeps; None where the layout keeps the table the table mapping defines (producer/schema/ddl.py)."""
        ...

    def finish_init(self, conn: psycopg.Connection, names: OutboxNames, shards: int, partition_ids: int) -> None:
        """``init-db``'s last steps, in its transaction (the cursor rows and first partitions; the storage
        parameters the table lacks)."""
        ...

    def init_summary(self, names: OutboxNames, value_type: str, wake: str, sharded: str) -> str:
        """``harvest init-db``'s line for a ready outbox."""
        ...

    def storage_note(self, conn: psycopg.Connection, names: OutboxNames) -> str | None:
        """A note on an existing table's storage that init-db does not change, if any."""
        ...

    @property
    def migrates_into(self) -> bool:
        """``init-db --migrate`` moves the other layout's table into this one."""
        ...

    # ------------------------------------------------------------------ least privilege
    def grants(self, names: OutboxNames) -> list[Need]:
        """The relay's and the dead-letter verbs' privileges on this layout's own objects (the outbox's schema
        and table, the cursor layout's cursor and held rows), each with why; producer/schema/grants.py adds the
        companions' both layouts keep, the writers' and the reader's."""
        ...

    # ------------------------------------------------------------------ checks
    def require(self, conn: psycopg.Connection, names: OutboxNames) -> None:
        """The outbox (if it exists) is in this layout, and keeps what the layout needs: else
        :class:`~producer.errors.SchemaError` (a relay of the other layout would lose or repeat rows)."""
        ...

    def check(self, checks: LayoutChecks[T_co]) -> T_co:
        """``harvest check``'s findings for this layout."""
        ...

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
        """The relay's two databases, connected and checked (fail fast): the write one (purges, resets,
        dead letters, commits, views) and the read one (reads and the meter's queries; commits without
        waiting for the WAL flush). With a fleet's ``pool``, both lease its connections (producer/db/statement_pool.py)."""
        ...

    @property
    def holds_dropped_rows(self) -> bool:
        """haltKey, at-least-once: rows dropped unsent for a halted key go to the store's ``hold`` (the
        cursor must pass them), instead of staying where they are (marked)."""
        ...

    def backlog_by_shard(
        self, conn: psycopg.Connection, names: OutboxNames, shards: int
    ) -> dict[int, tuple[int, float | None]]:
        """Per shard ``0..shards-1`` with rows: (rows the relay has not passed, age of the oldest in seconds)."""
        ...

    def backlog(self, conn: psycopg.Connection, names: OutboxNames, up_to: int | None = None, shards: int = 1) -> int:
        """Rows committed to the outbox and not relayed yet (tests, tools); with ``up_to``, ids up to it."""
        ...

    # ------------------------------------------------------------------ dead letters
    def waiting_table(self, names: OutboxNames) -> sql.Composable:
        """Where the rows of a key halted by its dead letters wait (haltKey)."""
        ...

    def require_passed(
        self, conn: psycopg.Connection, names: OutboxNames, where: sql.Composable, params: Any, what: str
    ) -> None:
        """Refuse (:class:`~producer.errors.DatabaseError`) to ``what`` (requeue, discard) dead letters whose
        outbox rows the relay has not passed yet (it would read them again)."""
        ...

    def requeue_sql(self, names: OutboxNames, where: sql.Composable, keep_ids: bool) -> sql.Composed | None:
        """This layout's own requeue of the dead letters ``where``, None where a requeue writes them back to
        the outbox (producer/ops/_deadletters.py)."""
        ...

    @property
    def writer_columns(self) -> frozenset[str]:
        """Columns of this layout's table a requeued row must leave to their defaults (the writer's own)."""
        ...
