"""Debezium's outbox event router options (``io.debezium.transforms.outbox.EventRouter``), as far as they
shape a record: their names, their defaults, and how harvest reads them (YAML ``eventRouter``,
docs/debezium.md). :class:`~producer.mapping.debezium.DebeziumMapping` turns rows into records with them.

Invariants (tests/test_producer/mapping/test_table_mapping.py):
- an unknown router option, a known one harvest does not implement (:data:`_UNSUPPORTED`, with the
  reason), or a value of the wrong kind is a :class:`~producer.errors.ConfigError` naming the option
  (never silently ignored);
- ``route.topic.regex`` is Java's regex, translated to a Postgres ARE that routes every value as Java's
  RegexRouter does, or refused naming the construct (:mod:`producer.mapping._java_regex`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harvest_outbox.producer.errors import ConfigError, shown
from harvest_outbox.producer.mapping._java_regex import translate

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
        pg_regex(regex, replacement, f"{path}.route.topic.regex")
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


def pg_regex(regex: str, replacement: str, where: str) -> tuple[str, str]:
    """Java regex + replacement (RegexRouter's) -> a Postgres ARE matching the whole value + a
    regexp_replace replacement that route every value as Java does, or a ConfigError naming the
    construct and a fix (:mod:`producer.mapping._java_regex`)."""
    translated = translate(regex, replacement, where)
    return translated.pattern, translated.replacement
