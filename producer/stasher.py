"""Writing records into the outbox inside the caller's transaction (synchronous psycopg).

``stash(conn, record)`` inserts one row; ``stash_many(conn, records)`` streams many through one
``COPY`` (one round trip for the lot; see ``bench/bench_stasher.py`` for the measured speed-up over
one INSERT each). Both run in whatever transaction ``conn`` is in, so the rows commit or roll back
with the caller's business writes — the whole point of an outbox. The asyncio twin is
:mod:`producer.stasher_async`, the SQLAlchemy binding :mod:`producer.sqlalchemy`.

Invariants (what is written, and how it is validated, is :class:`producer.outbox_rows.StashPlan`'s,
shared by every stasher):
- a record is validated before it reaches the database (:class:`~producer.errors.RecordError`
  naming the field), so a bad record fails the caller's transaction, not the relay;
- ``value=None`` is stored as SQL NULL and published as a tombstone;
- headers are ordered ``(key, value)`` pairs, stored as goharvest's two parallel TEXT[] columns;
- the relay is woken by the outbox's statement-level NOTIFY trigger (see :mod:`producer.schema`),
  which Postgres delivers at commit only — nothing to do here, and nothing if the tx rolls back.
"""

from __future__ import annotations

from collections.abc import Iterable

import psycopg

from harvest_outbox.producer.outbox_rows import Headers, OutboxRecord, StashPlan
from harvest_outbox.producer.schema import ValueType

__all__ = ["Headers", "OutboxRecord", "Stasher", "stash", "stash_many"]


class Stasher:
    """Inserts :class:`OutboxRecord` rows into one outbox table.

    ``trace_context`` (default on): record the current OpenTelemetry span's W3C trace context as
    headers when ``opentelemetry-api`` is installed (see :mod:`producer.tracing`).
    """

    def __init__(self, outbox_table: str = "outbox", value_type: ValueType = "varchar", *,
                 trace_context: bool = True) -> None:
        self.plan = StashPlan(outbox_table, value_type, trace_context=trace_context)
        self.names = self.plan.names
        self.value_type = value_type

    def stash(self, conn: psycopg.Connection | psycopg.Cursor, record: OutboxRecord) -> int:
        """Insert one record in ``conn``'s current transaction; return its outbox id."""
        row = self.plan.row(record)
        got = conn.execute(self.plan.insert, row).fetchone()
        assert got is not None
        return int(got[0])

    def stash_many(self, conn: psycopg.Connection | psycopg.Cursor, records: Iterable[OutboxRecord]) -> int:
        """Insert many records with one COPY in ``conn``'s current transaction; return the count.
        Ids follow the iteration order."""
        rows = self.plan.rows(records)  # validate all before writing any
        if not rows:
            return 0
        cur = conn.cursor() if isinstance(conn, psycopg.Connection) else conn
        with cur.copy(self.plan.copy) as copy:
            for row in rows:
                copy.write_row(row)
        return len(rows)


_default = Stasher()


def stash(conn: psycopg.Connection | psycopg.Cursor, record: OutboxRecord, outbox_table: str = "outbox",
          value_type: ValueType = "varchar") -> int:
    """Insert one record into ``outbox_table`` in ``conn``'s transaction; return its id."""
    s = _default if (outbox_table, value_type) == ("outbox", "varchar") else Stasher(outbox_table, value_type)
    return s.stash(conn, record)


def stash_many(conn: psycopg.Connection | psycopg.Cursor, records: Iterable[OutboxRecord],
               outbox_table: str = "outbox", value_type: ValueType = "varchar") -> int:
    """Insert many records (one COPY) into ``outbox_table`` in ``conn``'s transaction."""
    s = _default if (outbox_table, value_type) == ("outbox", "varchar") else Stasher(outbox_table, value_type)
    return s.stash_many(conn, records)
