"""``harvest dead-letters keys|list|export|discard|requeue`` as an operator runs them, on the real Postgres.

Dead letters of (t1, p), (t1, q) and (t2, p, parked two hours ago), and outbox rows waiting behind
them; the verbs' filters, the stuck-key listing with rows waiting, JSON-lines export, the audit line
of every change (who: ``--actor`` or the OS user, even at ``--log-level ERROR``), a requeue that
keeps the original id under ``haltKey`` and takes a new one under ``skip``, and one-line usage errors
that name the fix.
"""

from __future__ import annotations

import getpass
import json

import psycopg
import pytest
from psycopg import sql
from test_cli import assert_one_line_exit_2, harvest

from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db


def _setup(pg_dsn: str, table: str) -> OutboxNames:
    names = init_db(pg_dsn, table)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        dl = sql.SQL(
            "INSERT INTO {} (id, create_time, kafka_topic, kafka_key, kafka_value, error, attempts, dead_time) "
            "VALUES (%s, now(), %s, %s, %s, %s, 1, now() - make_interval(secs => %s))"
        ).format(names.dead_letters)
        conn.execute(dl, (5, "t1", "p", "p5", "bad row: header arrays differ in length", 0))
        conn.execute(dl, (6, "t1", "q", "q6", "cannot be sent: record of 30000 bytes is too LARGE", 0))
        conn.execute(dl, (7, "t2", "p", "p7", "bad row: kafka_header_keys contains NULL", 7200))
        # rows of t1/p waiting behind dead letter 5 (ids from the sequence: above 5)
        conn.execute(sql.SQL("SELECT setval(pg_get_serial_sequence(%s, 'id'), 100)"), (names.display,))
        ins = sql.SQL(
            "INSERT INTO {} (kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values) "
            "VALUES (%s, %s, %s, '{{}}', '{{}}')"
        ).format(names.outbox)
        for v in ("p8", "p9"):
            conn.execute(ins, ("t1", "p", v))
        conn.execute(ins, ("t1", "other", "o1"))
    return names


def _ids(out: str) -> list[int]:
    return [int(line.split()[0]) for line in out.splitlines()[1:-1]]


@pytest.mark.integration
def test_operator_verbs(pg_dsn: str, pg_schema: str) -> None:
    table = f"{pg_schema}.outbox"
    names = _setup(pg_dsn, table)
    env = {"HARVEST_DATA_SOURCE": pg_dsn, "HARVEST_OUTBOX_TABLE": table}

    keys = harvest("deadletters", "keys", env=env)  # the alias the issue names
    assert keys.returncode == 0, keys.stderr
    rows = [line.split() for line in keys.stdout.splitlines()[1:-1]]
    assert [(r[0], r[1], r[3], r[4]) for r in rows] == [
        ("t2", "p", "1", "0"),
        ("t1", "p", "1", "2"),
        ("t1", "q", "1", "0"),
    ]
    assert "header arrays differ" in keys.stdout and "not halted (deadLetterPolicy: skip)" in keys.stdout

    for flags, want in [
        ((), [5, 6, 7]),
        (("--topic", "t1"), [5, 6]),
        (("--key", "p"), [5, 7]),
        (("--reason", "large"), [6]),
        (("--older-than", "1h"), [7]),
        (("--newer-than", "1h"), [5, 6]),
        (("--topic", "t1", "--key", "p"), [5]),
    ]:
        listed = harvest("dead-letters", "list", *flags, env=env)
        assert listed.returncode == 0, listed.stderr
        assert _ids(listed.stdout) == want, (flags, listed.stdout)

    exported = harvest("dead-letters", "export", "--key", "p", "--actor", "bob", env=env)
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    assert [(d["id"], d["kafka_topic"], d["kafka_value"]) for d in lines] == [(5, "t1", "p5"), (7, "t2", "p7")]
    assert {"error", "attempts", "dead_time", "create_time"} <= set(lines[0])
    assert "dead-letters export by bob: 2 dead letter(s)" in exported.stderr

    discarded = harvest("dead-letters", "discard", "--key", "q", "--actor", "alice", "--log-level", "ERROR", env=env)
    assert discarded.returncode == 0, discarded.stderr
    assert "discarded 1 dead letter(s)" in discarded.stdout
    assert "dead-letters discard by alice: 1 dead letter(s)" in discarded.stderr and "ids 6 " in discarded.stderr
    assert "t1/q" in discarded.stderr

    # haltKey: the requeued row takes its own id back, ahead of the key's waiting rows
    halt_env = {**env, "HARVEST_DEAD_LETTER_POLICY": "haltKey"}
    keys = harvest("dead-letters", "keys", env=halt_env)
    assert "halted: their rows wait" in keys.stdout
    requeued = harvest("dead-letters", "requeue", "--topic", "t1", "--key", "p", "--skip-topic-check", env=halt_env)
    assert requeued.returncode == 0, requeued.stderr
    assert "requeued 1 dead letter(s)" in requeued.stdout
    assert f"dead-letters requeue by {getpass.getuser()}: 1 dead letter(s) moved back" in requeued.stderr
    assert "original ids" in requeued.stderr
    # skip: a new id, at the end of the outbox (today's behaviour)
    assert harvest("dead-letters", "requeue", "7", "--skip-topic-check", env=env).returncode == 0
    with psycopg.connect(pg_dsn) as conn:
        order = conn.execute(sql.SQL("SELECT id, kafka_value FROM {} ORDER BY id").format(names.outbox)).fetchall()
        left = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(names.dead_letters)).fetchone()
    assert [v for _i, v in order] == ["p5", "p8", "p9", "o1", "p7"]
    assert order[0][0] == 5 and order[-1][0] > 103
    assert left == (0,)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("discard",), ("give dead-letter ids or --all, or select with a filter", "--topic")),
        (("discard", "--all", "5"), ("give ids or --all, not both",)),
        (("requeue",), ("dead-letters requeue: give dead-letter ids or --all",)),
        (("discard", "--key", "q", "--actor", " "), ("--actor: ' ' is not a name", "--actor alice")),
        (("list", "--older-than", "5"), ("--older-than", "5")),
        (("discard", "--newer-than", "soon"), ("--newer-than", "soon")),
    ],
)
def test_operator_errors_are_one_line_and_change_nothing(
    args: tuple[str, ...], needles: tuple[str, ...], pg_dsn: str, pg_schema: str
) -> None:
    table = f"{pg_schema}.outbox"
    names = _setup(pg_dsn, table)
    proc = harvest("dead-letters", *args, env={"HARVEST_DATA_SOURCE": pg_dsn, "HARVEST_OUTBOX_TABLE": table})
    assert_one_line_exit_2(proc, *needles)
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(names.dead_letters)).fetchone() == (3,)


@pytest.mark.integration
def test_check_reports_halted_keys_and_the_missing_key_index(pg_dsn: str, pg_schema: str) -> None:
    from harvest_outbox.producer.config import HarvestConfig
    from harvest_outbox.producer.ops._check import check_outbox

    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table)
    cfg = HarvestConfig(data_source=pg_dsn, outbox_table=table, dead_letter_policy="haltKey")

    def findings() -> dict[str, list[str]]:
        with psycopg.connect(pg_dsn) as conn:
            out: dict[str, list[str]] = {}
            for f in check_outbox(conn, cfg):
                out.setdefault(f.subject, []).append(f.line())
            return out

    assert findings()["halted keys"] == ["OK   halted keys: none (deadLetterPolicy: haltKey)"]
    _setup(pg_dsn, f"{pg_schema}.other")  # another outbox's dead letters are not this one's
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (id, kafka_topic, kafka_key, error, attempts) VALUES "
                "(1, 't', 'k', 'e', 0), (2, 't', 'k', 'e', 0), (3, NULL, 'k', 'e', 0)"
            ).format(names.dead_letters)
        )
    [halted] = findings()["halted keys"]
    assert halted.startswith("WARN halted keys: 1 key(s) halted") and "harvest dead-letters keys" in halted
    assert not any("kafka_topic, kafka_key" in line for line in findings()["tables"])
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(pg_schema, names.dead_key_index_name)))
    [warn] = [line for line in findings()["tables"] if "kafka_topic, kafka_key" in line]
    assert warn.startswith("WARN") and "harvest init-db" in warn
    init_db(pg_dsn, table)  # the fix
    assert not any("kafka_topic, kafka_key" in line for line in findings()["tables"])
