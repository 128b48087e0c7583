"""The outbox's relay layout: relays that would split leadership never run on one outbox at once.

A *layout* is what decides which relays contend for the same leadership: ``shards`` and
``leaderElection`` (for ``neli`` also ``leaderGroupID`` and ``leaderTopic``). Relays of two layouts
each elect their own leaders (another leader topic, another group, a Postgres lock where the others
use Kafka), so both publish the outbox's rows: duplicates in at-least-once mode, nothing gained in
exactly-once mode. A rolling deploy that changes one of these settings would produce exactly that.

How liveness is known: every running relay holds, on a dedicated connection (``harvest-layout:<name>``
in ``pg_stat_activity``), a *shared* session-level advisory lock keyed by (outbox, layout). Postgres
releases it when the session ends, however the relay ends (stop, crash, kill -9, a terminated
backend), so a dead relay never blocks the next layout. ``<outbox>_harvest_layout`` (one row,
created by ``harvest init-db``) records the layout those relays have, for messages and operators.

Admission (:func:`admit`), in one transaction that locks the record row, so admissions are serial:
if a relay of another layout holds its lock, refuse (:class:`LayoutError`, naming both layouts and
the fix); otherwise take this layout's lock and record this layout. A relay that is refused exits
(the CLI with status 1): it never waits, because a relay of the new layout that waited would start
publishing the moment the old ones go, in the middle of a drain-then-change.

A running relay watches its layout session (a thread waits on the socket and checks it every
:data:`CHECK_INTERVAL`); when the session is lost it re-admits on a new one, and if another layout
was admitted meanwhile, the relay stops with that :class:`LayoutError` (:attr:`LayoutGuard.failure`).

Invariants (``tests/test_producer/relay/test_layout.py``):
- no relay admitted while a live relay of another layout holds its lock; the record holds the
  layout of the live relays whenever any is live;
- a layout's lock lives exactly as long as its relay's session: it is released by Postgres, never
  by a lease that could expire under a live relay.

Limits, documented: relays of an older harvest hold no layout lock (upgrade first, then change the
layout); behind a transaction-mode pooler the lock stays with the pooled server session (a crashed
relay's lock then lives until the pooler closes that server connection).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from dataclasses import dataclass
from typing import Protocol

import psycopg
from psycopg import sql

from harvest_outbox.producer._readable import readable
from harvest_outbox.producer.config import HarvestConfig
from harvest_outbox.producer.db import connect
from harvest_outbox.producer.election.lock_session import close_quietly
from harvest_outbox.producer.election.postgres import resolve_table
from harvest_outbox.producer.errors import DatabaseError, HarvestError, SchemaError
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.redact import redact_dsn, redact_error

log = logging.getLogger(__name__)

#: How often a running relay checks its layout session between the socket's own signals (a
#: terminated backend or a server restart makes the socket readable at once).
CHECK_INTERVAL = 5.0
#: How long a relay that lost its layout session waits between attempts to re-admit.
RETRY_INTERVAL = 1.0
_APP_PREFIX = "harvest-layout:"

_LIVE_SQL = (
    "SELECT l.objid::bigint, coalesce(a.application_name, '') FROM pg_locks l "
    "LEFT JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND l.classid = %s::bigint::oid AND l.objsubid = 2 AND l.granted"
)


class LayoutError(HarvestError):
    """Relays of another layout run on this outbox; the message names both layouts and the fix."""


def _key31(text: str) -> int:
    # 31 bits: pg_locks shows the two-int advisory key's parts as oid, which then read the same as int4.
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") & 0x7FFFFFFF


@dataclass(frozen=True)
class Layout:
    shards: int
    leader_election: str
    leader_group_id: str | None = None  # neli only: the group and topic are its election's identity
    leader_topic: str | None = None

    @classmethod
    def of(cls, config: HarvestConfig) -> Layout:
        if config.leader_election == "neli":
            return cls(config.shards, "neli", config.leader_group_id, config.leader_topic)
        return cls(config.shards, config.leader_election)

    @property
    def key(self) -> int:
        return _key31(
            f"harvest.layout\0{self.shards}\0{self.leader_election}\0{self.leader_group_id or ''}\0"
            f"{self.leader_topic or ''}"
        )

    def __str__(self) -> str:
        text = f"shards: {self.shards}, leaderElection: {self.leader_election}"
        if self.leader_group_id is not None:
            text += f" (leaderGroupID: {self.leader_group_id}, leaderTopic: {self.leader_topic})"
        return text


def namespace(qualified_table: str) -> int:
    """The first key of every layout lock of this outbox (``schema.table``, as resolved)."""
    return _key31(f"harvest.layout\0{qualified_table}")


def recorded_layout(conn: psycopg.Connection, names: OutboxNames, *, for_update: bool = False) -> Layout | None:
    """The layout of the outbox's relays as last recorded (None before the first relay started).
    ``for_update`` (in a transaction): lock the record's row, created if someone deleted it, so that
    admissions are serial."""
    lock = sql.SQL(" FOR UPDATE" if for_update else "")
    try:
        if for_update:
            conn.execute(
                sql.SQL("INSERT INTO {} (singleton) VALUES (true) ON CONFLICT DO NOTHING").format(names.layout)
            )
        row = conn.execute(
            sql.SQL("SELECT shards, leader_election, leader_group_id, leader_topic FROM {} WHERE singleton{}").format(
                names.layout, lock
            )
        ).fetchone()
    except psycopg.errors.UndefinedTable as exc:
        raise SchemaError(
            f"table {names.layout.as_string(conn)} (the layout of the relays running on the outbox, "
            f"which keeps relays of different shards or leaderElection from both publishing it) does "
            f"not exist: the outbox {names.display!r} was initialised by an older harvest. Fix: run "
            f"`harvest init-db` again (idempotent; it only adds what is missing)"
        ) from exc
    if row is None or row[0] is None:
        return None
    return Layout(int(row[0]), str(row[1]), row[2], row[3])


def live_relays(conn: psycopg.Connection, qualified_table: str) -> dict[int, list[str]]:
    """Layout key -> the names of the live relays holding that layout's lock on this outbox."""
    live: dict[int, list[str]] = {}
    for key, app in conn.execute(_LIVE_SQL, (namespace(qualified_table),)).fetchall():
        live.setdefault(int(key), []).append(app[len(_APP_PREFIX) :] if app.startswith(_APP_PREFIX) else "?")
    return live


def admit(conn: psycopg.Connection, outbox_table: str, layout: Layout, relay_name: str) -> str:
    """Admit a relay of ``layout`` on the session ``conn`` (module docstring): on success the session
    holds the layout's lock. Returns the outbox's resolved name. Raises :class:`LayoutError`."""
    names = OutboxNames.parse(outbox_table)
    table = resolve_table(conn, outbox_table)
    with conn.transaction():
        recorded = recorded_layout(conn, names, for_update=True)  # admissions queue here, one at a time
        others = {k: v for k, v in live_relays(conn, table).items() if k != layout.key}
        if others:
            raise LayoutError(_refusal(table, recorded, others, layout))
        conn.execute("SELECT pg_advisory_lock_shared(%s::int, %s::int)", (namespace(table), layout.key))
        if recorded != layout:
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET shards = %s, leader_election = %s, leader_group_id = %s, "
                    "leader_topic = %s, updated_by = %s, updated_at = now() WHERE singleton"
                ).format(names.layout),
                (layout.shards, layout.leader_election, layout.leader_group_id, layout.leader_topic, relay_name),
            )
    if recorded != layout:
        log.info(
            "%s: relay layout of %s is now %s (was %s; no relay of another layout runs)",
            relay_name,
            table,
            layout,
            recorded or "not recorded",
        )
    return table


def _refusal(table: str, recorded: Layout | None, others: dict[int, list[str]], mine: Layout) -> str:
    names = sorted(n for ns in others.values() for n in ns)
    theirs = str(recorded) if recorded is not None and recorded.key in others else "another layout (not recorded)"
    return (
        f"outbox {table} is being relayed by {len(names)} relay(s) with {theirs} ({', '.join(names)}); this "
        f"relay has {mine}. Relays of both layouts would each elect a leader and publish the same rows twice. "
        f"Fix: to change the layout, stop every running relay first, then start the relays with the new "
        f"settings (docs/sharding.md, Changing shards or leaderElection); otherwise give this relay the running relays' "
        f"settings"
    )


class SharedSession(Protocol):
    """Where a fleet's guards hold their locks (:class:`~producer.relay.layout_session.SharedLayoutSession`)."""

    def admit(self, guard: LayoutGuard) -> str: ...

    def release(self, guard: LayoutGuard) -> None: ...


class LayoutGuard:
    """A relay's admission and its layout session (module docstring). ``start()`` raises
    :class:`LayoutError` (refused), :class:`SchemaError` (no layout record) or ``DatabaseError``;
    :attr:`failure` is set when the session was lost and re-admission was refused."""

    def __init__(self, config: HarvestConfig, shared: SharedSession | None = None) -> None:
        self._dsn = config.data_source
        self.outbox_table = config.outbox_table
        self.layout = Layout.of(config)
        self.name = config.name
        #: A fleet's layout session of this database (producer/relay/layout_session.py), or None for a
        #: session of this relay's own.
        self._shared = shared
        #: Why this relay must stop (another layout was admitted while its session was gone).
        self.failure: HarvestError | None = None
        self._conn: psycopg.Connection | None = None
        self._stop = threading.Event()
        self._wake_r, self._wake_w = -1, -1
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._shared is not None:
            table = self._shared.admit(self)
            log.info("%s: admitted on %s with %s (shared layout session)", self.name, table, self.layout)
            return
        self._conn = self._admitted()
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._watch, name=f"harvest-layout-{self.name}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Release the layout lock (after the relay stopped publishing: the caller's last step)."""
        if self._shared is not None:
            self._shared.release(self)
            return
        self._stop.set()
        if self._wake_w >= 0:
            os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(CHECK_INTERVAL * 2)
            if self._thread.is_alive():
                log.warning("%s: layout thread did not stop; its lock goes with the process", self.name)
                return
        close_quietly(self._conn)
        self._conn = None
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1

    def _admitted(self) -> psycopg.Connection:
        conn = connect(self._dsn, application_name=f"{_APP_PREFIX}{self.name}"[:63])
        try:
            try:
                conn.execute("SET idle_session_timeout = 0")  # PostgreSQL 14+: the session is idle by design
            except psycopg.errors.UndefinedObject:
                pass
            table = admit(conn, self.outbox_table, self.layout, self.name)
        except psycopg.Error as exc:
            close_quietly(conn)
            raise DatabaseError(
                f"cannot check the relay layout ({redact_dsn(self._dsn)}): {redact_error(str(exc), self._dsn).strip()}"
            ) from exc
        except BaseException:
            close_quietly(conn)
            raise
        log.info("%s: admitted on %s with %s", self.name, table, self.layout)
        return conn

    def _watch(self) -> None:
        while not self._stop.is_set():
            conn = self._conn
            if conn is None:
                if self._stop.wait(RETRY_INTERVAL):
                    break
                try:
                    self._conn = self._admitted()
                except DatabaseError as exc:
                    log.warning("%s: cannot re-admit its relay layout yet: %s", self.name, exc)
                except HarvestError as exc:  # another layout was admitted while our session was gone
                    log.error("%s: %s", self.name, exc)
                    self.failure = exc
                    return
                continue
            try:
                readable([conn.fileno(), self._wake_r], CHECK_INTERVAL)
            except (OSError, ValueError):
                pass
            if self._stop.is_set():
                break
            try:
                conn.execute("SELECT 1")  # also reads whatever made the socket readable (FATAL, EOF)
            except psycopg.Error as exc:
                log.warning(
                    "%s: relay layout session lost (%s); re-admitting",
                    self.name,
                    redact_error(str(exc), self._dsn).strip() or type(exc).__name__,
                )
                close_quietly(conn)
                self._conn = None

    def __repr__(self) -> str:
        return f"LayoutGuard(name={self.name!r}, layout={str(self.layout)!r})"
