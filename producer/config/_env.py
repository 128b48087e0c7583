"""Configuration from the environment: ``${…}`` references in the config file's values, and
``HARVEST_<KEY>`` variables over the file's keys (docs/environment.md).

References, in the YAML's scalar values (never in keys), resolved when the file is read:

- ``${NAME}``: the variable's value; an unset variable is an error naming it and the key;
- ``${NAME:-default}``: ``default`` (the text up to ``}``, as written) when NAME is unset or empty;
- ``${file:PATH}``: the file's UTF-8 text, one trailing newline removed (a secret mounted by Docker or
  Kubernetes); a relative PATH is relative to the config file's folder; at most :data:`MAX_FILE_BYTES`;
- ``$$``: one ``$``; a ``$`` followed by anything else is itself.

``harvest.eventRouter.route.topic.replacement`` is read as written: its ``${name}`` are the Debezium
router's own group references. A key that a ``HARVEST_`` variable or a command-line flag replaces is not
interpolated at all (an unset variable there cannot matter).

Variables: ``HARVEST_<KEY>`` for every key of ``harvest:``, its name in UPPER_SNAKE (``dataSource`` ->
``HARVEST_DATA_SOURCE``, ``leaderGroupID`` -> ``HARVEST_LEADER_GROUP_ID``), and ``HARVEST_LOG_LEVEL``.
Text keys take the value as it is; number and boolean keys read it as YAML reads a plain scalar; mapping
keys take a YAML flow mapping, merged over the file's mapping. An empty variable counts as unset.

Invariants:

- an error names the variable or the file and the key where it is used, never a value read from the
  environment or from a file (a password may be in either);
- every file's content, and every variable's value put into ``dataSource`` or a secret Kafka property,
  is in :attr:`Origins.secrets`, and :meth:`Origins.explain` removes them from the loader's errors;
- a variable's value is taken as it is: it is never interpolated itself.
"""

from __future__ import annotations

import difflib
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harvest_outbox.producer.config._yaml import YamlPath, load_document, plain_scalar, yaml_problem
from harvest_outbox.producer.errors import ConfigError, shown
from harvest_outbox.redact import is_secret_kafka_key, redact_error

PREFIX = "HARVEST_"
LOG_LEVEL_VARIABLE = "HARVEST_LOG_LEVEL"
#: A secret file is a password, a DSN or a key: anything bigger is the wrong file.
MAX_FILE_BYTES = 64 * 1024
#: The project's own development and test variables (docs/embedded-services.md;
#: harvest_local, ./dev): set beside a relay, they are no misspelt setting. ``HARVEST_TEST_*`` too.
DEV_VARIABLES = frozenset(
    {
        "HARVEST_PG_DSN",
        "HARVEST_KAFKA_BOOTSTRAP",
        "HARVEST_WORK_DIR",
        "HARVEST_PG_USER",
        "HARVEST_PG_RUN_DIR",
        "HARVEST_PG_BINDIR",
        "HARVEST_PURE_PYTHON",
        "HARVEST_PYTHON",
        "HARVEST_FAULTS",
        "HARVEST_OUTAGES_FULL",
        "HARVEST_OUTAGE_SECONDS",
        "HARVEST_SKIP_LINT",
        "HARVEST_JVM_OPTS",
        "HARVEST_SPARK_PHASE_LOG",
        "HARVEST_SPARK_RELEASE_FREED",
        "HARVEST_PIPELINE_KILL_AT",
    }
)
DEV_PREFIX = "HARVEST_TEST_"
#: Kinds of ``harvest:`` keys for their variables (see the module doc); a key not listed is text.
SCALAR, MAPPING, TEXT = "scalar", "mapping", "text"
_ROUTER_REPLACEMENT: YamlPath = ("harvest", "eventRouter", "route.topic.replacement")
_REFERENCE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?")
_HOW = "write ${NAME}, ${NAME:-default} or ${file:/path}, and $$ for a literal '$'"
_MAPPING_EXAMPLES = {
    "baseKafkaConfig": "'{bootstrap.servers: kafka:9092}'",
    "producerKafkaConfig": "'{linger.ms: 5}'",
    "limits": "'{queueTimeout: 30s}'",
    "eventRouter": "'{route.by.field: aggregatetype}'",
}


def upper_snake(key: str) -> str:
    """``leaderGroupID`` -> ``LEADER_GROUP_ID``: the key's words, as its variable and attribute spell them."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).upper()


def variable_name(key: str) -> str:
    return PREFIX + upper_snake(key)


def attribute_name(key: str) -> str:
    """The :class:`~producer.config.HarvestConfig` attribute of a ``harvest:`` key (the CLI's overrides)."""
    return upper_snake(key).lower()


def dotted(path: YamlPath) -> str:
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in path)


@dataclass
class Origins:
    """What came from the environment: for the start-up notes, and to explain and redact errors."""

    #: config path (``harvest.shards``) -> the variable that set it
    variables: dict[str, str] = field(default_factory=dict)
    #: config path -> the references in its value (``${PGHOST}``, ``${file:/run/secrets/dsn}``)
    references: dict[str, list[str]] = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)
    #: ``HARVEST_`` variables that name no setting (a misspelling?), and those that do
    unknown: list[str] = field(default_factory=list)
    settings: tuple[str, ...] = ()

    def explain(self, message: str) -> str:
        """``message`` (a config error) without the secrets, saying where the key it names came from."""
        text = redact_error(message, None, self.secrets)
        sources = {**{p: ", ".join(refs) for p, refs in self.references.items()}, **self.variables}
        for path in sorted(sources, key=len, reverse=True):
            if text.startswith(path) and text[len(path) : len(path) + 1] in (":", ".", " "):
                return f"{text} ({path} is set by {sources[path]})"
        return text

    def notes(self, flagged: Iterable[str] = ()) -> list[tuple[str, str]]:
        """(``"info"`` or ``"warning"``, message): names only, never values. ``flagged``: config paths a
        command-line flag sets, over their variables."""
        flagged = set(flagged)
        out: list[tuple[str, str]] = []
        used = [
            f"{p} from {v}" + (" (a command-line flag wins)" if p in flagged else "") for p, v in self.variables.items()
        ]
        used += [f"{p} from {', '.join(refs)}" for p, refs in self.references.items()]
        if used:
            out.append(("info", f"configuration from the environment (values not shown): {'; '.join(used)}"))
        for name in self.unknown:
            near = difflib.get_close_matches(name, self.settings, n=1)
            hint = f"did you mean {near[0]}? " if near else ""
            out.append(
                (
                    "warning",
                    f"{name} is set but is no harvest setting, so it is ignored; {hint}the settings "
                    f"are {', '.join(self.settings)} (docs/environment.md)",
                )
            )
        return out


def literal_paths(env: Mapping[str, str], kinds: Mapping[str, str], flagged: Iterable[str]) -> frozenset[YamlPath]:
    """Paths of the file read as written: the router's replacement, and keys a variable or a flag replaces
    (``flagged``: config paths, e.g. ``harvest.dataSource``, ``logging.level``)."""
    paths = {_ROUTER_REPLACEMENT, *(tuple(p.split(".", 1)) for p in flagged)}
    paths.update(("harvest", key) for key, kind in kinds.items() if kind != MAPPING and env.get(variable_name(key)))
    if env.get(LOG_LEVEL_VARIABLE):
        paths.add(("logging", "level"))
    return frozenset(paths)


class Interpolation:
    """The ``rewrite`` hook of :func:`producer.config._yaml.load_document` resolving ``${…}`` references."""

    def __init__(
        self,
        env: Mapping[str, str],
        base_dir: Path,
        origins: Origins,
        literal: frozenset[YamlPath] = frozenset({_ROUTER_REPLACEMENT}),
    ) -> None:
        self.env, self.base_dir, self.origins, self.literal = env, base_dir, origins, literal

    def __call__(self, path: YamlPath, text: str) -> str | None:
        if "$" not in text or any(path[: len(p)] == p for p in self.literal):
            return None
        where, out, i = dotted(path), [], 0
        while (j := text.find("$", i)) >= 0:
            out.append(text[i:j])
            after = text[j + 1 : j + 2]
            if after != "{":
                out.append("$")
                i = j + (2 if after == "$" else 1)
                continue
            end = text.find("}", j + 2)
            if end < 0:  # the value is not shown: it may be a password that holds '${'
                raise ConfigError(f"{where}: the '${{' at character {j + 1} has no closing '}}'; {_HOW}")
            out.append(self._resolve(path, where, text[j + 2 : end], j + 1))
            i = end + 1
        out.append(text[i:])
        return "".join(out)

    def _resolve(self, path: YamlPath, where: str, inner: str, column: int) -> str:
        refs = self.origins.references.setdefault(where, [])
        if inner.startswith("file:"):
            refs.append(f"${{{inner}}}")
            content = self._read(where, inner[5:])
            self.origins.secrets.append(content)
            return content
        m = _REFERENCE.fullmatch(inner)
        if m is None:  # not shown either: the text between the braces may be part of a password
            raise ConfigError(f"{where}: the '${{…}}' at character {column} is not a reference; {_HOW}")
        name, default = m.group(1), m.group(2)
        value = self.env.get(name)
        if default is not None and not value:
            refs.append(f"${{{name}:-…}} (default)")
            return default
        if value is None:
            raise ConfigError(f"{where}: ${{{name}}} is not set; export it or write ${{{name}:-default}}")
        refs.append(f"${{{name}}}")
        if _secret_place(path):
            self.origins.secrets.append(value)
        return value

    def _read(self, where: str, name: str) -> str:
        ref = f"${{file:{shown(name)[1:-1]}}}"
        if not name:
            raise ConfigError(f"{where}: {ref} names no file; write ${{file:/run/secrets/name}}")
        path = Path(name) if Path(name).is_absolute() else self.base_dir / name
        try:
            info = path.stat()
            if not stat.S_ISREG(info.st_mode):  # a FIFO or a device would block or never end
                raise ConfigError(
                    f"{where}: {ref}: {shown(str(path))} is not a regular file; point it at the secret's file"
                )
            if info.st_size > MAX_FILE_BYTES:
                raise ConfigError(
                    f"{where}: {ref}: {shown(str(path))} holds {info.st_size:,} bytes, more than a "
                    f"secret file may ({MAX_FILE_BYTES:,}); point it at the secret's file"
                )
            with path.open("rb") as f:
                raw = f.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise ConfigError(
                f"{where}: {ref}: cannot read {shown(str(path))} ({exc.strerror or type(exc).__name__}); "
                f"create the file, make it readable to harvest, or correct the path"
            ) from exc
        if len(raw) > MAX_FILE_BYTES:  # it grew since stat()
            raise ConfigError(
                f"{where}: {ref}: {shown(str(path))} holds more than {MAX_FILE_BYTES:,} bytes, more "
                f"than a secret file may; point it at the secret's file"
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{where}: {ref}: {shown(str(path))} is not UTF-8 text (byte {exc.start}); save it as UTF-8"
            ) from None  # not chained: the exception quotes the content's bytes
        return text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text


def _secret_place(path: YamlPath) -> bool:
    if path[:2] == ("harvest", "dataSource"):
        return True
    return (
        len(path) == 3
        and path[:2] in (("harvest", "baseKafkaConfig"), ("harvest", "producerKafkaConfig"))
        and is_secret_kafka_key(str(path[2]))
    )


def apply_variables(
    section: Any, level: Any, env: Mapping[str, str], kinds: Mapping[str, str], origins: Origins
) -> tuple[Any, Any]:
    """``(harvest section, logging level)`` with the ``HARVEST_`` variables of ``env`` applied over the
    file's (``kinds``: every ``harvest:`` key -> :data:`SCALAR`, :data:`MAPPING` or :data:`TEXT`). A section
    that is not a mapping is returned as it is, for the config's own error."""
    names = {variable_name(key): key for key in kinds}
    origins.settings = tuple(sorted([*names, LOG_LEVEL_VARIABLE]))
    origins.unknown = sorted(
        v
        for v in env
        if v.startswith(PREFIX)
        and v not in names
        and v != LOG_LEVEL_VARIABLE
        and v not in DEV_VARIABLES
        and not v.startswith(DEV_PREFIX)
    )
    if env.get(LOG_LEVEL_VARIABLE):
        level = env[LOG_LEVEL_VARIABLE]
        origins.variables["logging.level"] = LOG_LEVEL_VARIABLE
    section = {} if section is None else section
    if not isinstance(section, Mapping):
        return section, level
    out = dict(section)
    for name, key in names.items():
        text = env.get(name)
        if not text:
            continue
        kind = kinds[key]
        if kind == MAPPING:
            value = _mapping(name, key, text)
            current = out.get(key)
            out[key] = {**current, **value} if isinstance(current, Mapping) else value
        elif kind == SCALAR:
            try:
                out[key] = plain_scalar(text)
            except ValueError:
                raise ConfigError(f"{name}: the number is too large for harvest.{key}") from None
        else:
            out[key] = text
        origins.variables[f"harvest.{key}"] = name
    return out, level


def _mapping(name: str, key: str, text: str) -> Mapping[str, Any]:
    example = f"{name}={_MAPPING_EXAMPLES.get(key, '{name: value}')}"
    try:
        value = load_document(text)
    except yaml.YAMLError as exc:  # not chained: PyYAML quotes the text, which may hold a SASL password
        raise ConfigError(
            f"{name}: not valid YAML: {yaml_problem(exc)}; write a flow mapping, e.g. {example}"
        ) from None
    except ValueError:
        raise ConfigError(f"{name}: a value cannot be read (a number too large?); e.g. {example}") from None
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{name}: expected a YAML flow mapping of harvest.{key}'s keys, got {type(value).__name__}; e.g. {example}"
        )
    return value
