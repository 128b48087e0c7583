"""Typed, validated relay configuration, and its YAML form (goharvest's reaper keys).

The import path of the relay's configuration (``from harvest_outbox.producer.config import HarvestConfig,
Limits, load_yaml``); each concept lives in a module of its own, re-exported here:

- :mod:`~producer.config._harvest`: :class:`HarvestConfig`, the whole relay config (YAML ``harvest:``);
- :mod:`~producer.config._limits`: :class:`Limits`, goharvest's limit names and defaults plus our own;
- :mod:`~producer.config._kafka`: the Kafka properties and the producer properties they make;
- :mod:`~producer.config._election`: the leader-election settings;
- :mod:`~producer.config._values`: durations, the default relay name, a listen address;
- :mod:`~producer.config._file`: :func:`load_yaml` / :func:`from_mapping`, the reaper YAML file read
  strictly; precedence: a CLI flag (``overrides``) > a ``HARVEST_<KEY>`` variable > the file's value
  (with its ``${…}`` references resolved) > the default (:mod:`producer.config._env`).

Invariants (each stated and kept by the module that owns it):
- every error is a :class:`~producer.errors.ConfigError` naming the field (YAML path), the value and a fix;
- a config object that exists is valid: frozen and validated at construction;
- every limit is bounded by what Kafka, Postgres and Python's timed waits accept (durations <= 24h,
  ``ioErrorBackoff`` >= 10ms, NELI's ``heartbeatTimeout`` 2s-10m, row counts <= 1,000,000,
  ``producerRing`` <= 256; see docs/configuration.md, Bounds, for why); ``dataSource`` is parsed by libpq;
  :meth:`HarvestConfig.check_kafka_properties` has librdkafka judge the Kafka properties;
- ``repr()``/``str()`` of a config never shows a secret (DSN password, SASL/SSL credentials);
- the producer config always ends up with ``enable.idempotence=true`` and ``acks=all``: a user
  value that contradicts them is rejected rather than silently overridden.
"""

from __future__ import annotations

from harvest_outbox.producer.config._election import (
    LEADER_ELECTIONS,
    NELI_MAX_HEARTBEAT_TIMEOUT,
    NELI_MIN_HEARTBEAT_TIMEOUT,
)
from harvest_outbox.producer.config._env import attribute_name, variable_name
from harvest_outbox.producer.config._file import (
    LOG_LEVELS,
    FileConfig,
    StartupNote,
    config_from_document,
    file_config,
    from_mapping,
    load_yaml,
    read_document,
    startup_notes,
)
from harvest_outbox.producer.config._harvest import (
    DEAD_LETTER_POLICIES,
    DEFAULT_DATA_SOURCE,
    ENV_KINDS,
    MAX_RETENTION,
    MIN_RETENTION,
    MISSING_TOPIC_POLICIES,
    TOP_KEYS,
    HarvestConfig,
)
from harvest_outbox.producer.config._kafka import DEFAULT_BOOTSTRAP, DEFAULT_LINGER_MS, DEFAULT_PARTITIONER
from harvest_outbox.producer.config._limits import (
    AUTO_MARK_RECORDS,
    AUTO_MAX_IN_FLIGHT,
    AUTO_TXN_RECORDS,
    INT32_MAX,
    MARK_FLOOR,
    MAX_DURATION,
    MIN_IO_ERROR_BACKOFF,
    Limits,
)
from harvest_outbox.producer.config._values import (
    DEFAULT_BIND_ADDRESS,
    check_bind_address,
    default_name,
    format_duration,
    parse_duration,
)

# The names this module had before the split (tests and the docs' generator read them).
_TOP_KEYS = TOP_KEYS
_ENV_KINDS = ENV_KINDS

__all__ = [
    "AUTO_MARK_RECORDS",
    "AUTO_MAX_IN_FLIGHT",
    "AUTO_TXN_RECORDS",
    "DEAD_LETTER_POLICIES",
    "DEFAULT_BIND_ADDRESS",
    "DEFAULT_BOOTSTRAP",
    "DEFAULT_DATA_SOURCE",
    "DEFAULT_LINGER_MS",
    "DEFAULT_PARTITIONER",
    "ENV_KINDS",
    "INT32_MAX",
    "LEADER_ELECTIONS",
    "LOG_LEVELS",
    "MARK_FLOOR",
    "MAX_DURATION",
    "MAX_RETENTION",
    "MIN_IO_ERROR_BACKOFF",
    "MIN_RETENTION",
    "MISSING_TOPIC_POLICIES",
    "NELI_MAX_HEARTBEAT_TIMEOUT",
    "NELI_MIN_HEARTBEAT_TIMEOUT",
    "TOP_KEYS",
    "FileConfig",
    "HarvestConfig",
    "Limits",
    "StartupNote",
    "attribute_name",
    "check_bind_address",
    "config_from_document",
    "default_name",
    "file_config",
    "format_duration",
    "from_mapping",
    "load_yaml",
    "parse_duration",
    "read_document",
    "startup_notes",
    "variable_name",
]
