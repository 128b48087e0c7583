"""Table mappings: which columns of an outbox table make a Kafka record, and where the relay keeps its
own bookkeeping (docs/debezium.md).

- :data:`GOHARVEST` (default): goharvest's table as is (``id``, ``create_time``, ``kafka_topic``,
  ``kafka_key``, ``kafka_value``, ``kafka_header_keys``/``_values``, ``leader_id``).
- :class:`DebeziumMapping`: Debezium's outbox convention (``id`` UUID, ``aggregatetype``,
  ``aggregateid``, ``type``, ``payload``, extra columns), turned into records the way Debezium's outbox
  event router (``io.debezium.transforms.outbox.EventRouter``) turns them, configured with the
  router's own option names and defaults (:class:`EventRouter`). ``harvest init-db`` adds the relay's
  bookkeeping columns (:data:`DEBEZIUM_SEQ`, :data:`DEBEZIUM_LEADER`, :data:`DEBEZIUM_CREATED`) with
  defaults, so the writers' INSERTs do not change.

The relay's statements (:mod:`producer.db`, :mod:`producer.deadletters`, :mod:`producer.shards`) name
the outbox's columns only through a mapping: :attr:`TableMapping.id` (the order of rows, bigint),
:attr:`~TableMapping.leader`, :attr:`~TableMapping.created`, and the record expressions of
:meth:`~TableMapping.record` (topic, key, value, header keys, header values), each qualified by the
statement's alias for the outbox.

Invariants (tests/test_producer/test_table_mapping.py):
- :data:`GOHARVEST` produces exactly the SQL the relay used before mappings existed;
- an unknown router option, a known one harvest does not implement, or a value of the wrong kind is
  a :class:`~producer.errors.ConfigError` naming the option (never silently ignored);
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

#: The ordering column ``harvest init-db`` adds to a Debezium outbox (its ``id`` is a UUID, which has
#: no order): a bigint from a sequence, so rows go out in insertion order, like goharvest's ``id``.
DEBEZIUM_SEQ = "harvest_seq"
#: The mark column (goharvest's ``leader_id``).
DEBEZIUM_LEADER = "harvest_leader"
#: When the row was written (goharvest's ``create_time``): backlog age, dwell.
DEBEZIUM_CREATED = "harvest_created"

_EVENT_ROUTER_CLASS = "io.debezium.transforms.outbox.EventRouter"

# The router's options (Debezium 3.x, EventRouterConfigDefinition) with their defaults. Options
# harvest does not implement are listed in _UNSUPPORTED with the reason, so a copied connector config
# fails with an explanation rather than "unknown option".
_DEFAULTS: dict[str, Any] = {
    "table.field.event.id": "id",
    "table.field.event.key": "aggregateid",
    "table.field.event.payload": "payload",
    "table.fields.additional.placement": "",
    "table.fields.additional.error.on.missing": True,
    "route.by.field": "aggregatetype",
    "route.topic.regex": "(?<routedByValue>.*)",
    "route.topic.replacement": "outbox.event.${routedByValue}",
    "route.tombstone.on.empty.payload": False,
    "table.expand.json.payload": False,
    # Accepted with their default values only (they have no effect on records harvest writes).
    "table.op.invalid.behavior": "warn",
    "debezium.op.invalid.behavior": "warn",
    "table.json.payload.null.behavior": "ignore",
}
_UNSUPPORTED = {
    "table.field.event.timestamp": "harvest stamps records with the produce time; the router's own default "
    "(the time Debezium read the change) is not a column value either",
    "table.field.event.schema.version": "harvest publishes the payload's bytes; versioned Connect schemas need a "
    "Connect converter",
    "tracing.span.context.field": "harvest carries W3C trace context in the traceparent header (docs/writing.md, Trace context)",
    "tracing.operation.name": "see tracing.span.context.field",
    "tracing.with.context.field.only": "see tracing.span.context.field",
}
_BOOLEAN = {"table.fields.additional.error.on.missing", "route.tombstone.on.empty.payload", "table.expand.json.payload"}
_FIXED = {"table.op.invalid.behavior", "debezium.op.invalid.behavior", "table.json.payload.null.behavior"}
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")
_JAVA_NAMED_GROUP = re.compile(r"\(\?<([A-Za-z][A-Za-z0-9]*)>")


@dataclass(frozen=True)
class AdditionalField:
    """One entry of ``table.fields.additional.placement``: ``column:header[:alias]`` or
    ``column:partition`` (the record's partition: an ``integer`` column, as the router reads an INT32)."""

    column: str
    alias: str
    placement: str = "header"


@dataclass(frozen=True)
class EventRouter:
    """Debezium's outbox event router options (their names and defaults), as far as they shape a record.

    Build with :meth:`from_options`, which takes a connector's settings as they are (with or without
    the ``transforms.<name>.`` prefix)."""

    field_event_id: str = "id"
    field_event_key: str = "aggregateid"
    field_event_payload: str = "payload"
    route_by_field: str = "aggregatetype"
    route_topic_regex: str = "(?<routedByValue>.*)"
    route_topic_replacement: str = "outbox.event.${routedByValue}"
    additional: tuple[AdditionalField, ...] = ()
    tombstone_on_empty_payload: bool = False

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None, path: str = "eventRouter") -> EventRouter:
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise ConfigError(
                f"{path}: expected a mapping of the event router's options (route.by.field: "
                f"aggregatetype, ...), got {type(options).__name__}"
            )
        values: dict[str, Any] = dict(_DEFAULTS)
        for raw_key, value in options.items():
            key = _strip_transform_prefix(str(raw_key))
            where = f"{path}.{raw_key}"
            if key == "type":
                if value != _EVENT_ROUTER_CLASS:
                    raise ConfigError(
                        f"{where}: {shown(value)} is not Debezium's outbox event router; harvest mirrors "
                        f"{_EVENT_ROUTER_CLASS} only"
                    )
                continue
            if key in _UNSUPPORTED:
                raise ConfigError(f"{where}: not supported by harvest ({_UNSUPPORTED[key]}); remove the option")
            if key not in _DEFAULTS:
                raise ConfigError(
                    f"{where}: unknown option of the outbox event router; known options: {', '.join(sorted(_DEFAULTS))}"
                )
            if key in _BOOLEAN:
                value = _boolean(value, where)
            elif not isinstance(value, str):
                raise ConfigError(f"{where}: {shown(value)} must be a string")
            if key in _FIXED and value != _DEFAULTS[key]:
                raise ConfigError(
                    f"{where}: only {_DEFAULTS[key]!r} is supported (harvest never sees updates or "
                    f"deletes of outbox rows as events); remove the option"
                )
            values[key] = value
        if values["table.expand.json.payload"]:
            raise ConfigError(
                f"{path}.table.expand.json.payload: true is not supported: expanded payloads are "
                f"serialised by Connect's JsonConverter, and harvest publishes the payload's text as "
                f"is (what the router emits with table.expand.json.payload=false and a "
                f"StringConverter); remove the option or set it to false"
            )
        for key in ("table.field.event.id", "table.field.event.key", "table.field.event.payload", "route.by.field"):
            _column(values[key], f"{path}.{key}")
        regex, replacement = values["route.topic.regex"], values["route.topic.replacement"]
        _pg_regex(regex, replacement, f"{path}.route.topic.regex")
        return cls(
            field_event_id=values["table.field.event.id"],
            field_event_key=values["table.field.event.key"],
            field_event_payload=values["table.field.event.payload"],
            route_by_field=values["route.by.field"],
            route_topic_regex=regex,
            route_topic_replacement=replacement,
            additional=_additional(
                values["table.fields.additional.placement"], f"{path}.table.fields.additional.placement"
            ),
            tombstone_on_empty_payload=values["route.tombstone.on.empty.payload"],
        )


def _strip_transform_prefix(key: str) -> str:
    # "transforms.outbox.route.by.field" (a connector's setting) -> "route.by.field"
    if key.startswith("transforms."):
        parts = key.split(".", 2)
        if len(parts) == 3:
            return parts[2]
    return key


def _boolean(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigError(f"{where}: {shown(value)} must be true or false")


def _column(name: Any, where: str) -> str:
    if not isinstance(name, str) or not _COLUMN.match(name):
        raise ConfigError(
            f"{where}: {shown(name)} is not a column name (letters, digits, '_'; harvest reads unquoted, "
            f"lower-case column names as the router's Connect fields name them)"
        )
    return name


def _additional(spec: str, where: str) -> tuple[AdditionalField, ...]:
    out: list[AdditionalField] = []
    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            continue
        parts = [p.strip() for p in entry.split(":")]
        if len(parts) not in (2, 3):
            raise ConfigError(f"{where}: {shown(entry)} must be column:placement[:alias], e.g. type:header:eventType")
        column, placement = _column(parts[0], where), parts[1].lower()
        alias = parts[2] if len(parts) == 3 and parts[2] else column
        if placement == "header":
            if alias == "id":
                raise ConfigError(
                    f"{where}: {shown(entry)} would add a second 'id' header (the router always sets "
                    f"'id' "
                    f"to the event id); choose another alias"
                )
            out.append(AdditionalField(column, alias))
        elif placement == "partition":
            if any(a.placement == "partition" for a in out):
                raise ConfigError(f"{where}: {shown(entry)}: a second partition placement; a record has one partition")
            out.append(AdditionalField(column, column, "partition"))
        elif placement == "envelope":
            raise ConfigError(
                f"{where}: {shown(entry)}: placement 'envelope' is not supported by harvest (the "
                f"envelope "
                f"is a Connect Struct, whose bytes a Connect converter makes); use header or partition"
            )
        else:
            raise ConfigError(f"{where}: {shown(entry)}: unknown placement {parts[1]!r}; use header or partition")
    return tuple(out)


def _pg_regex(regex: str, replacement: str, where: str) -> tuple[str, str]:
    """Java regex + replacement (RegexRouter's) -> a Postgres ARE matching the whole value + a
    regexp_replace replacement. Named groups become numbered ones; ``${name}`` and ``$n`` become
    ``\\n``."""
    # Count capturing groups in order: "(" not followed by "?" is one, "(?<name>" is one.
    pattern = ""
    i = 0
    numbered: dict[str, int] = {}
    count = 0
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            pattern += regex[i : i + 2]
            i += 2
            continue
        if c == "(":
            m = _JAVA_NAMED_GROUP.match(regex, i)
            if m:
                count += 1
                numbered[m.group(1)] = count
                pattern += "("
                i = m.end()
                continue
            if regex.startswith("(?", i):
                if not regex.startswith("(?:", i):
                    raise ConfigError(
                        f"{where}: {shown(regex)}: the group {regex[i : i + 4]!r}… is not supported "
                        f"(harvest "
                        f"evaluates the routing regex in Postgres: plain, non-capturing and named "
                        f"groups)"
                    )
            else:
                count += 1
        pattern += c
        i += 1
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"{where}: {shown(regex)} is not a valid regular expression: {exc}") from None
    out = ""
    i = 0
    while i < len(replacement):
        c = replacement[i]
        if c == "\\" and i + 1 < len(replacement):
            nxt = replacement[i + 1]
            out += "\\\\" if nxt == "\\" else nxt
            i += 2
            continue
        if c == "$":
            m = re.match(r"\$\{([A-Za-z][A-Za-z0-9]*)\}", replacement[i:])
            if m:
                if m.group(1) not in numbered:
                    raise ConfigError(
                        f"{where}: route.topic.replacement {shown(replacement)} names group "
                        f"{m.group(1)!r}, which route.topic.regex {shown(regex)} does not define"
                    )
                out += f"\\{numbered[m.group(1)]}"
                i += m.end()
                continue
            m = re.match(r"\$(\d)", replacement[i:])
            if m and int(m.group(1)) <= count:
                out += f"\\{m.group(1)}"
                i += m.end()
                continue
            raise ConfigError(
                f"{where}: route.topic.replacement {shown(replacement)}: '$' must name a group "
                f"(${{name}} or $1); write \\$ for a dollar sign"
            )
        out += "\\\\" if c == "\\" else c
        i += 1
    return "^(?:" + pattern + ")$", out


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
        routed = sql.SQL("{}::text").format(_col(alias, r.route_by_field))
        pattern, replacement = _pg_regex(r.route_topic_regex, r.route_topic_replacement, "route.topic.regex")
        whole = re.fullmatch(r"\^\(\?:\((\.\*|\.\+)\)\)\$", pattern)
        if whole and re.fullmatch(r"[^\\]*\\1[^\\]*", replacement):
            # The common case (the default regex, one group holding everything): a concatenation, no
            # regex per row. ".+" does not match the empty value, which then stays as it is ('').
            before, after = replacement.split("\\1")
            if whole.group(1) == ".*":
                return sql.SQL("({} || {} || {})").format(sql.Literal(before), routed, sql.Literal(after))
            return sql.SQL("CASE WHEN {v} = '' THEN {v} ELSE {b} || {v} || {a} END").format(
                v=routed, b=sql.Literal(before), a=sql.Literal(after)
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
  WHEN {eid} IS NULL THEN {eid_msg}
END""").format(
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
