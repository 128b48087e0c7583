"""Typed, validated relay configuration, and its YAML form (goharvest's reaper keys).

- :class:`Limits` carries goharvest's limit names and defaults, plus a few of our own
  (``maxDeliveryAttempts``, ``purgeBatchRecords``, ``purgeInterval``, ``idlePollInterval``).
- :class:`HarvestConfig` is the whole relay config; both are frozen and validated at construction,
  so an instance that exists is valid.
- :func:`load_yaml` / :func:`from_mapping` parse the reaper's YAML (``harvest: {...}``,
  ``logging: {level}``) strictly: an unknown key is an error that names it and lists the valid ones.
  Precedence: a CLI flag (``overrides``) > a ``HARVEST_<KEY>`` variable > the file's value (with its
  ``${…}`` references resolved) > the default (:mod:`producer.config_env`).

Invariants:
- every error is a :class:`~producer.errors.ConfigError` naming the field (YAML path), the value and a fix;
- every limit is bounded by what Kafka, Postgres and Python's timed waits accept (durations <= 24h,
  ``ioErrorBackoff`` >= 10ms, NELI's ``heartbeatTimeout`` 2s-10m, row counts <= 1,000,000,
  ``producerRing`` <= 256; see docs/configuration.md, Bounds, for why); ``dataSource`` is parsed by libpq;
  :meth:`HarvestConfig.check_kafka_properties` has librdkafka judge the Kafka properties;
- ``repr()``/``str()`` of a config never shows a secret (DSN password, SASL/SSL credentials);
- the producer config always ends up with ``enable.idempotence=true`` and ``acks=all``: a user
  value that contradicts them is rejected rather than silently overridden.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
import yaml
from psycopg.conninfo import conninfo_to_dict

from harvest_outbox.producer.config_env import (
    MAPPING,
    SCALAR,
    TEXT,
    Interpolation,
    Origins,
    apply_variables,
    attribute_name,
    literal_paths,
)
from harvest_outbox.producer.config_yaml import load_document, yaml_problem
from harvest_outbox.producer.errors import SHOWN_CHARS, ConfigError, shown
from harvest_outbox.producer.kafka_names import LEGAL_NAME, NAME_RULE, NOT_A_NAME_CHAR
from harvest_outbox.producer.redact import is_secret_kafka_key, redact_dsn, redact_error, redact_kafka_config
from harvest_outbox.producer.relay_spans import TracingConfig
from harvest_outbox.producer.serialization_config import SerializationConfig
from harvest_outbox.producer.table_mapping import GOHARVEST, TableMapping, table_mapping

DEFAULT_DATA_SOURCE = "host=localhost port=5432 user=postgres password= dbname=postgres sslmode=disable"
DEFAULT_BOOTSTRAP = "localhost:9092"
DEFAULT_PARTITIONER = "murmur2_random"  # Java client's default key placement
DEFAULT_LINGER_MS = 1
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL")


def _key(key: Any) -> str:
    """A mapping key as an error message's path shows it: plain when a short string, else :func:`shown`."""
    return key if isinstance(key, str) and len(key) <= SHOWN_CHARS and key.isprintable() else shown(key)


def parse_duration(value: Any, field_name: str) -> float:
    """Go-style duration (``"500ms"``, ``"1m30s"``, ``"0"``) -> seconds. Bare numbers are refused:
    Go reads them as nanoseconds, people mean seconds; we make them say which."""
    if isinstance(value, bool) or not isinstance(value, str):
        raise ConfigError(
            f"{field_name}: {shown(value)} is not a duration; write it with a unit, e.g. '500ms', '5s', '1m30s'"
        )
    text = value.strip()
    if text == "0":
        return 0.0
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ConfigError(
            f"{field_name}: {shown(value)} is not a duration; use Go syntax with units "
            f"ns/us/ms/s/m/h, e.g. '500ms', '5s', '1m30s'"
        )
    return total


def format_duration(seconds: float) -> str:
    if seconds == 0:
        return "0"
    if not math.isfinite(seconds) or seconds < 0:
        return repr(seconds)
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    if seconds < 60:
        return f"{seconds:g}s"
    return f"{seconds / 60:g}m" if seconds < 3600 else f"{seconds / 3600:g}h"


def default_name() -> str:
    host = NOT_A_NAME_CHAR.sub("_", socket.gethostname() or "localhost")
    import time

    return f"{host}_{os.getpid()}_{int(time.time())}"


#: Every duration limit is at most this: timed waits in Python overflow near 2**63 ns and Kafka's
#: millisecond settings are 32-bit (24.8 days); no relay timing is meaningful beyond a day.
MAX_DURATION = 24 * 3600.0
#: ioErrorBackoff floor: the pause after a failed database/Kafka operation before the next try.
MIN_IO_ERROR_BACKOFF = 0.01
INT32_MAX = 2**31 - 1
#: NELI maps heartbeatTimeout to the consumer group's session.timeout.ms = 3 x heartbeatTimeout;
#: brokers accept only sessions within group.min.session.timeout.ms (default 6 s) and
#: group.max.session.timeout.ms (default 30 min).
NELI_MIN_HEARTBEAT_TIMEOUT = 2.0
NELI_MAX_HEARTBEAT_TIMEOUT = 600.0
_ROWS_CAP = 1_000_000
_INT_CAPS = {
    "mark_query_records": _ROWS_CAP,
    "purge_batch_records": _ROWS_CAP,
    "txn_max_records": _ROWS_CAP,
    "max_in_flight_records": _ROWS_CAP,
    "producer_ring": 256,
}
_INT_CAP_WHY = {
    "mark_query_records": "one mark's rows are returned by one UPDATE ... RETURNING and held in memory at once",
    "purge_batch_records": "one purge sends its ids as one Postgres array parameter",
    "txn_max_records": "one harvest transaction's ids are deleted with one Postgres array parameter and held "
    "in memory until its commit",
    "max_in_flight_records": "in-flight records are held in memory until delivered",
    "producer_ring": "every ProducerID of every view is state that readers keep per partition until pruned; "
    "pipelining gains nothing beyond a few transactions in flight",
}

# (yaml key, attribute, kind) — kind "d" = duration (seconds), "i" = int
_LIMIT_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("ioErrorBackoff", "io_error_backoff", "d"),
    ("pollDuration", "poll_duration", "d"),
    ("minPollInterval", "min_poll_interval", "d"),
    ("maxPollInterval", "max_poll_interval", "d"),
    ("heartbeatTimeout", "heartbeat_timeout", "d"),
    ("drainInterval", "drain_interval", "d"),
    ("queueTimeout", "queue_timeout", "d"),
    ("markBackoff", "mark_backoff", "d"),
    ("maxInFlightRecords", "max_in_flight_records", "i"),
    ("sendConcurrency", "send_concurrency", "i"),
    ("sendBuffer", "send_buffer", "i"),
    ("markQueryRecords", "mark_query_records", "i"),
    ("minMetricsInterval", "min_metrics_interval", "d"),
    # ours
    ("maxDeliveryAttempts", "max_delivery_attempts", "i"),
    ("purgeBatchRecords", "purge_batch_records", "i"),
    ("purgeInterval", "purge_interval", "d"),
    ("idlePollInterval", "idle_poll_interval", "d"),
    ("rowTimeout", "row_timeout", "d"),
    # --uuid-sequencing (docs/design.md §5)
    ("txnMaxRecords", "txn_max_records", "i"),
    ("txnMaxDuration", "txn_max_duration", "d"),
    ("producerRing", "producer_ring", "i"),
    # operations (producer/health.py)
    ("livenessTimeout", "liveness_timeout", "d"),
)


# Limits that adapt to the backlog when the config leaves them out (``None``); a value a user sets
# is a cap. Measured on the relay benchmark (bench/bench_relay.py): beyond these the database's
# mark+purge loop, not the relay, bounds the drain.
_AUTO_FIELDS = frozenset({"mark_query_records", "max_in_flight_records", "txn_max_records"})
MARK_FLOOR = 100  # goharvest's markQueryRecords: the first mark of an idle relay asks for this many
AUTO_MARK_RECORDS = 5000
AUTO_MAX_IN_FLIGHT = 10000
AUTO_TXN_RECORDS = 5000


@dataclass(frozen=True)
class Limits:
    """Timing and sizing limits, in seconds / counts. Names follow goharvest's ``Limits``.

    ``None`` for ``max_poll_interval`` / ``drain_interval`` means goharvest's derived default
    (``heartbeat_timeout / 2`` and ``min(max_poll_interval, queue_timeout)``).
    ``send_concurrency`` and ``send_buffer`` are accepted for goharvest compatibility; this relay
    sends from one thread through one idempotent producer, so they have no effect.
    """

    # Each field's ``#:`` comment is its entry in the generated configuration reference
    # (docs/hooks/config_reference.py): a new limit documented here appears there.

    #: Pause after a database or Kafka error before retrying; at least 10ms (0 turned a database
    #: outage into a busy loop: 88 % CPU, ~5,000 log lines/s).
    io_error_backoff: float = 0.5
    #: How long the relay polls the producer per loop turn.
    poll_duration: float = 0.001
    #: NELI: the shortest pulse period of the election (goharvest's).
    min_poll_interval: float = 0.1
    #: NELI: the longest pulse period of the election. Unset: ``heartbeatTimeout`` / 2.
    max_poll_interval: float | None = None
    #: NELI: the leader fences itself when no heartbeat returns within this; the election group's
    #: session timeout is 3x it, so with ``leaderElection: neli`` it must be 2s-10m (brokers accept
    #: sessions of 6s-30m by default).
    heartbeat_timeout: float = 5.0
    #: How long a revoked leader waits for its in-flight records. Unset: min(``maxPollInterval``,
    #: ``queueTimeout``).
    drain_interval: float | None = None
    #: A record in flight longer than this is abandoned and its row marked again.
    queue_timeout: float = 30.0
    #: Pause when a mark finds nothing to claim.
    mark_backoff: float = 0.01
    #: Records in flight at once (at-least-once: also one record in flight per key). Unset: adaptive,
    #: up to :data:`AUTO_MAX_IN_FLIGHT`; a number caps it.
    max_in_flight_records: int | None = None
    #: Accepted for goharvest compatibility; no effect (one sending thread, one idempotent producer).
    send_concurrency: int = 8
    #: Accepted for goharvest compatibility; no effect.
    send_buffer: int = 10
    #: Rows one mark claims. Unset: adaptive, from :data:`MARK_FLOOR` (goharvest's, for the first mark
    #: of an idle relay) up to :data:`AUTO_MARK_RECORDS` (the ceiling once a mark comes back full,
    #: halving while they come back mostly empty); a number caps the adaptation (goharvest's meaning:
    #: no mark claims more rows than this).
    mark_query_records: int | None = None
    #: Period of the relay's metrics reading (``MeterRead``: backlog, oldest unsent age, throughput).
    min_metrics_interval: float = 5.0
    #: Failed deliveries before a row is dead-lettered, counted in Postgres across restarts
    #: (docs/reliability.md).
    max_delivery_attempts: int = 5
    #: At-least-once: delivered rows deleted per purge statement (with ``purgeInterval``).
    purge_batch_records: int = 500
    #: At-least-once: the longest a delivered row waits for its purge batch.
    purge_interval: float = 0.02
    #: Polling fallback: how often an idle relay marks when no NOTIFY arrives.
    idle_poll_interval: float = 1.0
    #: The longest one record may wait for its delivery report: the producer's ``message.timeout.ms``
    #: (``delivery.timeout.ms``) derives from it, so it bounds how long one row holds up others. A
    #: record that waits it out while the broker acknowledges other records counts as a failed attempt
    #: (in ``--uuid-sequencing`` mode, where a waiting record holds up every key, it is dead-lettered
    #: at once); one that waits it out while the broker acknowledges nothing (an outage) does not count.
    row_timeout: float = 30.0
    #: ``--uuid-sequencing``: a harvest transaction closes at this many records, at ``txnMaxDuration``,
    #: or once the backlog is drained and its first delivery report has arrived. Unset:
    #: :data:`AUTO_TXN_RECORDS`, halved after a delivery failure and grown back by half per commit.
    txn_max_records: int | None = None
    #: ``--uuid-sequencing``: a harvest transaction closes this long after its first record (or at
    #: ``txnMaxRecords``, or as soon as the backlog is drained).
    txn_max_duration: float = 0.05
    #: ``--uuid-sequencing``: producer ids per leader view, i.e. harvest transactions in flight (1 =
    #: stop-and-wait); at most 256.
    producer_ring: int = 4
    #: ``/healthz`` fails when the relay loop has not completed a metrics reading (one per
    #: ``minMetricsInterval``) for this long. Unset: max(15s, 3 x minMetricsInterval + heartbeatTimeout).
    liveness_timeout: float | None = None

    def __post_init__(self) -> None:
        if self.liveness_timeout is None and all(
            isinstance(v, (int, float)) and not isinstance(v, bool)
            for v in (self.min_metrics_interval, self.heartbeat_timeout)
        ):
            object.__setattr__(
                self, "liveness_timeout", max(15.0, 3 * self.min_metrics_interval + self.heartbeat_timeout)
            )
        if self.max_poll_interval is None:
            object.__setattr__(self, "max_poll_interval", self.heartbeat_timeout / 2)
        if self.drain_interval is None:
            object.__setattr__(self, "drain_interval", min(self.max_poll_interval, self.queue_timeout))  # type: ignore[type-var]
        yaml_name = {attr: key for key, attr, _ in _LIMIT_FIELDS}

        kinds = {attr: kind for _, attr, kind in _LIMIT_FIELDS}

        def need(attr: str, ok: bool, rule: str) -> None:
            if not ok:
                value = getattr(self, attr)
                text = format_duration(value) if kinds[attr] == "d" else shown(value)
                raise ConfigError(f"limits.{yaml_name[attr]}: {text} is invalid; it must be {rule}")

        for key, attr, kind in _LIMIT_FIELDS:
            value = getattr(self, attr)
            if value is None and attr in _AUTO_FIELDS:
                continue
            if kind == "i" and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"limits.{key}: {shown(value)} is not an integer; write a whole number, e.g. 100")
            if kind == "d" and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ConfigError(f"limits.{key}: {shown(value)} is not a duration in seconds")
        # Derived limits (maxPollInterval, drainInterval) last: their error should name what they derive from.
        for _key, attr, kind in sorted(_LIMIT_FIELDS, key=lambda f: f[1] in ("max_poll_interval", "drain_interval")):
            value = getattr(self, attr)
            if value is None and attr in _AUTO_FIELDS:
                continue
            if kind == "d":
                need(
                    attr,
                    value <= MAX_DURATION,
                    f"at most {format_duration(MAX_DURATION)} (Python's timed waits and "
                    f"Kafka's 32-bit millisecond settings overflow beyond; nothing in the relay needs more)",
                )
            else:
                cap = _INT_CAPS.get(attr, INT32_MAX)
                need(attr, value <= cap, f"at most {cap:,} ({_INT_CAP_WHY.get(attr, 'a 32-bit integer')})")
        # A zero back-off turns a database or Kafka outage into a busy loop (measured: 88 % CPU and
        # ~5,000 log lines/s during a Postgres outage with ioErrorBackoff: 0s).
        need(
            "io_error_backoff",
            self.io_error_backoff >= MIN_IO_ERROR_BACKOFF,
            f">= {format_duration(MIN_IO_ERROR_BACKOFF)} (a smaller back-off spins on the CPU and floods the log "
            f"while the database or Kafka is down)",
        )
        for attr in ("mark_backoff", "min_metrics_interval", "purge_interval"):
            need(attr, getattr(self, attr) >= 0, ">= 0")
        for attr in (
            "poll_duration",
            "min_poll_interval",
            "heartbeat_timeout",
            "drain_interval",
            "queue_timeout",
            "idle_poll_interval",
        ):
            need(attr, getattr(self, attr) >= 0.001, ">= 1ms")
        need("row_timeout", 1.0 <= self.row_timeout <= 3600.0, "between 1s and 1h (librdkafka's message timeout)")
        need(
            "max_poll_interval",
            self.max_poll_interval >= self.min_poll_interval,  # type: ignore[operator]
            f">= limits.minPollInterval ({format_duration(self.min_poll_interval)})",
        )
        need("txn_max_duration", self.txn_max_duration >= 0.0001, ">= 100us")
        # A metrics reading happens at most every minMetricsInterval: a shorter timeout would flap.
        need(
            "liveness_timeout",
            self.liveness_timeout > self.min_metrics_interval,  # type: ignore[operator]
            f"> limits.minMetricsInterval ({format_duration(self.min_metrics_interval)}), e.g. 3x it",
        )
        for attr in (
            "max_in_flight_records",
            "send_concurrency",
            "mark_query_records",
            "max_delivery_attempts",
            "purge_batch_records",
            "txn_max_records",
            "producer_ring",
        ):
            value = getattr(self, attr)
            need(attr, (value is None and attr in _AUTO_FIELDS) or value >= 1, ">= 1")
        need("send_buffer", self.send_buffer >= 0, ">= 0")

    @property
    def mark_ceiling(self) -> int:
        """The most rows one mark claims: ``markQueryRecords``, or the adaptive ceiling when unset."""
        return AUTO_MARK_RECORDS if self.mark_query_records is None else self.mark_query_records

    @property
    def in_flight_limit(self) -> int:
        return AUTO_MAX_IN_FLIGHT if self.max_in_flight_records is None else self.max_in_flight_records

    @property
    def txn_ceiling(self) -> int:
        return AUTO_TXN_RECORDS if self.txn_max_records is None else self.txn_max_records

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, path: str = "limits") -> Limits:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: expected a mapping of limit names to values, got {type(data).__name__}")
        by_key = {key: (attr, kind) for key, attr, kind in _LIMIT_FIELDS}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in by_key:
                raise ConfigError(f"{path}.{_key(key)}: unknown key; valid keys are: {', '.join(sorted(by_key))}")
            attr, kind = by_key[key]
            if kind == "d":
                kwargs[attr] = parse_duration(value, f"{path}.{key}")
            else:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ConfigError(f"{path}.{key}: {shown(value)} is not an integer; write a whole number, e.g. 100")
                kwargs[attr] = value
        return cls(**kwargs)


_TOP_KEYS = (
    "baseKafkaConfig",
    "producerKafkaConfig",
    "leaderTopic",
    "leaderGroupID",
    "dataSource",
    "outboxTable",
    "limits",
    "name",
    "prometheusPort",
    "leaderTopicReplicationFactor",
    "uuidSequencing",
    "leaderElection",
    "leaderLockCheckInterval",
    "prometheusBindAddress",
    "missingTopicPolicy",
    "shards",
    "tableMapping",
    "eventRouter",
    "eventIdHeader",
    "deadLetterRetention",
    "deadLetterPolicy",
    "tracing",
    "serialization",
)
#: How a ``HARVEST_<KEY>`` variable's text is read for each key (producer/config_env.py).
_ENV_KINDS = {
    **dict.fromkeys(_TOP_KEYS, TEXT),
    **dict.fromkeys(("prometheusPort", "leaderTopicReplicationFactor", "uuidSequencing", "shards"), SCALAR),
    **dict.fromkeys(
        ("baseKafkaConfig", "producerKafkaConfig", "limits", "eventRouter", "tracing", "serialization"), MAPPING
    ),
}
#: What the relay does with a row whose topic does not exist: park it in the dead letters at once,
#: or hold that topic's rows (marked, in memory) until the topic exists while other topics flow.
MISSING_TOPIC_POLICIES = ("deadLetter", "hold")
#: After a row is dead-lettered: its key's later rows flow (``skip``) or wait in the outbox until the
#: dead letter is requeued or discarded (``haltKey``; producer/key_halt.py, docs/dead-letters.md).
DEAD_LETTER_POLICIES = ("skip", "haltKey")
LEADER_ELECTIONS = ("neli", "postgres")
#: ``deadLetterRetention`` bounds, in seconds.
MIN_RETENTION, MAX_RETENTION = 60.0, 87600 * 3600.0
_FORCED_PRODUCER = {"enable.idempotence": True, "acks": "all"}
_DELIVERY_TIMEOUT_KEYS = ("message.timeout.ms", "delivery.timeout.ms")  # librdkafka aliases
#: Where /metrics, /healthz and /readyz listen unless told otherwise: every IPv4 interface, so a
#: Prometheus server or a kubelet on another host can reach them (bind 127.0.0.1 to keep them local).
DEFAULT_BIND_ADDRESS = "0.0.0.0"
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


def check_bind_address(value: Any, field_name: str = "prometheusBindAddress") -> str:
    """An IPv4/IPv6 literal or a host name to bind the HTTP endpoint to (no port, no brackets)."""
    import ipaddress

    fix = "e.g. '0.0.0.0' (all IPv4 interfaces), '127.0.0.1' (this host only), '::' or a host name"
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{field_name}: {shown(value)} is not an address to listen on; {fix}")
    text = value.strip()
    if text.startswith("[") and text.endswith("]"):
        raise ConfigError(f"{field_name}: {shown(value)}: write the IPv6 address without brackets, e.g. '::1'")
    try:
        ipaddress.ip_address(text)
        return text
    except ValueError:
        pass
    if text.count(":") == 1:
        raise ConfigError(
            f"{field_name}: {shown(value)} contains a port; put the port in prometheusPort and "
            f"only the address here, {fix}"
        )
    if not _HOSTNAME.match(text) or text.replace(".", "").isdigit():
        raise ConfigError(f"{field_name}: {shown(value)} is neither an IP address nor a host name; {fix}")
    return text


def _kafka_map(value: Any, path: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path}: expected a mapping of Kafka client properties, got {type(value).__name__}")
    out: dict[str, Any] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not k:
            raise ConfigError(f"{path}: property names must be non-empty strings, got {shown(k)}")
        if isinstance(v, (dict, list)):
            raise ConfigError(f"{path}.{k}: Kafka properties take scalar values, got {type(v).__name__}")
        out[k] = v
    return out


_BOOTSTRAP_KEYS = ("bootstrap.servers", "metadata.broker.list")  # librdkafka aliases


def _check_bootstrap(base: Mapping[str, Any]) -> None:
    for key in _BOOTSTRAP_KEYS:
        if key not in base:
            continue
        value = base[key]
        if value is None or (isinstance(value, str) and not value.strip()):
            raise ConfigError(
                f"baseKafkaConfig.{key}: {shown(value)} is empty; list the brokers, e.g. "
                f"'kafka1:9092,kafka2:9092' (or leave the key out for goharvest's default "
                f"{DEFAULT_BOOTSTRAP})"
            )
        if not isinstance(value, str):
            raise ConfigError(
                f"baseKafkaConfig.{key}: {shown(value)} is not a string (librdkafka would read "
                f"{shown(value)} as an IPv4 address and connect to it); quote it, e.g. "
                f"'kafka1:9092,kafka2:9092'"
            )


@dataclass(frozen=True)
class HarvestConfig:
    """Everything the relay needs. Construct directly (embedded mode) or via :func:`load_yaml`."""

    # Each field's ``#:`` comment is its entry in the generated configuration reference
    # (docs/hooks/config_reference.py): a new key documented here appears there.

    #: The outbox's Postgres, as a libpq connection string or URI (parsed by libpq when the file is
    #: read). Shown with its password and unknown keys redacted; prefer ``${file:…}`` or
    #: ``HARVEST_DATA_SOURCE`` to a password in the file (docs/environment.md).
    data_source: str = DEFAULT_DATA_SOURCE
    #: The outbox table, optionally schema-qualified (``app.outbox``).
    outbox_table: str = "outbox"
    #: librdkafka properties of every Kafka client the relay makes (producer, election, admin), checked
    #: by librdkafka when the file is read. ``bootstrap.servers`` must be a non-empty string; left out,
    #: the relay connects to ``localhost:9092`` (goharvest's default) and warns at start.
    base_kafka_config: Mapping[str, Any] = field(default_factory=dict)
    #: librdkafka properties of the producer only, over ``baseKafkaConfig``. ``enable.idempotence=true``
    #: and ``acks=all`` are forced (a contradicting value is an error); ``linger.ms`` defaults to 1; the
    #: delivery timeout derives from ``limits.rowTimeout``.
    producer_kafka_config: Mapping[str, Any] = field(default_factory=dict)
    #: NELI: the leader topic (created with one partition if missing). Unset: ``<leaderGroupID>.neli``,
    #: or ``<leaderGroupID>.neli.shards<S>`` with ``shards: S`` > 1 (one partition per shard).
    leader_topic: str = ""
    #: NELI: the consumer group of the election. Unset: ``harvest``.
    leader_group_id: str = ""
    #: This relay's name: the ``relay`` label of its metrics, the start of its log lines, its
    #: ``application_name``. Printable, no ``%``. Unset: ``<host>_<pid>_<time>``.
    name: str = ""
    #: Timing and sizing limits (below); durations are written ``500ms``, ``5s``, ``1m30s``.
    limits: Limits = field(default_factory=Limits)
    #: Serve ``/metrics``, ``/healthz`` and ``/readyz`` on this TCP port (0: any free port); unset: no
    #: endpoint (docs/health.md).
    prometheus_port: int | None = None
    #: Address the /metrics, /healthz and /readyz endpoint binds to (with ``prometheusPort``);
    #: ``127.0.0.1`` keeps them on this host.
    prometheus_bind_address: str = DEFAULT_BIND_ADDRESS
    #: NELI: replication factor of a leader topic the relay creates; -1: the broker's default.
    leader_topic_replication_factor: int = -1
    #: Exactly-once mode (docs/design.md §5): UUID-stamped CONTINUE_TXN records, harvest
    #: transactions committed with a fenced DB transaction, then ACK_TXN messages.
    uuid_sequencing: bool = False
    #: ``neli`` (goharvest's: Kafka consumer-group membership of ``leaderTopic``) or ``postgres`` (a
    #: session advisory lock in the outbox's database; see :mod:`producer.election.postgres`).
    leader_election: str = "neli"
    #: ``postgres`` election: how often the holder verifies its lock and standbys try to take it; the
    #: holder fences itself when it has not verified the lock for 2 x this.
    leader_lock_check_interval: float = 1.0
    #: ``deadLetter`` (default) or ``hold`` (see :data:`MISSING_TOPIC_POLICIES`).
    missing_topic_policy: str = "deadLetter"
    #: Scale out (``shards: S``): rows are split into S shards by a hash of ``kafka_key`` and each
    #: shard has its own leader, so up to S relays publish one outbox at once (docs/sharding.md).
    #: 1 (default): one active relay for the whole outbox, as goharvest.
    shards: int = 1
    #: Which columns of ``outboxTable`` make a record: goharvest's table (default) or Debezium's outbox
    #: routed as its event router does (YAML ``tableMapping: debezium`` + ``eventRouter: {...}`` with
    #: the router's option names; :mod:`producer.table_mapping`, docs/debezium.md).
    table_mapping: TableMapping = GOHARVEST
    #: A goharvest table's records get this header with a stable event id, ``<outboxTable>/<row id>``
    #: (the same on every re-send, so at-least-once consumers can dedupe); empty (default): records
    #: exactly as goharvest's. A Debezium table's records always carry the router's ``id`` header.
    event_id_header: str = ""
    #: The leader deletes dead letters parked (``dead_time``) longer ago than this, a batch at a time
    #: (docs/hygiene.md); 1m-87600h. Unset (or ``keep``, the default): kept until requeued.
    dead_letter_retention: float | None = None
    #: ``skip`` (default) or ``haltKey`` (see :data:`DEAD_LETTER_POLICIES`).
    dead_letter_policy: str = "skip"
    #: ``tracing: {spans, sampleRatio}``: relay spans when an OpenTelemetry SDK is configured
    #: (:class:`~producer.relay_spans.TracingConfig`, docs/tracing.md); on by default, a no-op without one.
    tracing: TracingConfig = field(default_factory=TracingConfig)
    #: ``serialization: {registry, topics}``: topics whose values the relay encodes with a schema
    #: registry (:class:`~producer.serialization_config.SerializationConfig`, docs/schemas.md); empty
    #: (default): every value published as stored.
    serialization: SerializationConfig = field(default_factory=SerializationConfig)

    def __post_init__(self) -> None:
        base = dict(_kafka_map(self.base_kafka_config, "baseKafkaConfig"))
        if not any(key in base for key in _BOOTSTRAP_KEYS):  # goharvest's default (FileConfig.notes says so)
            base["bootstrap.servers"] = DEFAULT_BOOTSTRAP
        _check_bootstrap(base)
        object.__setattr__(self, "base_kafka_config", base)
        prod = _kafka_map(self.producer_kafka_config, "producerKafkaConfig")
        for key, forced in _FORCED_PRODUCER.items():
            for where, conf in (("baseKafkaConfig", base), ("producerKafkaConfig", prod)):
                if key in conf and str(conf[key]).lower() not in {str(forced).lower(), "-1" if key == "acks" else ""}:
                    raise ConfigError(
                        f"{where}.{key}: {shown(conf[key])} is not allowed; the relay needs "
                        f"{key}={forced} for ordered, duplicate-free retries — remove the property"
                    )
        object.__setattr__(self, "producer_kafka_config", prod)
        if isinstance(self.limits, Limits):
            # The delivery timeout derives from limits.rowTimeout; a longer one would let a row hold
            # others up longer than the documented bound.
            bound = int(self.limits.row_timeout * 1000)
            for where, conf in (("baseKafkaConfig", base), ("producerKafkaConfig", prod)):
                for key in _DELIVERY_TIMEOUT_KEYS:
                    if key in conf:
                        try:
                            ms = int(conf[key])
                        except (TypeError, ValueError):
                            raise ConfigError(
                                f"{where}.{key}: {shown(conf[key])} is not a whole number of milliseconds"
                            ) from None
                        if ms <= 0 or ms > bound:
                            raise ConfigError(
                                f"{where}.{key}: {ms} exceeds limits.rowTimeout ({bound} ms) or is "
                                f"infinite; the producer's delivery timeout derives from "
                                f"limits.rowTimeout — set that instead and remove {key}"
                            )
        if not isinstance(self.data_source, str) or not self.data_source.strip():
            raise ConfigError(
                "dataSource: must be a non-empty libpq connection string or URI, e.g. "
                "'host=localhost dbname=app user=relay' or 'postgresql://relay@localhost/app'"
            )
        try:  # libpq's own parser (no connection): a typo such as passwd= is an error now, not at connect
            conninfo_to_dict(self.data_source)
        except psycopg.Error as exc:  # not chained: libpq's message quotes fragments of the DSN
            raise ConfigError(
                f"dataSource: {redact_error(str(exc), self.data_source).strip()} in "
                f"{redact_dsn(self.data_source)!r}; write a libpq connection string of key=value "
                f"pairs ('host=db dbname=app user=relay'; single-quote a value holding spaces or "
                f"quotes, backslash-escape quotes in it) or a URI "
                f"('postgresql://relay@db/app')"
            ) from None
        if not isinstance(self.outbox_table, str) or not self.outbox_table.strip():
            raise ConfigError("outboxTable: must be a table name, optionally schema-qualified ('app.outbox')")
        from harvest_outbox.producer.schema import parse_table_name  # late: schema imports errors only

        parse_table_name(self.outbox_table)  # raises ConfigError with the reason
        name = self.name or default_name()
        if "%" in name:
            raise ConfigError(f"name: {name!r} must not contain '%' (it separates fields in heartbeats)")
        if not name.isprintable():  # it starts every log line: a newline or ESC would forge or recolour lines
            raise ConfigError(
                f"name: {name!r} contains control or other non-printable characters; use a printable "
                f"name such as 'relay-1' (letters, digits, '.', '_', '-')"
            )
        object.__setattr__(self, "name", name)
        from harvest_outbox.producer.shards import check_shard_count

        check_shard_count(self.shards)
        if not isinstance(self.table_mapping, TableMapping):
            raise ConfigError(
                f"tableMapping: {shown(self.table_mapping)} is not a table mapping; build one with "
                f"producer.table_mapping.table_mapping('goharvest' | 'debezium', router_options)"
            )
        if not isinstance(self.event_id_header, str) or (
            self.event_id_header and (not self.event_id_header.isprintable() or len(self.event_id_header) > 64)
        ):
            raise ConfigError(
                f"eventIdHeader: {shown(self.event_id_header)} must be a header name of 1-64 printable "
                f"characters, e.g. 'harvest.event.id' (or empty: no event id header)"
            )
        if self.event_id_header in ("uuid", "traceparent", "tracestate"):
            raise ConfigError(
                f"eventIdHeader: {self.event_id_header!r} is a header harvest or its readers use; "
                f"choose another name, e.g. 'harvest.event.id'"
            )
        if self.event_id_header and self.table_mapping.kind != "goharvest":
            raise ConfigError(
                f"eventIdHeader: {self.event_id_header!r} applies to goharvest tables; a "
                f"{self.table_mapping.kind} table's records carry the event router's 'id' header; "
                f"remove eventIdHeader"
            )
        retention = self.dead_letter_retention
        if retention is not None and (
            isinstance(retention, bool)
            or not isinstance(retention, (int, float))
            or not MIN_RETENTION <= retention <= MAX_RETENTION
        ):
            number = isinstance(retention, (int, float)) and not isinstance(retention, bool)
            text = format_duration(retention) if number else shown(retention)
            raise ConfigError(
                f"deadLetterRetention: {text} must be a duration from {format_duration(MIN_RETENTION)} "
                f"(a shorter one deletes dead letters before anyone can look at them) to "
                f"{format_duration(MAX_RETENTION)} (10 years), e.g. '168h' for a week; leave it out "
                f"(or write 'keep') to keep dead letters until they are requeued"
            )
        group = self.leader_group_id or "harvest"
        # A sharded relay's leader topic has one partition per shard: by default a topic of its own,
        # so it never meets the one-partition topic of unsharded relays (or of another shard count).
        topic = self.leader_topic or (f"{group}.neli" if self.shards == 1 else f"{group}.neli.shards{self.shards}")
        for key, value in (("leaderGroupID", group), ("leaderTopic", topic)):
            if not LEGAL_NAME.match(value):
                raise ConfigError(f"{key}: {shown(value)} is not a valid Kafka name; use {NAME_RULE}")
        if not isinstance(self.uuid_sequencing, bool):
            raise ConfigError(f"uuidSequencing: {shown(self.uuid_sequencing)} must be true or false")
        if self.missing_topic_policy not in MISSING_TOPIC_POLICIES:
            raise ConfigError(
                f"missingTopicPolicy: {shown(self.missing_topic_policy)} is not a policy; use deadLetter "
                f"(park the row at once) or hold (keep that topic's rows until it exists)"
            )
        if not isinstance(self.tracing, TracingConfig):
            raise ConfigError(
                f"tracing: {shown(self.tracing)} is not a tracing config; build one with "
                f"producer.relay_spans.TracingConfig(spans=..., sample_ratio=...)"
            )
        if self.dead_letter_policy not in DEAD_LETTER_POLICIES:
            raise ConfigError(
                f"deadLetterPolicy: {shown(self.dead_letter_policy)} is not a policy; use skip (a key's later "
                f"rows flow past its dead letter) or haltKey (they wait until it is requeued or discarded)"
            )
        if self.leader_election not in LEADER_ELECTIONS:
            raise ConfigError(
                f"leaderElection: {shown(self.leader_election)} is not a leader election; use one of "
                f"{', '.join(LEADER_ELECTIONS)} (default neli)"
            )
        if (
            isinstance(self.leader_lock_check_interval, bool)
            or not isinstance(self.leader_lock_check_interval, (int, float))
            or not 0.01 <= self.leader_lock_check_interval <= 3600
        ):
            raise ConfigError(
                f"leaderLockCheckInterval: {shown(self.leader_lock_check_interval)} must be a duration "
                f"between 10ms and 1h, e.g. '1s'"
            )
        object.__setattr__(self, "leader_group_id", group)
        object.__setattr__(self, "leader_topic", topic)
        if not isinstance(self.limits, Limits):
            raise ConfigError("limits: expected a producer.config.Limits instance")
        if self.leader_election == "neli":
            hb = self.limits.heartbeat_timeout
            if hb < NELI_MIN_HEARTBEAT_TIMEOUT:
                raise ConfigError(
                    f"limits.heartbeatTimeout: {format_duration(hb)} is too short for leaderElection neli: the "
                    f"election's consumer-group session timeout is 3 x heartbeatTimeout "
                    f"({format_duration(3 * hb)}) and brokers refuse sessions shorter than "
                    f"group.min.session.timeout.ms (default 6s), so the relay would never lead; use "
                    f"{format_duration(NELI_MIN_HEARTBEAT_TIMEOUT)} or more"
                )
            if hb > NELI_MAX_HEARTBEAT_TIMEOUT:
                raise ConfigError(
                    f"limits.heartbeatTimeout: {format_duration(hb)} is too long for leaderElection neli: the "
                    f"election's consumer-group session timeout is 3 x heartbeatTimeout "
                    f"({format_duration(3 * hb)}) and brokers refuse sessions longer than "
                    f"group.max.session.timeout.ms (default 30m); use at most "
                    f"{format_duration(NELI_MAX_HEARTBEAT_TIMEOUT)}"
                )
        rf = self.leader_topic_replication_factor
        if isinstance(rf, bool) or not isinstance(rf, int) or not (rf == -1 or 1 <= rf <= 32767):
            raise ConfigError(
                f"leaderTopicReplicationFactor: {shown(rf)} must be -1 (the broker's default) or a "
                f"replica count 1-32767"
            )
        if self.prometheus_port is not None and (
            isinstance(self.prometheus_port, bool)
            or not isinstance(self.prometheus_port, int)
            or not 0 <= self.prometheus_port <= 65535
        ):
            raise ConfigError(
                f"prometheusPort: {shown(self.prometheus_port)} must be a TCP port 0-65535 (0 = any free "
                f"port), or omitted to disable the endpoint"
            )
        object.__setattr__(self, "prometheus_bind_address", check_bind_address(self.prometheus_bind_address))

    def producer_config(self) -> dict[str, Any]:
        """Effective confluent-kafka producer properties: base, then producer overrides, then forced values."""
        conf = dict(self.base_kafka_config)
        conf.setdefault("partitioner", DEFAULT_PARTITIONER)
        # One record in flight per key makes the relay round-trip bound, not batch bound: librdkafka's
        # 5 ms default linger would cap a key at ~100 records/s. 1 ms measured best (bench/).
        conf.setdefault("linger.ms", DEFAULT_LINGER_MS)
        conf.update(self.producer_kafka_config)
        conf.update(_FORCED_PRODUCER)
        if not any(k in conf for k in _DELIVERY_TIMEOUT_KEYS):
            conf["message.timeout.ms"] = int(self.limits.row_timeout * 1000)
        # librdkafka holds a record of a topic it has no metadata for up to this long (30 s by
        # default); the preflight refuses missing topics earlier, but keep it inside the bound too.
        conf.setdefault("topic.metadata.propagation.max.ms", min(30000, int(self.limits.row_timeout * 1000)))
        return conf

    def check_kafka_properties(self) -> None:
        """Let librdkafka judge the Kafka properties now, so a misspelt name or a bad value is a
        :class:`ConfigError` naming the section before anything starts (instead of an error at the first
        leadership). Builds a producer and a consumer with no bootstrap servers: they connect nowhere."""
        from confluent_kafka import Consumer, KafkaException, Producer

        quiet = {"bootstrap.servers": "", "log_level": 0}
        # In this order, so that an error is blamed on the section that holds the property: the producer
        # of base properties alone passing means the producer section's broke it (names may be aliases).
        checks: tuple[tuple[str, Any, dict[str, Any]], ...] = (
            ("baseKafkaConfig", Consumer, {**self.base_kafka_config, "group.id": "harvest-config-check", **quiet}),
            ("baseKafkaConfig", Producer, {**self.replace(producer_kafka_config={}).producer_config(), **quiet}),
            ("producerKafkaConfig", Producer, {**self.producer_config(), **quiet}),
        )
        if self.leader_election == "neli":  # the election consumer adds settings derived from the limits
            from harvest_outbox.producer.election.neli import neli_consumer_config

            checks += (
                (
                    "baseKafkaConfig",
                    Consumer,
                    {
                        **neli_consumer_config(
                            dict(self.base_kafka_config), self.leader_group_id, self.name, self.limits.heartbeat_timeout
                        ),
                        **quiet,
                    },
                ),
            )
        for where, client, conf in checks:
            try:
                made = client(conf)
                if isinstance(made, Consumer):
                    made.close()
            except (KafkaException, ValueError, TypeError) as exc:
                err = exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else str(exc)
                secrets = tuple(
                    str(v)
                    for conf_map in (self.base_kafka_config, self.producer_kafka_config)
                    for k, v in conf_map.items()
                    if is_secret_kafka_key(k)
                )
                text = redact_error(err, None, secrets)
                raise ConfigError(
                    f"{where}: {text}; check the property name and value against librdkafka's "
                    f"CONFIGURATION.md (https://github.com/confluentinc/librdkafka/blob/master/"
                    f"CONFIGURATION.md)"
                ) from None

    def replace(self, **changes: Any) -> HarvestConfig:
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        return (
            f"HarvestConfig(data_source={redact_dsn(self.data_source)!r}, outbox_table={self.outbox_table!r}, "
            f"base_kafka_config={redact_kafka_config(self.base_kafka_config)!r}, "
            f"producer_kafka_config={redact_kafka_config(self.producer_kafka_config)!r}, "
            f"leader_topic={self.leader_topic!r}, leader_group_id={self.leader_group_id!r}, "
            f"name={self.name!r}, limits={self.limits!r}, prometheus_port={self.prometheus_port!r}, "
            f"prometheus_bind_address={self.prometheus_bind_address!r}, "
            f"uuid_sequencing={self.uuid_sequencing!r}, leader_election={self.leader_election!r}, "
            f"leader_lock_check_interval={self.leader_lock_check_interval!r}, "
            f"missing_topic_policy={self.missing_topic_policy!r}, shards={self.shards!r}, "
            f"table_mapping={self.table_mapping!r}, event_id_header={self.event_id_header!r}, "
            f"dead_letter_retention={self.dead_letter_retention!r}, dead_letter_policy={self.dead_letter_policy!r}, "
            f"tracing={self.tracing!r}, serialization={self.serialization!r})"
        )

    __str__ = __repr__

    @classmethod
    def from_mapping(
        cls, data: Mapping[str, Any] | None, path: str = "harvest", overrides: Mapping[str, Any] | None = None
    ) -> HarvestConfig:
        data = {} if data is None else data
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: expected a mapping, got {type(data).__name__}")
        for key in data:
            if key not in _TOP_KEYS:
                raise ConfigError(f"{path}.{_key(key)}: unknown key; valid keys are: {', '.join(sorted(_TOP_KEYS))}")
        kwargs: dict[str, Any] = {}
        for key, attr in (
            ("dataSource", "data_source"),
            ("outboxTable", "outbox_table"),
            ("leaderTopic", "leader_topic"),
            ("leaderGroupID", "leader_group_id"),
            ("name", "name"),
            ("prometheusBindAddress", "prometheus_bind_address"),
        ):
            if key in data and data[key] is not None:
                if not isinstance(data[key], str):
                    text = "<redacted>" if key == "dataSource" else shown(data[key])
                    raise ConfigError(f"{path}.{key}: {text} must be a string")
                kwargs[attr] = data[key]
        for key, attr in (
            ("prometheusPort", "prometheus_port"),
            ("leaderTopicReplicationFactor", "leader_topic_replication_factor"),
        ):
            if data.get(key) is not None:
                kwargs[attr] = data[key]
        if data.get("uuidSequencing") is not None:
            kwargs["uuid_sequencing"] = data["uuidSequencing"]
        if data.get("leaderElection") is not None:
            kwargs["leader_election"] = data["leaderElection"]
        if data.get("shards") is not None:
            kwargs["shards"] = data["shards"]
        if data.get("eventIdHeader") is not None:
            kwargs["event_id_header"] = data["eventIdHeader"]
        if data.get("tableMapping") is not None or data.get("eventRouter") is not None:
            kwargs["table_mapping"] = table_mapping(data.get("tableMapping"), data.get("eventRouter"), path)
        if data.get("missingTopicPolicy") is not None:
            kwargs["missing_topic_policy"] = data["missingTopicPolicy"]
        if data.get("deadLetterPolicy") is not None:
            kwargs["dead_letter_policy"] = data["deadLetterPolicy"]
        if data.get("tracing") is not None:
            kwargs["tracing"] = TracingConfig.from_mapping(data["tracing"], f"{path}.tracing")
        if data.get("serialization") is not None:
            kwargs["serialization"] = SerializationConfig.from_mapping(data["serialization"], f"{path}.serialization")
        if data.get("deadLetterRetention") not in (None, "keep"):
            kwargs["dead_letter_retention"] = parse_duration(data["deadLetterRetention"], f"{path}.deadLetterRetention")
        if data.get("leaderLockCheckInterval") is not None:
            kwargs["leader_lock_check_interval"] = parse_duration(
                data["leaderLockCheckInterval"], f"{path}.leaderLockCheckInterval"
            )
        kwargs["base_kafka_config"] = _kafka_map(data.get("baseKafkaConfig"), f"{path}.baseKafkaConfig")
        kwargs["producer_kafka_config"] = _kafka_map(data.get("producerKafkaConfig"), f"{path}.producerKafkaConfig")
        kwargs["limits"] = Limits.from_mapping(data.get("limits"), f"{path}.limits")
        for attr, value in (overrides or {}).items():
            if value is None:
                continue
            if attr == "bootstrap_servers":
                kwargs["base_kafka_config"] = {**kwargs["base_kafka_config"], "bootstrap.servers": value}
            else:
                kwargs[attr] = value
        try:
            return cls(**kwargs)
        except ConfigError as exc:
            msg = str(exc)
            raise ConfigError(msg if msg.startswith(path) else f"{path}.{msg}") from None


@dataclass(frozen=True)
class FileConfig:
    """A whole reaper YAML file: the relay config plus logging."""

    harvest: HarvestConfig
    #: The relay's log level: goharvest's ``Trace`` / ``Debug`` / ``Info`` / ``Warn`` / ``Error`` (any
    #: case), or Python's names; everything goes to stderr in one format (docs/logs.md).
    log_level: str = "INFO"
    #: To log once logging is set up: defaults and overrides a user would not see otherwise
    #: (:func:`startup_notes`).
    notes: tuple[StartupNote, ...] = ()


class StartupNote(NamedTuple):
    level: int  # logging level
    message: str
    kafka: bool  # about the Kafka connection: only worth saying to a command that connects to Kafka


def startup_notes(
    harvest: Mapping[str, Any],
    overrides: Mapping[str, Any],
    sources: Mapping[str, str],
    in_file: Mapping[str, Any] | None = None,
) -> tuple[StartupNote, ...]:
    """What the relay would otherwise do silently: connect to goharvest's default Kafka, or use a
    ``dataSource`` from elsewhere (``sources`` names where an override came from) over the file's
    (``in_file``: the file's section, when ``harvest`` has variables applied). DSNs are shown redacted."""
    notes: list[StartupNote] = []
    base = harvest.get("baseKafkaConfig") or {}
    if not any(key in base for key in _BOOTSTRAP_KEYS) and overrides.get("bootstrap_servers") is None:
        notes.append(
            StartupNote(
                logging.WARNING,
                f"baseKafkaConfig sets no bootstrap.servers: connecting to "
                f"{DEFAULT_BOOTSTRAP} (goharvest's default); set "
                f"harvest.baseKafkaConfig.bootstrap.servers or --bootstrap-servers",
                True,
            )
        )
    dsn, file_dsn = overrides.get("data_source"), (harvest if in_file is None else in_file).get("dataSource")
    if dsn is not None and isinstance(file_dsn, str) and dsn != file_dsn:
        notes.append(
            StartupNote(
                logging.INFO,
                f"dataSource: {sources.get('data_source', 'an override')} "
                f"({redact_dsn(dsn)!r}) is used; it overrides the file's harvest.dataSource "
                f"({redact_dsn(file_dsn)!r})",
                False,
            )
        )
    return tuple(notes)


def from_mapping(
    data: Any,
    overrides: Mapping[str, Any] | None = None,
    log_level: str | None = None,
    sources: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> FileConfig:
    """``overrides``: HarvestConfig attribute names -> values that win over everything (``None`` = keep);
    ``sources``: where each came from (``--data-source``), for the notes; ``env`` (default
    ``os.environ``): its ``HARVEST_<KEY>`` variables win over ``data`` (which is taken as it is: ``${…}``
    references are the YAML file's, see :func:`load_yaml`)."""
    return _from_document(
        data, overrides or {}, log_level, sources or {}, os.environ if env is None else env, Origins()
    )


def _flagged(overrides: Mapping[str, Any], log_level: str | None) -> set[str]:
    """Config paths a flag (an override) sets."""
    paths = {f"harvest.{key}" for key in _TOP_KEYS if overrides.get(attribute_name(key)) is not None}
    return paths | ({"logging.level"} if log_level else set())


def _from_document(
    data: Any,
    overrides: Mapping[str, Any],
    log_level: str | None,
    sources: Mapping[str, str],
    env: Mapping[str, str],
    origins: Origins,
) -> FileConfig:
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"<root>: expected a mapping with keys 'harvest' and 'logging', got {type(data).__name__}")
    for key in data:
        if key not in ("harvest", "logging"):
            raise ConfigError(f"{_key(key)}: unknown top-level key; valid keys are: harvest, logging")
    logging_section = data.get("logging") or {}
    if not isinstance(logging_section, Mapping):
        raise ConfigError("logging: expected a mapping like {level: Info}")
    for key in logging_section:
        if key != "level":
            raise ConfigError(f"logging.{_key(key)}: unknown key; valid keys are: level")
    harvest, file_level = apply_variables(data.get("harvest"), logging_section.get("level"), env, _ENV_KINDS, origins)
    level = str(log_level or file_level or "INFO").upper()
    try:
        if level not in LOG_LEVELS:
            raise ConfigError(f"logging.level: {shown(level)} is not a level; use one of {', '.join(LOG_LEVELS)}")
        cfg = HarvestConfig.from_mapping(harvest, overrides=overrides)
    except ConfigError as exc:  # not chained: the first message may hold a value read from a secret file
        raise ConfigError(origins.explain(str(exc))) from None
    levels = {"info": logging.INFO, "warning": logging.WARNING}
    notes = tuple(StartupNote(levels[lvl], msg, False) for lvl, msg in origins.notes(_flagged(overrides, log_level)))
    sources = dict(sources)
    if overrides.get("data_source") is None and "harvest.dataSource" in origins.variables:  # said as a flag's
        overrides = {**overrides, "data_source": harvest["dataSource"]}
        sources["data_source"] = origins.variables["harvest.dataSource"]
    return FileConfig(cfg, level, notes + startup_notes(harvest, overrides, sources, data.get("harvest") or {}))


def load_yaml(
    path: str | Path,
    overrides: Mapping[str, Any] | None = None,
    log_level: str | None = None,
    sources: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> FileConfig:
    """Read a reaper YAML file, its ``${…}`` references resolved from ``env`` (default ``os.environ``) and
    files. ``overrides`` (HarvestConfig attribute names, ``None`` = keep) win over everything, as CLI flags
    do; then ``HARVEST_<KEY>`` variables (``sources``: see :func:`from_mapping`)."""
    env = os.environ if env is None else env
    overrides = overrides or {}
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} on line {line}); save the file as UTF-8"
        ) from None
    origins = Origins()
    literal = literal_paths(env, _ENV_KINDS, _flagged(overrides, log_level))
    try:
        data = load_document(text, Interpolation(env, Path(path).parent, origins, literal))
    except ConfigError:
        raise
    except yaml.YAMLError as exc:
        # Not chained: PyYAML's message quotes the offending line, which a logged traceback would show.
        raise ConfigError(f"{path}: not valid YAML: {yaml_problem(exc)}") from None
    except ValueError as exc:  # Python refuses to build the value (an integer of over 4,300 digits)
        raise ConfigError(f"{path}: a value cannot be read: {shown(str(exc))}") from None
    if data is None:
        raise ConfigError(
            f"{path}: the file is empty; it needs a 'harvest:' section with at least dataSource "
            f"(see docs/configuration.md)"
        )
    if isinstance(data, Mapping) and data.get("harvest") is None:
        raise ConfigError(f"{path}: no 'harvest:' section (or it is empty); add one with at least dataSource")
    return _from_document(data, overrides, log_level, sources or {}, env, origins)
