"""A fleet config file: many outboxes served by one relay process, listed and/or discovered.

A file is a fleet file when it has an ``outboxes:`` or a ``discover:`` section; any other file is one
relay's (goharvest's reaper YAML, read by :func:`producer.config.load_yaml`) and stays valid as it is::

    harvest:                 # the defaults every outbox starts from: any harvest key
      baseKafkaConfig: {bootstrap.servers: kafka:9092}
      leaderElection: postgres
      prometheusPort: 9090   # the fleet's one endpoint
    outboxes:                # listed: each entry's keys over the defaults (mappings merged key by key)
      - id: billing          # optional; default <database>/<outboxTable>
        dataSource: postgres://relay@db1/app
        outboxTable: billing.outbox
    discover:                # found while running: every schema matching `schemas` holding `table`
      - dataSource: postgres://relay@db2/tenants
        schemas: "tenant_*"
        table: outbox
        databases: ["tenants", "tenants_eu_*"]   # optional: other databases on that server
        harvest: {uuidSequencing: true}         # keys for the outboxes found here
    fleet: {discoveryInterval: 30s, restartBackoff: 1s, restartBackoffMax: 1m, statementConnections: 10}

Invariants (``tests/test_producer/fleet/test_fleet_spec.py``):
- every outbox's config is a whole :class:`~producer.config.HarvestConfig`, validated as a one-outbox
  file would be; flags and ``HARVEST_<KEY>`` variables stand in for the defaults (an entry's own key
  wins over them, so a ``HARVEST_DATA_SOURCE`` never points every outbox at one database); an error names the
  entry (``outboxes[2] (billing)``), the key, the value and the fix;
- ids are unique, and no two entries name the same outbox (server, database, table);
- each outbox gets a relay name ``<name>/<id>`` and, unless its entry sets one, a NELI group
  ``<leaderGroupID>.<id>`` of its own, so fleets elect a leader per outbox;
- an outbox's relay is a ``standby: cold`` one with ``idlePollInterval: 5s`` unless the defaults or its
  entry say otherwise (:data:`FLEET_DEFAULTS`);
- the fleet serves one HTTP endpoint: ``prometheusPort`` belongs to the defaults, never to an entry.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harvest_outbox.producer._kafka_names import NOT_A_NAME_CHAR
from harvest_outbox.producer.config import (
    FileConfig,
    HarvestConfig,
    StartupNote,
    attribute_name,
    config_from_document,
    default_name,
    file_config,
    parse_duration,
    read_document,
    variable_name,
)
from harvest_outbox.producer.errors import ConfigError, shown

#: The sections of a fleet file.
FLEET_KEYS = ("harvest", "logging", "outboxes", "discover", "fleet")
DISCOVER_KEYS = ("dataSource", "schemas", "table", "databases", "harvest")
OPTION_KEYS = (
    "discoveryInterval",
    "restartBackoff",
    "restartBackoffMax",
    "sharedProducer",
    "statementConnections",
    "workers",
)
#: ``fleet.statementConnections``' default and bounds (connections per database and process: docs/fleet.md).
DEFAULT_STATEMENT_CONNECTIONS = 10
STATEMENT_CONNECTIONS_RANGE = (0, 1000)
#: ``fleet.workers``' bounds: worker processes of one fleet (``auto``: one per CPU the process may run on).
WORKERS_RANGE = (1, 256)
#: Keys the fleet owns: its endpoint.
ENDPOINT_KEYS = ("prometheusPort", "prometheusBindAddress", "prometheusBasicAuth")
_ID = re.compile(r"[^\s%]{1,200}")


def is_fleet_document(data: Any) -> bool:
    return isinstance(data, Mapping) and ("outboxes" in data or "discover" in data)


@dataclass(frozen=True)
class FleetOptions:
    #: How often each ``discover`` entry looks for outboxes (also on SIGHUP). Default 30s.
    discovery_interval: float = 30.0
    #: The first wait before a failed outbox's relay is started again; doubled per failure ...
    restart_backoff: float = 1.0
    #: ... up to this. An outbox's failure never stops the others.
    restart_backoff_max: float = 60.0
    #: The statement connections the led outboxes of one database share in this process (a pool per
    #: database: producer/db/statement_pool.py). Default 10; 0: no pool (two per led outbox, each its own).
    statement_connections: int = DEFAULT_STATEMENT_CONNECTIONS
    #: Worker processes the fleet's outboxes are spread over (producer/fleet/workers.py): each runs the
    #: file as a fleet process of its own, and the balance shares the outboxes between them. Default 1:
    #: the process relays every outbox itself; ``auto``: one per CPU.
    workers: int = 1
    #: One Kafka producer for every at-least-once outbox this process leads that reaches Kafka with the same
    #: settings (producer/kafka/shared_producer.py); ``--uuid-sequencing`` and sharded outboxes keep their
    #: own. Default false, a producer per led outbox: a burst in one outbox held up another's trickle on a
    #: shared producer (docs/fleet.md); true saves ~3 threads, ~0.25 MB and the broker connections per led outbox.
    shared_producer: bool = False


@dataclass(frozen=True)
class Outbox:
    """One outbox of the fleet: its id (the ``outbox`` label of metrics) and its relay's config."""

    id: str
    config: HarvestConfig
    #: Where it came from: ``outboxes[2]`` or ``discover[0]``.
    origin: str

    @property
    def target(self) -> tuple[str, str, str, str]:
        """(host, port, database, table): two entries with the same target are the same outbox."""
        return outbox_target(self.config.data_source, self.config.outbox_table)


def outbox_target(dsn: str, table: str) -> tuple[str, str, str, str]:
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(dsn)
    return (str(parts.get("host", "")), str(parts.get("port", "")), str(parts.get("dbname", "")), table)


@dataclass(frozen=True)
class Discovery:
    """A ``discover`` entry: where to look and what the found outboxes' keys are."""

    origin: str
    data_source: str
    #: A glob (``tenant_*``) over schema names; the outbox is ``<schema>.<table>``.
    schemas: str
    table: str
    #: Globs over the server's database names; empty: only ``data_source``'s database.
    databases: tuple[str, ...]
    #: harvest keys for the outboxes found here, over the defaults.
    section: Mapping[str, Any]


@dataclass(frozen=True)
class FleetFile:
    """A fleet file read: its listed outboxes, its discoveries, its options, and how to make the config
    of an outbox found while running (:meth:`outbox`)."""

    listed: tuple[Outbox, ...]
    discoveries: tuple[Discovery, ...]
    options: FleetOptions
    log_level: str
    notes: tuple[StartupNote, ...]
    #: The fleet's endpoint (``prometheusPort`` etc. of the defaults); None: no endpoint.
    prometheus_port: int | None
    prometheus_bind_address: str
    prometheus_basic_auth: str
    #: The fleet's part of its relays' names (``<base_name>/<id>``); names its shared sessions too.
    base_name: str
    #: Builds a found outbox: (origin, section over the defaults, id) -> Outbox.
    _build: Callable[[str, Mapping[str, Any], str | None], Outbox] = dataclasses.field(repr=False)

    def outbox(self, origin: str, section: Mapping[str, Any], outbox_id: str | None = None) -> Outbox:
        return self._build(origin, section, outbox_id)


#: What an outbox of a fleet has where neither the fleet's defaults nor its entry say otherwise (one relay's
#: file keeps the relay's own defaults: ``standby: hot``, ``idlePollInterval`` 1s). ``idlePollInterval``: an
#: idle leader with the LISTEN open marks when a NOTIFY comes, and otherwise every 5 s, not every second:
#: an idle outbox's turn (a mark, its thread hand-offs) is ~1.3 ms of the process's CPU, and a process
#: leading 1,000 idle outboxes spent more than a core on them.
FLEET_DEFAULTS: Mapping[str, Any] = {"standby": "cold", "limits": {"idlePollInterval": "5s"}}


def merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over``'s keys over ``base``'s; mappings (``limits``, ``baseKafkaConfig``) merged key by key."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def default_id(config: HarvestConfig) -> str:
    _host, _port, database, table = outbox_target(config.data_source, config.outbox_table)
    return f"{database or 'postgres'}/{table}"


def group_suffix(outbox_id: str) -> str:
    """An outbox id as a Kafka name's part (``tenants/tenant_a.outbox`` -> ``tenants_tenant_a.outbox``)."""
    return NOT_A_NAME_CHAR.sub("_", outbox_id)


def load_config(
    path: str | Path,
    overrides: Mapping[str, Any] | None = None,
    log_level: str | None = None,
    sources: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> FleetFile | FileConfig:
    """The file at ``path``, read once: a fleet file, or one relay's (:func:`producer.config.load_yaml`'s)."""
    import os

    env = os.environ if env is None else env
    overrides = overrides or {}
    data, origins = read_document(path, overrides, log_level, env)
    if is_fleet_document(data):
        return fleet_from_document(data, overrides, log_level, sources, env, origins)
    return file_config(path, data, origins, overrides, log_level, sources, env)


def load_fleet(
    path: str | Path,
    overrides: Mapping[str, Any] | None = None,
    log_level: str | None = None,
    sources: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> FleetFile | None:
    """The fleet file at ``path``, or None when it is one relay's file (read it with ``load_yaml``)."""
    import os

    env = os.environ if env is None else env
    data, origins = read_document(path, overrides, log_level, env)
    if not is_fleet_document(data):
        return None
    return fleet_from_document(data, overrides, log_level, sources, env, origins)


def fleet_from_document(
    data: Mapping[str, Any],
    overrides: Mapping[str, Any] | None = None,
    log_level: str | None = None,
    sources: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    origins: Any = None,
) -> FleetFile:
    import os

    env = dict(os.environ if env is None else env)
    overrides = dict(overrides or {})
    for key in data:
        if key not in FLEET_KEYS:
            raise ConfigError(
                f"{shown(key)}: unknown top-level key of a fleet file; valid keys are: {', '.join(FLEET_KEYS)}"
            )
    defaults = _mapping(data.get("harvest"), "harvest")
    logging_section = data.get("logging")
    options = _options(_mapping(data.get("fleet"), "fleet"))

    # What makes each outbox's relay its own is the fleet's to set: a flag or variable naming one
    # relay (its name, its NELI group, its endpoint) applies to the fleet, not to every outbox alike.
    def own(key: str, attr: str) -> Any:
        value = overrides.pop(attr, None)
        from_env = env.pop(variable_name(key), None)
        return value if value is not None else from_env if from_env is not None else defaults.get(key)

    base_name = own("name", "name") or default_name()
    base_group = own("leaderGroupID", "leader_group_id") or "harvest"
    port = own("prometheusPort", "prometheus_port")
    bind = own("prometheusBindAddress", "prometheus_bind_address")
    auth = own("prometheusBasicAuth", "prometheus_basic_auth")
    defaults = {k: v for k, v in defaults.items() if k not in ("name", "leaderGroupID", *ENDPOINT_KEYS)}
    endpoint = _endpoint(port, bind, auth, logging_section, log_level, env)
    notes: list[StartupNote] = []

    def build(origin: str, section: Mapping[str, Any], outbox_id: str | None) -> Outbox:
        where = f"{origin} ({outbox_id})" if outbox_id else origin
        for key in ENDPOINT_KEYS:
            if key in section:
                raise ConfigError(
                    f"{origin}.{key}: a fleet serves one endpoint for all its outboxes; set harvest.{key} "
                    f"(the fleet's defaults) instead"
                )
        # A fleet's standbys hold no connections unless told to, and its idle leaders look for rows a NOTIFY did
        # not announce less often (docs/fleet.md, "Cost").
        harvest = merged(merged(copy.deepcopy(FLEET_DEFAULTS), defaults), section)  # never shared: _config reads it
        # Flags and variables stand in for the defaults: an entry's own key wins over them.
        own_overrides = {a: v for a, v in overrides.items() if not any(attribute_name(k) == a for k in section)}
        own_env = {v: t for v, t in env.items() if not any(variable_name(k) == v for k in section)}
        try:
            file_config = _config(harvest, logging_section, own_overrides, log_level, sources, own_env, origins)
        except ConfigError as exc:
            raise ConfigError(f"{where}, over the defaults in harvest: {exc}") from None
        config = file_config.harvest
        notes.extend(note for note in file_config.notes if note not in notes)
        oid = outbox_id if outbox_id is not None else default_id(config)
        if not _ID.fullmatch(oid):
            raise ConfigError(f"{origin}.id: {shown(oid)} must be 1-200 printable characters without spaces or '%'")
        name = section.get("name") or f"{base_name}/{oid}"
        group = section.get("leaderGroupID") or f"{base_group}.{group_suffix(oid)}"
        topic = config.leader_topic if ("leaderTopic" in harvest or "leader_topic" in overrides) else ""
        try:
            config = dataclasses.replace(config, name=name, leader_group_id=group, leader_topic=topic)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        return Outbox(oid, config, origin)

    listed = _listed(data.get("outboxes"), build)
    discoveries = tuple(
        _discovery(f"discover[{i}]", _mapping(entry, f"discover[{i}]"), defaults, overrides, env)
        for i, entry in enumerate(_sequence(data.get("discover"), "discover"))
    )
    if not listed and not discoveries:
        raise ConfigError(
            "outboxes / discover: a fleet file lists no outbox and discovers none; add an entry to either"
        )
    return FleetFile(
        listed,
        discoveries,
        options,
        endpoint.log_level,
        tuple(notes),
        None if port is None else endpoint.harvest.prometheus_port,
        endpoint.harvest.prometheus_bind_address,
        endpoint.harvest.prometheus_basic_auth,
        str(base_name),
        build,
    )


def _config(
    harvest: Mapping[str, Any],
    logging_section: Any,
    overrides: Mapping[str, Any],
    log_level: str | None,
    sources: Mapping[str, str] | None,
    env: Mapping[str, str],
    origins: Any,
) -> FileConfig:
    document: dict[str, Any] = {"harvest": dict(harvest)}
    if logging_section is not None:
        document["logging"] = logging_section
    return config_from_document(document, overrides, log_level, sources, env, origins)


def _endpoint(
    port: Any, bind: Any, auth: Any, logging_section: Any, log_level: str | None, env: Mapping[str, str]
) -> FileConfig:
    """The fleet's endpoint settings and log level, validated as a relay's would be."""
    section = {"prometheusPort": port, "prometheusBindAddress": bind, "prometheusBasicAuth": auth}
    # Only the endpoint's keys: the outboxes' own keys (a DSN from a variable) are theirs to judge.
    quiet_env = {k: v for k, v in env.items() if k == "HARVEST_LOG_LEVEL"}
    given = {k: v for k, v in section.items() if v is not None}
    return _config(given, logging_section, {}, log_level, {}, quiet_env, None)


def _listed(entries: Any, build: Callable[[str, Mapping[str, Any], str | None], Outbox]) -> tuple[Outbox, ...]:
    out: list[Outbox] = []
    for i, entry in enumerate(_sequence(entries, "outboxes")):
        origin = f"outboxes[{i}]"
        section = dict(_mapping(entry, origin))
        oid = section.pop("id", None)
        if oid is not None and not isinstance(oid, str):
            raise ConfigError(f"{origin}.id: {shown(oid)} must be a string, e.g. 'billing'")
        out.append(build(origin, section, oid))
    check_unique(out)
    return tuple(out)


def check_unique(outboxes: list[Outbox]) -> None:
    """Refuse two entries with one id, or two naming the same outbox."""
    ids: dict[str, Outbox] = {}
    targets: dict[tuple[str, str, str, str], Outbox] = {}
    for outbox in outboxes:
        if outbox.id in ids:
            raise ConfigError(
                f"{outbox.origin}.id: {shown(outbox.id)} is also {ids[outbox.id].origin}'s id; give each outbox its own id"
            )
        if outbox.target in targets:
            raise ConfigError(
                f"{outbox.origin}: names the outbox {outbox.config.outbox_table!r} of {targets[outbox.target].origin} "
                f"({targets[outbox.target].id}) again; list each outbox once"
            )
        ids[outbox.id] = targets[outbox.target] = outbox


def _discovery(
    origin: str,
    entry: Mapping[str, Any],
    defaults: Mapping[str, Any],
    overrides: Mapping[str, Any],
    env: Mapping[str, str],
) -> Discovery:
    for key in entry:
        if key not in DISCOVER_KEYS:
            raise ConfigError(f"{origin}.{shown(key)}: unknown key; valid keys are: {', '.join(DISCOVER_KEYS)}")
    dsn = (
        entry.get("dataSource")
        or overrides.get("data_source")
        or env.get("HARVEST_DATA_SOURCE")
        or defaults.get("dataSource")
    )
    if not isinstance(dsn, str) or not dsn:
        raise ConfigError(f"{origin}.dataSource: missing; name the server to look on, or set harvest.dataSource")
    texts = {}
    for key, default in (("schemas", "*"), ("table", "outbox")):
        value = entry.get(key, default)
        if not isinstance(value, str) or not value or not value.isprintable():
            raise ConfigError(f"{origin}.{key}: {shown(value)} must be a non-empty string, e.g. {default!r}")
        texts[key] = value
    if "." in texts["table"]:
        raise ConfigError(
            f"{origin}.table: {shown(texts['table'])} is a table name without its schema (the schemas come from "
            f"'schemas'), e.g. 'outbox'"
        )
    databases = entry.get("databases", ())
    if isinstance(databases, str):
        databases = (databases,)
    if not isinstance(databases, (list, tuple)) or not all(isinstance(d, str) and d for d in databases):
        raise ConfigError(f"{origin}.databases: {shown(databases)} must be a list of database names or globs")
    section = _mapping(entry.get("harvest"), f"{origin}.harvest")
    for key in ("dataSource", "outboxTable", *ENDPOINT_KEYS):
        if key in section:
            raise ConfigError(
                f"{origin}.harvest.{key}: set by discovery for each outbox it finds; remove it "
                f"(the server is {origin}.dataSource)"
            )
    return Discovery(origin, dsn, texts["schemas"], texts["table"], tuple(databases), section)


def _options(section: Mapping[str, Any]) -> FleetOptions:
    values: dict[str, Any] = {}
    for key, attr, low in (
        ("discoveryInterval", "discovery_interval", 1.0),
        ("restartBackoff", "restart_backoff", 0.01),
        ("restartBackoffMax", "restart_backoff_max", 0.01),
    ):
        if key in section:
            seconds = parse_duration(section[key], f"fleet.{key}")
            if not low <= seconds <= 86400:
                raise ConfigError(f"fleet.{key}: {shown(section[key])} must be between {low:g}s and 24h")
            values[attr] = seconds
    for key in section:
        if key not in OPTION_KEYS:
            raise ConfigError(f"fleet.{shown(key)}: unknown key; valid keys are: {', '.join(OPTION_KEYS)}")
    options = FleetOptions(**values)
    if "statementConnections" in section:
        options = dataclasses.replace(
            options, statement_connections=_statement_connections(section["statementConnections"])
        )
    if "workers" in section:
        options = dataclasses.replace(options, workers=_workers(section["workers"]))
    if "sharedProducer" in section:
        shared = section["sharedProducer"]
        if not isinstance(shared, bool):
            raise ConfigError(
                f"fleet.sharedProducer: {shown(shared)} must be true (one Kafka producer for the at-least-once "
                f"outboxes this process leads) or false (one per led outbox, the default)"
            )
        options = dataclasses.replace(options, shared_producer=shared)
    if options.restart_backoff_max < options.restart_backoff:
        raise ConfigError("fleet.restartBackoffMax: must be at least fleet.restartBackoff")
    return options


def _statement_connections(value: Any) -> int:
    low, high = STATEMENT_CONNECTIONS_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(
            f"fleet.statementConnections: {shown(value)} must be a whole number of connections from {low} to {high} "
            f"(per database and process, shared by the outboxes it leads; 0: two of its own per led outbox), e.g. "
            f"{DEFAULT_STATEMENT_CONNECTIONS}"
        )
    return value


def _workers(value: Any) -> int:
    low, high = WORKERS_RANGE
    if value == "auto":
        return max(low, min(high, cpus()))
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(
            f"fleet.workers: {shown(value)} must be a whole number of processes from {low} to {high}, or auto "
            f"(one per CPU), e.g. 2; 1 (the default) relays every outbox in this process"
        )
    return value


def cpus() -> int:
    """The CPUs this process may run on (its affinity, which a container's cpuset narrows)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path}: expected a mapping, got {type(value).__name__}")
    return value


def _sequence(value: Any, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{path}: expected a list of entries (YAML '- ...'), got {type(value).__name__}")
    return value
