"""The relay benchmarks' backlog: outbox rows of 100-byte values over a fixed set of keys.

Shared by ``bench_relay`` (harvest's drains) and ``bench_goharvest`` (goharvest draining the same
backlog), so both drain identical rows; its own module so that neither imports the other for it.
"""

from __future__ import annotations

import psycopg

from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

__all__ = ["backlog_headers", "backlog_records", "fill_backlog"]


#: What a service's outbox rows commonly carry: where they come from and the W3C trace context (the
#: stasher adds ``traceparent`` when OpenTelemetry is on); ``--headers N`` takes the first N, then h2, h3...
_HEADERS = (("source", "orders-service"), ("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"))


def backlog_headers(n: int) -> tuple[tuple[str, str], ...]:
    """The first ``n`` headers of a backlog row (none by default)."""
    return (*_HEADERS, *((f"h{i}", f"value-{i}") for i in range(len(_HEADERS), n)))[:n]


def backlog_records(topic: str, start: int, stop: int, keys: int, headers: int = 0) -> list[OutboxRecord]:
    """Rows ``start..stop`` of a backlog: key ``key-<i % keys>``, a 100-byte value starting with ``i``, and
    ``headers`` headers (:func:`backlog_headers`)."""
    pad = "x" * 100
    hs = backlog_headers(headers)
    return [OutboxRecord(topic, f"key-{i % keys}", f"{i:010d}{pad}"[:100], hs) for i in range(start, stop)]


def fill_backlog(dsn: str, table: str, topic: str, rows: int, keys: int, headers: int = 0) -> None:
    """``rows`` outbox rows in one transaction, written in COPY chunks (bounded memory)."""
    stasher = Stasher(table)
    with psycopg.connect(dsn) as conn:
        for start in range(0, rows, 100_000):
            stasher.stash_many(conn, backlog_records(topic, start, min(rows, start + 100_000), keys, headers))
