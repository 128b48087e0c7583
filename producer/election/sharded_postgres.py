"""Shard leadership through the outbox's own Postgres (``leaderElection: postgres``, ``shards: S``).

Each relay keeps one election connection (the same settings, keepalives and lease as the unsharded
:class:`~producer.election.postgres.PostgresElection`) holding:

- a **membership lock**: ``pg_advisory_lock_shared(ns, S)`` (two-int form; ``ns`` a 31-bit hash of
  the outbox's resolved name). Shared locks do not conflict, so every live relay holds it, and
  ``pg_locks`` counts the live relays of this sharding. A relay whose session dies drops out of the
  count the moment Postgres ends the session. The same lock with another S means relays of
  another shard count run on this outbox: a relay refuses to start then (changing ``shards`` is
  drain-then-change, docs/sharding.md);
- one **shard lock** per shard it leads: ``pg_try_advisory_lock(key)``, ``key`` a 64-bit hash of
  the outbox name, S and the shard index.

**Spreading.** Every ``check_interval`` (and at once on a NOTIFY: a relay joined, left or let a shard
go) each relay reads the live relay count n and the shard locks' holders. A relay holding more than
``ceil(S / n)`` shards lets the surplus go (its relay loops drain first, then it unlocks and notifies);
a relay holding fewer tries to lock free shards, starting at a random one, up to ``ceil(S / n)``. So
once stable no relay leads more than ``ceil(S / n)`` shards, a dead relay's shards are taken by
the others within a check interval of its session ending, and nobody takes them all while others
live. Failing a verification (or the lease expiring, as unsharded) fences every shard the relay
leads; shards whose locks are still held when verification succeeds again are led anew (new views).
"""

from __future__ import annotations

import logging
import random
import time

import psycopg

from harvest_outbox.producer.election.lock_session import LockSession, close_quietly
from harvest_outbox.producer.election.postgres import (
    MEMBERS_SQL,
    election_connection,
    key_parts,
    listen_for_others,
    lock_key,
    members_namespace,
    resolve_table,
)
from harvest_outbox.producer.election.sharded_neli import ShardListener, fair_share
from harvest_outbox.producer.errors import ElectionError
from harvest_outbox.redact import redact_dsn, redact_error

log = logging.getLogger(__name__)

# Holders of bigint-keyed advisory locks (the shard locks are among them).
_DB = "database = (SELECT oid FROM pg_database WHERE datname = current_database())"
_HOLDERS_SQL = (
    f"SELECT classid::bigint, objid::bigint, pid, pid = pg_backend_pid() FROM pg_locks "
    f"WHERE locktype = 'advisory' AND {_DB} AND objsubid = 1 AND granted "
    f"AND (classid::bigint, objid::bigint) IN (SELECT * FROM unnest(%s::bigint[], %s::bigint[]))"
)


def shard_lock_key(qualified_table: str, count: int, index: int) -> int:
    return lock_key(f"{qualified_table}\0shard {index}/{count}")


class PostgresShardElection(LockSession):
    """See the module docstring. Callbacks run on the thread calling :meth:`pulse` / :meth:`close`. The
    thread and its connection are :class:`~.lock_session.LockSession`'s."""

    _KIND = "shard election"
    _THREAD_PREFIX = "harvest-shard-election"
    _STUCK = "%s: shard election thread did not stop; its locks go with the process"
    _log = log

    def __init__(
        self,
        dsn: str,
        outbox_table: str,
        name: str,
        shards: int,
        *,
        check_interval: float = 1.0,
        lease: float | None = None,
    ) -> None:
        self._dsn = dsn
        self._outbox_table = outbox_table
        self.name, self.shards = name, shards
        self.check_interval = check_interval
        self.lease = lease if lease is not None else 2 * check_interval
        self.statement_timeout = max(0.1, check_interval)
        self.connect_timeout = max(2.0, self.lease)
        self.table = ""
        self.namespace = 0
        self.channel = ""
        self._keys: list[int] = []
        self._listener: ShardListener | None = None
        self._leading: set[int] = set()
        self._init_session()
        # shared with the election thread (guarded by _mu)
        self._held: dict[int, int] = {}  # shard -> generation it was locked in
        self._surplus: set[int] = set()  # held shards to let go (pulse drains them, then asks to unlock)
        self._unlock: set[int] = set()  # drained shards for the thread to unlock
        self._verified_at = 0.0
        self._generation = 0
        self.members = 0
        self._seen: dict[int, int] = {}  # shard -> generation pulse last acquired (pulse thread only)

    @property
    def led(self) -> frozenset[int]:
        return frozenset(self._leading)

    def start(self, listener: ShardListener) -> None:
        self._listener = listener
        self._start()  # fails fast: bad DSN, unreachable database, another sharding running

    # ------------------------------------------------------------------ pulse (relay supervisor thread)
    def pulse(self) -> None:
        if self._closed or self._listener is None:
            return
        now = time.monotonic()
        with self._mu:
            held, surplus, verified_at = dict(self._held), set(self._surplus), self._verified_at
        fresh = now - verified_at <= self.lease
        lost = {k for k in self._leading if not fresh or held.get(k) != self._seen.get(k)}
        if lost:
            why = "lock lost" if fresh else f"lock not verified for {now - verified_at:.2f}s (lease {self.lease:g}s)"
            self._lose(lost, f"fenced: {why}")
        self._lose(surplus & self._leading, "rebalanced")
        if fresh:
            new = {k for k in held if k not in self._leading and k not in surplus}
            if new:
                for k in new:
                    self._seen[k] = held[k]
                self._leading |= new
                log.info(
                    "%s: leads shard(s) %s of %d (Postgres locks)",
                    self.name,
                    ",".join(map(str, sorted(new))),
                    self.shards,
                )
                self._listener.on_shards_acquired(frozenset(new))
        # Shards the thread wants gone and pulse no longer leads are drained: unlock them.
        done = {k for k in surplus if k not in self._leading}
        if done:
            with self._mu:
                self._unlock |= done
            self._wake()

    def _lose(self, indices: set[int], why: str) -> None:
        gone = frozenset(indices) & self._leading
        if not gone:
            return
        self._leading -= gone
        log.info(
            "%s: no longer leads shard(s) %s of %d (%s)", self.name, ",".join(map(str, sorted(gone))), self.shards, why
        )
        assert self._listener is not None
        self._listener.on_shards_lost(gone, why)

    def close(self) -> None:
        if self._closed:
            return
        self._lose(set(self._leading), "stopping")
        self._closed = True
        self._stop_thread()

    # ------------------------------------------------------------------ election thread
    def _connect(self) -> None:
        conn = election_connection(
            self._dsn, self.name, self.check_interval, self.lease, self.connect_timeout, self.statement_timeout
        )
        try:
            if not self.table:
                self.table = resolve_table(conn, self._outbox_table)
                self.namespace = members_namespace(self.table)
                self._keys = [shard_lock_key(self.table, self.shards, k) for k in range(self.shards)]
                self.channel = f"harvest_shards_{self.namespace:08x}"
                log.info(
                    "%s: Postgres shard election on %s (%d shards, check every %gs, lease %gs)",
                    self.name,
                    self.table,
                    self.shards,
                    self.check_interval,
                    self.lease,
                )
            conn.execute("SELECT pg_advisory_lock_shared(%s::int, %s::int)", (self.namespace, self.shards))
            others = [
                (int(s), int(n))
                for s, n in conn.execute(MEMBERS_SQL, (self.namespace,)).fetchall()
                if int(s) != self.shards
            ]
            unsharded = conn.execute(
                _HOLDERS_SQL, ([key_parts(lock_key(self.table))[0]], [key_parts(lock_key(self.table))[1]])
            ).fetchone()
            if unsharded is not None:
                raise ElectionError(
                    f"an unsharded relay (shards: 1, backend pid {unsharded[2]}) leads {self.table}; this one has "
                    f"shards: {self.shards}. Changing shards on a live outbox is drain-then-change: stop every relay, "
                    f"change shards, run `harvest init-db`, start the relays (docs/sharding.md)"
                )
            if others:
                raise ElectionError(
                    f"relays with another shard count run on {self.table}: "
                    f"{', '.join(f'{n} relay(s) with shards: {s}' for s, n in others)}; this one has shards: "
                    f"{self.shards}. Changing shards on a live outbox is drain-then-change: stop every relay, change "
                    f"shards, run `harvest init-db`, start the relays (docs/sharding.md)"
                )
            pid = listen_for_others(conn, self.channel, self._on_notify)
            conn.execute("SELECT pg_notify(%s, %s)", (self.channel, self.name))  # others re-spread now
        except BaseException:
            conn.close()
            raise
        self._conn, self._pid = conn, pid

    def _on_notify(self) -> None:
        # Another relay joined, left or let a shard go; often read inside one of our own checks, whose
        # socket then never turns readable for it (listen_for_others).
        self._notified = True

    def _drop(self, why: str) -> None:
        with self._mu:
            had = sorted(self._held)
            self._held.clear()
            self._surplus.clear()
            self._unlock.clear()
        if had:
            log.warning(
                "%s: shard election connection failed (%s): shard locks %s considered lost", self.name, why, had
            )
        else:
            log.info("%s: shard election connection failed (%s); reconnecting", self.name, why)
        close_quietly(self._conn)
        self._conn = None

    def _step(self) -> None:
        conn = self._connected()
        if conn is None:
            return
        started = time.monotonic()
        try:
            with self._mu:
                unlock = set(self._unlock)
                self._unlock.clear()
            for k in sorted(unlock):
                conn.execute("SELECT pg_advisory_unlock(%s)", (self._keys[k],))
                with self._mu:
                    self._held.pop(k, None)
                    self._surplus.discard(k)
                log.info("%s: let shard %d/%d go", self.name, k, self.shards)
            if unlock:
                conn.execute("SELECT pg_notify(%s, %s)", (self.channel, self.name))
            members = sum(
                int(n) for s, n in conn.execute(MEMBERS_SQL, (self.namespace,)).fetchall() if int(s) == self.shards
            )
            parts = [key_parts(key) for key in self._keys]
            holders = conn.execute(_HOLDERS_SQL, ([c for c, _ in parts], [o for _, o in parts])).fetchall()
            by_part = {(int(c), int(o)): bool(mine) for c, o, _pid, mine in holders}
            mine = {k for k, p in enumerate(parts) if by_part.get(p) is True}
            free = [k for k, p in enumerate(parts) if p not in by_part]
            with self._mu:
                lost = set(self._held) - mine
                for k in lost:  # the session no longer holds it (pooler, terminated backend): fence
                    del self._held[k]
                self._verified_at = started
                self.members = members
                target = fair_share(self.shards, members)
                keeping = [k for k in sorted(self._held) if k not in self._surplus]
                if len(keeping) > target:
                    self._surplus |= set(keeping[target:])
                want = target - len(keeping)
            if lost:
                log.warning("%s: shard lock(s) %s no longer held by this session", self.name, sorted(lost))
            if want > 0 and free:
                start = random.randrange(len(free))
                for k in free[start:] + free[:start]:
                    if want <= 0:
                        break
                    row = conn.execute("SELECT pg_try_advisory_lock(%s), pg_backend_pid()", (self._keys[k],)).fetchone()
                    if row is None or not row[0]:
                        continue
                    if int(row[1]) != self._pid:
                        self._drop("backend pid changed (pooler in transaction mode?)")
                        return
                    with self._mu:
                        self._generation += 1
                        self._held[k] = self._generation
                    want -= 1
        except psycopg.Error as exc:
            self._drop(redact_error(str(exc), self._dsn).strip() or type(exc).__name__)

    def _check_now(self) -> bool:
        with self._mu:
            return bool(self._unlock)  # drained shards to unlock: do not wait for the interval

    def _release(self) -> None:
        conn = self._conn
        self._conn = None
        with self._mu:
            self._held.clear()
        if conn is None:
            return
        self._unlock_and_close(
            conn,
            "SELECT pg_advisory_unlock_all(), pg_notify(%s, %s)",
            (self.channel, self.name),
            "released its shard locks",
        )

    def __repr__(self) -> str:
        return (
            f"PostgresShardElection(dsn={redact_dsn(self._dsn)!r}, outbox_table={self._outbox_table!r}, "
            f"name={self.name!r}, shards={self.shards!r}, check_interval={self.check_interval!r})"
        )
