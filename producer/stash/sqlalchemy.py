"""Stashing inside a SQLAlchemy 2.x ``Session`` / ``AsyncSession`` (ORM or Core) on Postgres.

Needs the optional extra ``harvest-outbox[sqlalchemy]`` and SQLAlchemy's psycopg (v3) driver
(``postgresql+psycopg://`` URLs, sync or async engines). Importing :mod:`producer` never imports
SQLAlchemy; only importing this module does.

The rows are written on the session's own connection, inside the session's own transaction,
reached the way SQLAlchemy documents it: ``session.connection()`` (which begins the session's
transaction if none is open) then ``.connection.driver_connection`` for the psycopg connection
under the pool proxy; for asyncio, ``await session.connection()`` then
``await conn.get_raw_connection()`` and its ``.driver_connection`` (a ``psycopg.AsyncConnection``).
So ``session.commit()`` publishes them (the NOTIFY trigger fires at that commit) and
``session.rollback()`` — or an exception in ``with session.begin():`` — discards them with the
business writes. A Core ``Connection`` / ``AsyncConnection`` with no transaction open (the stash is
its first statement, or the first after a commit) gets one begun by the stash, as
``session.connection()`` does: writing through the driver alone would leave SQLAlchemy unaware of
the transaction, so ``conn.commit()`` would do nothing and the pool's reset would roll the rows back.

Invariants:
- no second connection and no commit of our own: the stash joins whatever transaction the session
  (or Core connection) has, and an ORM flush order never matters (one transaction);
- what is written, and its validation, is :class:`producer.stash._outbox_rows.StashPlan`'s, as for the
  plain psycopg stashers;
- any other driver (psycopg2, asyncpg, pg8000), or a sync stash on an asyncio engine (``run_sync``), is
  refused with :class:`~producer.errors.ConfigError`
  naming the driver and the fix, before anything is written.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

try:
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session
except ImportError as exc:  # exercised in a subprocess by the tests
    raise ImportError(
        "harvest_outbox.producer.stash.sqlalchemy needs SQLAlchemy 2.x: pip install 'harvest-outbox[sqlalchemy]'"
    ) from exc

if TYPE_CHECKING:  # asyncio support needs greenlet: imported only by the async functions
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

import psycopg

from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.producer.schema import ValueType
from harvest_outbox.producer.stash._outbox_rows import OutboxRecord
from harvest_outbox.producer.stash.async_stasher import AsyncStasher
from harvest_outbox.producer.stash.stasher import Stasher

__all__ = ["SessionStasher", "astash", "astash_many", "stash", "stash_many"]


def _wrong_driver(driver_connection: Any, dialect: Any) -> ConfigError:
    name = f"{getattr(dialect, 'name', '?')}+{getattr(dialect, 'driver', '?')}"
    return ConfigError(
        f"session: its connection uses the {name!r} driver ({type(driver_connection).__name__}); "
        f"harvest_outbox.producer.stash.sqlalchemy needs SQLAlchemy's psycopg (v3) driver: create the "
        f"engine with a 'postgresql+psycopg://' URL"
    )


def driver_connection(session: Session | Connection) -> psycopg.Connection:
    """The psycopg connection under ``session``'s (or Core ``Connection``'s) current transaction."""
    if isinstance(session, Session):
        conn = session.connection()  # begins the session's transaction if none is open
    elif isinstance(session, Connection):
        conn = session
    else:
        raise ConfigError(
            f"session: expected a sqlalchemy.orm.Session or sqlalchemy.engine.Connection, got "
            f"{type(session).__name__} (for AsyncSession use astash / astash_many)"
        )
    driver = conn.connection.driver_connection
    if isinstance(driver, psycopg.AsyncConnection):  # e.g. called inside AsyncSession.run_sync
        raise ConfigError(
            "session: it runs on an asyncio engine (psycopg.AsyncConnection underneath), where a "
            "synchronous stash cannot await; call `await astash(async_session, record)` (or "
            "astash_many) instead of stash inside run_sync"
        )
    if not isinstance(driver, psycopg.Connection):
        raise _wrong_driver(driver, conn.dialect)
    if not conn.in_transaction():
        conn.begin()  # so conn.commit() / rollback() end the transaction the rows are written in
    return driver


async def async_driver_connection(session: AsyncSession | AsyncConnection) -> psycopg.AsyncConnection:
    """The psycopg ``AsyncConnection`` under an ``AsyncSession``'s (or ``AsyncConnection``'s) transaction."""
    try:
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    except ImportError as exc:
        raise ImportError(
            "SQLAlchemy's asyncio support needs greenlet: pip install 'harvest-outbox[sqlalchemy]' "
            "(which installs SQLAlchemy[asyncio])"
        ) from exc
    if isinstance(session, AsyncSession):
        conn = await session.connection()  # begins the session's transaction if none is open
    elif isinstance(session, AsyncConnection):
        conn = session
    else:
        raise ConfigError(
            f"session: expected a sqlalchemy AsyncSession or AsyncConnection, got "
            f"{type(session).__name__} (for a sync Session use stash / stash_many)"
        )
    raw = await conn.get_raw_connection()
    driver = raw.driver_connection
    if not isinstance(driver, psycopg.AsyncConnection):
        raise _wrong_driver(driver, conn.dialect)
    if not conn.in_transaction():
        await conn.begin()  # as in driver_connection: conn.commit() must commit the stashed rows
    return driver


class SessionStasher:
    """Stashes :class:`OutboxRecord` rows into one outbox table through SQLAlchemy sessions."""

    def __init__(
        self, outbox_table: str = "outbox", value_type: ValueType = "varchar", *, trace_context: bool = True
    ) -> None:
        self._sync = Stasher(outbox_table, value_type, trace_context=trace_context)
        self._async = AsyncStasher(outbox_table, value_type, trace_context=trace_context)
        self.names = self._sync.names

    def stash(self, session: Session | Connection, record: OutboxRecord) -> int:
        """Insert one record in ``session``'s transaction; return its outbox id."""
        return self._sync.stash(driver_connection(session), record)

    def stash_many(self, session: Session | Connection, records: Iterable[OutboxRecord]) -> int:
        """Insert many records (one COPY) in ``session``'s transaction; return the count."""
        return self._sync.stash_many(driver_connection(session), records)

    async def astash(self, session: AsyncSession | AsyncConnection, record: OutboxRecord) -> int:
        """Insert one record in an ``AsyncSession``'s transaction; return its outbox id."""
        return await self._async.stash(await async_driver_connection(session), record)

    async def astash_many(self, session: AsyncSession | AsyncConnection, records: Iterable[OutboxRecord]) -> int:
        """Insert many records (one COPY) in an ``AsyncSession``'s transaction; return the count."""
        return await self._async.stash_many(await async_driver_connection(session), records)


def stash(
    session: Session | Connection, record: OutboxRecord, outbox_table: str = "outbox", value_type: ValueType = "varchar"
) -> int:
    return SessionStasher(outbox_table, value_type).stash(session, record)


def stash_many(
    session: Session | Connection,
    records: Iterable[OutboxRecord],
    outbox_table: str = "outbox",
    value_type: ValueType = "varchar",
) -> int:
    return SessionStasher(outbox_table, value_type).stash_many(session, records)


async def astash(
    session: AsyncSession | AsyncConnection,
    record: OutboxRecord,
    outbox_table: str = "outbox",
    value_type: ValueType = "varchar",
) -> int:
    return await SessionStasher(outbox_table, value_type).astash(session, record)


async def astash_many(
    session: AsyncSession | AsyncConnection,
    records: Iterable[OutboxRecord],
    outbox_table: str = "outbox",
    value_type: ValueType = "varchar",
) -> int:
    return await SessionStasher(outbox_table, value_type).astash_many(session, records)
