"""Schema + stasher against real Postgres: goharvest's table, COPY batches, tombstones, validation."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import psycopg
import pytest
from psycopg import sql

from harvest_outbox.producer.errors import ConfigError, RecordError, SchemaError
from harvest_outbox.producer.schema import OutboxNames, inspect_outbox
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.async_stasher import AsyncStasher
from harvest_outbox.producer.stash.async_stasher import stash_many as astash_many
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher, stash

pytestmark = pytest.mark.integration


def test_init_db_is_idempotent_and_has_goharvest_columns(pg_dsn: str, pg_schema: str) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    init_db(pg_dsn, table)
    with psycopg.connect(pg_dsn) as conn:
        assert inspect_outbox(conn, OutboxNames.parse(table)) == "varchar"
        cols = conn.execute(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = 'outbox' ORDER BY ordinal_position",
            (pg_schema,),
        ).fetchall()
    assert [c[0] for c in cols] == [
        "id",
        "create_time",
        "kafka_topic",
        "kafka_key",
        "kafka_value",
        "kafka_header_keys",
        "kafka_header_values",
        "leader_id",
    ]
    assert cols[0][1] == "bigint" and cols[7][1] == "uuid" and cols[5][1] == "ARRAY"


def test_missing_table_is_a_clear_error(pg_dsn: str, pg_schema: str) -> None:
    with psycopg.connect(pg_dsn) as conn, pytest.raises(SchemaError, match="does not exist; create it with"):
        inspect_outbox(conn, OutboxNames.parse(f"{pg_schema}.nope"))


def test_stash_round_trip_in_callers_transaction(pg_dsn: str, pg_schema: str) -> None:
    table = f'"{pg_schema}"."Odd.Name"'
    init_db(pg_dsn, table)
    st = Stasher(table)
    with psycopg.connect(pg_dsn) as conn:
        with conn.transaction():
            a = st.stash(conn, OutboxRecord("orders", "k1", "v1", [("h1", "x"), ("h1", "y")]))
            b = st.stash(conn, OutboxRecord("orders", "k1", None, {"only": None}))  # tombstone
        with pytest.raises(RuntimeError), conn.transaction():
            st.stash(conn, OutboxRecord("orders", "rolled-back", "z"))
            raise RuntimeError("business logic failed")
        rows = conn.execute(
            sql.SQL(
                "SELECT id, kafka_key, kafka_value, kafka_header_keys, kafka_header_values, "
                "leader_id FROM {} ORDER BY id"
            ).format(st.names.outbox)
        ).fetchall()
    assert rows == [(a, "k1", "v1", ["h1", "h1"], ["x", "y"], None), (b, "k1", None, ["only"], [None], None)]


def test_bytea_outbox(pg_dsn: str, pg_schema: str) -> None:
    table = f"{pg_schema}.bin"
    init_db(pg_dsn, table, "bytea")
    st = Stasher(table, "bytea")
    with psycopg.connect(pg_dsn) as conn:
        st.stash_many(conn, [OutboxRecord("t", "k", b"\x00\xff"), OutboxRecord("t", "k", "text")])
        values = [
            r[0]
            for r in conn.execute(sql.SQL("SELECT kafka_value FROM {} ORDER BY id").format(st.names.outbox)).fetchall()
        ]
    assert values == [b"\x00\xff", b"text"]


@pytest.mark.parametrize(
    ("record", "needle"),
    [
        (OutboxRecord("", "k", "v"), "topic: '' is not a valid Kafka topic name"),
        (OutboxRecord(None, "k", "v"), "topic: None is not a valid Kafka topic name"),  # type: ignore[arg-type]
        (OutboxRecord("t", None, "v"), "key: must be a string"),  # type: ignore[arg-type]
        (OutboxRecord("t", "k", 5), "value: must be str, bytes or None"),  # type: ignore[arg-type]
        (OutboxRecord("t", "k", b"\xff\xfe"), "is not UTF-8 but the outbox's kafka_value is VARCHAR"),
        (OutboxRecord("t", "k", "v", [("a",)]), "is not a (key, value) pair"),  # type: ignore[list-item]
        (OutboxRecord("t", "k", "v", [("a", 1)]), "headers['a']: value must be a string"),  # type: ignore[list-item]
        # lone surrogates (a surrogateescape decode): named by field, before psycopg's codec error mid-COPY
        (OutboxRecord("t", "k\udcff", "v"), "key: U+DCFF at position 1 is a lone surrogate"),
        (OutboxRecord("t", "k", "a\ud800"), "value: U+D800 at position 1 is a lone surrogate"),
        (OutboxRecord("t", "k", "v", [("a\udc80", "b")]), "headers: a key: U+DC80 at position 1"),
        (OutboxRecord("t", "k", "v", [("a", "é\udc80")]), "headers['a']: U+DC80 at position 1"),
        # NUL in a key or header: named up front, not Postgres' DataError from the middle of the batch
        (OutboxRecord("t", "k\x00", "v"), "key: contains NUL, which VARCHAR cannot hold"),
        (OutboxRecord("t", "k", "v", [("a\x00", "b")]), "headers: key 'a\\x00' contains NUL"),
        (OutboxRecord("t", "k", "v", [("a", "b\x00c")]), "headers['a']: value contains NUL"),
    ],
)
def test_bad_records_rejected_before_the_database(record: OutboxRecord, needle: str) -> None:
    with pytest.raises(RecordError) as info:
        Stasher().plan.row(record)
    assert needle in str(info.value)


def test_a_lone_surrogate_is_refused_by_a_bytea_outbox_too() -> None:
    """A bytea outbox encodes a str value itself: the same RecordError, not the codec's UnicodeEncodeError."""
    with pytest.raises(RecordError, match="value: U\\+D800 at position 0 is a lone surrogate"):
        Stasher(value_type="bytea").plan.row(OutboxRecord("t", "k", "\ud800"))
    assert Stasher(value_type="bytea").plan.row(OutboxRecord("t", "k", "é"))[2] == "é".encode()


# Headers and values whose text COPY and the array literals must carry unchanged (the literals' own
# rules: tests/test_producer/stash/test_text_array.py).
_TRICKY_HEADERS: list[list[tuple[str, str | None]]] = [
    [],
    [("h", "1")],
    [("source", "bench"), ("trace", None)],
    [('q"uote', "back\\slash"), ("NULL", "NULL"), ("", "")],
    [("{a,b}", " sp ,\t\n"), ("ü€😀", "\\N"), ("c\r", '"')],
]
_TRICKY_VALUES: list[str | None] = [None, "", "x", "tab\tnew\nline\\N", 'ü€😀 \\ "', "x" * 300]


@pytest.mark.parametrize("value_type", ["varchar", "bytea"])
def test_stash_many_writes_the_same_rows_as_stash(pg_dsn: str, pg_schema: str, value_type: str) -> None:
    """The batch form (COPY) stores exactly what one stash() per record stores, tricky headers and values
    included; its speed-up is measured in bench/bench_stasher.py, not here."""
    one, many = f"{pg_schema}.one_{value_type}", f"{pg_schema}.many_{value_type}"
    init_db(pg_dsn, one, value_type=value_type)  # type: ignore[arg-type]
    init_db(pg_dsn, many, value_type=value_type)  # type: ignore[arg-type]
    records = [
        OutboxRecord(
            "t",
            f"k{i % 50}",
            None if i % 97 == 0 else _TRICKY_VALUES[i % len(_TRICKY_VALUES)],
            [*_TRICKY_HEADERS[i % len(_TRICKY_HEADERS)], ("i", str(i))] if i % 3 else _TRICKY_HEADERS[i % 5],
        )
        for i in range(500)
    ]
    with psycopg.connect(pg_dsn) as conn:
        with conn.transaction():
            for r in records:
                Stasher(one, value_type).stash(conn, r)  # type: ignore[arg-type]
        with conn.transaction():
            assert Stasher(many, value_type).stash_many(conn, records) == 500  # type: ignore[arg-type]
        cols = "SELECT kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values FROM {} ORDER BY id"
        rows = [
            conn.execute(sql.SQL(cols).format(sql.Identifier(pg_schema, t))).fetchall()
            for t in (f"one_{value_type}", f"many_{value_type}")
        ]
    assert rows[0] == rows[1] and len(rows[0]) == 500
    assert {tuple(r[3]) for r in rows[1]} >= {tuple(k for k, _ in h) for h in _TRICKY_HEADERS}


_REC = OutboxRecord("t", "k", "v")


async def _sync_call(call: Callable[[object], object], conn: object) -> object:
    return call(conn)


# (stasher call, what it is given, what the error must say). The sync stasher given an asyncio connection
# used to build coroutines nobody awaited (AttributeError); the async one given a sync connection wrote
# the row, then failed on `await` (TypeError) with the row left in the caller's transaction.
_BAD_CONNECTIONS: list[tuple[str, Callable[[object], Awaitable[object]], str, str]] = [
    (
        "Stasher.stash",
        lambda c: _sync_call(lambda x: Stasher().stash(x, _REC), c),
        "async",  # type: ignore[arg-type]
        "conn: the synchronous Stasher needs a psycopg.Connection or Cursor, got AsyncConnection (asyncio); "
        "use harvest_outbox.producer.stash.async_stasher.AsyncStasher",
    ),
    (
        "Stasher.stash_many",
        lambda c: _sync_call(lambda x: Stasher().stash_many(x, [_REC]), c),  # type: ignore[arg-type]
        "async cursor",
        "got AsyncCursor (asyncio); use harvest_outbox.producer.stash.async_stasher.AsyncStasher",
    ),
    (
        "stasher.stash",
        lambda c: _sync_call(lambda x: stash(x, _REC), c),
        "async",  # type: ignore[arg-type]
        "got AsyncConnection (asyncio)",
    ),
    (
        "AsyncStasher.stash",
        lambda c: AsyncStasher().stash(c, _REC),
        "sync",  # type: ignore[arg-type]
        "conn: AsyncStasher needs a psycopg.AsyncConnection or AsyncCursor, got Connection (synchronous); "
        "use harvest_outbox.producer.stash.stasher.Stasher",
    ),
    (
        "AsyncStasher.stash_many",
        lambda c: AsyncStasher().stash_many(c, [_REC]),
        "sync cursor",  # type: ignore[arg-type]
        "got Cursor (synchronous); use harvest_outbox.producer.stash.stasher.Stasher",
    ),
    (
        "stasher_async.stash_many",
        lambda c: astash_many(c, [_REC]),
        "sync",  # type: ignore[arg-type]
        "got Connection (synchronous)",
    ),
    (
        "Stasher.stash",
        lambda c: _sync_call(lambda x: Stasher().stash(x, _REC), c),
        "none",  # type: ignore[arg-type]
        "conn: the synchronous Stasher needs a psycopg.Connection or Cursor, got NoneType; pass the psycopg connection",
    ),
    (
        "AsyncStasher.stash",
        lambda c: AsyncStasher().stash(c, _REC),
        "none",  # type: ignore[arg-type]
        "conn: AsyncStasher needs a psycopg.AsyncConnection or AsyncCursor, got NoneType",
    ),
]


@pytest.mark.parametrize(
    ("call", "given", "needle"),
    [row[1:] for row in _BAD_CONNECTIONS],
    ids=[f"{row[0]}-{row[2]}" for row in _BAD_CONNECTIONS],
)
def test_a_connection_of_the_wrong_kind_is_refused_before_anything_runs(
    pg_dsn: str, call: Callable[[object], Awaitable[object]], given: str, needle: str
) -> None:
    async def run() -> tuple[str, list[psycopg.pq.TransactionStatus]]:
        sync = psycopg.connect(pg_dsn)
        aconn = await psycopg.AsyncConnection.connect(pg_dsn)
        try:
            conn = {
                "sync": sync,
                "sync cursor": sync.cursor(),
                "async": aconn,
                "async cursor": aconn.cursor(),
                "none": None,
            }[given]
            with pytest.raises(ConfigError) as info:
                await call(conn)
            return str(info.value), [sync.info.transaction_status, aconn.info.transaction_status]
        finally:
            sync.close()
            await aconn.close()

    message, status = asyncio.run(run())
    assert needle in message
    assert status == [psycopg.pq.TransactionStatus.IDLE] * 2  # nothing reached the server


def test_headers_none_means_no_headers(pg_dsn: str, pg_schema: str) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    st = Stasher(table)
    none = OutboxRecord("t", "k", "v", None)

    async def astash(conn_dsn: str) -> None:
        async with await psycopg.AsyncConnection.connect(conn_dsn) as aconn:
            await AsyncStasher(table).stash(aconn, none)
            await AsyncStasher(table).stash_many(aconn, [none])

    with psycopg.connect(pg_dsn) as conn:
        st.stash(conn, none)
        st.stash_many(conn, [none])
    asyncio.run(astash(pg_dsn))
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT kafka_header_keys, kafka_header_values FROM {}").format(st.names.outbox)
        ).fetchall()
    assert rows == [([], [])] * 4  # empty arrays, not NULL (which the relay would refuse as a poison row)
