"""A fleet's LISTEN connection per database (producer/db/shared_listener.py) on a real Postgres: each
relay's listener is rung by its own channel's NOTIFYs only, a burst is one wake-up, a terminated
connection rings everyone and is made again with every channel, the connection closes a linger after the
last listener left, and listeners coming and going at once share one connection."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest

from harvest_outbox.producer.db import shared_listener
from harvest_outbox.producer.db.shared_listener import ListenHubs

pytestmark = pytest.mark.integration


def _backends(dsn: str, name: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (f"harvest-listen:{name}",)
        ).fetchall()
    return [int(r[0]) for r in rows]


def _until(cond: Callable[[], bool], what: str, timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out: {what}"
        time.sleep(0.02)


def test_relays_of_one_process_share_a_listen_connection_per_database(
    pg_dsn: str, unique_name: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shared_listener, "LINGER", 0.2)
    name = unique_name("fleet")
    hubs = ListenHubs(name)
    one, two, also_one = (
        hubs.listener(pg_dsn, f"{name}_a"),
        hubs.listener(pg_dsn, f"{name}_b"),
        hubs.listener(pg_dsn, f"{name}_a"),
    )
    try:
        _until(lambda: len(_backends(pg_dsn, name)) == 1, "one LISTEN connection")
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"LISTEN {name}_a")  # a witness of this connection's LISTEN order
            time.sleep(0.3)  # the dispatcher LISTENs after a subscribe's wake-up; give it its turn
            assert not one.pending() and not two.pending()
            for _ in range(5):
                conn.execute("SELECT pg_notify(%s, '')", (f"{name}_a",))
        assert one.wait(5.0) and also_one.wait(5.0)
        assert not two.wait(0.2)  # another channel's NOTIFY rings nobody here
        time.sleep(0.2)
        one.pending()
        assert not one.pending()  # the burst was drained: the next look is quiet

        (pid,) = _backends(pg_dsn, name)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        assert two.wait(5.0)  # a lost connection rings everyone (they mark, as a poll would)
        _until(lambda: _backends(pg_dsn, name) not in ([], [pid]), "a new LISTEN connection")
        time.sleep(0.3)
        while two.pending():
            pass
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_notify(%s, '')", (f"{name}_b",))
        assert two.wait(5.0)  # the channel is LISTENed again on the new connection
    finally:
        for listener in (one, two, also_one):
            listener.close()
    _until(lambda: _backends(pg_dsn, name) == [], "the connection closed with its last listener")
    assert one.fileno() is None and not one.pending()


def test_listeners_that_come_and_go_at_once_never_hold_two_connections(
    pg_dsn: str, unique_name: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cold standbys subscribe and leave at once while they start: they share one connection, which stays
    a linger after the last one left, and the hub never holds two."""
    monkeypatch.setattr(shared_listener, "LINGER", 0.5)
    name = unique_name("churn")
    hubs = ListenHubs(name)
    most, sampling = [0], threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            most[0] = max(most[0], len(_backends(pg_dsn, name)))
            sampling.wait(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        for i in range(8):  # each one gone before its dispatcher has connected
            hubs.listener(pg_dsn, f"{name}_{i}").close()
        staying = hubs.listener(pg_dsn, f"{name}_staying")
        _until(lambda: len(_backends(pg_dsn, name)) == 1, "its LISTEN connection")
        staying.close()
    finally:
        sampling.set()
        sampler.join()
    _until(lambda: _backends(pg_dsn, name) == [], "the connection closed with its last listener")
    assert most[0] == 1, most
