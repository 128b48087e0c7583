"""Writing records into the outbox inside the caller's transaction (synchronous psycopg).

``stash(conn, record)`` inserts one row; ``stash_many(conn, records)`` streams many through one
``COPY`` (one round trip for the lot; see ``bench/bench_stasher.py`` for the measured speed-up over
one INSERT each). Both run in whatever transaction ``conn`` is in, so the rows commit or roll back
with the caller's business writes — the whole point of an outbox. The asyncio twin is
:mod:`producer.stash.async_stasher`, the SQLAlchemy binding :mod:`producer.stash.sqlalchemy`.

Invariants (what is written, and how it is validated, is :class:`producer.stash._outbox_rows.StashPlan`'s,
shared by every stasher):
- a record is validated before it reaches the database (:class:`~producer.errors.RecordError`
  naming the field), so a bad record fails the caller's transaction, not the relay;
- ``value=None`` is stored as SQL NULL and published as a tombstone;
- headers are ordered ``(key, value)`` pairs, stored as goharvest's two parallel TEXT[] columns;
  ``headers=None`` means no headers (two empty arrays, as ``()``);
- a connection of the wrong kind (an asyncio one here, a synchronous one for the asyncio stasher,
  anything not psycopg) is refused with :class:`~producer.errors.ConfigError` naming it and the
  stasher to use, before anything runs on it;
- the relay is woken by the outbox's statement-level NOTIFY trigger (see :mod:`producer.schema`),
  which Postgres delivers at commit only — nothing to do here, and nothing if the tx rolls back.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import psycopg

from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.producer.schema import ValueType
from harvest_outbox.producer.stash._outbox_rows import Headers, OutboxRecord, StashPlan

if TYPE_CHECKING:
    from harvest_outbox.producer.stash.validation import StashValidator

__all__ = ["Headers", "OutboxRecord", "Stasher", "require_connection", "stash", "stash_many"]

_SYNC = (psycopg.Connection, psycopg.Cursor)
_ASYNC = (psycopg.AsyncConnection, psycopg.AsyncCursor)


def require_connection(conn: object, *, asynchronous: bool) -> None:
    """Refuse ``conn`` unless it is the psycopg kind the (a)synchronous stasher runs on.

    Checked before anything runs: a synchronous stash on an asyncio connection only builds coroutines
    nobody awaits, and an asyncio stash on a synchronous one would write the row, then fail to await."""
    want, other = (_ASYNC, _SYNC) if asynchronous else (_SYNC, _ASYNC)
    if isinstance(conn, want):
        return
    got = type(conn).__name__
    if isinstance(conn, other):
        got += " (synchronous)" if asynchronous else " (asyncio)"
        fix = f"use harvest_outbox.producer.{'stash.stasher.Stasher' if asynchronous else 'stash.async_stasher.AsyncStasher'} for it"
    elif type(conn).__module__.split(".")[0] == "sqlalchemy":
        fix = "for SQLAlchemy sessions and connections use harvest_outbox.producer.stash.sqlalchemy.SessionStasher"
    else:
        fix = "pass the psycopg connection (or cursor) whose transaction the rows belong to"
    who, need = (
        ("AsyncStasher", "psycopg.AsyncConnection or AsyncCursor")
        if asynchronous
        else ("the synchronous Stasher", "psycopg.Connection or Cursor")
    )
    raise ConfigError(f"conn: {who} needs a {need}, got {got}; {fix}")


class Stasher:
    """Inserts :class:`OutboxRecord` rows into one outbox table.

    ``trace_context`` (default on): record the current OpenTelemetry span's W3C trace context as
    headers when ``opentelemetry-api`` is installed (see :mod:`producer.observe.tracing`).
    ``validate`` (default none): a :class:`~producer.stash.validation.StashValidator`; a record whose
    value does not fit its topic's registry schema (locally cached) fails with RecordError.
    """

    def __init__(
        self,
        outbox_table: str = "outbox",
        value_type: ValueType = "varchar",
        *,
        trace_context: bool = True,
        validate: StashValidator | None = None,
    ) -> None:
        self.plan = StashPlan(outbox_table, value_type, trace_context=trace_context, validate=validate)
        self.names = self.plan.names
        self.value_type = value_type

    def stash(self, conn: psycopg.Connection | psycopg.Cursor, record: OutboxRecord) -> int:
        """Insert one record in ``conn``'s current transaction; return its outbox id."""
        require_connection(conn, asynchronous=False)
        row = self.plan.row(record)
        got = conn.execute(self.plan.insert, row).fetchone()
        assert got is not None
        return int(got[0])

    def stash_many(self, conn: psycopg.Connection | psycopg.Cursor, records: Iterable[OutboxRecord]) -> int:
        """Insert many records with one COPY in ``conn``'s current transaction; return the count.
        Ids follow the iteration order."""
        require_connection(conn, asynchronous=False)
        rows = self.plan.rows(records)  # validate all before writing any
        if not rows:
            return 0
        cur = conn.cursor() if isinstance(conn, psycopg.Connection) else conn
        with cur.copy(self.plan.copy) as copy:
            copy.set_types(self.plan.copy_types)
            for row in rows:
                copy.write_row(row)
        return len(rows)


_default = Stasher()


def stash(
    conn: psycopg.Connection | psycopg.Cursor,
    record: OutboxRecord,
    outbox_table: str = "outbox",
    value_type: ValueType = "varchar",
) -> int:
    """Insert one record into ``outbox_table`` in ``conn``'s transaction; return its id."""
    s = _default if (outbox_table, value_type) == ("outbox", "varchar") else Stasher(outbox_table, value_type)
    return s.stash(conn, record)


def stash_many(
    conn: psycopg.Connection | psycopg.Cursor,
    records: Iterable[OutboxRecord],
    outbox_table: str = "outbox",
    value_type: ValueType = "varchar",
) -> int:
    """Insert many records (one COPY) into ``outbox_table`` in ``conn``'s transaction."""
    s = _default if (outbox_table, value_type) == ("outbox", "varchar") else Stasher(outbox_table, value_type)
    return s.stash_many(conn, records)
