"""The relay's LISTEN connection (producer/db/_listener.py) on Postgres: ``pending()`` answers without
blocking, consumes what it reports, sees a NOTIFY sent while nobody listened on the socket, and turns a lost
connection into a wake-up (the invariant: a LISTEN problem never stops the relay)."""

from __future__ import annotations

import time

import psycopg
import pytest

from harvest_outbox.producer.db import Listener
from harvest_outbox.producer.schema import OutboxNames

pytestmark = pytest.mark.integration


def _until_pending(listener: Listener, timeout: float = 5.0) -> float:
    """Seconds until ``pending()`` reports a notification (each call non-blocking)."""
    t0 = time.monotonic()
    while not listener.pending():
        assert time.monotonic() - t0 < timeout, "a NOTIFY never showed as pending"
        time.sleep(0.005)
    return time.monotonic() - t0


def test_pending_reports_each_burst_once_and_a_lost_connection_as_a_wake_up(pg_dsn: str, pg_schema: str) -> None:
    names = OutboxNames.parse(f"{pg_schema}.outbox")
    listener = Listener(pg_dsn, names)
    try:
        assert listener.fileno() is None  # connects on first use
        assert listener.pending() is False
        assert listener.fileno() is not None
        with psycopg.connect(pg_dsn, autocommit=True) as writer:
            t0 = time.monotonic()
            assert listener.pending() is False
            assert time.monotonic() - t0 < 0.5, "pending() blocked"

            writer.execute("SELECT pg_notify(%s, '1')", (names.channel,))
            _until_pending(listener)
            assert listener.pending() is False  # consumed

            # a burst is one wake-up
            with writer.transaction():
                pass
            for i in range(3):
                writer.execute("SELECT pg_notify(%s, %s)", (names.channel, str(i)))
            time.sleep(0.2)  # all three reach the socket
            assert listener.pending() is True
            assert listener.pending() is False

            # another channel wakes nobody
            writer.execute("SELECT pg_notify(%s, 'x')", (names.channel + "_other",))
            time.sleep(0.2)
            assert listener.pending() is False

            # the connection is terminated under the listener: a wake-up, then a new connection
            pid = writer.execute(
                "SELECT pid FROM pg_stat_activity WHERE query ILIKE 'LISTEN%%' AND pid <> pg_backend_pid()"
            ).fetchall()
            assert pid, "the listener's backend is not listed"
            for (p,) in pid:
                writer.execute("SELECT pg_terminate_backend(%s)", (p,))
            # (the first look may only read the server's goodbye; the next finds the socket closed)
            _until_pending(listener)
            assert listener.pending() is False  # connected and LISTENing again
            writer.execute("SELECT pg_notify(%s, 'again')", (names.channel,))
            _until_pending(listener)
    finally:
        listener.close()
