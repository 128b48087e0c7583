"""The asyncio stasher against real Postgres: the same rows, NOTIFY and errors as the sync one."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from psycopg import sql

from harvest_outbox.producer.errors import RecordError
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.async_stasher import AsyncStasher
from harvest_outbox.producer.stash.async_stasher import stash as astash
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

pytestmark = pytest.mark.integration

_COLS = "SELECT kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values FROM {} ORDER BY id"


def _rows(conn: psycopg.Connection, names: OutboxNames) -> list[tuple[object, ...]]:
    return conn.execute(sql.SQL(_COLS).format(names.outbox)).fetchall()


def _records() -> list[OutboxRecord]:
    return [
        OutboxRecord("t", f"k{i % 7}", None if i % 11 == 0 else f"v{i}", [("h", str(i)), ("dup", None)])
        for i in range(200)
    ]


@pytest.mark.parametrize("value_type", ["varchar", "bytea"])
def test_async_writes_exactly_what_sync_writes(pg_dsn: str, pg_schema: str, value_type: str) -> None:
    sync_t, async_t = f"{pg_schema}.sync_{value_type}", f"{pg_schema}.async_{value_type}"
    init_db(pg_dsn, sync_t, value_type)  # type: ignore[arg-type]
    init_db(pg_dsn, async_t, value_type)  # type: ignore[arg-type]
    records = _records()
    sync_st, async_st = Stasher(sync_t, value_type), AsyncStasher(async_t, value_type)  # type: ignore[arg-type]
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        one = sync_st.stash(conn, records[0])
        assert sync_st.stash_many(conn, records[1:]) == 199

    async def write() -> int:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
            async with conn.transaction():
                first = await async_st.stash(conn, records[0])
                async with conn.cursor() as cur:  # a cursor works as well as a connection
                    assert await async_st.stash_many(cur, records[1:]) == 199
                assert await async_st.stash_many(conn, []) == 0
            return first

    first = asyncio.run(write())
    assert isinstance(first, int) and isinstance(one, int)
    with psycopg.connect(pg_dsn) as conn:
        got_sync, got_async = _rows(conn, sync_st.names), _rows(conn, async_st.names)
    assert got_async == got_sync and len(got_async) == 200


def test_async_rollback_writes_nothing_and_commit_notifies(pg_dsn: str, pg_schema: str) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    st = AsyncStasher(table)
    listener = psycopg.connect(pg_dsn, autocommit=True)
    listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(st.names.channel)))

    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
            with pytest.raises(RuntimeError):
                async with conn.transaction():
                    await st.stash(conn, OutboxRecord("t", "gone", "x"))
                    raise RuntimeError("business logic failed")
            assert list(listener.notifies(timeout=0.5, stop_after=1)) == []  # nothing on rollback
            async with conn.transaction():
                await st.stash_many(conn, [OutboxRecord("t", "kept", "y")])

    try:
        asyncio.run(run())
        notes = list(listener.notifies(timeout=5, stop_after=1))
        assert [n.channel for n in notes] == [st.names.channel]
        assert [r[1] for r in _rows(listener, st.names)] == ["kept"]
    finally:
        listener.close()


def test_async_bad_record_fails_before_the_database(pg_dsn: str, pg_schema: str) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    st = AsyncStasher(table)

    async def run() -> list[str]:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
            errors = []
            for call in (
                lambda: st.stash(conn, OutboxRecord("bad topic!", "k", "v")),
                lambda: st.stash_many(conn, [OutboxRecord("t", "k", "fine"), OutboxRecord("t", "k", 5)]),  # type: ignore[arg-type]
                lambda: astash(conn, OutboxRecord("t", None, "v"), table),
            ):  # type: ignore[arg-type]
                with pytest.raises(RecordError) as info:
                    await call()
                errors.append(str(info.value))
            # Nothing reached the server: the connection is not even in a transaction.
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            return errors

    errors = asyncio.run(run())
    assert errors[0].startswith("topic: 'bad topic!' is not a valid Kafka topic name")
    assert errors[1].startswith("value: must be str, bytes or None, got int")
    assert errors[2].startswith("key: must be a string")
    with psycopg.connect(pg_dsn) as conn:
        assert _rows(conn, st.names) == []


@pytest.mark.parametrize(
    "record",
    [
        OutboxRecord("", "k", "v"),
        OutboxRecord("t", "k", b"\xff"),
        OutboxRecord("t", "k", "v", [("a", 1)]),
        "not a record",
    ],
)  # type: ignore[list-item]
def test_sync_and_async_raise_the_same_error(pg_dsn: str, pg_schema: str, record: OutboxRecord) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    with psycopg.connect(pg_dsn) as conn, pytest.raises(RecordError) as sync_info:
        Stasher(table).stash_many(conn, [record])

    async def run() -> str:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
            with pytest.raises(RecordError) as info:
                await AsyncStasher(table).stash(conn, record)
            return str(info.value)

    assert asyncio.run(run()) == str(sync_info.value)
