"""The fleet's balance: each process's share, the surplus it hands over, the held-back standby that
still takes an outbox nobody leads, on a real Postgres (producer/fleet/balance.py; the spread over
three processes is test_fleet_failover.py's)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from harvest_outbox.producer.election.postgres import UNLED_CHECKS, PostgresElection
from harvest_outbox.producer.fleet.balance import Balance, share, surplus
from harvest_outbox.producer.schema.ddl import init_db


@pytest.mark.parametrize(
    ("outboxes", "processes", "expected"), [(21, 1, 21), (21, 2, 11), (21, 3, 7), (20, 3, 7), (2, 3, 1), (0, 3, 0)]
)
def test_the_share_is_every_outbox_split_evenly_rounded_up(outboxes: int, processes: int, expected: int) -> None:
    assert share(outboxes, processes) == expected


def test_the_surplus_is_what_is_led_beyond_the_share_by_id() -> None:
    assert surplus(["c", "a", "b", "d"], 2) == ["c", "d"]
    assert surplus(["a", "b"], 2) == []


def test_before_the_first_count_a_process_may_lead_everything_and_hands_nothing_over() -> None:
    led: list[str] = ["a", "b", "c"]
    balance = Balance(lambda: led, lambda: [(i, "dsn", f"{i}.outbox") for i in "abcdef"])
    assert balance.share() == 6 and balance.may_acquire() and balance.to_hand_over() == []
    balance.processes = 3
    assert balance.share() == 2 and not balance.may_acquire() and balance.to_hand_over() == ["c"]


class _Listener:
    def __init__(self) -> None:
        self.acquired = threading.Event()

    def on_acquired(self) -> None:
        self.acquired.set()

    def on_revoked(self) -> None:
        pass

    def on_fenced(self) -> None:
        pass


@pytest.mark.integration
def test_a_held_back_standby_leaves_a_held_lock_alone_and_takes_one_nobody_holds(
    pg_dsn: str, pg_schema: str, unique_name: Callable[[str], str]
) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    asked: list[float] = []

    def never() -> bool:
        asked.append(time.monotonic())
        return False

    holder = PostgresElection(pg_dsn, table, unique_name("holder"), check_interval=0.1)
    held_back = PostgresElection(pg_dsn, table, unique_name("back"), check_interval=0.1, may_acquire=never)
    first, second = _Listener(), _Listener()
    elections: list[Any] = [holder, held_back]
    try:
        holder.start(first)
        _pulse_until(holder, first.acquired, "the first election leads")
        held_back.start(second)
        time.sleep(1.0)  # ~10 checks: each asked the balance, none took the lock (it is held)
        held_back.pulse()
        assert not second.acquired.is_set() and len(asked) >= UNLED_CHECKS
        before = len(asked)
        holder.close()  # nobody holds it now, and the balance still says no
        _pulse_until(held_back, second.acquired, "the held-back standby takes the unled lock")
        assert len(asked) - before >= UNLED_CHECKS  # it saw the lock free that many checks in a row first
        with psycopg.connect(pg_dsn) as conn:
            assert conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND pid = %s",
                (held_back.backend_pid,),
            ).fetchone() == (1,)
    finally:
        for election in elections:
            election.close()


def _pulse_until(election: PostgresElection, done: threading.Event, what: str) -> None:
    end = time.monotonic() + 20
    while not done.is_set():
        assert time.monotonic() < end, f"timed out: {what}"
        election.pulse()
        time.sleep(0.02)
