"""Table mappings: which columns of an outbox table make a Kafka record, and where the relay keeps its
own bookkeeping (docs/debezium.md).

- :data:`GOHARVEST` (default): goharvest's table as is (``id``, ``create_time``, ``kafka_topic``,
  ``kafka_key``, ``kafka_value``, ``kafka_header_keys``/``_values``, ``leader_id``).
- :class:`DebeziumMapping`: Debezium's outbox convention (``id`` UUID, ``aggregatetype``,
  ``aggregateid``, ``type``, ``payload``, extra columns), turned into records the way Debezium's outbox
  event router (``io.debezium.transforms.outbox.EventRouter``) turns them, configured with the
  router's own option names and defaults (:class:`~producer.mapping._event_router.EventRouter`). ``harvest
  init-db`` adds the relay's bookkeeping columns (:data:`DEBEZIUM_SEQ`, :data:`DEBEZIUM_LEADER`,
  :data:`DEBEZIUM_CREATED`) with defaults, so the writers' INSERTs do not change.

The relay's statements (:mod:`producer.db`, :mod:`producer.ops._deadletters`, :mod:`producer.relay.shards`) name
the outbox's columns only through a mapping: :attr:`TableMapping.id` (the order of rows, bigint),
:attr:`~TableMapping.leader`, :attr:`~TableMapping.created`, and the record expressions of
:meth:`~TableMapping.record` (topic, key, value, header keys, header values), each qualified by the
statement's alias for the outbox.

Invariants (tests/test_producer/test_table_mapping.py):
- :data:`GOHARVEST` produces exactly the SQL the relay used before mappings existed;
- the router's options are read strictly (:mod:`producer.mapping._event_router`: an unknown, unimplemented or
  mistyped option is a :class:`~producer.errors.ConfigError` naming it);
- the topic of a row is the router's: ``route.topic.regex`` must match the whole routed value, and
  then ``route.topic.replacement`` replaces it; otherwise the value itself is the topic.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from psycopg import sql

from harvest_outbox.producer.errors import ConfigError, shown

# AdditionalField and EventRouter are re-exported: their import path before the router had a module of its own.
from harvest_outbox.producer.mapping._event_router import AdditionalField as AdditionalField
from harvest_outbox.producer.mapping._event_router import EventRouter as EventRouter
from harvest_outbox.producer.mapping._event_router import pg_regex
from harvest_outbox.producer.mapping._java_regex import LINE_TERMINATOR_CLASS

#: Java's ``(.*)``, ``(.+)`` or the same in a named group: the whole value in group 1.
_WHOLE_VALUE_GROUP = re.compile(r"\((?:\?<[A-Za-z][A-Za-z0-9]*>)?\.([*+])\)")

#: The ordering column ``harvest init-db`` adds to a Debezium outbox (its ``id`` is a UUID, which has
#: no order): a bigint from a sequence, so rows go out in insertion order, like goharvest's ``id``.
DEBEZIUM_SEQ = "harvest_seq"
#: The mark column (goharvest's ``leader_id``).
DEBEZIUM_LEADER = "harvest_leader"
#: When the row was written (goharvest's ``create_time``): backlog age, dwell.
DEBEZIUM_CREATED = "harvest_created"


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


class TableMapping(ABC):
    """How the relay reads one kind of outbox table (see the module docstring)."""

    kind: str = ""
    id_column: str = "id"
    leader_column: str = "leader_id"
    created_column: str = "create_time"

    def id(self, alias: str | None = None) -> sql.Identifier:
        return _col(alias, self.id_column)

    def leader(self, alias: str | None = None) -> sql.Identifier:
        return _col(alias, self.leader_column)

    def created(self, alias: str | None = None) -> sql.Identifier:
        return _col(alias, self.created_column)

    @abstractmethod
    def shard_key(self, alias: str | None = None) -> sql.Composable:
        """The text a row's shard is hashed from (its Kafka key)."""

    def relayed(self, alias: str | None = None) -> sql.Composable | None:
        """The condition of the rows the relay owns (None: every row)."""
        return None

    def claimable(self, joiner: str = "WHERE", alias: str | None = None) -> sql.Composable:
        """`` WHERE <relayed>`` (or ``AND``), empty when every row is the relay's."""
        cond = self.relayed(alias)
        return sql.SQL("") if cond is None else sql.SQL(" {} {}").format(sql.SQL(joiner), cond)

    @abstractmethod
    def record(self, alias: str, value_type: str) -> RecordSql:
        """The SQL of a row's record, over the statement's alias ``alias`` for the outbox."""

    def source_row(self, alias: str) -> sql.Composable | None:
        """The row as JSON, kept with its dead letter so a requeue can restore it (None: the dead
        letter's record columns are the row)."""
        return None


def _col(alias: str | None, name: str) -> sql.Identifier:
    return sql.Identifier(alias, name) if alias else sql.Identifier(name)


# Why a marked row can never be produced, decided in the mark statement. Its texts are the dead
# letters' errors (see producer.db: _HEADER_BAD checks header arrays on the returned rows).
_GOHARVEST_BAD = """CASE
  WHEN {o}.kafka_topic IS NULL OR {o}.kafka_topic = '' THEN
    'kafka_topic is NULL or empty: the row has nowhere to go; fix kafka_topic and requeue'
  WHEN {o}.kafka_key IS NULL THEN 'kafka_key is NULL: goharvest''s schema requires a key; set kafka_key and requeue'
  WHEN {o}.kafka_header_keys IS NULL OR {o}.kafka_header_values IS NULL THEN
    'kafka_header_keys/kafka_header_values is NULL: use empty arrays ''{{}}'' for no headers'
END"""


class GoharvestMapping(TableMapping):
    """goharvest's outbox table, unchanged."""

    kind = "goharvest"

    def __repr__(self) -> str:
        return "GOHARVEST"

    def shard_key(self, alias: str | None = None) -> sql.Composable:
        return _col(alias, "kafka_key")

    def record(self, alias: str, value_type: str) -> RecordSql:
        o = sql.Identifier(alias)

        def c(name: str) -> sql.Composable:
            return _col(alias, name)

        value = c("kafka_value") if value_type == "bytea" else sql.SQL("{}::varchar").format(c("kafka_value"))
        return RecordSql(
            topic=sql.SQL("{}::text").format(c("kafka_topic")),
            key=sql.SQL("{}::varchar").format(c("kafka_key")),
            value=value,
            header_keys=sql.SQL("NULLIF({}::text[], '{{}}')").format(c("kafka_header_keys")),
            header_values=sql.SQL("NULLIF({}::text[], '{{}}')").format(c("kafka_header_values")),
            bad=sql.SQL(_GOHARVEST_BAD).format(o=o),
        )


GOHARVEST = GoharvestMapping()

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
class DebeziumMapping(TableMapping):
    """Debezium's outbox table, routed by :class:`EventRouter`."""

    router: EventRouter = field(default_factory=EventRouter)

    kind = "debezium"
    id_column = DEBEZIUM_SEQ
    leader_column = DEBEZIUM_LEADER
    created_column = DEBEZIUM_CREATED

    def shard_key(self, alias: str | None = None) -> sql.Composable:
        return sql.SQL("{}::text").format(_col(alias, self.router.field_event_key))

    def relayed(self, alias: str | None = None) -> sql.Composable | None:
        # Rows written before `harvest init-db` have no harvest_seq: they were the previous relay's.
        return sql.SQL("{} IS NOT NULL").format(self.id(alias))

    def topic(self, alias: str) -> sql.Composable:
        r = self.router
        # Collation "C": the routing then depends on no locale, and a column's nondeterministic collation
        # (which Postgres refuses regular expressions under) does not matter.
        routed = sql.SQL('{}::text COLLATE "C"').format(_col(alias, r.route_by_field))
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
        payload = _col(alias, r.field_event_payload)
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
        partition = next((a.column for a in r.additional if a.placement == "partition"), None)
        topic = self.topic(alias)
        key = _col(alias, r.field_event_key)
        bad = sql.SQL("""CASE
  WHEN {route} IS NULL OR {route}::text = '' THEN
    {route_msg}
  WHEN {key} IS NULL THEN {key_msg}
  WHEN {eid} IS NULL THEN {eid_msg}{negative}
END""").format(
            negative=_negative_partition(alias, partition),
            route=_col(alias, r.route_by_field),
            route_msg=sql.Literal(
                f"{r.route_by_field} (route.by.field) is NULL or empty: the row has nowhere to go; "
                f"fix {r.route_by_field} and requeue"
            ),
            key=key,
            key_msg=sql.Literal(
                f"{r.field_event_key} (table.field.event.key) is NULL: harvest keeps per-key order "
                f"and needs a key; set {r.field_event_key} and requeue"
            ),
            eid=_col(alias, r.field_event_id),
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
                sql.SQL(", ").join(sql.SQL("{}::text").format(_col(alias, c)) for c in cols)
            ),
            bad=bad,
            partition=sql.SQL("NULL::int") if partition is None else sql.SQL("{}::int").format(_col(alias, partition)),
        )

    def source_row(self, alias: str) -> sql.Composable | None:
        return sql.SQL("to_jsonb({})").format(sql.Identifier(alias))


def _negative_partition(alias: str, column: str | None) -> sql.Composable:
    """The ``bad`` branch for a negative ``column:partition`` value. produce() reads -1 as librdkafka's
    "unassigned" (the partitioner picks) and other negatives are no partition at all, where Debezium's
    producer refuses the record: a permanent fault of the row, so it is a dead letter at once, naming the
    value. A partition at or above the topic's count is the relay's to find (producer/ops/preflight.py: the
    count is the broker's)."""
    if column is None:
        return sql.SQL("")
    return sql.SQL("\n  WHEN {col} < 0 THEN {before} || {col}::int::text || {after}").format(
        col=_col(alias, column),
        before=sql.Literal(f"{column} (table.fields.additional.placement {column}:partition) is "),
        after=sql.Literal(
            ": a negative partition, which Debezium's producer refuses (-1 is not 'any partition' here); "
            f"set {column} to a partition of the topic (0 or more) or NULL (the partitioner, by key), and requeue"
        ),
    )


def partition_column(mapping: TableMapping) -> str | None:
    """The column a Debezium mapping places in the record's partition (``column:partition``), or None."""
    if not isinstance(mapping, DebeziumMapping):
        return None
    return next((a.column for a in mapping.router.additional if a.placement == "partition"), None)


def _array_item(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


TABLE_MAPPINGS = ("goharvest", "debezium")


def table_mapping(kind: Any, router_options: Mapping[str, Any] | None = None, path: str = "") -> TableMapping:
    """The mapping named by ``tableMapping`` (with ``eventRouter``'s options for ``debezium``)."""
    where = f"{path}." if path else ""
    if kind in (None, "goharvest"):
        if router_options:
            raise ConfigError(
                f"{where}eventRouter: only applies to tableMapping: debezium (this outbox is "
                f"goharvest's); remove it or set tableMapping: debezium"
            )
        return GOHARVEST
    if kind == "debezium":
        return DebeziumMapping(EventRouter.from_options(router_options, f"{where}eventRouter"))
    raise ConfigError(
        f"{where}tableMapping: {shown(kind)} is not a table mapping; use one of "
        f"{', '.join(TABLE_MAPPINGS)} (default goharvest)"
    )
