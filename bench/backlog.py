"""The relay benchmarks' backlog: outbox rows of 100-byte values over a fixed set of keys.

Shared by ``bench_relay`` (harvest's drains) and ``bench_goharvest`` (goharvest draining the same
backlog), so both drain identical rows; its own module so that neither imports the other for it.
"""

from __future__ import annotations

import psycopg

from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

__all__ = ["backlog_records", "fill_backlog"]


def backlog_records(topic: str, start: int, stop: int, keys: int) -> list[OutboxRecord]:
    """Rows ``start..stop`` of a backlog: key ``key-<i % keys>``, a 100-byte value starting with ``i``."""
    pad = "x" * 100
    return [OutboxRecord(topic, f"key-{i % keys}", f"{i:010d}{pad}"[:100], ()) for i in range(start, stop)]


def fill_backlog(dsn: str, table: str, topic: str, rows: int, keys: int) -> None:
    """``rows`` outbox rows in one transaction, written in COPY chunks (bounded memory)."""
    stasher = Stasher(table)
    with psycopg.connect(dsn) as conn:
        for start in range(0, rows, 100_000):
            stasher.stash_many(conn, backlog_records(topic, start, min(rows, start + 100_000), keys))
