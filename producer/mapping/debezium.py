"""Debezium's outbox table (``id`` UUID, ``aggregatetype``, ``aggregateid``, ``type``, ``payload``, extra
columns), turned into records the way Debezium's outbox event router
(``io.debezium.transforms.outbox.EventRouter``) turns them, configured with the router's own option names
and defaults (:class:`~producer.mapping._event_router.EventRouter`): a table mapping
(:class:`~producer.mapping.protocol.TableMapping`; docs/debezium.md). ``harvest init-db`` adds the relay's
bookkeeping columns (:data:`DEBEZIUM_SEQ`, :data:`DEBEZIUM_LEADER`, :data:`DEBEZIUM_CREATED`) with defaults,
so the writers' INSERTs do not change.

Invariants (tests/test_producer/mapping/test_table_mapping.py, test_java_regex.py):
- the topic of a row is the router's: ``route.topic.regex`` must match the whole routed value, and
  then ``route.topic.replacement`` replaces it; otherwise the value itself is the topic;
- a routing regex Postgres refuses is refused before the relay runs (:meth:`DebeziumMapping.check_columns`),
  not by every page read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from harvest_outbox.producer.errors import ConfigError, SchemaError, shown
from harvest_outbox.producer.mapping._event_router import EventRouter, pg_regex
from harvest_outbox.producer.mapping._java_regex import LINE_TERMINATOR_CLASS
from harvest_outbox.producer.mapping.names import derived_name
from harvest_outbox.producer.mapping.protocol import RecordSql, claimable, column

if TYPE_CHECKING:
    from harvest_outbox.producer.mapping.names import OutboxNames, Statement, ValueType

#: Java's ``(.*)``, ``(.+)`` or the same in a named group: the whole value in group 1.
_WHOLE_VALUE_GROUP = re.compile(r"\((?:\?<[A-Za-z][A-Za-z0-9]*>)?\.([*+])\)")

#: The ordering column ``harvest init-db`` adds to a Debezium outbox (its ``id`` is a UUID, which has
#: no order): a bigint from a sequence, so rows go out in insertion order, like goharvest's ``id``.
DEBEZIUM_SEQ = "harvest_seq"
#: The mark column (goharvest's ``leader_id``).
DEBEZIUM_LEADER = "harvest_leader"
#: When the row was written (goharvest's ``create_time``): backlog age, dwell.
DEBEZIUM_CREATED = "harvest_created"

#: Column types whose text (``::text``) is the text Debezium's Connect value of the column gives
#: (StringConverter / SimpleHeaderConverter), so keys and headers are byte-for-byte the router's.
DEBEZIUM_TEXT_TYPES = frozenset(
    {
        "text",
        "character varying",
        "character",
        "uuid",
        "smallint",
        "integer",
        "bigint",
        "boolean",
        "json",
        "jsonb",
        "name",
    }
)
#: Payload types: their text as is (json/jsonb as Postgres prints them), or bytea's bytes.
DEBEZIUM_PAYLOAD_TYPES = DEBEZIUM_TEXT_TYPES | {"bytea"}


@dataclass(frozen=True)
class DebeziumMapping:
    """Debezium's outbox table, routed by :class:`EventRouter`."""

    router: EventRouter = field(default_factory=EventRouter)

    kind = "debezium"
    described = "a debezium table"
    id_column = DEBEZIUM_SEQ
    leader_column = DEBEZIUM_LEADER
    created_column = DEBEZIUM_CREATED
    # the mark layout's name for it: a table moved to the cursor layout by hand keeps drawing above the ids
    # its dead letters and attempt counts hold (producer/mapping/names.py: id_sequence)
    sequence_suffix = "_harvest_seq"
    event_id_source = "the event router's 'id' header"
    row_is_record = False
    adopts_existing_table = True

    def id(self, alias: str | None = None) -> sql.Identifier:
        return column(alias, self.id_column)

    def leader(self, alias: str | None = None) -> sql.Identifier:
        return column(alias, self.leader_column)

    def created(self, alias: str | None = None) -> sql.Identifier:
        return column(alias, self.created_column)

    def shard_key(self, alias: str | None = None) -> sql.Composable:
        return sql.SQL("{}::text").format(column(alias, self.router.field_event_key))

    def relayed(self, alias: str | None = None) -> sql.Composable | None:
        # Rows written before `harvest init-db` have no harvest_seq: they were the previous relay's.
        return sql.SQL("{} IS NOT NULL").format(self.id(alias))

    def claimable(self, joiner: str = "WHERE", alias: str | None = None) -> sql.Composable:
        return claimable(self.relayed(alias), joiner)

    @property
    def partition_column(self) -> str | None:
        """The column placed in the record's partition (``column:partition``), or None."""
        return next((a.column for a in self.router.additional if a.placement == "partition"), None)

    def topic(self, alias: str) -> sql.Composable:
        r = self.router
        # Collation "C": the routing then depends on no locale, and a column's nondeterministic collation
        # (which Postgres refuses regular expressions under) does not matter.
        routed = sql.SQL('{}::text COLLATE "C"').format(column(alias, r.route_by_field))
        pattern, replacement = pg_regex(r.route_topic_regex, r.route_topic_replacement, "route.topic.regex")
        whole = _WHOLE_VALUE_GROUP.fullmatch(r.route_topic_regex)
        if whole and re.fullmatch(r"[^\\]*\\1[^\\]*", replacement):
            # The common case (the default regex, one group holding everything): a concatenation, no
            # regex per row. Java's "." stops at a line terminator, so such a value keeps its name,
            # and ".+" does not match the empty value, which then stays as it is ('').
            before, after = replacement.split("\\1")
            keep = sql.SQL("{v} ~ {lt}").format(v=routed, lt=sql.Literal(LINE_TERMINATOR_CLASS))
            if whole.group(1) == "+":
                keep = sql.SQL("{v} = '' OR {k}").format(v=routed, k=keep)
            return sql.SQL("CASE WHEN {k} THEN {v} ELSE {b} || {v} || {a} END").format(
                k=keep, v=routed, b=sql.Literal(before), a=sql.Literal(after)
            )
        return sql.SQL("CASE WHEN {v} ~ {p} THEN regexp_replace({v}, {p}, {r}) ELSE {v} END").format(
            v=routed, p=sql.Literal(pattern), r=sql.Literal(replacement)
        )

    def record(self, alias: str, value_type: str) -> RecordSql:
        r = self.router
        payload = column(alias, r.field_event_payload)
        if value_type == "bytea":
            value: sql.Composable = payload
        else:
            value = sql.SQL("{}::text::varchar").format(payload)
            if r.tombstone_on_empty_payload:
                # The router sends a tombstone for a payload whose text is empty after Java's trim()
                # (which drops every character up to U+0020).
                value = sql.SQL(
                    "CASE WHEN {p}::text ~ '^[\\x01-\\x20]*$' THEN NULL ELSE {p}::text::varchar END"
                ).format(p=payload)
        headers = [a for a in r.additional if a.placement == "header"]
        names = ["id"] + [a.alias for a in headers]
        cols = [r.field_event_id] + [a.column for a in headers]
        partition = self.partition_column
        topic = self.topic(alias)
        key = column(alias, r.field_event_key)
        bad = sql.SQL("""CASE
  WHEN {route} IS NULL OR {route}::text = '' THEN
    {route_msg}
  WHEN {key} IS NULL THEN {key_msg}
  WHEN {eid} IS NULL THEN {eid_msg}{negative}
END""").format(
            negative=_negative_partition(alias, partition),
            route=column(alias, r.route_by_field),
            route_msg=sql.Literal(
                f"{r.route_by_field} (route.by.field) is NULL or empty: the row has nowhere to go; "
                f"fix {r.route_by_field} and requeue"
            ),
            key=key,
            key_msg=sql.Literal(
                f"{r.field_event_key} (table.field.event.key) is NULL: harvest keeps per-key order "
                f"and needs a key; set {r.field_event_key} and requeue"
            ),
            eid=column(alias, r.field_event_id),
            eid_msg=sql.Literal(
                f"{r.field_event_id} (table.field.event.id) is NULL: the record's id header needs "
                f"it; set {r.field_event_id} and requeue"
            ),
        )
        return RecordSql(
            topic=topic,
            key=sql.SQL("{}::text::varchar").format(key),
            value=value,
            header_keys=sql.SQL("{}::text[]").format(sql.Literal("{" + ",".join(_array_item(n) for n in names) + "}")),
            header_values=sql.SQL("ARRAY[{}]::text[]").format(
                sql.SQL(", ").join(sql.SQL("{}::text").format(column(alias, c)) for c in cols)
            ),
            bad=bad,
            partition=sql.SQL("NULL::int")
            if partition is None
            else sql.SQL("{}::int").format(column(alias, partition)),
        )

    def source_row(self, alias: str) -> sql.Composable | None:
        return sql.SQL("to_jsonb({})").format(sql.Identifier(alias))

    # --- the table ------------------------------------------------------------------------------------
    def columns(self, value_type: str, primary_key: bool = True) -> list[sql.Composable]:
        """Debezium's outbox columns under the router's names (its ``id`` the primary key unless
        ``primary_key`` is false: the cursor layout's partitioned table keys on its ordering column)."""
        r = self.router
        payload = sql.SQL("BYTEA" if value_type == "bytea" else "JSONB")
        key = sql.SQL("PRIMARY KEY" if primary_key else "NOT NULL")
        cols: list[sql.Composable] = [sql.SQL("{} UUID {}").format(sql.Identifier(r.field_event_id), key)]
        seen = {r.field_event_id, r.field_event_payload}
        for col in (r.route_by_field, r.field_event_key, "type"):
            if col not in seen:
                seen.add(col)
                cols.append(sql.SQL("{} VARCHAR(255) NOT NULL").format(sql.Identifier(col)))
        cols.append(sql.SQL("{} {}").format(sql.Identifier(r.field_event_payload), payload))
        return cols

    def outbox_ddl(self, names: OutboxNames, value_type: ValueType, fillfactor: int) -> list[Statement]:
        """The table in Debezium's convention if it does not exist yet (an existing one is kept as it is),
        then the relay's bookkeeping columns, each with a default, so the writers' INSERTs stay as they are.
        Rows written before ``init-db`` have no ``harvest_seq`` and are never relayed: they belong to the
        tool that relayed the table until then (docs/debezium.md)."""
        seq = names.qualified(derived_name(names.table, self.sequence_suffix))
        return [
            sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}) WITH (fillfactor = {})").format(
                names.outbox, sql.SQL(", ").join(self.columns(value_type)), sql.Literal(fillfactor)
            ),
            sql.SQL("CREATE SEQUENCE IF NOT EXISTS {}").format(seq),
            sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} BIGINT").format(names.outbox, self.id()),
            sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET DEFAULT nextval({})").format(
                names.outbox, self.id(), sql.Literal(_regclass_text(names))
            ),
            sql.SQL("ALTER SEQUENCE {} OWNED BY {}.{}").format(seq, names.outbox, self.id()),
            sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} UUID").format(names.outbox, self.leader()),
            sql.SQL(
                "ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now()"
            ).format(names.outbox, self.created()),
            sql.SQL("CREATE UNIQUE INDEX IF NOT EXISTS {} ON {} ({})").format(
                sql.Identifier(self.id_index(names)), names.outbox, self.id()
            ),
            # The half-empty pages (OUTBOX_FILLFACTOR) unless the owner chose a fillfactor: init_db, missing_storage.
        ]

    def cursor_columns(
        self, value_type: str, id_default: sql.Composable, mapped_columns: list[sql.Composable] | None
    ) -> sql.Composable:
        # the writers' columns as they are; the relay's take their defaults, so their INSERTs do not change
        mapped = self.columns(value_type, primary_key=False) if mapped_columns is None else mapped_columns
        return sql.SQL(", ").join(
            [
                *mapped,
                sql.SQL("{} BIGINT NOT NULL DEFAULT {}").format(self.id(), id_default),
                sql.SQL("{} UUID").format(self.leader()),
                sql.SQL("{} TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now()").format(self.created()),
            ]
        )

    def id_index(self, names: OutboxNames) -> str:
        """The unique index of the ordering column (the mark reads it in order)."""
        return derived_name(names.table, "_harvest_seq_idx")

    def value_type(self, columns: Mapping[str, str]) -> ValueType:
        return "bytea" if columns.get(self.router.field_event_payload) == "bytea" else "varchar"

    def check_columns(self, conn: psycopg.Connection, names: OutboxNames, columns: Mapping[str, str]) -> ValueType:
        """The router's columns exist, with types rendered as Debezium does, and the relay's; the routing
        regex compiles (:meth:`prove_routing`)."""
        r = self.router
        options = {
            r.field_event_id: "table.field.event.id",
            r.field_event_key: "table.field.event.key",
            r.field_event_payload: "table.field.event.payload",
            r.route_by_field: "route.by.field",
        }
        for a in r.additional:
            options.setdefault(a.column, "table.fields.additional.placement")
        partition = {a.column for a in r.additional if a.placement == "partition"}
        for col, option in options.items():
            if col not in columns:
                raise SchemaError(
                    f"outbox table {names.display!r} has no column {col!r}, which the event router reads "
                    f"({option}); set eventRouter.{option} to the column's name"
                )
            allowed = DEBEZIUM_PAYLOAD_TYPES if option == "table.field.event.payload" else DEBEZIUM_TEXT_TYPES
            if col in partition:
                allowed = frozenset({"integer"})  # the router reads the partition as an INT32
            if columns[col] not in allowed:
                raise SchemaError(
                    f"outbox table {names.display!r}: column {col!r} ({option}) has type {columns[col]}, whose "
                    f"Debezium rendering harvest does not reproduce byte for byte; supported: "
                    f"{', '.join(sorted(allowed))}"
                )
        missing = {self.id_column, self.leader_column, self.created_column} - columns.keys()
        if missing:
            raise SchemaError(
                f"outbox table {names.display!r} lacks the relay's column(s) {', '.join(sorted(missing))}; "
                f"run `harvest init-db` with tableMapping: debezium (idempotent; it adds them with "
                f"defaults, so the writers' INSERTs do not change)"
            )
        value_type = self.value_type(columns)
        self.prove_routing(conn)
        return value_type

    def prove_routing(self, conn: psycopg.Connection) -> None:
        """Run the topic expression once, so that Postgres compiles the routing regex where the relay will
        evaluate it: a pattern Postgres refuses would otherwise fail every page read (nothing published,
        nothing dead-lettered) while the relay retried forever."""
        r = self.router
        try:  # a mapping built in code, not from a config file, is translated here first
            topic = self.topic("o")
        except ConfigError as exc:
            raise SchemaError(f"eventRouter.{exc}") from None
        probe = sql.SQL("SELECT {} FROM (SELECT ''::text AS {}) AS o").format(topic, sql.Identifier(r.route_by_field))
        try:
            with conn.transaction():  # a savepoint inside a caller's transaction
                conn.execute(probe)
        except psycopg.errors.InvalidRegularExpression as exc:
            raise SchemaError(
                f"eventRouter.route.topic.regex: {shown(r.route_topic_regex)}: Postgres refuses the pattern harvest "
                f"evaluates it as ({exc.diag.message_primary}); fix: rewrite it with the constructs "
                f"docs/debezium.md lists as accepted"
            ) from None

    def ready(self, value_type: str, companions: str) -> str:
        return f"ready as a {self.kind} outbox (relay columns added with defaults; {companions})"


def _regclass_text(names: OutboxNames) -> str:
    """The sequence's name as nextval() reads it (a quoted, schema-qualified identifier)."""
    seq = derived_name(names.table, DebeziumMapping.sequence_suffix)
    quoted = '"' + seq.replace('"', '""') + '"'
    return ('"' + names.schema.replace('"', '""') + '".' + quoted) if names.schema else quoted


def _negative_partition(alias: str, column_name: str | None) -> sql.Composable:
    """The ``bad`` branch for a negative ``column:partition`` value. produce() reads -1 as librdkafka's
    "unassigned" (the partitioner picks) and other negatives are no partition at all, where Debezium's
    producer refuses the record: a permanent fault of the row, so it is a dead letter at once, naming the
    value. A partition at or above the topic's count is the relay's to find (producer/ops/preflight.py: the
    count is the broker's)."""
    if column_name is None:
        return sql.SQL("")
    return sql.SQL("\n  WHEN {col} < 0 THEN {before} || {col}::int::text || {after}").format(
        col=column(alias, column_name),
        before=sql.Literal(f"{column_name} (table.fields.additional.placement {column_name}:partition) is "),
        after=sql.Literal(
            ": a negative partition, which Debezium's producer refuses (-1 is not 'any partition' here); "
            f"set {column_name} to a partition of the topic (0 or more) or NULL (the partitioner, by key), and requeue"
        ),
    )


def _array_item(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
