"""A rotated Postgres password, picked up without a restart (issue #49 item 4, docs/security.md "Rotating
Postgres credentials"): an at-least-once relay (Postgres-lock election, LISTEN wake-ups) logs in as a LOGIN
role whose password a file holds and ``dataSourcePasswordCommand`` reads (the DSN's own password is wrong:
the provider's wins). While writers stash rows, the role's password is changed (``ALTER ROLE … PASSWORD``)
and every session of the role ended (``pg_terminate_backend``); the relay's reconnects fail on the old
password (logged, the password not) until the file holds the new one, then succeed: the same relay, still running, delivers every
row (duplicates counted, none lost), in per-key order, as the new password's sessions."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from relaylib import BackgroundWriter, assert_per_key_order, consume_all, covers, relay_config, wait_drained

from harvest_outbox.harvest_local.relays import wait_for
from harvest_outbox.producer.db.credentials import provide
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.relay.lifecycle import State
from harvest_outbox.producer.schema.ddl import init_db

pytestmark = pytest.mark.integration


@pytest.fixture
def role(pg_dsn: str, pg_schema: str, unique_name: Callable[[str], str]) -> Iterator[str]:
    """A LOGIN role owning the test's schema (so it may run init-db and the relay there); dropped after."""
    name = unique_name("rot")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        conn.execute(sql.SQL("ALTER SCHEMA {} OWNER TO {}").format(sql.Identifier(pg_schema), sql.Identifier(name)))
    yield name
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        _end_sessions(conn, name)
        conn.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(name)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def _set_password(conn: psycopg.Connection, role: str, password: str) -> None:
    conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(role), sql.Literal(password)))


def _end_sessions(conn: psycopg.Connection, role: str) -> int:
    rows = conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s AND pid <> pg_backend_pid()",
        [role],
    ).fetchall()
    return len(rows)


def _sessions(conn: psycopg.Connection, role: str) -> int:
    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s", [role]).fetchone()
    return int(row[0]) if row else 0


def test_the_relay_reconnects_with_the_rotated_password_and_loses_no_row(
    pg_dsn: str,
    pg_schema: str,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    role: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    old, new = os.urandom(9).hex(), os.urandom(9).hex()
    secret = tmp_path / "pgpassword"
    secret.write_text(old + "\n")
    table, topic = f"{pg_schema}.outbox", topic_factory(partitions=2)
    admin = psycopg.connect(pg_dsn, autocommit=True)
    _set_password(admin, role, old)
    init_db(make_conninfo(pg_dsn, user=role, password=old), table)
    relay_dsn = make_conninfo(pg_dsn, user=role, password="stale-in-the-dsn")
    config = relay_config(relay_dsn, kafka_bootstrap, table, f"g-{role}").replace(
        leader_election="postgres",
        leader_lock_check_interval=0.2,
        data_source_password_command=f"cat {secret}",
    )
    writer = BackgroundWriter(pg_dsn, table, topic)  # the application, as the superuser
    relay = Harvest(config)
    try:
        relay.start()
        writer.start()
        wait_for(lambda: relay.metrics.delivered >= 100, 30, "deliveries with the old password")
        _set_password(admin, role, new)
        assert _end_sessions(admin, role) >= 3  # statements, reads, election, layout, LISTEN
        time.sleep(0.5)  # the relay's reconnects fail: the file still holds the old password
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(make_conninfo(pg_dsn, user=role, password=old)).close()
        delivered_before = relay.metrics.delivered
        secret.write_text(new + "\n")  # the rotation reaches the relay's host
        wait_for(lambda: relay.metrics.delivered >= delivered_before + 100, 30, "deliveries with the new password")
        writer.stop()
        wait_drained(pg_dsn, table, timeout=30)
        assert relay.metrics.delivered > delivered_before  # delivered again, after the rotation
        assert relay.state is State.RUNNING  # never restarted
        assert _sessions(admin, role) >= 3  # its connections are back, made with the new password
    finally:
        writer.stop()
        relay.stop()
        relay.wait(15)
        provide(relay_dsn, None)
        admin.close()
    assert writer.total >= 300
    got = consume_all(kafka_bootstrap, topic, covers(writer.expected), timeout=30)
    arrived = {(g.key, g.value) for g in got}
    lost = [(k, v) for k, vs in writer.expected.items() for v in vs if (k, v) not in arrived]
    assert not lost, f"{len(lost)} of {writer.total} rows lost, e.g. {lost[:3]}"
    duplicates = len(got) - len(arrived)
    assert duplicates <= writer.total  # at least once: a re-sent batch at most, counted
    assert_per_key_order(got, writer.expected, allow_dups=True)
    assert "password authentication failed" in caplog.text  # the reconnects with the old password were refused
    assert old not in caplog.text and new not in caplog.text  # and no log line shows either password
