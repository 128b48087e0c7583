"""A fleet's shared layout session (producer/relay/layout_session.py) on a real Postgres: many relays'
layout locks on one connection, each released on its own; another layout still refused; the session
terminated by the server and every guard admitted again on a new one; closed with its last guard."""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg
import pytest

from harvest_outbox.producer.config import HarvestConfig
from harvest_outbox.producer.relay.admission import LayoutError, LayoutGuard, live_relays
from harvest_outbox.producer.relay.layout_session import SharedLayoutSession
from harvest_outbox.producer.schema.ddl import init_db

pytestmark = pytest.mark.integration


def _holders(dsn: str, table: str) -> list[int]:
    """Backend pids holding a layout lock of ``table``."""
    with psycopg.connect(dsn) as conn:
        from harvest_outbox.producer.relay.admission import namespace

        rows = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND granted "
            "AND classid = %s::bigint::oid ORDER BY pid",
            (namespace(table),),
        ).fetchall()
    return [int(r[0]) for r in rows]


def test_relays_of_one_process_share_a_layout_session_and_each_lets_go_of_its_own(
    pg_dsn: str, pg_schema: str, unique_name: Callable[[str], str]
) -> None:
    tables = [f"{pg_schema}.outbox", f"{pg_schema}.outbox2"]
    for table in tables:
        init_db(pg_dsn, table)
    session = SharedLayoutSession(pg_dsn, unique_name("fleet"))

    def guard(table: str, **settings: object) -> LayoutGuard:
        config = HarvestConfig(data_source=pg_dsn, outbox_table=table, leader_election="postgres", name=f"r/{table}")
        if settings:
            config = HarvestConfig(data_source=pg_dsn, outbox_table=table, name=f"r/{table}", **settings)  # type: ignore[arg-type]
        return LayoutGuard(config, session)

    first, second, successor = guard(tables[0]), guard(tables[1]), guard(tables[0])
    try:
        for g in (first, second, successor):  # successor: a relay handed over while the first still stops
            g.start()
        pids = _holders(pg_dsn, tables[0]) + _holders(pg_dsn, tables[1])
        assert len(set(pids)) == 1 and session.guards == 3  # one backend holds every lock (one row per lock)
        with pytest.raises(LayoutError):  # relays of another layout are refused as with sessions of their own
            guard(tables[0], leader_election="neli", leader_group_id="g").start()

        first.close()  # its successor's count of the shared lock keeps the outbox's layout held
        assert _holders(pg_dsn, tables[0]) == pids[:1]

        with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the server ends the session
            conn.execute("SELECT pg_terminate_backend(%s)", (pids[0],))
        end = time.monotonic() + 30
        while not (
            _holders(pg_dsn, tables[0]) and _holders(pg_dsn, tables[1]) and _holders(pg_dsn, tables[0]) != pids[:1]
        ):
            assert time.monotonic() < end, "the guards were not admitted again on a new session"
            time.sleep(0.1)
        assert successor.failure is None and second.failure is None
        with psycopg.connect(pg_dsn) as conn:
            assert set(live_relays(conn, tables[1])) == {second.layout.key}
    finally:
        for g in (second, successor):
            g.close()
    assert _holders(pg_dsn, tables[0]) == _holders(pg_dsn, tables[1]) == []
    assert session.guards == 0
