"""Application writers with a verifiable ground truth, for the demo, the fault suite and benchmarks.

Each writer runs application transactions: lock a business row ``accounts(key)``, bump its
``version``, and stash one outbox message ``{"key": k, "version": v}`` for that key, in the same
transaction. The row lock serializes writers of one key, as a real application serializes changes
to one aggregate, so per key the committed versions are exactly 1..N in commit order. Some
transactions roll back (their version bump and message vanish together); some are held open for a
while (long-running), so rows commit out of id order.

A backlog (:func:`stash_backlog`) is the same thing in bulk: one transaction bumps every key's
version by its share of the rows and stashes the messages with ``Stasher.stash_many`` (COPY), as a
batch import or a relay outage would leave them; the relay then drains it as fast as it can.

Invariant: ``accounts`` holds, per key, the number N of committed messages for that key, and the
committed messages for that key carry versions 1..N; nothing else is ever committed.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

log = logging.getLogger(__name__)


@dataclass
class WriterStats:
    committed: int = 0
    rolled_back: int = 0
    long_running: int = 0
    interrupted: int = 0  # transactions cut off by a database restart (outcome read back from the DB)
    commit_times: list[float] = field(default_factory=list)  # monotonic time of each committed row


def create_accounts(dsn: str, schema: str, keys: int) -> None:
    table = sql.Identifier(schema, "accounts")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (key text PRIMARY KEY, version bigint NOT NULL)").format(table)
        )
        conn.execute(
            sql.SQL("INSERT INTO {} SELECT 'key-' || g, 0 FROM generate_series(0, %s) g ON CONFLICT DO NOTHING").format(
                table
            ),
            (keys - 1,),
        )


@dataclass(frozen=True)
class Backlog:
    rows: int
    committed_at: float  # time.time() right after the commit
    committed_mono: float  # time.monotonic() at the same moment


def stash_backlog(
    dsn: str, schema: str, outbox_table: str, topic: str, keys: int, rows: int, analyze: bool = True
) -> Backlog:
    """Commit ``rows`` messages over the keys ``key-0 .. key-{keys-1}`` in one transaction.

    Each key's version is bumped by its share of the rows (under the row lock, in the writers' key
    order, so running writers cannot deadlock with it) and its messages carry the next versions in
    ascending order; keys are interleaved round-robin, as many independent aggregates would be.
    Backlog messages have ``"ts": null`` (they are not stamped when written: their wait in the
    backlog is the point, not a latency) and the header ``phase: backlog``.

    ``analyze``: ``ANALYZE`` the outbox in the same transaction, before the commit, as Postgres
    advises after a bulk load. Without it the planner may still hold the statistics of a nearly
    empty outbox (autoanalyze ran during a quiet spell) and plan the relay's mark query
    (``UPDATE … WHERE id IN (SELECT … LIMIT n)``) as a nested loop that re-runs the subquery per
    outbox row: quadratic, minutes for a 100k-row backlog. Before the commit, so that the relay's
    first mark already plans with the new row count."""
    if rows < 1 or keys < 1:
        raise ValueError(f"stash_backlog: rows={rows!r} and keys={keys!r} must both be at least 1")
    names = sorted(f"key-{i}" for i in range(keys))
    share = {k: rows // keys + (1 if i < rows % keys else 0) for i, k in enumerate(names)}
    bump = sql.SQL("UPDATE {} SET version = version + %s WHERE key = %s RETURNING version").format(
        sql.Identifier(schema, "accounts")
    )
    with psycopg.connect(dsn) as conn:
        first: dict[str, int] = {}
        for key in names:
            if share[key]:
                row = conn.execute(bump, (share[key], key)).fetchone()
                if row is None:
                    raise ValueError(
                        f"stash_backlog: {key!r} is not in {schema}.accounts; create_accounts() "
                        f"with at least {keys} keys first"
                    )
                first[key] = int(row[0]) - share[key] + 1
        records = [
            OutboxRecord(
                topic,
                key,
                json.dumps({"key": key, "version": first[key] + j, "ts": None}),
                headers=(("phase", "backlog"),),
            )
            for j in range(max(share.values()))
            for key in names
            if j < share[key]
        ]
        stasher = Stasher(outbox_table)
        stasher.stash_many(conn, records)
        if analyze:
            conn.execute(sql.SQL("ANALYZE {}").format(stasher.names.outbox))
        conn.commit()
        return Backlog(len(records), time.time(), time.monotonic())


def committed_versions(dsn: str, schema: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT key, version FROM {}").format(sql.Identifier(schema, "accounts"))
        ).fetchall()
    return {k: int(v) for k, v in rows if v}


class Writers:
    """``threads`` concurrent writers, ``rows`` messages in all (or fewer: :meth:`stop`), then they stop."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        outbox_table: str,
        topic: str,
        keys: int,
        rows: int,
        threads: int = 4,
        rollback_rate: float = 0.1,
        long_txn_rate: float = 0.02,
        rate_per_s: float | None = None,
        seed: int = 1,
    ) -> None:
        self.dsn, self.schema, self.topic, self.keys = dsn, schema, topic, keys
        self.rows, self.threads = rows, threads
        self.rollback_rate, self.long_txn_rate = rollback_rate, long_txn_rate
        self.rate_per_s = rate_per_s
        self.seed = seed
        self.stasher = Stasher(outbox_table)
        self.stats = WriterStats()
        self._lock = threading.Lock()
        self._issued = 0
        self._workers: list[threading.Thread] = []
        self._errors: list[BaseException] = []
        self._started = 0.0
        self._stopped = False

    def start(self) -> Writers:
        self._started = time.monotonic()
        for i in range(self.threads):
            t = threading.Thread(
                target=self._run, args=(random.Random(self.seed * 1000 + i),), name=f"writer-{i}", daemon=True
            )
            t.start()
            self._workers.append(t)
        return self

    def join(self, timeout: float | None = None) -> WriterStats:
        for t in self._workers:
            t.join(timeout)
        if self._errors:
            raise RuntimeError(f"writer failed: {self._errors[0]!r}") from self._errors[0]
        return self.stats

    def stop(self) -> None:
        """Start no more transactions (those in flight finish); :meth:`join` waits for them."""
        with self._lock:
            self._stopped = True

    @property
    def done(self) -> bool:
        return all(not t.is_alive() for t in self._workers)

    def _claim(self, n: int) -> int:
        with self._lock:
            if self._stopped:
                return 0
            n = min(n, self.rows - self._issued)
            self._issued += max(n, 0)
            return n

    def _run(self, rng: random.Random) -> None:
        try:
            while self._issued < self.rows and not self._stopped:
                try:
                    self._session(rng)
                    return
                except psycopg.OperationalError as exc:
                    # The database went away (a restart in a fault run). The transaction in flight
                    # may or may not have committed: the ground truth is read back from `accounts`.
                    log.info("writer reconnecting after: %s", exc)
                    with self._lock:
                        self.stats.interrupted += 1
                    time.sleep(0.5)
        except BaseException as exc:  # reported by join()
            self._errors.append(exc)

    def _session(self, rng: random.Random) -> None:
        accounts = sql.Identifier(self.schema, "accounts")
        bump = sql.SQL("UPDATE {} SET version = version + 1 WHERE key = %s RETURNING version").format(accounts)
        with psycopg.connect(self.dsn, connect_timeout=5) as conn:
            while (n := self._claim(rng.randint(1, 5))) > 0:
                try:
                    committed = self._transaction(conn, rng, bump, n)
                except BaseException:
                    with self._lock:
                        self._issued -= n
                    raise
                with self._lock:
                    self._issued += committed - n

    def _transaction(self, conn: psycopg.Connection, rng: random.Random, bump: sql.Composed, n: int) -> int:
        """One application transaction; returns how many rows it committed."""
        rollback = rng.random() < self.rollback_rate
        # Lock keys in sorted order: concurrent writers never deadlock.
        keys = sorted({f"key-{rng.randrange(self.keys)}" for _ in range(n)})
        records = []
        for key in keys:
            version = conn.execute(bump, (key,)).fetchone()[0]  # type: ignore[index]
            records.append(
                OutboxRecord(
                    self.topic,
                    key,
                    json.dumps({"key": key, "version": version, "ts": time.time()}),
                    headers=(("writer", threading.current_thread().name),),
                )
            )
        self.stasher.stash_many(conn, records)
        if not rollback and rng.random() < self.long_txn_rate:
            time.sleep(rng.uniform(0.2, 1.0))  # a long transaction: later ids commit first
            with self._lock:
                self.stats.long_running += 1
        if rollback:
            conn.rollback()
            with self._lock:
                self.stats.rolled_back += len(records)
            committed = 0
        else:
            conn.commit()
            now = time.monotonic()
            with self._lock:
                self.stats.committed += len(records)
                self.stats.commit_times.extend([now] * len(records))
            committed = len(records)
        if self.rate_per_s:
            time.sleep(self.threads * max(len(records), 1) / self.rate_per_s)
        return committed
