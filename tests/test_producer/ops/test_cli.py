"""The ``harvest`` command as a subprocess: bad input is one clear line on stderr and exit code 2
(configuration or usage), never a traceback, never a secret; row data cannot drive the terminal.

The table of bad config files runs each file through three commands by the command's ``main`` in this
process (~160 calls, each a Python start of ~0.3-1 s as a subprocess); one file of the table also runs as
a subprocess, which shows the process behaves the same."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from clilib import harvest_in_process
from psycopg import sql

from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db

SECRET = "hunter2secret"


def harvest(*args: str, env: dict[str, str] | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harvest_outbox.producer", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def assert_one_line_exit_2(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert SECRET not in proc.stderr + proc.stdout
    for needle in needles:
        assert needle in err, err
    return err


def _limits(**limits: str) -> str:
    return "".join(f"    {k}: {v}\n" for k, v in limits.items())


VALID_HEAD = f"harvest:\n  dataSource: host=127.0.0.1 port=1 user=relay password={SECRET}\n"

# (file bytes, needles in the one-line error)
BAD_FILES = {
    "empty": (b"", ["h.yaml: the file is empty", "harvest:"]),
    "comments-only": (b"# nothing here\n", ["the file is empty"]),
    "logging-only": (b"logging:\n  level: Info\n", ["no 'harvest:' section"]),
    "yaml-syntax": (
        f'harvest:\n  dataSource: "host=x password={SECRET}\n'.encode(),
        ["not valid YAML: line 3, column 1: found unexpected end of stream"],
    ),
    "yaml-tab": (
        f"harvest:\n  dataSource: host=x password={SECRET}\n\toutboxTable: o\n".encode(),
        ["not valid YAML: line 3"],
    ),
    "non-utf8": (b"harvest:\n  dataSource: host=x password=\xff\xfe\n", ["not UTF-8 text (byte 0xff on line 2)"]),
    "passwd-typo": (
        f"harvest:\n  dataSource: host=127.0.0.1 passwd={SECRET}\n".encode(),
        ['harvest.dataSource: invalid connection option "passwd"'],
    ),
    "password-unquoted-space": (
        f"harvest:\n  dataSource: host=127.0.0.1 password=a {SECRET}\n".encode(),
        ['harvest.dataSource: missing "=" after'],
    ),
    "unknown-kafka-property": (
        (VALID_HEAD + "  producerKafkaConfig:\n    lingr.ms: 1\n").encode(),
        ['producerKafkaConfig: No such configuration property: "lingr.ms"'],
    ),
    "unknown-base-kafka-property": (
        (VALID_HEAD + f"  baseKafkaConfig:\n    sasl.pasword: {SECRET}\n").encode(),
        ['baseKafkaConfig: No such configuration property: "sasl.pasword"'],
    ),
    "bad-kafka-value": (
        (VALID_HEAD + "  producerKafkaConfig:\n    compression.type: zip\n").encode(),
        ['producerKafkaConfig: Invalid value "zip" for configuration property "compression.codec"'],
    ),
    "heartbeat-overflow": (
        (VALID_HEAD + "  limits:\n" + _limits(heartbeatTimeout="1431657766ms")).encode(),
        ["limits.heartbeatTimeout", "at most 24h"],
    ),
    "heartbeat-above-session-max": (
        (VALID_HEAD + "  limits:\n" + _limits(heartbeatTimeout="11m")).encode(),
        ["limits.heartbeatTimeout: 11m is too long", "group.max.session.timeout.ms"],
    ),
    "heartbeat-below-session-min": (
        (VALID_HEAD + "  limits:\n" + _limits(heartbeatTimeout="1500ms")).encode(),
        ["limits.heartbeatTimeout: 1.5s is too short", "group.min.session.timeout.ms", "use 2s or more"],
    ),
    "huge-duration": (
        (VALID_HEAD + "  limits:\n" + _limits(queueTimeout="9" * 400 + "h")).encode(),
        ["limits.queueTimeout: inf is invalid; it must be at most 24h"],
    ),
    "io-backoff-zero": (
        (VALID_HEAD + "  limits:\n" + _limits(ioErrorBackoff="0s")).encode(),
        ["limits.ioErrorBackoff: 0 is invalid; it must be >= 10ms"],
    ),
    "huge-mark-query": (
        (VALID_HEAD + "  limits:\n" + _limits(markQueryRecords="10000000000")).encode(),
        ["limits.markQueryRecords: 10000000000 is invalid; it must be at most 1,000,000"],
    ),
    "huge-producer-ring": (
        (VALID_HEAD + "  limits:\n" + _limits(producerRing="100000")).encode(),
        ["limits.producerRing: 100000 is invalid; it must be at most 256"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_config_file_is_one_line_and_exit_2(tmp_path: Path, case: str) -> None:
    content, needles = BAD_FILES[case]
    path = tmp_path / "h.yaml"
    path.write_bytes(content)
    for command in (["-f", str(path)], ["init-db", "-f", str(path)], ["dead-letters", "list", "-f", str(path)]):
        err = assert_one_line_exit_2(harvest_in_process(*command), *needles)
        assert err.startswith("harvest: configuration error: ")


@pytest.mark.parametrize("command", [[], ["init-db"], ["dead-letters", "list"]])
def test_a_bad_config_file_as_a_process(tmp_path: Path, command: list[str]) -> None:
    content, needles = BAD_FILES["yaml-syntax"]
    path = tmp_path / "h.yaml"
    path.write_bytes(content)
    proc = harvest(*command, "-f", str(path))
    err = assert_one_line_exit_2(proc, *needles)
    assert err.startswith("harvest: configuration error: ")
    in_process = harvest_in_process(*command, "-f", str(path))
    assert (in_process.returncode, in_process.stderr) == (proc.returncode, proc.stderr)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["dead-letters", "list", "--limit", "-1"], "argument --limit: -1 is out of range; give 1-1,000,000"),
        (["dead-letters", "list", "--limit", "0"], "argument --limit: 0 is out of range"),
        (["dead-letters", "list", "--limit", "10000000000000000000000"], "is out of range"),
        (["dead-letters", "list", "--limit", "many"], "argument --limit: 'many' is not a whole number"),
        (["dead-letters", "requeue", "99999999999999999999"], "argument ids: 99999999999999999999 is out of range"),
        (["dead-letters", "requeue", "-5"], "usage error"),
        (["--prometheus-port", "http"], "argument --prometheus-port"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args: list[str], needle: str) -> None:
    err = assert_one_line_exit_2(harvest(*args), needle)
    assert "usage error" in err and "--help" in err


@pytest.mark.integration
def test_prometheus_port_in_use_is_a_configuration_error(tmp_path: Path, pg_dsn: str, pg_schema: str) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        path = tmp_path / "h.yaml"
        path.write_text(f"harvest:\n  outboxTable: {table}\n  baseKafkaConfig:\n    bootstrap.servers: 127.0.0.1:1\n")
        proc = harvest(
            "-f", str(path), "--prometheus-port", str(port), "--log-level", "ERROR", env={"HARVEST_DATA_SOURCE": pg_dsn}
        )
    err = assert_one_line_exit_2(proc, f"prometheusPort: cannot listen on 0.0.0.0:{port}", "pick a free port")
    password = psycopg.conninfo.conninfo_to_dict(pg_dsn).get("password")
    assert not password or str(password) not in proc.stdout + proc.stderr, "the DSN's password was printed"
    assert err.startswith("harvest: configuration error: ")


@pytest.mark.integration
def test_dead_letters_list_escapes_control_characters(pg_dsn: str, pg_schema: str) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    names = OutboxNames.parse(table)
    evil_key = "k\x1b[2J\x1b]0;pwned\x07"
    evil_error = "boom\r\n\x1b[31mred\x9b1m\u202etxet"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (id, create_time, kafka_topic, kafka_key, kafka_value, error, attempts, "
                "dead_time) VALUES (7, now(), %s, %s, 'v', %s, 3, now())"
            ).format(names.dead_letters),
            ("t\x1bopic", evil_key, evil_error),
        )
    proc = harvest("dead-letters", "list", "--outbox-table", table, env={"HARVEST_DATA_SOURCE": pg_dsn})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert not any(ch in out for ch in "\x1b\x07\r\x9b\u202e"), repr(out)
    assert r"k\x1b[2J\x1b]0;pwned\x07" in out and r"boom\r\n\x1b[31mred\x9b1m\u202etxet" in out
    assert r"t\x1bopic" in out and "1 dead letter(s)" in out
    assert len(out.strip().splitlines()) == 3  # header, the row, the count: the row's \n did not split it


@pytest.mark.integration
def test_requeue_refuses_rows_of_a_missing_topic(
    pg_dsn: str, pg_schema: str, kafka_bootstrap: str, unique_name
) -> None:
    """Requeueing rows whose topic does not exist only dead-letters them again: nothing moves until the
    topic exists (or --skip-topic-check)."""
    from harvest_outbox.harvest_local.kafka import create_topic

    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    names = OutboxNames.parse(table)
    missing = unique_name("missing")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (id, create_time, kafka_topic, kafka_key, kafka_value, error, attempts) "
                "VALUES (1, now(), %s, 'k', 'v', 'UNKNOWN_TOPIC_OR_PART', 1)"
            ).format(names.dead_letters),
            (missing,),
        )

    def counts() -> tuple[int, int]:
        with psycopg.connect(pg_dsn) as conn:
            dl = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(names.dead_letters)).fetchone()
            ob = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(names.outbox)).fetchone()
            return int(dl[0]), int(ob[0])  # type: ignore[index]

    env = {"HARVEST_DATA_SOURCE": pg_dsn}
    args = ["dead-letters", "requeue", "--all", "--outbox-table", table, "--bootstrap-servers", kafka_bootstrap]
    proc = harvest(*args, env=env)
    assert (
        proc.returncode == 1 and f"id 1 (topic '{missing}'): topic '{missing}' does not exist in Kafka" in proc.stderr
    ), proc.stderr
    assert "Traceback" not in proc.stderr and counts() == (1, 0)
    create_topic(kafka_bootstrap, missing)
    proc = harvest(*args, env=env)
    assert proc.returncode == 0 and "requeued 1 dead letter(s)" in proc.stdout, proc.stderr
    assert counts() == (0, 1)
    unreachable = harvest(
        "dead-letters", "requeue", "1", "--outbox-table", table, "--bootstrap-servers", "127.0.0.1:1", env=env
    )
    assert unreachable.returncode == 0 and "requeued 0" in unreachable.stdout  # no row: no topic to check


@pytest.mark.integration
def test_requeue_all_moves_what_it_can_and_reports_the_rest(
    pg_dsn: str, pg_schema: str, kafka_bootstrap: str, topic_factory, unique_name
) -> None:
    """One row of an illegal topic name must not hold the others back, and the advice never asks to
    create a topic Kafka cannot have."""
    from harvest_outbox.harvest_local.kafka import create_topic

    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    names = OutboxNames.parse(table)
    good, missing = topic_factory(partitions=1), unique_name("missing")
    rows = [
        (1, good, "k"),
        (2, "", "k"),
        (3, missing, "k"),
        (4, None, "k"),
        (5, good, None),
        (6, "bad topic!", "k"),
        (7, "__consumer_offsets", "k"),
        (8, good, "k2"),
    ] + [(100 + i, "", "k") for i in range(12)]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for row in rows:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (id, create_time, kafka_topic, kafka_key, kafka_value, error, "
                    "attempts) VALUES (%s, now(), %s, %s, 'v', 'e', 1)"
                ).format(names.dead_letters),
                row,
            )

    def left() -> list[int]:
        with psycopg.connect(pg_dsn) as conn:
            return [r[0] for r in conn.execute(sql.SQL("SELECT id FROM {} ORDER BY id").format(names.dead_letters))]

    env = {"HARVEST_DATA_SOURCE": pg_dsn}
    args = ["dead-letters", "requeue", "--all", "--outbox-table", table, "--bootstrap-servers", kafka_bootstrap]
    proc = harvest(*args, env=env)
    err = proc.stderr
    assert proc.returncode == 1 and "requeued 2 dead letter(s)" in proc.stdout, (proc.stdout, err)
    assert "Traceback" not in err and "18 dead letter(s) not requeued" in err, err
    assert left() == [2, 3, 4, 5, 6, 7] + [100 + i for i in range(12)]
    assert (
        "ids 2, 100, 101, 102, 103, 104, 105, 106, 107, 108 and 3 more (topic ''): kafka_topic '' is not a legal "
        "Kafka topic name"
    ) in err, err
    assert f"id 3 (topic '{missing}'): topic '{missing}' does not exist in Kafka at" in err
    assert "id 4 (topic None): kafka_topic is NULL; set the row's topic" in err
    assert f"id 5 (topic '{good}'): kafka_key is NULL; set the row's key" in err
    assert "id 6 (topic 'bad topic!'): kafka_topic 'bad topic!' is not a legal Kafka topic name" in err
    assert "id 7 (topic '__consumer_offsets'): topic '__consumer_offsets' is one of Kafka's internal topics" in err
    for line in err.splitlines():
        assert "create it" not in line or missing in line, line  # only an existing-name topic is to be created
    create_topic(kafka_bootstrap, missing)
    again = harvest(*args, env=env)
    assert again.returncode == 1 and "requeued 1 dead letter(s)" in again.stdout, again
    assert left() == [2, 4, 5, 6, 7] + [100 + i for i in range(12)]
    chosen = harvest("dead-letters", "requeue", "5", "6", "--outbox-table", table, "--skip-topic-check", env=env)
    assert chosen.returncode == 1 and "requeued 0 dead letter(s)" in chosen.stdout
    assert "2 dead letter(s) not requeued" in chosen.stderr and "id 5 (topic" in chosen.stderr


@pytest.mark.integration
def test_the_log_says_which_data_source_won_and_when_kafka_is_goharvests_default(
    tmp_path: Path, pg_dsn: str, pg_schema: str
) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    path = tmp_path / "h.yaml"
    path.write_text(
        f"harvest:\n  dataSource: host=127.0.0.1 port=1 user=filer password={SECRET}\n"
        f"  outboxTable: {table}\nlogging:\n  level: Info\n"
    )
    env = {"HARVEST_DATA_SOURCE": pg_dsn}
    env_password = str(psycopg.conninfo.conninfo_to_dict(pg_dsn).get("password") or "no-password-in-dsn")
    listed = harvest("dead-letters", "list", "-f", str(path), env=env)
    assert listed.returncode == 0, listed.stderr
    assert "INFO harvest: dataSource: HARVEST_DATA_SOURCE (" in listed.stderr, listed.stderr
    assert (
        "is used; it overrides the file's harvest.dataSource ('host=127.0.0.1 port=1 user=filer "
        "password=<redacted>')" in listed.stderr
    ), listed.stderr
    assert SECRET not in listed.stderr + listed.stdout and env_password not in listed.stderr + listed.stdout
    assert "bootstrap.servers" not in listed.stderr  # listing dead letters never talks to Kafka
    requeued = harvest("dead-letters", "requeue", "--all", "-f", str(path), env=env)
    assert requeued.returncode == 0 and "requeued 0 dead letter(s)" in requeued.stdout, requeued.stderr
    assert (
        "WARNING harvest: baseKafkaConfig sets no bootstrap.servers: connecting to localhost:9092 (goharvest's "
        "default); set harvest.baseKafkaConfig.bootstrap.servers or --bootstrap-servers"
    ) in requeued.stderr
    flag = harvest("dead-letters", "list", "-f", str(path), "--data-source", pg_dsn)
    assert flag.returncode == 0 and "dataSource: --data-source (" in flag.stderr, flag.stderr


@pytest.mark.integration
def test_init_db_names_a_packed_outbox_it_did_not_create(tmp_path: Path, pg_dsn: str, pg_schema: str) -> None:
    path = tmp_path / "h.yaml"
    path.write_text(f"harvest:\n  outboxTable: {pg_schema}.outbox\n  outboxLayout: mark\n")  # its fillfactor
    env = {"HARVEST_DATA_SOURCE": pg_dsn}
    first = harvest("init-db", "-f", str(path), env=env)
    assert first.returncode == 0 and "ready" in first.stdout and "fillfactor" not in first.stdout, first
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # as goharvest's own DDL leaves it
        conn.execute(sql.SQL("ALTER TABLE {} RESET (fillfactor)").format(sql.Identifier(pg_schema, "outbox")))
    again = harvest("init-db", "-f", str(path), env=env)
    assert again.returncode == 0, again
    assert "has fillfactor 100" in again.stdout and "SET (fillfactor = 50)" in again.stdout, again.stdout
