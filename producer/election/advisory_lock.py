"""The Postgres elections' advisory locks: their keys, who holds one, the sharded relays' membership locks,
and the dedicated connection an election holds its lock on (:mod:`producer.election.postgres` says why an
advisory lock, and what each setting of the connection is for).

Invariants:
- an outbox's leader-lock key is a 64-bit hash of a namespace and its resolved ``schema.table``
  (:func:`resolve_table`), so every relay of one outbox contends for one lock whatever its search_path,
  relays of different outboxes never do, and other applications' advisory locks are unlikely to meet it;
- a key reads in ``pg_locks`` as (classid, objid) = its high and low 32 bits (:func:`key_parts`);
- an election connection is autocommit, UTF-8, with keepalives on both ends and no idle timeouts: the
  holder of a lock learns of a dead session within its lease, and the server keeps a silent holder's
  session a little longer than that.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable

import psycopg
from psycopg import sql

from harvest_outbox.producer.db.credentials import open_connection
from harvest_outbox.producer.schema import OutboxNames

_NAMESPACE = b"harvest.leader\0"

_DB = "database = (SELECT oid FROM pg_database WHERE datname = current_database())"
# Sharded relays (producer/election/sharded_postgres.py): the live relays of each shard count on this outbox (shared membership locks).
MEMBERS_SQL = (
    f"SELECT objid::bigint, count(*) FROM pg_locks WHERE locktype = 'advisory' AND {_DB} "
    f"AND classid = %s::bigint::oid AND objsubid = 2 AND granted GROUP BY objid"
)

#: ``MEMBERS_SQL`` for many outboxes: the namespace (``classid``) of each row says whose it is.
_MEMBERS_OF_SQL = (
    f"SELECT classid::bigint, objid::bigint, count(*) FROM pg_locks WHERE locktype = 'advisory' AND {_DB} "
    f"AND classid::bigint = ANY(%s::bigint[]) AND objsubid = 2 AND granted GROUP BY classid, objid"
)


def members_namespace(qualified_table: str) -> int:
    """The first key of the membership lock (31 bits, so it reads the same as int4 and as oid)."""
    return (
        int.from_bytes(hashlib.sha256(b"harvest.shards\0" + qualified_table.encode()).digest()[:4], "big") & 0x7FFFFFFF
    )


def sharded_members(conn: psycopg.Connection, qualified_table: str) -> list[tuple[int, int]]:
    """``(shard count, live relays)`` of the sharded relays on this outbox."""
    return sharded_members_of(conn, [qualified_table]).get(qualified_table, [])


def sharded_members_of(conn: psycopg.Connection, qualified_tables: Iterable[str]) -> dict[str, list[tuple[int, int]]]:
    """:func:`sharded_members` of many outboxes in one query: only those with sharded relays are keys."""
    by_namespace: dict[int, list[str]] = {}
    for table in qualified_tables:
        by_namespace.setdefault(members_namespace(table), []).append(table)
    found: dict[str, list[tuple[int, int]]] = {}
    for namespace, shards, live in conn.execute(_MEMBERS_OF_SQL, (list(by_namespace),)).fetchall():
        for table in by_namespace.get(int(namespace), ()):
            found.setdefault(table, []).append((int(shards), int(live)))
    return found


def lock_key(qualified_table: str) -> int:
    """The signed 64-bit advisory-lock key of an outbox (``schema.table``, as resolved)."""
    digest = hashlib.sha256(_NAMESPACE + qualified_table.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def key_parts(key: int) -> tuple[int, int]:
    """How ``pg_locks`` shows a bigint advisory key: ``(classid, objid)`` = high and low 32 bits."""
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    return unsigned >> 32, unsigned & 0xFFFFFFFF


def resolve_table(conn: psycopg.Connection, outbox_table: str) -> str:
    """``schema.table`` of the outbox as this connection's search_path resolves it (so relays with an
    unqualified ``outboxTable`` agree on the key); falls back to ``current_schema()``."""
    names = OutboxNames.parse(outbox_table)
    if names.schema is not None:
        return f"{names.schema}.{names.table}"
    row = conn.execute(
        "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)",
        (names.outbox.as_string(conn),),
    ).fetchone()
    if row is None:
        row = conn.execute("SELECT current_schema()").fetchone()
    return f"{row[0] if row else 'public'}.{names.table}"


def lock_holder(conn: psycopg.Connection, outbox_table: str) -> int | None:
    """Backend pid holding the leader lock of ``outbox_table`` (None if nobody leads). Its
    ``pg_stat_activity.application_name`` is ``harvest-election:<relay name>``."""
    classid, objid = key_parts(lock_key(resolve_table(conn, outbox_table)))
    row = conn.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s::bigint::oid "
        "AND objid = %s::bigint::oid AND objsubid = 1 AND granted "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        (classid, objid),
    ).fetchone()
    return None if row is None else int(row[0])


def listen_for_others(conn: psycopg.Connection, channel: str, on_other: Callable[[], None]) -> int | None:
    """LISTEN on ``channel``; ``on_other()`` runs for every NOTIFY another session sends there. Returns
    the connection's backend pid. A notify handler, not select() alone: a NOTIFY that arrives while
    one of our own queries is in flight is read by libpq with that query's reply, and the socket never
    turns readable for it."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    pid = int(row[0]) if row else None
    conn.add_notify_handler(lambda notify: on_other() if notify.pid != pid else None)
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    return pid


def election_connection(
    dsn: str, name: str, check_interval: float, lease: float, connect_timeout: float, statement_timeout: float
) -> psycopg.Connection:
    """An election connection with the settings :mod:`producer.election.postgres` describes (keepalives on both ends,
    timeouts, no idle timeouts): the holder of an advisory lock learns of a dead session within
    ``lease``, and the server keeps a silent holder's session a little longer than that."""
    lease_s = max(1, math.ceil(lease))
    # client_encoding as db.connect's: the outbox's schema name (hence the lock keys) is read as the
    # same text as `harvest shards` reads it, and as text, not bytes, even in a SQL_ASCII database.
    conn = open_connection(
        dsn,
        autocommit=True,
        connect_timeout=max(2, math.ceil(connect_timeout)),
        client_encoding="UTF8",
        application_name=f"harvest-election:{name}"[:63],
        keepalives=1,
        keepalives_idle=max(1, math.ceil(check_interval)),
        keepalives_interval=1,
        keepalives_count=3,
        tcp_user_timeout=int(lease * 1000),
    )
    try:
        server_silence = lease_s + 1 + 3  # server keepalive idle + 3 probes 1 s apart: > lease
        for stmt in (
            f"SET statement_timeout = {max(1, int(statement_timeout * 1000))}",
            "SET lock_timeout = 0",
            "SET idle_in_transaction_session_timeout = 0",
            f"SET tcp_keepalives_idle = {lease_s + 1}",
            "SET tcp_keepalives_interval = 1",
            "SET tcp_keepalives_count = 3",
        ):
            conn.execute(stmt)
        for stmt in (
            f"SET tcp_user_timeout = {server_silence * 1000}",  # PostgreSQL 12+
            "SET idle_session_timeout = 0",
        ):  # PostgreSQL 14+
            try:
                conn.execute(stmt)
            except psycopg.errors.UndefinedObject:
                pass
    except BaseException:
        conn.close()
        raise
    return conn
