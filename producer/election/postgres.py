"""Leader election through the outbox's own Postgres: a session-level advisory lock (FOLIO's
"lock in the database" idea), behind the :class:`~producer.election.neli.LeaderElection` protocol.

Whoever holds ``pg_try_advisory_lock(key)`` on its dedicated election connection is the leader.
``key`` is a 64-bit hash of ``"harvest.leader\\0<schema>.<table>"`` (the outbox's resolved, schema
-qualified name), so every relay of one outbox contends for one lock, relays of different outboxes
never do, and the key is very unlikely to meet another application's advisory locks (64 bits, a
namespace prefix). Postgres releases it when the holder's session ends: graceful close, process
death (the kernel closes the socket; on loopback or a reachable host the backend sees EOF at once),
``pg_terminate_backend``, a server restart, or the server's TCP keepalives giving up on a
partitioned client.

**Why an advisory lock, not ``SELECT … FOR UPDATE`` on a lock row** (the FOLIO proposal's
``internal_lock``). Both are released by Postgres when the session dies. But a row lock only lives
as long as its *transaction*, so a relay that leads for days must keep one transaction open for
days:

- an open transaction that locked a row has an xid, and every xid still running holds back the
  database-wide xmin horizon: VACUUM cannot remove *any* row deleted after it started, in any table
  — first of all the outbox itself, which is a delete-heavy queue (``tests/test_producer/
  test_election_postgres.py::test_for_update_lock_row_pins_vacuum`` shows the dead outbox rows
  "dead but not yet removable" while the row lock is held, and removed while the advisory lock is);
  held long enough it also ages ``datfrozenxid`` toward wraparound;
- it is ``idle in transaction``, which ``idle_in_transaction_session_timeout`` (common in managed
  Postgres and sane DBA defaults) kills — leadership would flap every timeout
  (``test_for_update_lock_row_killed_by_idle_in_transaction_timeout``); monitoring that alerts on
  long transactions fires forever; DDL on the lock table waits behind it;
- it needs a lock table and row to exist (schema, migrations, grants).

An advisory lock is held by the *session*, outside any transaction: the election connection runs in
autocommit and is idle between checks, with no xid and no snapshot, so it pins nothing and is
immune to ``idle_in_transaction_session_timeout``. Its caveats, documented rather than hidden: the
election connection must be a real session (direct, or PgBouncer in *session* mode — a transaction-
mode pooler would hand the locked server session to other clients; the per-check verification below
compares the backend pid and fences if the session moved to another backend), and
the advisory key space is shared by the database (hence the 64-bit namespaced key).

**Detecting loss, fencing first.** A background thread owns the dedicated connection (libpq TCP
keepalives, ``tcp_user_timeout``, ``connect_timeout``; session ``statement_timeout``; session
``idle_session_timeout`` / ``idle_in_transaction_session_timeout`` switched off; server-side
``tcp_keepalives_*`` / ``tcp_user_timeout`` set so the *server* gives up on a silent client only
after more than one lease). Every ``check_interval`` the holder verifies, with one cheap query,
that ``pg_locks`` shows the lock granted to its own backend pid (the pid it acquired with). Between
checks the thread waits on the socket, so anything the server sends unasked — the FATAL of
``pg_terminate_backend``, EOF of a restart — triggers a check at once. ``pulse()`` (relay thread,
cheap: no I/O) reports leadership only while the last *successful* verification started less than
``lease`` (default 2 × ``check_interval``) ago and the connection has not failed; otherwise it calls
``on_fenced`` and the relay stops publishing. The thread may be stuck on a dead socket; the lease
check does not depend on it returning.

**The window, stated honestly.** No client can learn instantly that the server dropped its session,
so there is a short interval in which the old holder may still publish while a standby already
holds the lock:

- the server ends the session itself (``pg_terminate_backend``, restart) while the network works:
  the holder's socket becomes readable, the thread's check fails within milliseconds, and the relay
  stops at its next ``pulse()``; a standby polls every ``check_interval``, so it usually acquires
  after the holder fenced, but the bound is only "one check interval (+ the relay's pulse period)";
- a network partition: the server keeps the session until its keepalives give up
  (≥ ``lease`` + a few seconds, set per session), while the holder's checks stop succeeding and it
  fences after ``lease`` — *before* the server can release the lock;
- the holder is paused (SIGSTOP, a long GC/VM freeze): its kernel keeps the TCP connection alive, so
  the server keeps the lock and **no standby can acquire** while it is paused; the paused holder
  keeps leadership until it resumes (its lease has then expired: it fences at its first pulse, and
  re-acquires — as a new leader view — if its session still holds the lock) or its connection dies.
  A paused relay thread that resumes mid-tick can publish a few records before its next pulse, as
  with NELI.

So in at-least-once mode the worst case is a few duplicates (never a loss: rows are deleted only
after delivery); in ``--uuid-sequencing`` mode every acquisition is a new view that bumps the DB
fence epoch, so a stale holder's commit is refused and readers never see its records — the window
is harmless there.

Events are NELI's: ``on_acquired`` when the lock is won (and after a fence, when verification
succeeds again on the same session: the relay starts a new view); ``on_fenced`` on any loss or lease
expiry; ``on_revoked`` on :meth:`close`, which reports revocation (the relay drains) *before* it
unlocks, then ``pg_notify``\\ s the standbys (they LISTEN on the election connection), so a graceful
hand-over takes milliseconds, not a poll interval. The NOTIFY can reach a standby while one of its
own checks is in flight; libpq then reads it with the check's reply, off the socket the thread waits
on, so a notify handler records it and the standby checks again at once. Standbys otherwise poll
``pg_try_advisory_lock`` every ``check_interval``: database load is one idle connection and one
trivial query per check interval per relay.

Connection settings the election sets on its own connection (overriding the DSN's, for this
connection only): ``keepalives=1``, ``keepalives_idle=ceil(check_interval)``, ``keepalives_interval=1``,
``keepalives_count=3``, ``tcp_user_timeout=lease``, ``connect_timeout=max(2, lease)`` s,
``application_name=harvest-election:<name>`` (so ``pg_stat_activity`` shows who leads; see also
:func:`lock_holder`). With a multi-host DSN, add ``target_session_attrs=read-write`` so that after a
database failover the relays contend on the new primary (advisory locks are not replicated; the old
primary's sessions are gone, so holders fence and standbys acquire there).

Invariant: the DSN (which may carry a password) is never logged or put in an error unredacted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

import psycopg

from harvest_outbox.producer.election.advisory_lock import (
    MEMBERS_SQL,
    election_connection,
    key_parts,
    listen_for_others,
    lock_holder,
    lock_key,
    members_namespace,
    resolve_table,
    sharded_members,
)
from harvest_outbox.producer.election.lock_session import LockSession, close_quietly
from harvest_outbox.producer.election.neli import ElectionListener
from harvest_outbox.producer.errors import ElectionError
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.redact import redact_dsn, redact_error

# The advisory lock's key, holder and connection (election/advisory_lock.py) are re-exported: their import path
# before they had a module of their own.
__all__ = [
    "MEMBERS_SQL",
    "PostgresElection",
    "election_connection",
    "key_parts",
    "listen_for_others",
    "lock_holder",
    "lock_key",
    "members_namespace",
    "resolve_table",
    "sharded_members",
]

log = logging.getLogger(__name__)

#: Checks in a row a held-back standby (``may_acquire``) sees nobody holding the lock before it takes it
#: anyway: an outbox never stays unled because every process thinks it has its share.
UNLED_CHECKS = 3
_HELD_SQL = (
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND classid = %s::bigint::oid AND objid = %s::bigint::oid AND objsubid = 1 AND granted)"
)
_CHECK_SQL = (
    "SELECT pg_backend_pid(), EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND classid = %s::bigint::oid AND objid = %s::bigint::oid AND objsubid = 1 "
    "AND pid = pg_backend_pid() AND granted)"
)


class LeasedElection(Protocol):
    """What :func:`leased_pulse` and :func:`revoke_first` keep of an election whose lock a thread verifies."""

    name: str
    _leader: bool
    _seen_generation: int
    _closed: bool
    _listener: ElectionListener | None

    @property
    def lease(self) -> float: ...

    def _holding_line(self) -> str: ...


def leased_pulse(election: LeasedElection, state: Callable[[], tuple[bool, int, float]]) -> bool:
    """An election's pulse (no I/O): leader while the lock's last verification (``state()``: held,
    generation, verified at) started less than the lease ago in the same acquisition; fences otherwise,
    and reports a new acquisition as a new leadership."""
    listener = election._listener
    if election._closed or listener is None:
        return election._leader
    now = time.monotonic()
    held, generation, verified_at = state()
    should = held and now - verified_at <= election.lease
    if election._leader and (not should or generation != election._seen_generation):
        election._leader = False
        why = (
            "lock lost"
            if generation != election._seen_generation or not held
            else f"lock not verified for {now - verified_at:.2f}s (lease {election.lease:g}s)"
        )
        log.warning("%s: %s: fenced", election.name, why)
        listener.on_fenced()
    if not election._leader and should:
        election._leader = True
        election._seen_generation = generation
        log.info("%s: %s: leader", election.name, election._holding_line())
        listener.on_acquired()
    return election._leader


def revoke_first(election: LeasedElection) -> bool:
    """``close()``'s first half: report revocation (the relay drains) before the lock is let go; False
    when the election was closed already."""
    if election._closed:
        return False
    election._closed = True
    if election._leader:
        election._leader = False
        if election._listener is not None:
            election._listener.on_revoked()
    return True


class PostgresElection(LockSession):
    """Leader election by a session-level advisory lock on a dedicated connection (module docstring).

    ``check_interval``: how often the holder verifies the lock and standbys try to take it.
    ``lease``: the holder fences when its last successful verification started longer ago than this
    (default 2 × ``check_interval``). ``statement_timeout`` (default ``check_interval``, at least
    100 ms) and ``connect_timeout`` (default ``max(2, lease)`` s; libpq's minimum is 2 s) bound the
    election thread's calls. The thread and its connection are :class:`~.lock_session.LockSession`'s.
    """

    _KIND = "leader election"
    _THREAD_PREFIX = "harvest-election"
    _STUCK = "%s: election thread did not stop; the lock is released when the process exits"
    _log = log

    def __init__(
        self,
        dsn: str,
        outbox_table: str,
        name: str,
        *,
        check_interval: float = 1.0,
        lease: float | None = None,
        statement_timeout: float | None = None,
        connect_timeout: float | None = None,
        may_acquire: Callable[[], bool] | None = None,
    ) -> None:
        if check_interval <= 0:
            raise ElectionError(f"leader lock check interval must be > 0, got {check_interval!r}")
        self._dsn = dsn
        self._outbox_table = outbox_table
        OutboxNames.parse(outbox_table)  # validate early (ConfigError)
        self.name = name
        self.check_interval = check_interval
        self.lease = lease if lease is not None else 2 * check_interval
        if self.lease < check_interval:
            raise ElectionError(f"leader lock lease ({self.lease}s) must be >= the check interval ({check_interval}s)")
        self.statement_timeout = statement_timeout if statement_timeout is not None else max(0.1, check_interval)
        self.connect_timeout = connect_timeout if connect_timeout is not None else max(2.0, self.lease)
        self.key: int | None = None
        self.channel = ""
        self._listener: ElectionListener | None = None
        self._leader = False
        self._init_session()
        # shared with the election thread (guarded by _mu)
        self._held = False
        self._verified_at = 0.0  # monotonic start of the last successful verification while held
        self._generation = 0  # +1 per acquisition of the lock (new session or re-lock)
        self._seen_generation = 0
        self.backend_pid: int | None = None  # the election connection's backend (tests, diagnostics)
        #: A fleet's balance (producer/fleet/balance.py): while it says no, this standby leaves the lock to
        #: the others, unless nobody has taken it for UNLED_CHECKS checks in a row.
        self._may_acquire = may_acquire
        self._unled_checks = 0

    # ------------------------------------------------------------------ protocol
    @property
    def is_leader(self) -> bool:
        return self._leader

    def start(self, listener: ElectionListener) -> None:
        self._listener = listener
        self._start()

    def pulse(self) -> bool:
        """No I/O: compares the election thread's last verification with the lease."""
        return leased_pulse(self, self._lock_state)

    def _lock_state(self) -> tuple[bool, int, float]:
        with self._mu:
            return self._held, self._generation, self._verified_at

    def _holding_line(self) -> str:
        return f"holding the Postgres leader lock of {self._outbox_table} (backend pid {self.backend_pid})"

    def close(self) -> None:
        """Report revocation (the relay drains) *before* releasing the lock; then unlock and notify."""
        if revoke_first(self):
            self._stop_thread()

    # ------------------------------------------------------------------ election thread
    def _connect(self) -> None:
        conn = election_connection(
            self._dsn, self.name, self.check_interval, self.lease, self.connect_timeout, self.statement_timeout
        )
        try:
            if self.key is None:
                table = resolve_table(conn, self._outbox_table)
                self.key = lock_key(table)
                self.channel = f"harvest_leader_{self.key & 0xFFFFFFFFFFFFFFFF:016x}"
                log.info(
                    "%s: Postgres leader election on %s (advisory lock key %d, check every %gs, lease %gs)",
                    self.name,
                    table,
                    self.key,
                    self.check_interval,
                    self.lease,
                )
                self._refuse_sharded_relays(conn, table)
            pid = listen_for_others(conn, self.channel, self._on_notify)
        except BaseException:
            conn.close()
            raise
        self._conn, self._pid = conn, pid
        self.backend_pid = self._pid

    def _refuse_sharded_relays(self, conn: psycopg.Connection, table: str) -> None:
        """Sharded relays (``shards: S``) of this outbox hold membership locks; an unsharded relay
        leading next to them would publish their shards' rows too."""
        members = sharded_members(conn, table)
        if members:
            raise ElectionError(
                f"sharded relays run on {table} ({', '.join(f'{n} with shards: {s}' for s, n in members)}); this "
                f"one has shards: 1. Changing shards on a live outbox is drain-then-change: stop every relay, change "
                f"shards, run `harvest init-db`, start the relays (docs/sharding.md)"
            )

    def _on_notify(self) -> None:
        # Often inside one of our own checks (a leader let go while it was in flight): this flag is
        # then the only trace of the hand-over (listen_for_others).
        self._notified = True

    def _drop(self, why: str) -> None:
        with self._mu:
            was_held = self._held
            self._held = False
        if was_held:
            log.warning("%s: Postgres leader lock connection failed (%s): lock considered lost", self.name, why)
        else:
            log.info("%s: Postgres election connection failed (%s); reconnecting", self.name, why)
        close_quietly(self._conn)
        self._conn = None

    def _step(self) -> None:
        """One check: verify (holder) or try to acquire (standby). Errors drop the connection."""
        conn = self._connected()
        if conn is None:
            return
        assert self.key is not None
        started = time.monotonic()
        try:
            with self._mu:
                held = self._held
            if held:
                classid, objid = key_parts(self.key)
                row = conn.execute(_CHECK_SQL, (classid, objid)).fetchone()
                ok = row is not None and bool(row[1]) and int(row[0]) == self._pid
                if ok:
                    with self._mu:
                        self._verified_at = started
                else:
                    self._drop(
                        f"backend pid {row[0] if row else '?'} does not hold the lock (pooler in transaction mode?)"
                    )
            else:
                if self._may_acquire is not None and not self._may_acquire():
                    classid, objid = key_parts(self.key)
                    held_by_someone = conn.execute(_HELD_SQL, (classid, objid)).fetchone()
                    self._unled_checks = 0 if held_by_someone and held_by_someone[0] else self._unled_checks + 1
                    if self._unled_checks < UNLED_CHECKS:
                        return
                self._unled_checks = 0
                row = conn.execute("SELECT pg_try_advisory_lock(%s), pg_backend_pid()", (self.key,)).fetchone()
                if row is not None and row[0]:
                    if int(row[1]) != self._pid:
                        self._drop("backend pid changed (pooler in transaction mode?)")
                        return
                    with self._mu:
                        self._held = True
                        self._verified_at = started
                        self._generation += 1
        except psycopg.Error as exc:
            self._drop(redact_error(str(exc), self._dsn).strip() or type(exc).__name__)

    def _look_again(self) -> bool:
        # A standby's check read a NOTIFY with its reply: the lock may have been let go after the
        # check was answered. Look again now (one extra query per hand-over when it was the very
        # notification that woke us) instead of after check_interval.
        with self._mu:
            held = self._held
        return self._notified and not held

    def _release(self) -> None:
        conn = self._conn
        self._conn = None
        if conn is None:
            return
        with self._mu:
            held = self._held
            self._held = False
        if held and self.key is not None:
            self._unlock_and_close(
                conn,
                "SELECT pg_advisory_unlock(%s), pg_notify(%s, %s)",
                (self.key, self.channel, self.name),
                "released the Postgres leader lock",
            )
        else:
            close_quietly(conn)

    def __repr__(self) -> str:
        return (
            f"PostgresElection(dsn={redact_dsn(self._dsn)!r}, outbox_table={self._outbox_table!r}, "
            f"name={self.name!r}, check_interval={self.check_interval!r}, lease={self.lease!r})"
        )
