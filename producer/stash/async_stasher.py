"""Writing records into the outbox from asyncio code (``psycopg.AsyncConnection``).

The asyncio twin of :mod:`producer.stash.stasher`: ``await stash(conn, record)`` inserts one row,
``await stash_many(conn, records)`` streams many through one ``COPY``; both run in ``conn``'s
current transaction, so the rows commit or roll back with the caller's writes.

Invariant: this module only awaits. What is written, its validation and its errors are
:class:`producer.stash._outbox_rows.StashPlan`'s, shared with the synchronous stasher, so both write the
same rows, wake the relay with the same NOTIFY (the table's trigger, at commit) and raise the same
:class:`~producer.errors.RecordError` before touching the database. A synchronous psycopg connection
(or anything else not an ``AsyncConnection`` / ``AsyncCursor``) is refused with
:class:`~producer.errors.ConfigError` before anything runs on it
(:func:`producer.stash.stasher.require_connection`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import psycopg

from harvest_outbox.producer.stash._outbox_rows import OutboxRecord, StashPlan

if TYPE_CHECKING:
    from harvest_outbox.producer.stash.validation import StashValidator
from harvest_outbox.producer.schema import ValueType
from harvest_outbox.producer.stash.stasher import require_connection

__all__ = ["AsyncStasher", "stash", "stash_many"]


class AsyncStasher:
    """Inserts :class:`~producer.stash._outbox_rows.OutboxRecord` rows into one outbox table, awaiting psycopg."""

    def __init__(
        self,
        outbox_table: str = "outbox",
        value_type: ValueType = "varchar",
        *,
        trace_context: bool = True,
        validate: StashValidator | None = None,
    ) -> None:
        # validate: producer.stash.validation.StashValidator (a local cache; no network in the transaction)
        self.plan = StashPlan(outbox_table, value_type, trace_context=trace_context, validate=validate)
        self.names = self.plan.names
        self.value_type = value_type

    async def stash(self, conn: psycopg.AsyncConnection | psycopg.AsyncCursor, record: OutboxRecord) -> int:
        """Insert one record in ``conn``'s current transaction; return its outbox id."""
        require_connection(conn, asynchronous=True)
        row = self.plan.row(record)
        cur = await conn.execute(self.plan.insert, row)
        got = await cur.fetchone()
        assert got is not None
        return int(got[0])

    async def stash_many(
        self, conn: psycopg.AsyncConnection | psycopg.AsyncCursor, records: Iterable[OutboxRecord]
    ) -> int:
        """Insert many records with one COPY in ``conn``'s current transaction; return the count.
        Ids follow the iteration order; nothing is written if any record is invalid."""
        require_connection(conn, asynchronous=True)
        rows = self.plan.rows(records)
        if not rows:
            return 0
        cur = conn.cursor() if isinstance(conn, psycopg.AsyncConnection) else conn
        async with cur.copy(self.plan.copy) as copy:
            copy.set_types(self.plan.copy_types)
            for row in rows:
                await copy.write_row(row)
        return len(rows)


_default = AsyncStasher()


async def stash(
    conn: psycopg.AsyncConnection | psycopg.AsyncCursor,
    record: OutboxRecord,
    outbox_table: str = "outbox",
    value_type: ValueType = "varchar",
) -> int:
    """Insert one record into ``outbox_table`` in ``conn``'s transaction; return its id."""
    s = _default if (outbox_table, value_type) == ("outbox", "varchar") else AsyncStasher(outbox_table, value_type)
    return await s.stash(conn, record)


async def stash_many(
    conn: psycopg.AsyncConnection | psycopg.AsyncCursor,
    records: Iterable[OutboxRecord],
    outbox_table: str = "outbox",
    value_type: ValueType = "varchar",
) -> int:
    """Insert many records (one COPY) into ``outbox_table`` in ``conn``'s transaction."""
    s = _default if (outbox_table, value_type) == ("outbox", "varchar") else AsyncStasher(outbox_table, value_type)
    return await s.stash_many(conn, records)
