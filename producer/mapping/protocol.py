"""The table mapping's interface: everything the relay asks of the kind of outbox table it reads
(docs/design.md, "Table mappings").

A mapping is chosen once, where the config names it (:func:`~producer.mapping.table.table_mapping`), and
travels with the outbox's names (:attr:`OutboxNames.mapping <producer.mapping.names.OutboxNames>`). Every
other module calls it: the DDL of the table, the checks of its columns, the storage ``init-db`` sets, the
column expressions the relay's statements read a row through, the dead letter's shape, and what
``init-db`` and ``harvest check`` print. Two implement it: :mod:`producer.mapping.goharvest` (goharvest's
table, the default) and :mod:`producer.mapping.debezium` (Debezium's outbox-event-router table). They share
code through this module's functions, never by inheritance.

Invariants (tests/test_foundation/test_table_mapping_chosen_once.py): no module but the chooser tests which
mapping it holds (``isinstance``, its ``kind``); each implementation satisfies :class:`TableMapping`
(strict mypy checks them where they are passed as one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from psycopg import sql

if TYPE_CHECKING:
    import psycopg

    from harvest_outbox.producer.mapping.names import OutboxNames, Statement, ValueType


@dataclass(frozen=True)
class RecordSql:
    """The SQL expressions of one row's record, over the outbox alias of the statement."""

    topic: sql.Composable
    key: sql.Composable
    value: sql.Composable
    header_keys: sql.Composable  # text[], NULL when the row has no headers
    header_values: sql.Composable
    bad: sql.Composable  # NULL, or why the row can never be produced (a dead letter's error)
    partition: sql.Composable = field(default_factory=lambda: sql.SQL("NULL::int"))  # NULL: by key


@runtime_checkable  # HarvestConfig refuses a table_mapping that is none (a string, say)
class TableMapping(Protocol):
    """How the relay reads one kind of outbox table (module doc)."""

    # --- what it is called ----------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        """The config's name for it (``tableMapping``), printed by ``init-db`` and ``harvest check``."""

    @property
    def described(self) -> str:
        """The table in a sentence: ``goharvest's table``, ``a debezium table``."""

    # --- the relay's columns --------------------------------------------------------------------------
    @property
    def id_column(self) -> str:
        """The order of rows (bigint): the mark reads, the cursor passes and dead letters keep it."""

    @property
    def leader_column(self) -> str:
        """The mark (goharvest's ``leader_id``)."""

    @property
    def created_column(self) -> str:
        """When the row was written: backlog age, dwell."""

    @property
    def sequence_suffix(self) -> str:
        """The suffix of the ordering column's sequence's name (``<table><suffix>``)."""

    def id(self, alias: str | None = None) -> sql.Identifier: ...

    def leader(self, alias: str | None = None) -> sql.Identifier: ...

    def created(self, alias: str | None = None) -> sql.Identifier: ...

    def shard_key(self, alias: str | None = None) -> sql.Composable:
        """The text a row's shard is hashed from (its Kafka key)."""

    def relayed(self, alias: str | None = None) -> sql.Composable | None:
        """The condition of the rows the relay owns (None: every row)."""

    def claimable(self, joiner: str = "WHERE", alias: str | None = None) -> sql.Composable:
        """`` WHERE <relayed>`` (or ``AND``), empty when every row is the relay's (:func:`claimable`)."""

    # --- the record of a row --------------------------------------------------------------------------
    def record(self, alias: str, value_type: str) -> RecordSql:
        """The SQL of a row's record, over the statement's alias ``alias`` for the outbox."""

    @property
    def partition_column(self) -> str | None:
        """The column placed in the record's partition (None: the producer's partitioner, by key)."""

    @property
    def event_id_source(self) -> str | None:
        """Where a record already carries its event id, in a sentence (None: nowhere, so ``eventIdHeader``
        may add one)."""

    # --- dead letters and held rows -------------------------------------------------------------------
    @property
    def row_is_record(self) -> bool:
        """True: a row's columns are its record's (goharvest's), so a dead letter or a held row is the row,
        and the cursor layout's DDL makes the columns. False: the writers' columns are their own; a dead
        letter keeps the row (:meth:`source_row`) and a migration keeps their definitions."""

    def source_row(self, alias: str) -> sql.Composable | None:
        """The row as JSON, kept with its dead letter so a requeue can restore it (None: the dead
        letter's record columns are the row)."""

    # --- the table: DDL, storage, checks --------------------------------------------------------------
    @property
    def adopts_existing_table(self) -> bool:
        """True: ``init-db`` takes a table its writers made as it is and adds the relay's columns: the table's
        payload column then decides the value type, it gets the queue table's fillfactor, and its columns
        are checked once the relay's exist. False: an existing table is its owner's, left as it is."""

    def outbox_ddl(self, names: OutboxNames, value_type: ValueType, fillfactor: int) -> list[Statement]:
        """The outbox of the mark layout (pages ``fillfactor`` % full), idempotent."""

    def cursor_columns(
        self, value_type: str, id_default: sql.Composable, mapped_columns: list[sql.Composable] | None
    ) -> sql.Composable:
        """The columns of the cursor layout's partitioned outbox (producer/layouts/cursor/schema.py), its
        ordering column defaulted to ``id_default``; ``mapped_columns``: the writers' columns as a migrated
        table had them (only when not :attr:`row_is_record`)."""

    def id_index(self, names: OutboxNames) -> str | None:
        """The index ``init-db`` builds on the ordering column (None: the table's primary key, its owner's)."""

    def value_type(self, columns: Mapping[str, str]) -> ValueType:
        """The value type the table's columns (name -> type) make."""

    def check_columns(self, conn: psycopg.Connection, names: OutboxNames, columns: Mapping[str, str]) -> ValueType:
        """Refuse a table without the columns this mapping reads (:class:`~producer.errors.SchemaError`
        naming them and the fix); return its value type."""

    def ready(self, value_type: str, companions: str) -> str:
        """What ``init-db`` prints after ``outbox <table>`` for the mark layout, ``companions`` (the dead
        letters, the wake-up, the shards) in it."""


def column(alias: str | None, name: str) -> sql.Identifier:
    """``alias.name`` (``name`` without an alias)."""
    return sql.Identifier(alias, name) if alias else sql.Identifier(name)


def claimable(relayed: sql.Composable | None, joiner: str) -> sql.Composable:
    """`` <joiner> <relayed>``, empty when ``relayed`` is None (every row is the relay's)."""
    return sql.SQL("") if relayed is None else sql.SQL(" {} {}").format(sql.SQL(joiner), relayed)
