"""Postgres elections of many outboxes on one session per database (producer/election/shared_postgres.py),
on a real Postgres: one backend holds every lock of its process; a hand-over between processes is
notified; a successor in the same process waits for its predecessor; the server ending the session
fences every election on it, and they lead again on a new one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from harvest_outbox.producer.election.advisory_lock import key_parts, lock_key
from harvest_outbox.producer.election.shared_postgres import ElectionSessions, SharedElection, SharedLockSession
from harvest_outbox.producer.errors import ElectionError
from harvest_outbox.producer.schema.ddl import init_db

pytestmark = pytest.mark.integration


class _Listener:
    def __init__(self) -> None:
        self.events: list[str] = []

    def on_acquired(self) -> None:
        self.events.append("acquired")

    def on_revoked(self) -> None:
        self.events.append("revoked")

    def on_fenced(self) -> None:
        self.events.append("fenced")


def _holder(dsn: str, table: str) -> int | None:
    classid, objid = key_parts(lock_key(table))
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted "
            "AND classid = %s::bigint::oid AND objid = %s::bigint::oid",
            (classid, objid),
        ).fetchone()
    return None if row is None else int(row[0])


def _until(cond: Callable[[], bool], what: str, elections: list[SharedElection], timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while True:
        for e in elections:
            e.pulse()
        if cond():
            return
        assert time.monotonic() < end, f"timed out: {what}"
        time.sleep(0.02)


def test_one_session_per_process_and_database_carries_every_outboxs_election(
    pg_dsn: str, pg_schema: str, unique_name: Callable[[str], str]
) -> None:
    tables = [f"{pg_schema}.outbox", f"{pg_schema}.outbox2"]
    for table in tables:
        init_db(pg_dsn, table)
    p1, p2 = ElectionSessions(unique_name("p1")), ElectionSessions(unique_name("p2"))
    a = [p1.election(pg_dsn, t, f"p1/{t}", 0.2, None) for t in tables]
    b = [p2.election(pg_dsn, t, f"p2/{t}", 0.2, None) for t in tables]
    la, lb = [_Listener() for _ in a], [_Listener() for _ in b]
    everything = [*a, *b]
    try:
        for e, listener in zip(a, la, strict=True):
            e.start(listener)
        _until(lambda: all(e.is_leader for e in a), "p1 leads both", everything)
        for e, listener in zip(b, lb, strict=True):
            e.start(listener)
        time.sleep(0.6)
        _until(lambda: True, "", everything)
        assert not any(e.is_leader for e in b)
        holders = {_holder(pg_dsn, t) for t in tables}
        assert len(holders) == 1 and None not in holders  # one backend: p1's session

        # a graceful hand-over of one outbox: p2 is notified and takes it well before its next checks would
        t0 = time.monotonic()
        a[0].close()
        assert la[0].events == ["acquired", "revoked"]
        _until(lambda: b[0].is_leader, "p2 takes the released outbox", everything)
        assert time.monotonic() - t0 < 2.0
        assert a[1].is_leader and not b[1].is_leader

        # a successor of the same outbox in p1 (a relay handed over while it starts) does not take p1's own lock
        successor = p1.election(pg_dsn, tables[1], f"p1/{tables[1]}#2", 0.2, None)
        everything.append(successor)
        successor.start(_Listener())
        time.sleep(0.6)
        _until(lambda: True, "", everything)
        assert a[1].is_leader and not successor.is_leader

        # the server ends p1's session: its election fences; the lock goes to p2 or back to p1 on a new session
        pid = _holder(pg_dsn, tables[1])
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        _until(lambda: "fenced" in la[1].events, "p1's election fenced", everything)
        _until(lambda: b[1].is_leader or a[1].is_leader or successor.is_leader, "someone leads again", everything)
        assert sum(e.is_leader for e in (b[1], a[1], successor)) == 1
        assert _holder(pg_dsn, tables[1]) not in (None, pid)
    finally:
        threads = [threading.Thread(target=e.close) for e in everything]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert _holder(pg_dsn, tables[0]) is None and _holder(pg_dsn, tables[1]) is None


def test_a_check_costs_a_few_statements_however_many_outboxes_join_lead_and_leave(
    pg_dsn: str, pg_schema: str, unique_name: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet's start joins hundreds of elections at once and its stop lets them all go. Each statement of a
    check is a round trip, taken while the process's relays compete for the GIL; when a check took one per
    outbox, a 1,000-outbox fleet's checks outlasted the lease and every outbox fenced, again and again. A
    check makes at most five statements, whatever the number of outboxes: the LISTENs, the sharded members,
    the verification, the free locks, the tries."""
    per_check: list[list[str]] = []
    statements: list[str] | None = None
    real_step, real_execute = SharedLockSession._step, psycopg.Connection.execute

    def step(self: SharedLockSession) -> None:
        nonlocal statements
        statements = []
        try:
            real_step(self)
        finally:
            per_check.append(statements)
            statements = None

    def execute(self: psycopg.Connection, query: Any, *args: Any, **kwargs: Any) -> Any:
        if statements is not None and threading.current_thread().name.startswith("harvest-election"):
            statements.append(str(query)[:40])
        return real_execute(self, query, *args, **kwargs)

    monkeypatch.setattr(SharedLockSession, "_step", step)
    monkeypatch.setattr(psycopg.Connection, "execute", execute)
    tables = [f"{pg_schema}.o{i}" for i in range(60)]  # the lock keys are names: no table needed
    sessions = ElectionSessions(unique_name("many"))
    elections = [sessions.election(pg_dsn, t, f"many/{t}", 0.1, None) for t in tables]
    listeners = [_Listener() for _ in elections]

    def all_at_once(calls: list[Callable[[], None]]) -> None:
        threads = [threading.Thread(target=c) for c in calls]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)

    all_at_once([lambda e=e, li=li: e.start(li) for e, li in zip(elections, listeners, strict=True)])
    _until(lambda: all(e.is_leader for e in elections), "every outbox led", elections)
    time.sleep(0.5)  # steady checks
    _until(lambda: all(e.is_leader for e in elections), "still led", elections)
    all_at_once([e.close for e in elections])

    assert all(li.events == ["acquired", "revoked"] for li in listeners), {li.events[-1] for li in listeners}
    assert all(_holder(pg_dsn, t) is None for t in tables[:3])
    assert len(per_check) >= 6
    worst = max(per_check, key=len)
    assert len(worst) <= 5, worst


def test_a_join_waits_while_checks_go_on_and_fails_when_they_stop(
    pg_dsn: str, pg_schema: str, unique_name: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet's start joins hundreds of outboxes while their relays compete with the session's thread for the
    GIL, so the check that takes one in can come later than a join's limit (22-34 relays of a 1,000-outbox
    fleet failed their first start that way). A join waits as long as checks still take joiners in; when
    none does for a whole limit, the session is stuck and the join fails, naming why."""
    monkeypatch.setattr(SharedLockSession, "join_limit", lambda self: 0.3)
    late, real_resolve = f"{pg_schema}.late", SharedLockSession._resolve
    held_back_until = time.monotonic() + 1.5  # five limits of checks that do not take this one in yet

    def resolve(self: SharedLockSession, seat: Any, table: str, members: list[tuple[int, int]]) -> None:
        if table == late and time.monotonic() < held_back_until:
            return  # not resolved in this check: the next one tries again
        real_resolve(self, seat, table, members)

    monkeypatch.setattr(SharedLockSession, "_resolve", resolve)
    sessions = ElectionSessions(unique_name("slow"))
    slow = sessions.election(pg_dsn, late, "slow/late", 0.1, None)
    listener = _Listener()
    slow.start(listener)  # returns once taken in, ~1.5 s in: six limits
    assert time.monotonic() >= held_back_until
    _until(lambda: slow.is_leader, "the late outbox led", [slow])

    stuck = ElectionSessions(unique_name("stuck"))
    first = stuck.election(pg_dsn, f"{pg_schema}.first", "stuck/first", 0.1, None)
    first.start(_Listener())
    session = first._session

    def failing(self: SharedLockSession, conn: Any, seats: Any, deadline: float) -> None:
        raise psycopg.OperationalError("simulated: every check's join fails")

    monkeypatch.setattr(SharedLockSession, "_join", failing)
    second = stuck.election(pg_dsn, f"{pg_schema}.second", "stuck/second", 0.1, None)
    t0 = time.monotonic()
    with pytest.raises(ElectionError, match=r"stuck/second: .* did not take the outbox in time \(no check"):
        second.start(_Listener())
    assert time.monotonic() - t0 < 5
    assert second._seat not in session._seats
    for e in (slow, first):
        e.close()
