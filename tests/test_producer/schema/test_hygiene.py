"""Queue-table hygiene (docs/hygiene.md): the outbox's autovacuum settings set by ``init-db``
(never over a value the owner set), ``deadLetterRetention`` enforced by the leader, and ``harvest check``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from relaylib import relay_config
from test_cli import harvest

from harvest_outbox.producer.config import HarvestConfig, from_mapping
from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.producer.harvest import RETENTION_BATCH, Harvest
from harvest_outbox.producer.mapping.table import table_mapping
from harvest_outbox.producer.ops._check import DEAD_ROWS_WARNING, Finding, check_outbox, vacuum_finding
from harvest_outbox.producer.relay.events import LeaderAcquired, MeterRead
from harvest_outbox.producer.relay.sharded import relay_for
from harvest_outbox.producer.schema import OUTBOX_AUTOVACUUM, OutboxNames, table_reloptions
from harvest_outbox.producer.schema.ddl import init_db

# goharvest's own DDL (sh/init-outbox.sh): no storage parameters.
_GOHARVEST_DDL = """
    CREATE TABLE {} (
      id BIGSERIAL PRIMARY KEY, create_time TIMESTAMP WITH TIME ZONE NOT NULL, kafka_topic VARCHAR(249) NOT NULL,
      kafka_key VARCHAR(100) NOT NULL, kafka_value VARCHAR(10000), kafka_header_keys TEXT[] NOT NULL,
      kafka_header_values TEXT[] NOT NULL, leader_id UUID)"""
# A Debezium outbox as its users create it (the router's default columns).
_DEBEZIUM_DDL = """
    CREATE TABLE {} (id UUID PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, aggregateid VARCHAR(255) NOT NULL,
                     type VARCHAR(255) NOT NULL, payload JSONB)"""


def _reloptions(pg_dsn: str, names: OutboxNames) -> dict[str, str]:
    with psycopg.connect(pg_dsn) as conn:
        return table_reloptions(conn, names.outbox)


# ---------------------------------------------------------------------------------------- init-db


@pytest.mark.integration
def test_init_db_gives_a_new_outbox_the_queue_table_autovacuum_settings(pg_dsn: str, pg_schema: str) -> None:
    names = init_db(pg_dsn, f"{pg_schema}.outbox")
    options = _reloptions(pg_dsn, names)
    assert options == {"fillfactor": "50", **OUTBOX_AUTOVACUUM}, options
    assert OUTBOX_AUTOVACUUM["autovacuum_vacuum_scale_factor"] == "0"  # dead rows counted, not a share of the table
    init_db(pg_dsn, f"{pg_schema}.outbox")  # idempotent
    assert _reloptions(pg_dsn, names) == options


@pytest.mark.integration
@pytest.mark.parametrize(
    "kind, ddl, fillfactor_after",
    [
        # goharvest's table: init-db never changes its fillfactor (a backlog would take twice the disk): it says so.
        ("goharvest", _GOHARVEST_DDL, None),
        # Debezium's: init-db ALTERs it anyway (its columns), and gives it the half-empty pages when it has no fillfactor.
        ("debezium", _DEBEZIUM_DDL, "50"),
    ],
)
def test_init_db_sets_on_an_existing_outbox_only_the_settings_it_lacks(
    pg_dsn: str, pg_schema: str, kind: str, ddl: str, fillfactor_after: str | None
) -> None:
    names = OutboxNames.parse(f"{pg_schema}.outbox", table_mapping(kind))
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(ddl).format(names.outbox))
    init_db(pg_dsn, names.display, mapping=names.mapping)
    options = _reloptions(pg_dsn, names)
    assert options.get("fillfactor") == fillfactor_after, options
    assert {k: options[k] for k in OUTBOX_AUTOVACUUM} == OUTBOX_AUTOVACUUM, options
    # The owner's own values (here: a larger threshold and a fillfactor of 70) are kept on every later init-db.
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER TABLE {} SET (autovacuum_vacuum_threshold = 5000, fillfactor = 70)").format(names.outbox)
        )
        conn.execute(sql.SQL("ALTER TABLE {} RESET (autovacuum_analyze_threshold)").format(names.outbox))
    init_db(pg_dsn, names.display, mapping=names.mapping)
    options = _reloptions(pg_dsn, names)
    assert options == {**OUTBOX_AUTOVACUUM, "autovacuum_vacuum_threshold": "5000", "fillfactor": "70"}, options


# ---------------------------------------------------------------------------------------- deadLetterRetention


@pytest.mark.parametrize("value, seconds", [("168h", 7 * 86400.0), ("1m", 60.0), ("keep", None), (None, None)])
def test_dead_letter_retention_is_a_duration_or_keep(value: Any, seconds: float | None) -> None:
    assert from_mapping({"harvest": {"deadLetterRetention": value}}).harvest.dead_letter_retention == seconds


@pytest.mark.parametrize(
    "value, says",
    [
        ("0", "harvest.deadLetterRetention: 0 must be a duration from 1m (a shorter one deletes dead letters before"),
        ("30s", "harvest.deadLetterRetention: 30s must be a duration from 1m"),
        (
            "87601h",
            "harvest.deadLetterRetention: 87601h must be a duration from 1m (a shorter one deletes dead letters "
            "before anyone can look at them) to 87600h (10 years), e.g. '168h' for a week; leave it out (or write "
            "'keep') to keep dead letters until they are requeued",
        ),
        ("7d", "harvest.deadLetterRetention: '7d' is not a duration; use Go syntax with units ns/us/ms/s/m/h"),
        (7, "harvest.deadLetterRetention: 7 is not a duration; write it with a unit"),
        (True, "harvest.deadLetterRetention: True is not a duration"),
        ("9" * 400 + "h", "harvest.deadLetterRetention: inf must be a duration from 1m"),
    ],
)
def test_bad_dead_letter_retention_is_named_with_the_fix(value: Any, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_mapping({"harvest": {"deadLetterRetention": value}})
    assert says in str(err.value), str(err.value)


def _park(pg_dsn: str, names: OutboxNames, first_id: int, count: int, age: str) -> None:
    """``count`` dead letters parked ``age`` ago."""
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (id, kafka_topic, kafka_key, error, attempts, dead_time) "
                "SELECT i, 't', 'k' || i, 'poison', 5, now() - %s::interval "
                "FROM generate_series(%s::bigint, %s::bigint) AS i"
            ).format(names.dead_letters),
            (age, first_id, first_id + count - 1),
        )


def _dead_letter_ids(pg_dsn: str, names: OutboxNames) -> list[int]:
    with psycopg.connect(pg_dsn) as conn:
        return [r[0] for r in conn.execute(sql.SQL("SELECT id FROM {} ORDER BY id").format(names.dead_letters))]


@pytest.mark.integration
@pytest.mark.parametrize("shards", [1, 2])  # sharded: the leader of shard 0 (here one relay leads both)
def test_the_leader_deletes_dead_letters_older_than_the_retention_in_batches(
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    unique_name: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
    shards: int,
) -> None:
    names = init_db(pg_dsn, f"{pg_schema}.outbox", shards=shards)
    old = 2 * RETENTION_BATCH + 500
    _park(pg_dsn, names, 1, old, "2 hours")  # expired: older than the hour below
    _park(pg_dsn, names, 100_000, 10, "50 minutes")  # not yet
    cfg = relay_config(pg_dsn, kafka_bootstrap, names.display, unique_name("g")).replace(
        leader_election="postgres", dead_letter_retention=3600.0, shards=shards
    )
    with caplog.at_level(logging.INFO, logger="harvest_outbox.producer.harvest"):
        with relay_for(cfg):
            deadline = time.monotonic() + 60
            while len(_dead_letter_ids(pg_dsn, names)) > 10 and time.monotonic() < deadline:
                time.sleep(0.2)
    assert _dead_letter_ids(pg_dsn, names) == list(range(100_000, 100_010))
    said = [r.getMessage() for r in caplog.records if "deadLetterRetention" in r.getMessage()]
    counts = [int(m.split("deleted ")[1].split()[0]) for m in said]
    assert sum(counts) == old and max(counts) == RETENTION_BATCH, said  # in batches, each logged with its count
    assert "dead letter(s) parked more than 1h ago (deadLetterRetention)" in said[0], said


@pytest.mark.integration
def test_without_a_retention_dead_letters_are_kept(
    pg_dsn: str, kafka_bootstrap: str, pg_schema: str, unique_name: Callable[[str], str]
) -> None:
    names = init_db(pg_dsn, f"{pg_schema}.outbox")
    _park(pg_dsn, names, 1, 20, "3000 days")
    cfg = relay_config(pg_dsn, kafka_bootstrap, names.display, unique_name("g")).replace(leader_election="postgres")
    assert cfg.dead_letter_retention is None
    events: list[object] = []

    def readings_while_leading() -> int:
        led = [i for i, e in enumerate(events) if isinstance(e, LeaderAcquired)]
        return sum(isinstance(e, MeterRead) for e in events[led[0] :]) if led else 0

    with Harvest(cfg, events.append):
        deadline = time.monotonic() + 30
        # A retention runs at once on leading: three meter readings later, it would have run.
        while readings_while_leading() < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
    assert readings_while_leading() >= 3, events
    assert _dead_letter_ids(pg_dsn, names) == list(range(1, 21))


# ---------------------------------------------------------------------------------------- harvest check


@pytest.mark.integration
@pytest.mark.parametrize("kind, shards", [("goharvest", 1), ("goharvest", 4), ("debezium", 1)])
def test_check_finds_nothing_to_fix_after_init_db(
    tmp_path: Path, pg_dsn: str, pg_schema: str, kind: str, shards: int
) -> None:
    path = tmp_path / "h.yaml"
    path.write_text(
        f"harvest:\n  outboxTable: {pg_schema}.outbox\n  tableMapping: {kind}\n  shards: {shards}\n"
        f"  deadLetterRetention: 168h\n  outboxLayout: mark\n"  # the mark layout's queue-table hygiene
    )
    env = {"HARVEST_DATA_SOURCE": pg_dsn}
    assert harvest("init-db", "-f", str(path), env=env).returncode == 0
    checked = harvest("check", "-f", str(path), env=env)
    assert checked.returncode == 0, checked
    lines = checked.stdout.splitlines()
    # the one WARN: the test's DSN is a superuser's (test_grants_pg.py checks the relay's own role)
    assert lines[-2].startswith("WARN privileges: connected as ") and "a superuser" in lines[-2], lines
    assert all(line.startswith("OK ") for line in lines[:-2]) and lines[-1].endswith(" OK, 1 WARN, 0 FAIL"), lines
    said = "\n".join(lines)
    for needle in (
        "table: ",
        "fillfactor: 50",
        "autovacuum: autovacuum_vacuum_scale_factor = 0,",
        "trigger: ",
        "backlog: 0 row(s) to relay",
        "dead letters: 0; deleted 168h after parking",
        "vacuum: ",
    ):
        assert needle in said, said
    assert (f"_shard{shards}_v2_idx (shards: {shards})" in said) == (shards > 1), said


# (what breaks the outbox, config shards, the finding: level, subject, in its message, in its fix)
_DAMAGE: dict[str, tuple[str, int, tuple[str, str, str, str]]] = {
    "packed": (
        "ALTER TABLE {o} RESET (fillfactor)",
        1,
        ("WARN", "fillfactor", "has fillfactor 100", "SET (fillfactor = 50)"),
    ),
    "autovacuum-missing": (
        "ALTER TABLE {o} RESET (autovacuum_vacuum_threshold, autovacuum_analyze_scale_factor)",
        1,
        (
            "WARN",
            "autovacuum",
            "lacks the queue-table setting(s) autovacuum_vacuum_threshold, autovacuum_analyze_scale_factor",
            "SET (autovacuum_vacuum_threshold = 1000, autovacuum_analyze_scale_factor = 0)`",
        ),
    ),
    "autovacuum-off": (
        "ALTER TABLE {o} SET (autovacuum_enabled = false)",
        1,
        ("WARN", "autovacuum", "dead rows are never removed", "RESET (autovacuum_enabled)"),
    ),
    "trigger-dropped": (
        "DROP TRIGGER {trg} ON {o}",
        1,
        ("WARN", "trigger", "no NOTIFY trigger", "run `harvest init-db`"),
    ),
    "trigger-disabled": (
        "ALTER TABLE {o} DISABLE TRIGGER {trg}",
        1,
        ("WARN", "trigger", "is disabled: the relay learns of new rows only by polling", "ENABLE TRIGGER"),
    ),
    "trigger-replica-only": (
        "ALTER TABLE {o} ENABLE REPLICA TRIGGER {trg}",
        1,
        ("WARN", "trigger", "fires only in replica sessions", "ENABLE TRIGGER"),
    ),
    "trigger-other-channel": (
        "DROP TRIGGER {trg} ON {o}; CREATE TRIGGER {trg} AFTER INSERT ON {o} FOR EACH STATEMENT "
        "EXECUTE FUNCTION {s}.harvest_notify('harvest_old_name')",
        1,
        (
            "WARN",
            "trigger",
            "notifies 'harvest_old_name' through harvest_notify(), not the relay's channel",
            "it recreates the trigger",
        ),
    ),
    "primary-key-dropped": (
        "ALTER TABLE {o} DROP CONSTRAINT outbox_pkey",
        1,
        ("FAIL", "index", "starts with id: every mark sorts the whole outbox", "ADD PRIMARY KEY (id)"),
    ),
    "attempts-dropped": ("DROP TABLE {a}", 1, ("FAIL", "tables", "missing: ", "run `harvest init-db`")),
    "shard-index-dropped": (
        "DROP INDEX {s}.outbox_shard2_v2_idx",
        2,
        ("FAIL", "index", "is not initialised for shards: 2", "run `harvest init-db` with shards: 2"),
    ),
    "old-shard-index": (
        "CREATE INDEX outbox_shard2_idx ON {o} (id)",
        2,
        ("WARN", "index", "outbox_shard2_idx is built by an older harvest", "DROP INDEX"),
    ),
    "other-shard-count": (
        "CREATE INDEX outbox_shard4_v2_idx ON {o} (id)",
        2,
        (
            "WARN",
            "index",
            "serves relays of shards: 4, not this config's shards: 2",
            "once no relay runs with shards: 4",
        ),
    ),
}


@pytest.mark.integration
@pytest.mark.parametrize("case", sorted(_DAMAGE))
def test_check_names_what_is_wrong_and_the_fix(pg_dsn: str, pg_schema: str, case: str) -> None:
    statement, shards, (level, subject, message, fix) = _DAMAGE[case]
    names = init_db(pg_dsn, f"{pg_schema}.outbox", shards=shards)
    config = HarvestConfig(data_source=pg_dsn, outbox_table=names.display, shards=shards)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(statement).format(
                o=names.outbox, trg=names.notify_trigger, a=names.delivery_attempts, s=sql.Identifier(pg_schema)
            )
        )
        found = check_outbox(conn, config)
    flagged = [f for f in found if f.level != "OK"]
    assert len(flagged) == 1, [f.line() for f in found]
    assert (flagged[0].level, flagged[0].subject) == (level, subject), flagged[0].line()
    assert message in flagged[0].message and fix in flagged[0].line(), flagged[0].line()  # some messages hold the fix
    if "init-db" in fix:  # the fix fixes it
        init_db(pg_dsn, names.display, shards=shards)
        with psycopg.connect(pg_dsn) as conn:
            assert [f.line() for f in check_outbox(conn, config) if f.level != "OK"] == []


@pytest.mark.integration
def test_check_fails_with_exit_1_on_an_outbox_that_does_not_exist(tmp_path: Path, pg_dsn: str, pg_schema: str) -> None:
    path = tmp_path / "h.yaml"
    path.write_text(f"harvest:\n  outboxTable: {pg_schema}.outbox\n")
    checked = harvest("check", "-f", str(path), env={"HARVEST_DATA_SOURCE": pg_dsn})
    assert checked.returncode == 1, checked
    assert checked.stdout.splitlines()[0].startswith(
        f"FAIL table: outbox table '{pg_schema}.outbox' does not exist; create it with `harvest init-db`"
    ), checked.stdout
    assert checked.stdout.splitlines()[-1] == "0 OK, 0 WARN, 1 FAIL"


@pytest.mark.parametrize(
    "live, dead, age, level",
    [
        (0, 0, None, "OK"),
        (10, DEAD_ROWS_WARNING - 1, 30.0, "OK"),
        (DEAD_ROWS_WARNING * 2, DEAD_ROWS_WARNING, 30.0, "OK"),  # a backlog being drained: dead rows are expected
        (5, DEAD_ROWS_WARNING, 3600.0, "WARN"),
        (0, DEAD_ROWS_WARNING * 10, None, "WARN"),
    ],
)
def test_dead_rows_warn_when_they_pile_up(live: int, dead: int, age: float | None, level: str) -> None:
    found = vacuum_finding("app.outbox", live, dead, age)
    assert found.level == level, found.line()
    assert f"{dead} dead / {live} live rows" in found.message
    if level == "WARN":
        assert "pg_replication_slots" in found.fix and "VACUUM (VERBOSE) app.outbox" in found.fix
    assert isinstance(found, Finding)
