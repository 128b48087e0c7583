"""Configuration from the environment (issue #33 item 1): ``${VAR}``, ``${VAR:-default}``, ``$$`` and
``${file:…}`` in the YAML's values, ``HARVEST_<KEY>`` variables over the file, their precedence (flag >
variable > file > default), errors that name the variable or file and the key but never a value read
from them; and, as a process against the real Postgres, a DSN from a secret file that never shows."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from harvest_outbox.producer.config import _TOP_KEYS, FileConfig, from_mapping, load_yaml
from harvest_outbox.producer.config._env import DEV_PREFIX, DEV_VARIABLES, MAX_FILE_BYTES, variable_name
from harvest_outbox.producer.errors import ConfigError

SECRET = "Sup3rSecr3tValue"
REPO = Path(__file__).resolve().parents[3]
HEAD = "harvest:\n  dataSource: host=db user=relay\n"


def load(tmp_path: Path, text: str, env: dict[str, str] | None = None, **kwargs: Any) -> FileConfig:
    path = tmp_path / "h.yaml"
    path.write_text(text)
    return load_yaml(path, env=env or {}, **kwargs)


def write(tmp_path: Path, files: dict[str, bytes | str]) -> None:
    for name, content in files.items():
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)


# (lines under harvest:, env, files (relative to the config's folder), attribute, expected value)
INTERPOLATIONS: dict[str, tuple[str, dict[str, str], dict[str, bytes | str], str, Any]] = {
    "variable": ("  name: ${RELAY}\n", {"RELAY": "relay-7"}, {}, "name", "relay-7"),
    "inside text": ("  name: pre-${A}-${B}-post\n", {"A": "x", "B": "y"}, {}, "name", "pre-x-y-post"),
    "default when unset": ("  name: ${RELAY:-relay-1}\n", {}, {}, "name", "relay-1"),
    "default when empty": ("  name: ${RELAY:-relay-1}\n", {"RELAY": ""}, {}, "name", "relay-1"),
    "set wins over default": ("  name: ${RELAY:-relay-1}\n", {"RELAY": "r9"}, {}, "name", "r9"),
    "empty default": ('  eventIdHeader: "${H:-}"\n', {}, {}, "event_id_header", ""),
    "dollar dollar": ("  name: a$$b$$\n", {}, {}, "name", "a$b$"),
    "dollar dollar brace": ("  name: a$${B}\n", {"B": "no"}, {}, "name", "a${B}"),
    "lone dollar": ("  name: a$b$\n", {}, {}, "name", "a$b$"),
    "no comment in a value": ("  name: ${N}\n", {"N": "a #b"}, {}, "name", "a #b"),
    "not re-interpolated": ("  name: ${N}\n", {"N": "${OTHER}", "OTHER": "x"}, {}, "name", "${OTHER}"),
    "number": ("  shards: ${SHARDS:-1}\n", {"SHARDS": "4"}, {}, "shards", 4),
    "number default": ("  shards: ${SHARDS:-2}\n", {}, {}, "shards", 2),
    "port": ("  prometheusPort: ${PORT}\n", {"PORT": "9464"}, {}, "prometheus_port", 9464),
    "bool": ("  uuidSequencing: ${EXACTLY_ONCE:-false}\n", {"EXACTLY_ONCE": "true"}, {}, "uuid_sequencing", True),
    "quoted stays text": ('  name: "${N}"\n', {"N": "123"}, {}, "name", "123"),
    "single quoted stays text": ("  name: '${N}'\n", {"N": "123"}, {}, "name", "123"),
    "!!str stays text": ("  name: !!str ${N}\n", {"N": "123"}, {}, "name", "123"),
    "null is the default": ("  prometheusPort: ${PORT:-}\n", {}, {}, "prometheus_port", None),
    "duration": ("  leaderLockCheckInterval: ${CHECK:-2s}\n", {}, {}, "leader_lock_check_interval", 2.0),
    "alias shares it": ("  name: &n ${N}\n  leaderGroupID: *n\n", {"N": "grp"}, {}, "leader_group_id", "grp"),
    "file": ("  name: ${file:name.txt}\n", {}, {"name.txt": "from-file\n"}, "name", "from-file"),
    "file one newline only": ("  dataSource: ${file:n}\n", {}, {"n": "host=a\n\n"}, "data_source", "host=a\n"),
    "file crlf": ("  name: ${file:n}\n", {}, {"n": "r1\r\n"}, "name", "r1"),
    "file no newline": ("  name: ${file:n}\n", {}, {"n": "r2"}, "name", "r2"),
    "file inside a dsn": (
        "  dataSource: host=db user=relay password=${file:pw}\n",
        {},
        {"pw": f"{SECRET}\n"},
        "data_source",
        f"host=db user=relay password={SECRET}",
    ),
    "file in a kafka property": (
        "  baseKafkaConfig:\n    bootstrap.servers: k:9092\n    sasl.password: ${file:sasl}\n",
        {},
        {"sasl": SECRET},
        "base_kafka_config",
        {"bootstrap.servers": "k:9092", "sasl.password": SECRET},
    ),
    "limit": ("  limits:\n    queueTimeout: ${QT:-7s}\n", {}, {}, "limits", 7.0),
}


@pytest.mark.parametrize("case", sorted(INTERPOLATIONS))
def test_interpolation(tmp_path: Path, case: str) -> None:
    lines, env, files, attr, expected = INTERPOLATIONS[case]
    write(tmp_path, files)
    cfg = load(tmp_path, "harvest:\n" + lines, env).harvest
    value = getattr(cfg, attr)
    if attr == "limits":
        value = value.queue_timeout
    assert value == expected


def test_absolute_file_path_and_log_level(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("host=filedb user=relay\n")
    cfg = load(
        tmp_path / "..",
        f"harvest:\n  dataSource: ${{file:{tmp_path / 'secret'}}}\nlogging:\n  level: ${{LEVEL:-Debug}}\n",
    )
    assert cfg.harvest.data_source == "host=filedb user=relay" and cfg.log_level == "DEBUG"


def test_keys_are_never_interpolated(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^harvest\.\$\{K\}: unknown key"):
        load(tmp_path, HEAD + "  ${K}: x\n", {"K": "name"})


def test_the_router_replacement_keeps_its_own_references(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        HEAD + "  tableMapping: debezium\n  eventRouter:\n    route.topic.replacement: "
        "outbox.${routedByValue}.events\n    route.by.field: ${BY:-aggregatetype}\n",
    )
    router = cfg.harvest.table_mapping.router  # type: ignore[attr-defined]
    assert router.route_topic_replacement == "outbox.${routedByValue}.events"
    assert router.route_by_field == "aggregatetype"


# (harvest: lines, env, files, needles in the message); SECRET must never be in it
ERRORS: dict[str, tuple[str, dict[str, str], dict[str, bytes | str], list[str]]] = {
    "unset": (
        "  dataSource: ${PG_DSN}\n",
        {},
        {},
        ["harvest.dataSource: ${PG_DSN} is not set; export it or write ${PG_DSN:-default}"],
    ),
    "unset in a limit": (
        "  limits:\n    rowTimeout: ${ROW_TIMEOUT}\n",
        {},
        {},
        ["harvest.limits.rowTimeout: ${ROW_TIMEOUT} is not set"],
    ),
    "unset in a list": (
        "  eventRouter:\n    table.fields.additional.placement:\n      - ${PLACE}\n",
        {},
        {},
        ["harvest.eventRouter.table.fields.additional.placement.[0]: ${PLACE} is not set"],
    ),
    "unterminated": (
        f"  dataSource: host=db password={SECRET}${{x\n",
        {},
        {},
        ["harvest.dataSource: the '${' at character 34 has no closing '}'", "$$ for a literal '$'"],
    ),
    "not a name": (
        f"  dataSource: host=db password=${{{SECRET} x}}\n",
        {},
        {},
        [
            "harvest.dataSource: the '${…}' at character 18 is not a reference; write ${NAME}, "
            "${NAME:-default} or ${file:/path}"
        ],
    ),
    "missing file": (
        "  dataSource: ${file:/nonexistent/harvest/dsn}\n",
        {},
        {},
        [
            "harvest.dataSource: ${file:/nonexistent/harvest/dsn}: cannot read '/nonexistent/harvest/dsn' "
            "(No such file or directory); create the file"
        ],
    ),
    "no file named": ("  dataSource: ${file:}\n", {}, {}, ["harvest.dataSource: ${file:} names no file"]),
    "a directory": (
        "  dataSource: ${file:sub}\n",
        {},
        {"sub/x": "x"},
        ["harvest.dataSource: ${file:sub}:", "/sub' is not a regular file"],
    ),
    "too big": (
        "  dataSource: ${file:big}\n",
        {},
        {"big": SECRET + "x" * MAX_FILE_BYTES},
        [
            "harvest.dataSource: ${file:big}: ",
            f"holds {MAX_FILE_BYTES + len(SECRET):,} bytes, more than a secret file may (65,536)",
        ],
    ),
    "not utf-8": (
        "  dataSource: ${file:bin}\n",
        {},
        {"bin": SECRET.encode() + b"\xff\n"},
        ["harvest.dataSource: ${file:bin}:", f"is not UTF-8 text (byte {len(SECRET)}); save it as UTF-8"],
    ),
    "file content in a bad value": (
        "  name: ${file:n}\n",
        {},
        {"n": f"{SECRET}%1"},
        ["harvest.name: '<redacted>' must not contain '%'", "(harvest.name is set by ${file:n})"],
    ),
    "variable in a dsn": (
        "  dataSource: host=db password=${PW} passwd=x\n",
        {"PW": SECRET},
        {},
        [
            'harvest.dataSource: invalid connection option "passwd"',
            "'host=db password=<redacted> passwd=<redacted>'",
            "(harvest.dataSource is set by ${PW})",
        ],
    ),
    "variable bad number": (
        "  shards: ${SHARDS}\n",
        {"SHARDS": "four"},
        {},
        ["harvest.shards: 'four' must be a whole number of shards", "(harvest.shards is set by ${SHARDS})"],
    ),
    "HARVEST_ bad number": (
        "",
        {"HARVEST_SHARDS": "four"},
        {},
        ["harvest.shards: 'four' must be a whole number", "(harvest.shards is set by HARVEST_SHARDS)"],
    ),
    "HARVEST_ bad port": (
        "",
        {"HARVEST_PROMETHEUS_PORT": "99999"},
        {},
        [
            "harvest.prometheusPort: 99999 must be a TCP port",
            "(harvest.prometheusPort is set by HARVEST_PROMETHEUS_PORT)",
        ],
    ),
    "HARVEST_ bad bool": (
        "",
        {"HARVEST_UUID_SEQUENCING": "maybe"},
        {},
        [
            "harvest.uuidSequencing: 'maybe' must be true or false",
            "(harvest.uuidSequencing is set by HARVEST_UUID_SEQUENCING)",
        ],
    ),
    "HARVEST_ bad limit": (
        "",
        {"HARVEST_LIMITS": "{queueTimeout: 30}"},
        {},
        ["harvest.limits.queueTimeout: 30 is not a duration", "(harvest.limits is set by HARVEST_LIMITS)"],
    ),
    "HARVEST_ mapping not a mapping": (
        "",
        {"HARVEST_LIMITS": "queueTimeout=30s"},
        {},
        [
            "HARVEST_LIMITS: expected a YAML flow mapping of harvest.limits's keys, got "
            "str; e.g. HARVEST_LIMITS='{queueTimeout: 30s}'"
        ],
    ),
    "HARVEST_ mapping not yaml": (
        "",
        {"HARVEST_BASE_KAFKA_CONFIG": f"{{sasl.password: [{SECRET}}}"},
        {},
        [
            "HARVEST_BASE_KAFKA_CONFIG: not valid YAML: line 1, column",
            "e.g. HARVEST_BASE_KAFKA_CONFIG='{bootstrap.servers: kafka:9092}'",
        ],
    ),
    "HARVEST_ dsn bad": (
        "",
        {"HARVEST_DATA_SOURCE": f"host=db passwd={SECRET}"},
        {},
        [
            'harvest.dataSource: invalid connection option "passwd"',
            "(harvest.dataSource is set by HARVEST_DATA_SOURCE)",
        ],
    ),
    "HARVEST_LOG_LEVEL bad": (
        "",
        {"HARVEST_LOG_LEVEL": "loud"},
        {},
        ["logging.level: 'LOUD' is not a level", "(logging.level is set by HARVEST_LOG_LEVEL)"],
    ),
    "HARVEST_ huge number": (
        "",
        {"HARVEST_SHARDS": "9" * 5000},
        {},
        ["HARVEST_SHARDS: the number is too large for harvest.shards"],
    ),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_errors_name_the_variable_or_file_and_never_the_value(tmp_path: Path, case: str) -> None:
    lines, env, files, needles = ERRORS[case]
    write(tmp_path, files)
    with pytest.raises(ConfigError) as err:
        load(tmp_path, ("harvest:\n" if "dataSource" in lines else HEAD) + lines, env)
    message = str(err.value)
    assert SECRET not in message, message
    for needle in needles:
        assert needle in message, message
    assert err.value.__cause__ is None or SECRET not in str(err.value.__cause__)


def test_a_key_a_variable_or_flag_replaces_is_not_interpolated(tmp_path: Path) -> None:
    text = "harvest:\n  dataSource: ${UNSET_DSN}\n  outboxTable: ${UNSET_TABLE}\nlogging:\n  level: ${UNSET_LEVEL}\n"
    cfg = load(
        tmp_path,
        text,
        {"HARVEST_DATA_SOURCE": "host=envdb", "HARVEST_LOG_LEVEL": "warning"},
        overrides={"outbox_table": "flag.outbox"},
    )
    assert (cfg.harvest.data_source, cfg.harvest.outbox_table, cfg.log_level) == (
        "host=envdb",
        "flag.outbox",
        "WARNING",
    )
    with pytest.raises(ConfigError, match=r"harvest\.dataSource: \$\{UNSET_DSN\} is not set"):
        load(tmp_path, text, {"HARVEST_LOG_LEVEL": "warning"}, overrides={"outbox_table": "flag.outbox"})


@pytest.mark.parametrize(
    "key,variable",
    [
        ("dataSource", "HARVEST_DATA_SOURCE"),
        ("outboxTable", "HARVEST_OUTBOX_TABLE"),
        ("leaderGroupID", "HARVEST_LEADER_GROUP_ID"),
        ("uuidSequencing", "HARVEST_UUID_SEQUENCING"),
        ("baseKafkaConfig", "HARVEST_BASE_KAFKA_CONFIG"),
        ("leaderTopicReplicationFactor", "HARVEST_LEADER_TOPIC_REPLICATION_FACTOR"),
        ("prometheusBindAddress", "HARVEST_PROMETHEUS_BIND_ADDRESS"),
        ("eventIdHeader", "HARVEST_EVENT_ID_HEADER"),
    ],
)
def test_variable_names(key: str, variable: str) -> None:
    assert variable_name(key) == variable


def test_every_variable_is_documented() -> None:
    section = _readme_section()
    for variable in [*(variable_name(key) for key in _TOP_KEYS), "HARVEST_LOG_LEVEL"]:
        assert f"`{variable}`" in section, variable
    for variable in DEV_VARIABLES:
        assert f"`{variable}`" in section, variable
    assert f"`{DEV_PREFIX}*`" in section


def _readme_section() -> str:
    """docs/environment.md as the site shows it: its variables table is generated by the docs hook."""
    spec = importlib.util.spec_from_file_location("config_reference", REPO / "docs" / "hooks" / "config_reference.py")
    assert spec and spec.loader
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page: str = hook.on_page_markdown((REPO / "docs" / "environment.md").read_text())
    return page


# (env, expected harvest attributes); the file sets outboxTable, shards, uuidSequencing, baseKafkaConfig, limits
FILE = (
    "harvest:\n  dataSource: host=db user=relay\n  outboxTable: file.outbox\n  shards: 2\n  uuidSequencing: true\n"
    "  baseKafkaConfig:\n    bootstrap.servers: file:9092\n    client.id: from-file\n"
    "  limits:\n    queueTimeout: 20s\n    rowTimeout: 10s\n"
)
OVERRIDES: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "text": ({"HARVEST_OUTBOX_TABLE": "env.outbox"}, {"outbox_table": "env.outbox", "shards": 2}),
    "number": ({"HARVEST_SHARDS": "8"}, {"shards": 8, "outbox_table": "file.outbox"}),
    "port": ({"HARVEST_PROMETHEUS_PORT": "9464"}, {"prometheus_port": 9464}),
    "bool false": ({"HARVEST_UUID_SEQUENCING": "false"}, {"uuid_sequencing": False}),
    "bool no": ({"HARVEST_UUID_SEQUENCING": "no"}, {"uuid_sequencing": False}),
    "duration": ({"HARVEST_LEADER_LOCK_CHECK_INTERVAL": "3s"}, {"leader_lock_check_interval": 3.0}),
    "dsn as it is": (
        {"HARVEST_DATA_SOURCE": "host=envdb password='a #b: ${c}'"},
        {"data_source": "host=envdb password='a #b: ${c}'"},
    ),
    "empty is unset": (
        {"HARVEST_OUTBOX_TABLE": "", "HARVEST_SHARDS": ""},
        {"outbox_table": "file.outbox", "shards": 2},
    ),
    "mapping merged": (
        {"HARVEST_BASE_KAFKA_CONFIG": "{bootstrap.servers: env:9092, linger.ms: 5}"},
        {"base_kafka_config": {"bootstrap.servers": "env:9092", "client.id": "from-file", "linger.ms": 5}},
    ),
    "limits merged": ({"HARVEST_LIMITS": "{queueTimeout: 40s}"}, {"limits": (40.0, 10.0)}),
    "mapping in block style": (
        {"HARVEST_PRODUCER_KAFKA_CONFIG": "compression.type: lz4"},
        {"producer_kafka_config": {"compression.type": "lz4"}},
    ),
}


@pytest.mark.parametrize("case", sorted(OVERRIDES))
def test_harvest_variables_override_the_file(tmp_path: Path, case: str) -> None:
    env, expected = OVERRIDES[case]
    cfg = load(tmp_path, FILE, env).harvest
    for attr, value in expected.items():
        got = getattr(cfg, attr)
        if attr == "limits":
            got = (got.queue_timeout, got.row_timeout)
        assert got == value, attr


def test_harvest_variables_without_a_file() -> None:
    cfg = from_mapping(
        {},
        env={
            "HARVEST_DATA_SOURCE": "host=envdb",
            "HARVEST_LOG_LEVEL": "error",
            "HARVEST_BASE_KAFKA_CONFIG": "{bootstrap.servers: env:9092}",
        },
    )
    assert cfg.harvest.data_source == "host=envdb" and cfg.log_level == "ERROR"
    assert cfg.harvest.base_kafka_config["bootstrap.servers"] == "env:9092"
    assert not any("bootstrap.servers" in n.message for n in cfg.notes)  # no goharvest-default warning


# (default, file, file via ${VAR}, HARVEST_ variable, flag) -> which wins: outboxTable, then logging.level
PRECEDENCE = [
    ({}, None, None, "outbox", "INFO"),
    ({}, "file", None, "file", "ERROR"),
    ({"T": "ref"}, "${T}", None, "ref", "ERROR"),
    ({"HARVEST_OUTBOX_TABLE": "env", "HARVEST_LOG_LEVEL": "warning"}, None, None, "env", "WARNING"),
    ({"HARVEST_OUTBOX_TABLE": "env", "HARVEST_LOG_LEVEL": "warning"}, "file", None, "env", "WARNING"),
    ({"HARVEST_OUTBOX_TABLE": "env", "HARVEST_LOG_LEVEL": "warning", "T": "ref"}, "${T}", None, "env", "WARNING"),
    ({"HARVEST_OUTBOX_TABLE": "env", "HARVEST_LOG_LEVEL": "warning"}, "file", "flag", "flag", "DEBUG"),
    ({}, "file", "flag", "flag", "DEBUG"),
    ({}, None, "flag", "flag", "DEBUG"),
]


@pytest.mark.parametrize("env,in_file,flag,table,level", PRECEDENCE)
def test_precedence_flag_variable_file_default(
    tmp_path: Path, env: dict[str, str], in_file: str | None, flag: str | None, table: str, level: str
) -> None:
    text = HEAD + (f"  outboxTable: {in_file}\nlogging:\n  level: Error\n" if in_file else "")
    cfg = load(tmp_path, text, env, overrides={"outbox_table": flag}, log_level="debug" if flag else None)
    assert (cfg.harvest.outbox_table, cfg.log_level) == (table, level)


def test_the_notes_name_keys_and_sources_never_values(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text(SECRET)
    text = (
        "harvest:\n  dataSource: host=db password=${file:pw}\n  name: ${NAME:-r1}\n  shards: ${S}\n"
        "  baseKafkaConfig:\n    bootstrap.servers: k:9092\n"
    )
    env = {
        "S": "3",
        "HARVEST_OUTBOX_TABLE": "app.outbox",
        "HARVEST_LEADER_TOPIC": "lt",
        "HARVEST_SHRADS": "4",
        "HARVEST_PG_DSN": "host=x",
        "HARVEST_TEST_CRASH_AT": "x",
        "HARVEST_FAULTS": "",
    }
    cfg = load(tmp_path, text, env, overrides={"leader_topic": "flag-topic"})
    assert cfg.notes[0] == (
        logging.INFO,
        "configuration from the environment (values not shown): harvest.leaderTopic "
        "from HARVEST_LEADER_TOPIC (a command-line flag wins); harvest.outboxTable from "
        "HARVEST_OUTBOX_TABLE; harvest.dataSource from ${file:pw}; harvest.name from "
        "${NAME:-…} (default); harvest.shards from ${S}",
        False,
    )
    assert cfg.notes[1].level == logging.WARNING and len(cfg.notes) == 2
    assert cfg.notes[1].message.startswith(
        "HARVEST_SHRADS is set but is no harvest setting, so it is ignored; did "
        "you mean HARVEST_SHARDS? the settings are HARVEST_BASE_KAFKA_CONFIG, "
    )
    everything = " ".join(n.message for n in cfg.notes)
    assert SECRET not in everything and "app.outbox" not in everything and "flag-topic" not in everything
    assert cfg.harvest.leader_topic == "flag-topic"


def test_harvest_data_source_is_said_as_before(tmp_path: Path) -> None:
    text = "harvest:\n  dataSource: host=filedb password=filepw1\n  baseKafkaConfig: {bootstrap.servers: k:9092}\n"
    cfg = load(tmp_path, text, {"HARVEST_DATA_SOURCE": f"host=envdb password={SECRET}"})
    assert cfg.harvest.data_source == f"host=envdb password={SECRET}"
    assert [n.message for n in cfg.notes] == [
        "configuration from the environment (values not shown): harvest.dataSource from HARVEST_DATA_SOURCE",
        "dataSource: HARVEST_DATA_SOURCE ('host=envdb password=<redacted>') is used; it overrides the file's "
        "harvest.dataSource ('host=filedb password=<redacted>')",
    ]


_TOKEN = re.compile(r"\bHARVEST_[A-Z0-9_]*[A-Z0-9]\b")


def test_every_harvest_variable_of_the_project_is_a_setting_or_a_dev_variable() -> None:
    """No project variable set beside a relay (the tests', the demo's) draws the unknown-variable warning."""
    settings = {variable_name(key) for key in _TOP_KEYS} | {"HARVEST_LOG_LEVEL"}
    found: set[str] = set()
    for folder in ("producer", "consumer", "sequencer", "spark_reader", "harvest_local", "scripts", "bench", "tests"):
        for path in (REPO / folder).rglob("*.py"):
            if path.name != Path(__file__).name:
                found.update(_TOKEN.findall(path.read_text(errors="replace")))
    for name in ("dev", "setup.py"):
        found.update(_TOKEN.findall((REPO / name).read_text()))
    stray = sorted(v for v in found if v not in settings | DEV_VARIABLES and not v.startswith(DEV_PREFIX))
    assert not stray, f"add these to config_env.DEV_VARIABLES and docs/environment.md: {stray}"


# ---------------------------------------------------------------- the CLI on the real Postgres


def harvest(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "HARVEST_DATA_SOURCE"}
    return subprocess.run(
        [sys.executable, "-m", "harvest_outbox.producer", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, **env},
        stdin=subprocess.DEVNULL,
    )


def _password(pg_dsn: str) -> str:
    password = conninfo_to_dict(pg_dsn).get("password")
    assert password and len(password) >= 8, "the test Postgres runs with a password (scram-sha-256 over TCP)"
    return str(password)


@pytest.mark.integration
def test_init_db_with_the_dsn_from_a_secret_file(tmp_path: Path, pg_dsn: str, pg_schema: str) -> None:
    password = _password(pg_dsn)
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "dsn").write_text(pg_dsn + "\n")
    path = tmp_path / "h.yaml"
    path.write_text(
        f"harvest:\n  dataSource: ${{file:{secrets / 'dsn'}}}\n  outboxTable: {pg_schema}.outbox\n"
        f"logging:\n  level: Info\n"
    )
    proc = harvest("init-db", "-f", str(path), env={})
    assert proc.returncode == 0 and f"outbox {pg_schema}.outbox ready" in proc.stdout, proc
    assert (
        f"configuration from the environment (values not shown): harvest.dataSource from ${{file:{secrets}"
        in proc.stderr
    ), proc.stderr
    assert password not in proc.stdout + proc.stderr
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (f"{pg_schema}.outbox",)).fetchone() == (f"{pg_schema}.outbox",)


@pytest.mark.integration
def test_a_wrong_password_from_a_file_never_shows(tmp_path: Path, pg_dsn: str, pg_schema: str) -> None:
    password = _password(pg_dsn)
    wrong = "Wr0ngPassw0rdFromFile"
    (tmp_path / "dsn").write_text(make_conninfo(pg_dsn, password=wrong) + "\n")
    path = tmp_path / "h.yaml"
    path.write_text(f"harvest:\n  dataSource: ${{file:dsn}}\n  outboxTable: {pg_schema}.outbox\n")
    proc = harvest("init-db", "-f", str(path), env={"HARVEST_LOG_LEVEL": "debug"})
    assert proc.returncode == 1, proc
    assert "password authentication failed" in proc.stderr, proc.stderr
    assert wrong not in proc.stdout + proc.stderr and password not in proc.stdout + proc.stderr


@pytest.mark.integration
def test_password_variable_in_the_file_and_variables_under_flags(tmp_path: Path, pg_dsn: str, pg_schema: str) -> None:
    password = _password(pg_dsn)
    params = conninfo_to_dict(pg_dsn)
    params.pop("password")
    path = tmp_path / "h.yaml"
    path.write_text(
        f"harvest:\n  dataSource: {make_conninfo(**params)} password=${{PG_PASSWORD}}\n"
        f"  outboxTable: ${{TABLE:-{pg_schema}.unused}}\n"
    )
    env = {"PG_PASSWORD": password, "HARVEST_OUTBOX_TABLE": f"{pg_schema}.from_env", "HARVEST_LOG_LEVEL": "info"}
    by_env = harvest("init-db", "-f", str(path), env=env)
    assert by_env.returncode == 0 and f"outbox {pg_schema}.from_env ready" in by_env.stdout, by_env
    assert "harvest.outboxTable from HARVEST_OUTBOX_TABLE; harvest.dataSource from ${PG_PASSWORD}" in by_env.stderr
    by_flag = harvest("init-db", "-f", str(path), "--outbox-table", f"{pg_schema}.from_flag", env=env)
    assert by_flag.returncode == 0 and f"outbox {pg_schema}.from_flag ready" in by_flag.stdout, by_flag
    assert "harvest.outboxTable from HARVEST_OUTBOX_TABLE (a command-line flag wins)" in by_flag.stderr
    unset = harvest("init-db", "-f", str(path), env={"HARVEST_LOG_LEVEL": "info"})
    assert unset.returncode == 2, unset
    assert unset.stderr.strip() == (
        "harvest: configuration error: harvest.dataSource: ${PG_PASSWORD} is not set; "
        "export it or write ${PG_PASSWORD:-default}"
    )
    for proc in (by_env, by_flag, unset):
        assert password not in proc.stdout + proc.stderr
