"""The relay's connection to the outbox's database: how it connects, the session settings every statement
runs under, and the session each layout's relay database composes (:class:`OutboxSession`; the mark layout's
:class:`~producer.layouts.mark.database.MarkDatabase`, the cursor layout's
:class:`~producer.layouts.cursor.database.CursorDatabase`; docs/design.md, "Outbox layouts").

A session has a connection of its own (a one-outbox relay), or borrows one per unit of work from a
fleet's :class:`~producer.db.statement_pool.StatementPool` of its database (:meth:`OutboxSession.lease`; a
layout's relay database leases around each of its methods, :func:`leased`).

Invariants: every statement runs in autocommit mode (each is its own transaction, as in goharvest, but the
explicit transactions a layout sends whole: the fenced commit, the cursor layout's batch start with its first page),
committed synchronously except on a session built with ``async_commit`` (the relay's mark connection:
see ``RelayCore.open``, tests/test_producer/layouts/mark/test_async_mark.py); a session's connection is checked
(UTF-8 readable, the outbox's shape, its attempt and shard tables) before its first statement on it (a
pooled connection once per session: test_statement_pool.py); failures are raised as
:class:`~producer.errors.DatabaseError` chained to the psycopg error, with secrets scrubbed from the
message, and a failed statement's connection is replaced on next use (a pooled one is closed, never lent
again); a pooled session runs statements only inside a lease (every public method of both layouts' relay
databases is :func:`leased`: tests/test_producer/db/test_statement_pool.py).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import Format

from harvest_outbox.producer.db._header_arrays import TEXT_ARRAY_OID, HeaderArrayLoader
from harvest_outbox.producer.db._rendered import rendered
from harvest_outbox.producer.db._statements import id_array
from harvest_outbox.producer.db.credentials import open_connection
from harvest_outbox.producer.errors import DatabaseError, LayoutChanged
from harvest_outbox.producer.schema import (
    OutboxNames,
    Statement,
    ValueType,
    inspect_outbox,
    require_attempts_table,
    require_shards,
    require_utf8_readable,
)
from harvest_outbox.redact import redact_dsn, redact_error

#: The SQLSTATE a migrated outbox's trigger raises on a row update or delete (producer/layouts/cursor/migrate.py):
#: a relay of the mark layout still running on it (:class:`~producer.errors.LayoutChanged`).
LAYOUT_CHANGED_SQLSTATE = "HRV01"

if TYPE_CHECKING:
    from harvest_outbox.producer.db.statement_pool import StatementPool

# The relay's transactions are a few statements sent back to back; a session of ours that sits idle
# inside one for this long belongs to a frozen process (SIGSTOP, VM pause) that may hold the fence
# row lock. Postgres then ends that session, so the next leader's view start is not blocked for as
# long as the zombie stays frozen; the zombie's commit is refused by the fence anyway.
IDLE_IN_TRANSACTION_TIMEOUT = "10s"
# A lock wait longer than this fails (and the caller retries after its I/O back-off) instead of
# holding the relay thread, which also runs the leader-election heartbeats.
LOCK_TIMEOUT = "2s"
# A network path to Postgres that silently drops packets (a partition, a NAT entry gone) would
# leave a relay statement waiting for TCP's own give-up, ~15 minutes. These libpq settings (unless
# the DSN sets them) make the kernel fail such a connection after ~20 s of unacknowledged data or
# silence, so the relay's ordinary error path (back off, reconnect, remark) takes over.
TCP_DEFAULTS = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "3",
    "keepalives_count": "3",
    "tcp_user_timeout": "20000",
}


def connect(dsn: str, **kwargs: Any) -> psycopg.Connection:
    """The connection every command and relay statement on the outbox uses (autocommit, UTF-8, the
    timeouts above). Refuses a database the relay cannot read (:func:`require_utf8_readable`)."""
    try:
        given = conninfo_to_dict(dsn)
        host = str(given.get("host", ""))
        if not host.startswith("/"):  # TCP only (not a Unix socket)
            kwargs = {**{k: v for k, v in TCP_DEFAULTS.items() if k not in given}, **kwargs}
        # UTF-8 whatever the DSN or the database's encoding say: the mark loads text columns as the
        # bytes the server sends (Kafka keys and values are the UTF-8 of the outbox's text).
        conn = open_connection(dsn, autocommit=True, **{**kwargs, "client_encoding": "UTF8"})
    except psycopg.Error as exc:
        raise DatabaseError(
            f"cannot connect to Postgres ({redact_dsn(dsn)}): {redact_error(str(exc), dsn).strip()}"
        ) from exc
    try:
        require_utf8_readable(conn)
        conn.execute(f"SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION_TIMEOUT}'")
        conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
        return conn
    except psycopg.Error as exc:
        conn.close()
        raise DatabaseError(
            f"cannot connect to Postgres ({redact_dsn(dsn)}): {redact_error(str(exc), dsn).strip()}"
        ) from exc
    except BaseException:
        conn.close()
        raise


@dataclass(eq=False)
class SessionConnection:
    """A connection set up for the relay's statements (:func:`connect`, then :func:`open_session_connection`'s
    settings): its own, or one of a fleet's pool."""

    conn: psycopg.Connection
    #: The read's own cursor: text loaded as the bytes the server sent (see OutboxSession.conn).
    row_cursor: psycopg.Cursor
    #: Whether the read may be prepared (``plan_cache_mode`` exists: planned anew on every run).
    prepare_reads: bool
    #: The connection's ``synchronous_commit`` is off (the mark's: see RelayCore.open).
    async_commit: bool = False
    #: The sessions (outboxes) whose checks passed on this connection: each is checked once per connection.
    checked: weakref.WeakSet[OutboxSession] = field(default_factory=weakref.WeakSet)
    #: monotonic time it was last given back to its pool.
    idle_since: float = 0.0


def open_session_connection(dsn: str, *, async_commit: bool = False, **kwargs: Any) -> SessionConnection:
    """A :func:`connect`-ion with what every outbox's statements need (raises psycopg.Error or DatabaseError)."""
    conn = connect(dsn, **kwargs)
    try:
        conn.adapters.register_loader(TEXT_ARRAY_OID, HeaderArrayLoader)
        # Prepared statements (the mark; psycopg prepares the others after 5 runs) are parsed
        # once but planned for every run with its own parameters: a generic plan, which Postgres
        # would otherwise settle on after 5 runs, made while the outbox was empty sorted the
        # whole outbox on every mark once a burst arrived (2,600 rows/s instead of ~60,000).
        try:
            conn.execute("SET plan_cache_mode = force_custom_plan")
            prepare_reads = True
        except psycopg.errors.UndefinedObject:  # PostgreSQL < 12: the mark stays unprepared
            prepare_reads = False
        if async_commit:
            conn.execute("SET synchronous_commit = off")
        # Key and value come back as varchar and are loaded as the bytes the server sent (UTF-8,
        # the connection's client encoding): no convert_to() call per column and row on the
        # database (4 % of a 5,000-row mark) and the same bytes. Only on the read's own cursor.
        row_cursor = conn.cursor()
        bytea = conn.adapters.get_loader(psycopg.postgres.types["bytea"].oid, Format.BINARY)
        assert bytea is not None  # psycopg always has it
        row_cursor.adapters.register_loader("varchar", bytea)
    except BaseException:
        conn.close()
        raise
    return SessionConnection(conn, row_cursor, prepare_reads, async_commit)


class OutboxSession:
    """One autocommit connection (made on first use, remade after a failure) to the database of one outbox
    table, or of a set of its shards (``shard_count`` > 1, :meth:`set_shards`). The set changes only
    between leader views, when no statement of the old view runs. The relay's statements are those of
    the parts that compose it (:class:`~producer.db.fence.Fence`, :class:`~producer.db._statements.Attempts`,
    a layout's relay database), which :meth:`watch` its new connections and shard sets."""

    def __init__(
        self,
        dsn: str,
        names: OutboxNames,
        shard_count: int | None = None,
        *,
        async_commit: bool = False,
        pool: StatementPool | None = None,
    ) -> None:
        if pool is not None and shard_count is not None and shard_count > 1:
            raise ValueError("a sharded outbox's session keeps connections of its own (random_page_cost)")
        self._dsn = dsn
        #: A fleet's pool of this database (None: a connection of this session's own).
        self.pool = pool
        #: The pooled connection lent to this session now (inside :meth:`lease`), and the last one it had.
        self._leased: SessionConnection | None = None
        self.last_leased: SessionConnection | None = None
        #: Commit without waiting for the WAL flush (``synchronous_commit = off``): only for a connection
        #: whose writes need not survive a database crash on their own (see RelayCore.open).
        self.async_commit = async_commit
        self.names = names
        self.shard_count = shard_count if shard_count and shard_count > 1 else None
        self.shards: frozenset[int] = frozenset()
        self._own: SessionConnection | None = None
        #: Whether the read (the mark, the cursor's page) may be prepared (see conn: planned anew on every run).
        self.prepare_reads = False
        self.value_type: ValueType = "varchar"
        #: The read's own cursor (see conn): text loaded as the bytes the server sent.
        self.row_cursor: psycopg.Cursor | None = None
        self._on_connect: list[Callable[[psycopg.Connection], None]] = []
        self._on_shards: list[Callable[[], None]] = []

    def watch(
        self,
        connected: Callable[[psycopg.Connection], None] | None = None,
        shards_changed: Callable[[], None] | None = None,
    ) -> None:
        """Call ``connected`` with each new connection, once it is set up and checked (to build what depends
        on it: the value column's type), and ``shards_changed`` after each :meth:`set_shards`; in the order
        the parts registered."""
        if connected is not None:
            self._on_connect.append(connected)
        if shards_changed is not None:
            self._on_shards.append(shards_changed)

    def set_shards(self, shards: frozenset[int]) -> None:
        """Lead these shards from now on (sharded relays, between views)."""
        if self.shard_count is None:
            raise ValueError("set_shards on an unsharded outbox database")
        if any(not 0 <= k < self.shard_count for k in shards):
            raise ValueError(f"shards {sorted(shards)} outside 0..{self.shard_count - 1}")
        self.shards = frozenset(shards)
        for changed in self._on_shards:
            changed()

    def shard_array(self) -> sql.Composable:
        ks = sorted(self.shards) if self.shard_count is not None else [0]
        return sql.SQL("'{" + ",".join(str(int(k)) for k in ks) + "}'::int[]")

    @property
    def shard_text(self) -> str:
        """`` (shards 0,3 of 8)`` for messages; empty unsharded."""
        if self.shard_count is None:
            return ""
        return f" (shards {','.join(map(str, sorted(self.shards))) or 'none'} of {self.shard_count})"

    @property
    def live(self) -> psycopg.Connection | None:
        """The open connection, None when there is none (never connects; pooled: the lent one)."""
        held = self._leased if self.pool is not None else self._own
        return held.conn if held is not None and not held.conn.closed else None

    @property
    def conn(self) -> psycopg.Connection:
        if self.pool is not None:
            if self._leased is None:
                raise RuntimeError(
                    f"a statement on {self.names.display!r} outside a lease of its pooled connection (a bug: "
                    "every method of a relay database is @leased)"
                )
            return self._leased.conn
        if self._own is None or self._own.conn.closed:
            own = open_session_connection(self._dsn, async_commit=self.async_commit)
            try:
                self._check(own)
            except BaseException:
                own.conn.close()
                raise
            self._own = own
        return self._own.conn

    def _check(self, held: SessionConnection) -> None:
        """This outbox's checks on ``held`` and what depends on its connection (the parts' statements)."""
        conn = held.conn
        self.value_type = inspect_outbox(conn, self.names)
        require_attempts_table(conn, self.names)
        if self.shard_count is not None:
            require_shards(conn, self.names, self.shard_count)
            # A led shard's rows are spread over the whole outbox, so Postgres' default cost of a
            # random page (4) made the planner read the primary key in id order and hash every
            # row's key instead of taking the shard's range of the (shard, id) index, once the
            # outbox's pages were half empty (OUTBOX_FILLFACTOR; 100k rows, 5,000-row marks).
            # The relay's working set is the head of the outbox, in shared buffers: a random
            # page costs about what a sequential one does (the usual setting for SSDs and RAM).
            conn.execute("SET random_page_cost = 1.1")
        self.prepare_reads = held.prepare_reads
        self.row_cursor = held.row_cursor
        for connected in self._on_connect:
            connected(conn)

    @contextmanager
    def lease(self) -> Iterator[None]:
        """Inside: :attr:`conn` is a connection of the session's pool lent to it alone (checked for this
        outbox if it is new to it), given back after, or closed if it failed or is left in a transaction.
        Without a pool, or inside a lease already, nothing happens. Raises DatabaseError when no connection
        comes free in time (producer/db/statement_pool.py)."""
        pool = self.pool
        if pool is None or self._leased is not None:
            yield
            return
        held = pool.lease(self, self.async_commit)
        self._leased = self.last_leased = held
        try:
            if self not in held.checked:
                try:
                    self._check(held)
                except psycopg.Error as exc:
                    raise self.failed("checking the outbox", exc) from exc
                held.checked.add(self)
            else:
                self.prepare_reads, self.row_cursor = held.prepare_reads, held.row_cursor
            yield
        except psycopg.Error:
            held.conn.close()  # a psycopg error no part turned into ours: never lend this connection again
            raise
        finally:
            self._leased = None
            self.row_cursor = None
            pool.give_back(held)

    def run(
        self,
        what: str,
        query: Statement,
        params: Sequence[Any] | dict[str, Any],
        prepare: bool | None = None,
        cursor: psycopg.Cursor | None = None,
    ) -> psycopg.Cursor:
        try:
            conn = self.conn
            return (cursor or conn).execute(rendered(conn, query), params, binary=True, prepare=prepare)
        except psycopg.Error as exc:
            raise self.failed(what, exc) from exc

    def failed(self, what: str, exc: psycopg.Error) -> DatabaseError:
        """The error for ``what`` failing on this outbox (the DSN's secrets redacted); closes the connection,
        which is replaced on next use (a pooled one: the pool opens another)."""
        self.close()
        if exc.sqlstate == LAYOUT_CHANGED_SQLSTATE:  # the migrated table's trigger (cursor/migrate.py)
            return LayoutChanged(f"{what} on {self.names.display!r} refused: {self.redacted(exc)}")
        return DatabaseError(f"{what} on {self.names.display!r} failed: {self.redacted(exc)}")

    def redacted(self, exc: psycopg.Error) -> str:
        """``exc``'s message with the DSN's secrets taken out."""
        return redact_error(str(exc), self._dsn).strip()

    @staticmethod
    def id_array(ids: Sequence[int]) -> str:
        return id_array(ids)

    def close(self) -> None:
        """Close the session's connection; pooled: the lent one if any (it failed), else nothing (the pool's
        connections outlive its sessions)."""
        held = self._leased if self.pool is not None else self._own
        if held is not None:
            try:
                held.conn.close()
            except Exception:  # closing a broken connection: nothing to salvage
                pass
        if self.pool is None:
            self._own = None


F = TypeVar("F", bound=Callable[..., Any])


def leased(method: F) -> F:
    """A relay database's method: runs inside its session's :meth:`~OutboxSession.lease` (one pooled connection
    for all its statements, a transaction's among them), directly without a pool."""

    @functools.wraps(method)
    def run_leased(self: Any, *args: Any, **kwargs: Any) -> Any:
        session = self.session
        if session.pool is None or session._leased is not None:
            return method(self, *args, **kwargs)
        with session.lease():
            return method(self, *args, **kwargs)

    run_leased.leased = True  # type: ignore[attr-defined]
    return run_leased  # type: ignore[return-value]
