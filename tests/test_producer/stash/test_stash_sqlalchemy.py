"""Stashing inside SQLAlchemy sessions (sync + asyncio, ORM + Core) on the real database, relayed
by a real relay to Kafka: what commits with the session is delivered, what rolls back never is."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from relaylib import consume_all, relay_config, wait_drained
from sqlalchemy import MetaData, String, create_engine, func, insert, select, text
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.sqlalchemy import SessionStasher, astash, astash_many, stash, stash_many
from harvest_outbox.producer.stash.stasher import OutboxRecord

pytestmark = pytest.mark.integration


def _url(pg_dsn: str) -> URL:
    p = conninfo_to_dict(pg_dsn)
    return URL.create(
        "postgresql+psycopg",
        username=p.get("user"),
        password=p.get("password"),
        host=p.get("host"),
        port=int(p["port"]),
        database=p.get("dbname"),
    )


def _model(schema: str) -> tuple[type, type]:
    class Base(DeclarativeBase):
        metadata = MetaData(schema=schema)

    class Order(Base):
        __tablename__ = "orders"
        id: Mapped[int] = mapped_column(primary_key=True)
        item: Mapped[str] = mapped_column(String(50))

    return Base, Order


def _outbox_keys(pg_dsn: str, table: str) -> list[str]:
    schema, name = table.split(".")
    with psycopg.connect(pg_dsn) as conn:
        return [
            r[0]
            for r in conn.execute(
                sql.SQL("SELECT kafka_key FROM {} ORDER BY id").format(sql.Identifier(schema, name))
            ).fetchall()
        ]


def _delivered_exactly(kafka_bootstrap: str, topic: str, committed: set[str], rolled_back: set[str]) -> None:
    """Every committed key arrives; the last one is stashed after every rolled-back one, so once it
    (and all others) arrived, a rolled-back record would have arrived before it had it been relayed."""
    got = consume_all(kafka_bootstrap, topic, lambda g: committed <= {x.key for x in g}, timeout=60)
    keys = [g.key for g in got]
    assert committed <= set(keys), f"not delivered: {committed - set(keys)}"
    assert not rolled_back & set(keys), f"rolled back but delivered: {rolled_back & set(keys)}"
    assert sorted(keys) == sorted(committed)  # once each: nothing else on the topic


def test_session_and_core_connection_commit_delivered_rollback_never(
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic, table = topic_factory(), f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    engine = create_engine(_url(pg_dsn))
    Base, Order = _model(pg_schema)
    Base.metadata.create_all(engine)
    st = SessionStasher(table)
    relay = Harvest(relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g"))).start()
    try:
        # ORM Session, committed: the row is visible inside the session before commit, invisible outside.
        with Session(engine) as session:
            session.add(Order(id=1, item="book"))
            rid = st.stash(session, OutboxRecord(topic, "orm-commit", '{"order": 1}'))
            inside = session.execute(
                text(f'SELECT kafka_key FROM "{pg_schema}".outbox WHERE id = :i'), {"i": rid}
            ).scalar_one()
            assert inside == "orm-commit"
            assert _outbox_keys(pg_dsn, table) == []  # not committed yet: the session's own transaction
            session.commit()
        # ORM Session, rolled back by an exception inside session.begin().
        with pytest.raises(RuntimeError), Session(engine) as session, session.begin():
            session.add(Order(id=2, item="pen"))
            stash_many(
                session, [OutboxRecord(topic, "orm-rollback-1", "x"), OutboxRecord(topic, "orm-rollback-2", "y")], table
            )
            raise RuntimeError("payment declined")
        # ORM Session, explicit rollback() after a flush.
        with Session(engine) as session:
            session.add(Order(id=3, item="ink"))
            session.flush()
            stash(session, OutboxRecord(topic, "orm-explicit-rollback", "z"), table)
            session.rollback()
        # Core: engine.begin() commits, a Connection's rollback() discards.
        with engine.begin() as conn:
            conn.execute(insert(Order.__table__).values(id=4, item="cup"))
            assert (
                st.stash_many(
                    conn, [OutboxRecord(topic, "core-commit-1", "a"), OutboxRecord(topic, "core-commit-2", None)]
                )
                == 2
            )
        with engine.connect() as conn:
            st.stash(conn, OutboxRecord(topic, "core-rollback", "b"))
            conn.rollback()
        # A SAVEPOINT (begin_nested) rolled back takes its stash with it; the outer commit keeps the rest.
        with Session(engine) as session:
            nested = session.begin_nested()
            st.stash(session, OutboxRecord(topic, "orm-savepoint-rollback", "s"))
            nested.rollback()
            st.stash(session, OutboxRecord(topic, "orm-after-savepoint", "t"))
            session.commit()
        with Session(engine) as session:  # last: stashed after every rolled-back record
            st.stash(session, OutboxRecord(topic, "orm-last", "c"))
            session.commit()

        _delivered_exactly(
            kafka_bootstrap,
            topic,
            {"orm-commit", "core-commit-1", "core-commit-2", "orm-after-savepoint", "orm-last"},
            {"orm-rollback-1", "orm-rollback-2", "orm-explicit-rollback", "core-rollback", "orm-savepoint-rollback"},
        )
        wait_drained(pg_dsn, table)
        with Session(engine) as session:
            assert session.scalars(select(Order.id).order_by(Order.id)).all() == [1, 4]
    finally:
        relay.stop()
        relay.wait(60)
        engine.dispose()


def test_async_session_and_connection_commit_delivered_rollback_never(
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic, table = topic_factory(), f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    Base, Order = _model(pg_schema)
    st = SessionStasher(table)

    async def app() -> None:
        engine = create_async_engine(_url(pg_dsn))
        try:
            async with engine.begin() as conn:
                await conn.run_sync(Base.metadata.create_all)
            async with AsyncSession(engine) as session:
                session.add(Order(id=1, item="book"))
                await st.astash(session, OutboxRecord(topic, "async-orm-commit", "v"))
                n = (
                    await session.execute(select(func.count()).select_from(text(f'"{pg_schema}".outbox')))
                ).scalar_one()
                assert n == 1 and _outbox_keys(pg_dsn, table) == []
                await session.commit()
            with pytest.raises(RuntimeError):
                async with AsyncSession(engine) as session, session.begin():
                    session.add(Order(id=2, item="pen"))
                    await st.astash_many(session, [OutboxRecord(topic, "async-orm-rollback", "x")])
                    raise RuntimeError("payment declined")
            async with engine.begin() as conn:  # Core AsyncConnection
                await conn.execute(insert(Order.__table__).values(id=3, item="cup"))
                await astash(conn, OutboxRecord(topic, "async-core-commit", "y"), table)
            async with engine.connect() as conn:
                await st.astash_many(conn, [OutboxRecord(topic, "async-core-rollback", "z")])
                await conn.rollback()
            async with AsyncSession(engine) as session:
                await st.astash(session, OutboxRecord(topic, "async-last", "w"))
                await session.commit()
            async with AsyncSession(engine) as session:
                assert (await session.scalars(select(Order.id).order_by(Order.id))).all() == [1, 3]
        finally:
            await engine.dispose()

    relay = Harvest(relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g"))).start()
    try:
        asyncio.run(app())
        _delivered_exactly(
            kafka_bootstrap,
            topic,
            {"async-orm-commit", "async-core-commit", "async-last"},
            {"async-orm-rollback", "async-core-rollback"},
        )
        wait_drained(pg_dsn, table)
    finally:
        relay.stop()
        relay.wait(60)


class _Abort(Exception):
    """Raised inside a ``begin()`` block to roll it back."""


# Each way an application opens a transaction, with the stash as the FIRST statement on the connection
# it checked out of the pool: ``put`` stashes, then the transaction commits (``commit``) or rolls back.
Put = Callable[[Connection | Session], object]


def _core(engine: Engine, put: Put, commit: bool) -> None:
    with engine.connect() as conn:
        put(conn)
        conn.commit() if commit else conn.rollback()


def _core_after_commit(engine: Engine, put: Put, commit: bool) -> None:
    with engine.connect() as conn:  # commit-as-you-go: the stash is the first statement after a commit
        conn.execute(text("SELECT 1"))
        conn.commit()
        put(conn)
        conn.commit() if commit else conn.rollback()


def _core_begin(engine: Engine, put: Put, commit: bool) -> None:
    with contextlib.suppress(_Abort), engine.begin() as conn:
        put(conn)
        if not commit:
            raise _Abort


def _orm(engine: Engine, put: Put, commit: bool) -> None:
    with Session(engine) as session:
        put(session)
        session.commit() if commit else session.rollback()


def _orm_begin(engine: Engine, put: Put, commit: bool) -> None:
    with contextlib.suppress(_Abort), Session(engine) as session, session.begin():
        put(session)
        if not commit:
            raise _Abort


@pytest.mark.parametrize(
    "scenario", [_core, _core_after_commit, _core_begin, _orm, _orm_begin], ids=lambda f: f.__name__.strip("_")
)
def test_stash_first_on_a_pooled_connection_commits_and_rolls_back_with_it(
    pg_dsn: str, pg_schema: str, scenario: Callable[[Engine, Put, bool], None]
) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    st = SessionStasher(table)
    engine = create_engine(_url(pg_dsn), pool_size=1, max_overflow=0)
    with engine.connect():
        pass  # the pool now holds one connection, reset on return: the one every scenario checks out
    committed: list[str] = []
    try:
        for end in ("commit", "rollback"):
            one, many = f"{end}-stash", f"{end}-stash_many"
            scenario(engine, lambda c, k=one: st.stash(c, OutboxRecord("t", k, "v")), end == "commit")
            scenario(engine, lambda c, k=many: stash_many(c, [OutboxRecord("t", k, "v")], table), end == "commit")
            if end == "commit":
                committed += [one, many]
        assert _outbox_keys(pg_dsn, table) == committed
    finally:
        engine.dispose()


AsyncPut = Callable[[AsyncConnection | AsyncSession], Awaitable[object]]


async def _acore(engine: AsyncEngine, put: AsyncPut, commit: bool) -> None:
    async with engine.connect() as conn:
        await put(conn)
        await (conn.commit() if commit else conn.rollback())


async def _acore_after_commit(engine: AsyncEngine, put: AsyncPut, commit: bool) -> None:
    async with engine.connect() as conn:
        await conn.execute(text("SELECT 1"))
        await conn.commit()
        await put(conn)
        await (conn.commit() if commit else conn.rollback())


async def _acore_begin(engine: AsyncEngine, put: AsyncPut, commit: bool) -> None:
    with contextlib.suppress(_Abort):
        async with engine.begin() as conn:
            await put(conn)
            if not commit:
                raise _Abort


async def _aorm(engine: AsyncEngine, put: AsyncPut, commit: bool) -> None:
    async with AsyncSession(engine) as session:
        await put(session)
        await (session.commit() if commit else session.rollback())


async def _aorm_begin(engine: AsyncEngine, put: AsyncPut, commit: bool) -> None:
    with contextlib.suppress(_Abort):
        async with AsyncSession(engine) as session, session.begin():
            await put(session)
            if not commit:
                raise _Abort


@pytest.mark.parametrize(
    "scenario", [_acore, _acore_after_commit, _acore_begin, _aorm, _aorm_begin], ids=lambda f: f.__name__.strip("_")
)
def test_astash_first_on_a_pooled_connection_commits_and_rolls_back_with_it(
    pg_dsn: str, pg_schema: str, scenario: Callable[[AsyncEngine, AsyncPut, bool], Awaitable[None]]
) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    st = SessionStasher(table)

    async def run() -> list[str]:
        engine = create_async_engine(_url(pg_dsn), pool_size=1, max_overflow=0)
        async with engine.connect():
            pass
        committed: list[str] = []
        try:
            for end in ("commit", "rollback"):
                one, many = f"{end}-astash", f"{end}-astash_many"
                await scenario(engine, lambda c, k=one: st.astash(c, OutboxRecord("t", k, "v")), end == "commit")
                await scenario(
                    engine, lambda c, k=many: astash_many(c, [OutboxRecord("t", k, "v")], table), end == "commit"
                )
                if end == "commit":
                    committed += [one, many]
        finally:
            await engine.dispose()
        return committed

    committed = asyncio.run(run())
    assert _outbox_keys(pg_dsn, table) == committed


def test_other_drivers_are_refused_by_name(tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    with Session(engine) as session, pytest.raises(ConfigError) as info:
        stash(session, OutboxRecord("t", "k", "v"))
    assert "'sqlite+pysqlite' driver" in str(info.value) and "postgresql+psycopg://" in str(info.value)
    with pytest.raises(ConfigError, match=r"expected a sqlalchemy\.orm\.Session or sqlalchemy\.engine\.Connection"):
        stash(object(), OutboxRecord("t", "k", "v"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="expected a sqlalchemy AsyncSession or AsyncConnection"):
        asyncio.run(astash(Session(engine), OutboxRecord("t", "k", "v")))  # type: ignore[arg-type]
    engine.dispose()


def test_sync_stash_inside_run_sync_points_to_astash(pg_dsn: str, pg_schema: str) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)

    async def run() -> str:
        engine = create_async_engine(_url(pg_dsn))
        try:
            async with AsyncSession(engine) as session:
                with pytest.raises(ConfigError) as info:
                    await session.run_sync(lambda s: stash(s, OutboxRecord("t", "k", "v"), table))
                return str(info.value)
        finally:
            await engine.dispose()

    assert "runs on an asyncio engine" in asyncio.run(run()) and _outbox_keys(pg_dsn, table) == []
