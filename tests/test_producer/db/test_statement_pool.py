"""A fleet's statement pool (producer/db/statement_pool.py) on a real Postgres, stepped through as its
relays use it: the bound and the bounded wait, each outbox checked once per connection, the commit mode
of each lease, failed and terminated connections replaced, a resize; and (no services) that every method
of both layouts' relay databases runs inside a lease, and ``fleet.statementConnections``' errors."""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable

import psycopg
import pytest

from harvest_outbox.harvest_local.relays import wait_for
from harvest_outbox.producer.db import OutboxSession, StatementPool, StatementPools, statement_pool
from harvest_outbox.producer.errors import ConfigError, DatabaseError
from harvest_outbox.producer.fleet.spec import fleet_from_document
from harvest_outbox.producer.layouts.cursor.database import CursorDatabase
from harvest_outbox.producer.layouts.layout import RelayDatabase
from harvest_outbox.producer.layouts.mark.database import MarkDatabase
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db

#: RelayDatabase members that run no statement.
_NO_STATEMENT = {"conn", "set_shards", "close", "halted_keys", "shard_stats", "scan"}


@pytest.mark.parametrize("database", [MarkDatabase, CursorDatabase], ids=["mark", "cursor"])
def test_every_method_of_a_relay_database_runs_inside_a_lease(database: type) -> None:
    """A pooled session refuses a statement outside a lease, so a method that forgot one would fail in a
    fleet only; each is @leased instead (one connection for its statements, a transaction's among them)."""
    methods = {n for n, _ in inspect.getmembers(RelayDatabase) if not n.startswith("_")} - _NO_STATEMENT
    assert {"mark_with_attempts", "commit_txns", "start_view_with_floor", "stats"} <= methods
    unleased = sorted(n for n in methods if not getattr(getattr(database, n), "leased", False))
    assert not unleased, f"{database.__name__}: {unleased} run statements outside a lease"


def _fleet_options(fleet: object) -> object:
    doc = {"harvest": {"dataSource": "postgres://relay@db1/app"}, "outboxes": [{"outboxTable": "a.outbox"}]}
    if fleet is not None:
        doc["fleet"] = fleet
    return fleet_from_document(doc, {}, None, {}, {}).options


@pytest.mark.parametrize("value", [-1, 1001, "ten", 2.5, True, None], ids=repr)
def test_a_bad_statement_connections_value_names_the_key_the_value_and_the_fix(value: object) -> None:
    with pytest.raises(ConfigError) as err:
        _fleet_options({"statementConnections": value})
    msg = str(err.value)
    assert msg.startswith("fleet.statementConnections: ") and repr(value) in msg, msg
    assert "from 0 to 1000" in msg and "e.g. 10" in msg, msg


def test_statement_connections_defaults_to_ten_0_is_no_pool_and_a_misspelt_key_fails() -> None:
    assert _fleet_options(None).statement_connections == 10  # type: ignore[attr-defined]
    assert _fleet_options({"statementConnections": 3}).statement_connections == 3  # type: ignore[attr-defined]
    assert _fleet_options({"statementConnections": 0}).statement_connections == 0  # type: ignore[attr-defined]
    assert StatementPools("r", 0).for_dsn("postgres://relay@db1/app") is None
    with pytest.raises(
        ConfigError, match=r"fleet\.'statementConnection': unknown key; valid keys are: .*statementConnections"
    ):
        _fleet_options({"statementConnection": 3})


def _backends(dsn: str, app: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,))]


def test_a_pool_lends_checked_connections_within_its_bound_and_replaces_failed_ones(
    pg_dsn: str, unique_name: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    schemas = [unique_name("pa"), unique_name("pb")]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for s in schemas:
            conn.execute(f'CREATE SCHEMA "{s}"')
    for s in schemas:
        init_db(pg_dsn, f"{s}.outbox")
    name = unique_name("pool")
    app = f"harvest-statements:{name}"
    pool = StatementPool(pg_dsn, name, 2, wait=0.3)
    mark_a, write_a, write_b = (
        OutboxSession(pg_dsn, OutboxNames.parse(f"{schemas[0]}.outbox"), async_commit=True, pool=pool),
        OutboxSession(pg_dsn, OutboxNames.parse(f"{schemas[0]}.outbox"), pool=pool),
        OutboxSession(pg_dsn, OutboxNames.parse(f"{schemas[1]}.outbox"), pool=pool),
    )
    checks: list[str] = []
    for s in (mark_a, write_a, write_b):
        s.watch(connected=lambda conn, s=s: checks.append(s.names.display))

    def commit_mode(session: OutboxSession) -> str:
        with session.lease():
            row = session.conn.execute("SHOW synchronous_commit").fetchone()
        assert row is not None
        return str(row[0])

    try:
        # a statement outside a lease is a bug, refused
        with pytest.raises(RuntimeError, match="outside a lease"):
            mark_a.conn  # noqa: B018
        # each lease has its borrower's commit mode; the mark's connection is the write's next
        assert commit_mode(mark_a) == "off"
        assert commit_mode(write_a) == "on"
        assert commit_mode(mark_a) == "off"
        assert len(_backends(pg_dsn, app)) == 1  # one at a time needs one connection
        # at most 2 lent: a third borrower waits its bound, then gets the relay's ordinary error
        with mark_a.lease(), write_a.lease():
            assert mark_a.conn is not write_a.conn
            assert len(_backends(pg_dsn, app)) == 2
            began = time.monotonic()
            with pytest.raises(DatabaseError, match=r"within 0\.3s: .* all 2 of fleet\.statementConnections"):
                with write_b.lease():
                    pass
            assert 0.25 <= time.monotonic() - began < 2.0
        assert pool.stats().timeouts == 1
        # borrowers wait in line: each connection given back goes to the first in it
        line = StatementPool(pg_dsn, name, 1, wait=10)
        order: list[str] = []

        def borrow(session: OutboxSession, who: str) -> None:
            with session.lease():
                order.append(who)

        holder, *waiting = (
            OutboxSession(pg_dsn, OutboxNames.parse(f"{schemas[i % 2]}.outbox"), pool=line) for i in range(4)
        )
        try:
            with holder.lease():
                threads = []
                for who, session in zip(("first", "second", "third"), waiting, strict=True):
                    waited = line.stats().waited
                    threads.append(threading.Thread(target=borrow, args=(session, who)))
                    threads[-1].start()
                    wait_for(lambda waited=waited: line.stats().waited > waited, 5, f"{who} waiting")
            for t in threads:
                t.join(10)
        finally:
            line.close()
        assert order == ["first", "second", "third"]
        # checked once per (connection, outbox): both connections for outbox a's two sessions, none again
        with write_b.lease():
            pass
        assert sorted(checks) == sorted([f"{schemas[0]}.outbox"] * 3 + [f"{schemas[1]}.outbox"]), checks
        before = list(checks)
        for _ in range(3):
            commit_mode(mark_a), commit_mode(write_a), commit_mode(write_b)
        assert checks == before
        # a failed statement's connection is closed, never lent again; the next lease opens another
        with mark_a.lease():
            failed_pid = mark_a.conn.info.backend_pid
        with pytest.raises(DatabaseError, match="division by zero"):
            with mark_a.lease():
                mark_a.run("dividing", "SELECT 1 / 0", ())
        assert failed_pid not in _backends(pg_dsn, app)
        with mark_a.lease():
            assert mark_a.conn.info.backend_pid != failed_pid
        # a connection the server ended while idle (pg_terminate_backend) is never lent: no statement fails
        idle = _backends(pg_dsn, app)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (idle,))
        time.sleep(0.2)
        discarded = pool.stats().discarded
        assert commit_mode(write_a) == "on" and commit_mode(mark_a) == "off"
        assert pool.stats().discarded >= discarded + 1
        assert not set(_backends(pg_dsn, app)) & set(idle)
        # a transaction left open is not given back open
        with write_a.lease():
            write_a.conn.execute("BEGIN")
            in_txn = write_a.conn.info.backend_pid
        assert in_txn not in _backends(pg_dsn, app)
        # smaller: the surplus closes
        with mark_a.lease(), write_a.lease():
            pass
        pool.resize(1)
        assert len(_backends(pg_dsn, app)) <= 1
        stats = pool.stats()
        assert stats.open <= 1 and stats.opened >= 4, stats
        # a connection unused for IDLE_CLOSE is closed (seen when another comes back)
        pool.resize(2)
        with mark_a.lease(), write_a.lease():
            pass
        assert len(_backends(pg_dsn, app)) == 2
        monkeypatch.setattr(statement_pool, "IDLE_CLOSE", 0.2)
        time.sleep(0.3)
        with write_b.lease():
            pass
        assert len(_backends(pg_dsn, app)) == 1
    finally:
        pool.close()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for s in schemas:
                conn.execute(f'DROP SCHEMA IF EXISTS "{s}" CASCADE')
