"""A whole relay config file (goharvest's reaper YAML: ``harvest: {...}``, ``logging: {level}``) and how it is read.

:func:`load_yaml` / :func:`from_mapping` parse it strictly: an unknown key is an error that names it and
lists the valid ones. Precedence: a CLI flag (``overrides``) > a ``HARVEST_<KEY>`` variable > the file's
value (with its ``${…}`` references resolved) > the default (:mod:`producer.config._env`).

Invariants:
- every error is a :class:`~producer.errors.ConfigError` naming the field (YAML path), the value and a fix,
  and says where a value came from (a variable, a ``${…}`` reference) without showing a secret read from one;
- what the relay would otherwise do silently (goharvest's default brokers, a ``dataSource`` from elsewhere
  than the file) becomes a :class:`StartupNote` to log once logging is set up.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from harvest_outbox.producer.config._env import Interpolation, Origins, apply_variables, attribute_name, literal_paths
from harvest_outbox.producer.config._harvest import ENV_KINDS, TOP_KEYS, HarvestConfig
from harvest_outbox.producer.config._kafka import BOOTSTRAP_KEYS, DEFAULT_BOOTSTRAP
from harvest_outbox.producer.config._values import key_text
from harvest_outbox.producer.config._yaml import load_document, yaml_problem
from harvest_outbox.producer.errors import ConfigError, shown
from harvest_outbox.redact import redact_dsn

LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL")


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
    if not any(key in base for key in BOOTSTRAP_KEYS) and overrides.get("bootstrap_servers") is None:
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
    paths = {f"harvest.{key}" for key in TOP_KEYS if overrides.get(attribute_name(key)) is not None}
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
            raise ConfigError(f"{key_text(key)}: unknown top-level key; valid keys are: harvest, logging")
    logging_section = data.get("logging") or {}
    if not isinstance(logging_section, Mapping):
        raise ConfigError("logging: expected a mapping like {level: Info}")
    for key in logging_section:
        if key != "level":
            raise ConfigError(f"logging.{key_text(key)}: unknown key; valid keys are: level")
    harvest, file_level = apply_variables(data.get("harvest"), logging_section.get("level"), env, ENV_KINDS, origins)
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


def read_document(
    path: str | Path,
    overrides: Mapping[str, Any] | None = None,
    log_level: str | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[Any, Origins]:
    """A config file's YAML document, its ``${…}`` references resolved from ``env`` (default
    ``os.environ``) and files, with the record of where values came from (for
    :func:`config_from_document`). Flags (``overrides``, ``log_level``) keep their paths literal."""
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
    literal = literal_paths(env, ENV_KINDS, _flagged(overrides, log_level))
    try:
        data = load_document(text, Interpolation(env, Path(path).parent, origins, literal))
    except ConfigError:
        raise
    except yaml.YAMLError as exc:
        # Not chained: PyYAML's message quotes the offending line, which a logged traceback would show.
        raise ConfigError(f"{path}: not valid YAML: {yaml_problem(exc)}") from None
    except ValueError as exc:  # Python refuses to build the value (an integer of over 4,300 digits)
        raise ConfigError(f"{path}: a value cannot be read: {shown(str(exc))}") from None
    return data, origins


def config_from_document(
    data: Any,
    overrides: Mapping[str, Any] | None = None,
    log_level: str | None = None,
    sources: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    origins: Origins | None = None,
) -> FileConfig:
    """One relay's config from a document ``{harvest: …, logging: …}`` as :func:`read_document` returns
    it (``origins``: its record, for the messages), with variables and flags applied."""
    return _from_document(
        data,
        overrides or {},
        log_level,
        sources or {},
        os.environ if env is None else env,
        Origins() if origins is None else origins,
    )


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
    data, origins = read_document(path, overrides, log_level, env)
    return file_config(path, data, origins, overrides, log_level, sources, env)


def file_config(
    path: str | Path,
    data: Any,
    origins: Origins,
    overrides: Mapping[str, Any],
    log_level: str | None,
    sources: Mapping[str, str] | None,
    env: Mapping[str, str],
) -> FileConfig:
    """One relay's config from the document :func:`read_document` read of the file at ``path``."""
    if data is None:
        raise ConfigError(
            f"{path}: the file is empty; it needs a 'harvest:' section with at least dataSource "
            f"(see docs/configuration.md)"
        )
    if isinstance(data, Mapping) and data.get("harvest") is None:
        raise ConfigError(f"{path}: no 'harvest:' section (or it is empty); add one with at least dataSource")
    return _from_document(data, overrides, log_level, sources or {}, env, origins)
