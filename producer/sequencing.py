"""``--uuid-sequencing``: the fenced, exactly-once commit protocol (docs/design.md §5).

:class:`SequencedMode` is the relay's delivery strategy when ``config.uuid_sequencing`` is set: where
:class:`~producer.at_least_once.AtLeastOnceMode` purges each delivered row, it commits harvest
*transactions*. Everything runs on the relay thread except SQL, which runs on the relay's DB worker
threads (:class:`~producer.relay_core.RelayCore`: statements execute in submission order on each).

Protocol, per leader *view* (a view starts on acquisition and after every failure):

1. **View start**: a new ``leader_id`` and, in ONE DB transaction, ``UPDATE state SET epoch =
   epoch + 1 … RETURNING epoch`` followed by reading every persisted, unconfirmed ACK intent.
2. **Recovery first**: the recovered intents are published (in commit order: epoch, clock) and
   their delivery awaited before the view publishes anything else; then they are deleted.
3. **Harvest transactions**: marked rows are produced in id order as CONTINUE_TXN records (header
   ``uuid`` = 16 raw bytes; key, value and headers untouched) through the one idempotent producer.
   A transaction closes at ``txnMaxRecords`` records, ``txnMaxDuration`` after its first record, or
   once the backlog is taken and a first delivery report of it has arrived: rows marked while its
   first records are on their way join it (its commit could not start before that report anyway),
   so a trickle makes a transaction, a fenced commit and an ACK per delivery round trip, not per
   row (``_reported``). One monotonic Clock per view: clocks rise in publish order; a
   transaction's ACK clock is ticked when it closes, so ACK clocks rise in transaction order. A
   view's Clock starts at the state row's ``last_clock`` (raised to each committed ACK clock by the
   fenced commit) or the wall clock, whichever is later: clocks rise across views and leaders even
   when a leader's wall clock is behind or steps back.
4. **Commit** (when every record of transaction *k* is delivered, strictly in transaction order):
   one DB transaction locks the fence row and checks the epoch, deletes exactly the transaction's
   ids ``AND leader_id = $leader`` (row count must match), dead-letters its poison rows and inserts
   its ACK intents (producer, ACK clock, one row per topic-partition touched). Then one ACK_TXN per
   touched partition is produced, in transaction order. Once all of a transaction's ACKs are
   delivered its intents are deleted (batched, lazily). One commit job runs at a time: transactions
   delivered meanwhile are committed together by the next one (one DB transaction, each with its own
   intents: the same as committing them one after another with nothing in between).
5. **Producer ring**: ``producerRing`` (M) ProducerIDs per view; transaction *k* uses
   ``ring[k mod M]`` and opens only once ACK *k-M* was enqueued (at most M transactions between
   open and ACK-enqueued). M = 1 is stop-and-wait.
6. **Failure** (a produce or delivery failure, a refused commit, a DB error) abandons the view:
   in-flight deliveries are drained (bounded), commits already submitted finish and get their ACKs,
   uncommitted transactions are dropped (their rows are re-marked by the next view and re-sent in id
   order under new ProducerIDs) and each abandoned span gets a rollback ACK (clock = the producer's
   last ACK in that partition, else the span's first clock - 1) in every partition it is known to
   have touched. Then a new view starts (step 1). After a refused commit (another view exists: we are
   probably a zombie) the relay waits ``heartbeatTimeout`` first, so leader election can catch up
   instead of two processes bumping the epoch in turn.
7. **Zombies** cannot commit: their epoch check fails once a newer view exists.
8. **Per-key order** needs no per-key barrier: one idempotent producer keeps per-partition log order
   = produce order = id order; a failure drops the failed transaction and every later one, never a
   subset; committed transactions' ACKs are written in transaction order, and recovered ACKs are
   delivered before any record of a newer view.

Poison records: a record whose production fails synchronously with a permanent error (too large,
unknown topic) or that is malformed is dead-lettered *inside* the current transaction's fenced
commit (it never reached the log). A record whose delivery keeps failing abandons the view each time;
after ``maxDeliveryAttempts`` such failures or one permanent asynchronous error, the next view
dead-letters it in its fenced commit instead of producing it again. Failed attempts are counted per
row id in the delivery-attempts table: written while the failed view winds down (before the row can
be produced again), read back by the mark, deleted by the commit that delivers or dead-letters the
row — so the count survives crashes and leader changes.

Test hooks (for crash tests): :func:`install_crash_points` makes the process SIGKILL (``crash_at``)
or SIGSTOP (``pause_at``) itself the n-th time it reaches ``point``, given as ``point:n``, one of
``after_publish_before_delivery`` (a transaction closed, all its records produced),
``after_delivery_before_commit``, ``after_commit_before_ack`` and ``after_some_acks`` (the first ACK
of a transaction touching >= 2 partitions was delivered, the others not produced). Only the test-only
relay runner (:mod:`harvest_local.relay_runner`, from ``HARVEST_TEST_CRASH_AT`` / ``HARVEST_TEST_PAUSE_AT``)
calls it: the ``harvest`` command never does, so those variables mean nothing to a production relay.
"""

from __future__ import annotations

import logging
import os
import signal
import struct
import time
import uuid
from collections import deque
from concurrent.futures import Future, wait
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message

from harvest_outbox.producer.db import MarkedRow, TxnCommit
from harvest_outbox.producer.errors import ConfigError, DatabaseError, FenceError, ProducerError
from harvest_outbox.producer.events import LeaderRefreshed, ViewStarted
from harvest_outbox.producer.kafka import ANY_PARTITION, KafkaProducer, is_permanent, is_size_refusal
from harvest_outbox.producer.preflight import header_bytes, too_large
from harvest_outbox.producer.relay_core import RelayCore
from harvest_outbox.sequencer import TICK, Clock, Flags, new_producer_id
from harvest_outbox.sequencer.clock import clock_from_unix_ns

log = logging.getLogger(__name__)
_yield = time.sleep

_CONTINUE = int(Flags.CONTINUE_TXN)
_ACK = int(Flags.ACK_TXN)
CRASH_POINTS = ("after_publish_before_delivery", "after_delivery_before_commit", "after_commit_before_ack",
                "after_some_acks")


_UUID_HEAD = struct.Struct(">IHHH").pack


def continue_uuid(producer: bytes, clock: int, _pack: Any = _UUID_HEAD) -> bytes:
    """``uuid_bytes(int.from_bytes(producer, "big"), clock, CONTINUE_TXN)`` for the per-record path:
    time_low, time_mid, time_hi|version, variant|counter|flags packed by one C call, then the
    6-byte ProducerID (a quarter less work than the 128-bit integer arithmetic)."""
    return _pack((clock >> 4) & 0xFFFFFFFF, (clock >> 36) & 0xFFFF, ((clock >> 52) & 0x0FFF) | 0x1000,
                 ((clock & 0xF) << 10) | _CONTINUE | 0x8000) + producer


def _reported(t: _Txn) -> bool:
    """A delivery report of one of ``t``'s records has arrived (or it has none): once the backlog is
    taken, the transaction closes then. Rows marked while its first records were on their way have
    joined it (its commit could not start before that report anyway), and rows marked later go to the
    next one: at a trickle, a transaction per delivery round trip instead of one per row, and no
    record waits more than about one round trip longer for its commit."""
    return t.pending < len(t.ids) or not t.pending


def uuid_bytes(producer: int, clock: int, flags: int) -> bytes:
    """``build_uuid(producer, clock, flags).bytes`` without validation (hot path; ``producer`` as int)."""
    return (((clock >> 4) & 0xFFFFFFFF) << 96
            | ((clock >> 36) & 0xFFFF) << 80
            | (((clock >> 52) & 0x0FFF) | 0x1000) << 64
            | (((clock & 0xF) << 10) | flags | 0x8000) << 48
            | producer).to_bytes(16, "big")


class CrashPoints:
    """The crash/pause test hooks of the relays this process builds (see module doc). Empty (and
    falsy) unless :func:`install_crash_points` was called."""

    def __init__(self, crash_at: str | None = None, pause_at: str | None = None,
                 names: tuple[str, str] = ("crash_at", "pause_at")) -> None:
        self._points: dict[str, tuple[int, signal.Signals]] = {}
        self._counts: dict[str, int] = {}
        for what, spec, sig in zip(names, (crash_at, pause_at), (signal.SIGKILL, signal.SIGSTOP)):
            if spec:
                point, n = _parse_point(what, spec)
                self._points[point] = (n, sig)

    def __bool__(self) -> bool:
        return bool(self._points)

    def hit(self, point: str, settle: float = 0.0) -> None:
        if point not in self._points:
            return
        n = self._counts[point] = self._counts.get(point, 0) + 1
        at, sig = self._points[point]
        if n == at:
            if settle:
                time.sleep(settle)  # let librdkafka's threads write the records; serve no delivery reports
            log.warning("test hook: %s at %s #%d", sig.name, point, n)
            for h in logging.getLogger().handlers:
                h.flush()
            os.kill(os.getpid(), sig)


def _parse_point(what: str, spec: str) -> tuple[str, int]:
    point, _, n = spec.partition(":")
    fix = f"give point:n with point one of {', '.join(CRASH_POINTS)} and n >= 1 (default 1)"
    if point not in CRASH_POINTS:
        raise ConfigError(f"{what}={spec!r}: {point!r} is not a crash point; {fix}")
    try:
        count = int(n or 1)
    except ValueError:
        raise ConfigError(f"{what}={spec!r}: {n!r} is not a whole number; {fix}") from None
    if count < 1:
        raise ConfigError(f"{what}={spec!r}: the count must be 1 or more; {fix}")
    return point, count


#: What :class:`SequencedMode` instances built from now on use; nothing unless a test installed hooks.
_crash_points = CrashPoints()


def install_crash_points(crash_at: str | None = None, pause_at: str | None = None,
                         names: tuple[str, str] = ("crash_at", "pause_at")) -> None:
    """Test use only: relays built after this call SIGKILL / SIGSTOP themselves at the given points
    (``point:n``, see module doc). ConfigError names a bad value by its entry in ``names``."""
    global _crash_points
    _crash_points = CrashPoints(crash_at, pause_at, names)


class _View:
    """One leader view: fence epoch, leader id, clock and producer ring."""

    __slots__ = ("clock", "epoch", "failed", "k", "last_ack", "leader_id", "max_ok", "ring")

    def __init__(self, leader_id: uuid.UUID, epoch: int, ring_size: int, now_ns: int, floor: int = 0) -> None:
        self.leader_id = leader_id
        self.epoch = epoch
        # Never below the largest ACK clock committed by any earlier view (the state row's
        # last_clock): a leader whose wall clock is behind (stepped back, or a standby with a slow
        # clock) still stamps clocks above everything readers have seen committed.
        self.clock = Clock(floor)
        self.clock.update(now_ns)
        self.ring = [new_producer_id() for _ in range(ring_size)]
        self.k = 0  # transactions opened
        # Largest clock of an acknowledged record of this view: a failed record with a smaller clock
        # waited while the broker acknowledged records sent after it (poison, not an outage).
        self.max_ok = 0
        self.failed = False  # set by the DB worker when a commit of this view failed
        self.last_ack: dict[tuple[bytes, str, int], int] = {}  # (producer, topic, partition) -> ACK clock


class _Txn:
    """One harvest transaction."""

    __slots__ = ("ack_clock", "ack_failed", "ack_pending", "closed", "commit", "dead", "failures", "first_clock",
                 "ids", "journals", "k", "opened", "pending", "producer", "producer_int", "rows", "view")

    def __init__(self, view: _View, k: int, producer: bytes, now: float) -> None:
        self.view = view
        self.k = k
        self.producer = producer
        self.producer_int = int.from_bytes(producer, "big")
        self.opened = now
        self.rows: list[MarkedRow] = []
        self.ids: list[int] = []
        self.dead: list[tuple[int, str, int]] = []
        self.pending = 0  # produced, delivery report not yet seen
        # touched (topic, partition) -> clock of the first record there (from delivery reports)
        self.journals: dict[tuple[str, int], int] = {}
        self.failures: list[tuple[KafkaError, Message | None, int]] = []  # (error, message, its clock)
        self.first_clock = 0
        self.ack_clock = 0
        self.closed = False
        self.commit: Future[None] | None = None
        self.ack_pending = 0
        self.ack_failed = False

    def on_delivery(self, clock: int, err: KafkaError | None, msg: Message) -> None:
        """Delivery report of the record stamped ``clock`` (bound per record by a :class:`_Slot`:
        librdkafka's delivery reports carry no headers, so the clock cannot be read back from them;
        the poison-or-outage rule needs every record's clock)."""
        self.pending -= 1
        if err is None:
            if clock > self.view.max_ok:
                self.view.max_ok = clock
        else:
            self.failures.append((err, msg, clock))
            if msg is None or msg.partition() is None or msg.partition() < 0:
                return  # (a failed record with a known partition may be in the log anyway)
        j = (msg.topic(), msg.partition())
        if j not in self.journals:  # once per partition per transaction: reports arrive in log order
            # The first clock of this producer in this partition: a rollback ACK at clock - 1 equals
            # the reader's implicit last ACK, so it is a clean ACK_ROLLBACK.
            self.journals[j] = clock

    def on_ack(self, err: KafkaError | None, msg: Message) -> None:
        self.ack_pending -= 1
        if err is not None:
            log.warning("ACK_TXN of harvest transaction %d to %s/%s failed: %s (its intent stays; the next "
                        "view re-sends it)", self.k, msg.topic(), msg.partition(), err.str())
            self.ack_failed = True


class _Slot:
    """The delivery callback of one in-flight record: calls ``txn.on_delivery(clock, err, msg)``.

    Slots are pooled and reused (a free list owned by the relay), not allocated per record: a
    ``functools.partial`` per record lived until its delivery report, so thousands of them at a time
    survived into Python's oldest GC generation and triggered a full collection every few thousand
    records (10-20 ms each, every Python thread stopped). A slot returns to the pool when its report
    arrives (librdkafka calls each record's callback exactly once); slots of a producer that is
    dropped without reports are simply freed with it."""

    __slots__ = ("clock", "pool", "txn")

    def __init__(self, pool: list[_Slot]) -> None:
        self.pool = pool
        self.txn: _Txn | None = None
        self.clock = 0

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        t, clock = self.txn, self.clock
        self.txn = None
        self.pool.append(self)
        t.on_delivery(clock, err, msg)  # type: ignore[union-attr]


class _Counter:
    """Delivery counter for recovery and rollback ACKs."""

    __slots__ = ("failed", "pending")

    def __init__(self) -> None:
        self.pending = 0
        self.failed = 0

    def on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        self.pending -= 1
        if err is not None:
            self.failed += 1
            log.warning("ACK to %s/%s failed: %s", msg.topic(), msg.partition(), err.str())


class SequencedMode:
    """The relay's ``--uuid-sequencing`` mode (see module doc): a
    :class:`~producer.relay_core.RelayMode` over a :class:`~producer.relay_core.RelayCore`."""

    #: Bytes of headers the relay adds to every record: the ``uuid`` header.
    HEADER_BYTES = len("uuid") + 16 + 10
    #: A failed ACK must not be overtaken by a later one in its partition (per-key order): librdkafka
    #: then raises a fatal error instead of leaving a gap; the view is abandoned and a fresh producer
    #: re-sends the intents in order.
    PRODUCER_SETTINGS: dict[str, Any] = {"enable.gapless.guarantee": True}

    def __init__(self, core: RelayCore) -> None:
        self.core = core
        self.config = core.config
        self.limits = core.limits
        self.metrics = core.metrics
        self._ready = core.ready  # the same deque for the relay's life (cleared, never replaced)
        self._held = core.held
        self._guard = core.guard
        self._view: _View | None = None
        self._slots: list[_Slot] = []  # free delivery-callback slots (see _Slot)
        self._txns: deque[_Txn] = deque()  # opened, ACKs not yet enqueued, in order
        self._acking: deque[_Txn] = deque()  # ACKs enqueued, not yet all delivered, in order
        self._confirm_buf: list[tuple[bytes, int]] = []
        self._next_confirm = 0.0
        self._poison: dict[int, tuple[str, int]] = {}  # id -> (reason, attempts): dead-letter when seen
        self._view_backoff_until = 0.0
        self._last_mark_short = True
        self._hook = _crash_points
        self._refreshing = False
        # An ACK of this view failed: produce nothing more in it (not even ACKs of later commits, which
        # could overtake the missing one in a partition); recovery re-sends every intent in order.
        self._ack_broken = False
        self.views_started = 0
        #: The wall clock UUID clocks follow (Unix ns). A seam: tests step it back.
        self.wall_clock_ns = time.time_ns
        # Adaptive transaction size (AIMD): a delivery failure abandons every transaction in flight,
        # so under a steady error rate e, big transactions almost never commit (a transaction of n
        # records commits with probability (1-e)^n). Halve on such an abandonment, grow by half on
        # each commit, between 1 and limits.txnMaxRecords: the relay keeps making progress.
        self.txn_limit = self.limits.txn_ceiling
        # Consecutive synchronous produce failures of the row at the head of the ready queue.
        self._sync_failures = 0

    # ------------------------------------------------------------------ RelayMode
    def ensure_producer(self) -> KafkaProducer:
        return self.core.ensure_producer(self.PRODUCER_SETTINGS, _unexpected_report)

    def on_acquired(self) -> None:
        self._view = None  # the first tick starts a view (epoch bump + recovery)

    def gauges(self) -> tuple[int, int]:
        return self._in_flight_count(), len(self._ready) + self.core.held_count

    def in_flight_keys(self) -> list[bytes]:
        return []  # records are tracked per transaction, not per key

    # ------------------------------------------------------------------ main loop
    def tick(self) -> None:
        core = self.core
        producer = self.ensure_producer()
        if core.producer_fatal and self._view is not None:
            self._abandon("the Kafka producer hit a fatal error", self._failed_txn())
        if core.remark:  # a DB error surfaced by the main loop, or a failure: abandon the view
            self._refresh()
            return
        if self._view is None:
            now = time.monotonic()
            if now < self._view_backoff_until:
                core.stop_requested.wait(min(0.05, self._view_backoff_until - now))
                return
            self._start_view()
            return
        view = self._view
        producer.poll(0)
        now = time.monotonic()
        self._guard.expire(now)
        self._advance(now)
        if core.remark or core.leader_id is None:
            return
        # mark (prefetch, as in at-least-once mode)
        mark = core.take_mark()
        if mark is not None:
            rows, persisted = mark.future.result()  # DatabaseError -> main loop: back off, abandon the view
            core.mark_size.observe(mark.asked, len(rows))
            if persisted and mark.view == view.leader_id:
                self._take_persisted(persisted)
            if mark.view == view.leader_id:
                self._ready.extend(rows)
                self._last_mark_short = core.idle = len(rows) < mark.asked
                if core.idle:  # the backlog is taken: the next mark waits for a NOTIFY or markBackoff
                    core.next_mark = now + self.limits.mark_backoff
                else:
                    # A full mark: more rows wait. The database marks the next batches while this
                    # thread produces the one that just arrived (not after it).
                    core.mark_ahead(len(self._ready))
        if not core.marks and len(self._ready) < 2 * core.mark_size.value and now >= core.next_mark:
            core.submit_mark()
            if not (self._txns or self._acking or self._ready or self._held):
                # Nothing else to do (e.g. woken by a stasher's NOTIFY): wait for the mark here, not in
                # 1 ms polls, so its rows go out the moment it returns (idle-to-delivery latency).
                wait((core.marks[0].future,), timeout=self.limits.min_poll_interval)
                return
        if self._held:
            core.release_held(now)
        if self._ready:
            self._fill(now)
        in_flight = self._in_flight_count()
        if self._txns or self._acking or self._ready or core.marks:
            if not self._ready or in_flight >= self.limits.in_flight_limit or self._ring_full():
                # Nothing can be produced now: wait (a busy loop here took a core at 500 rows/s
                # whenever ready rows waited for a ring slot).
                core.await_progress(producer)
            core.notified_while_idle()
        elif self._confirm_buf:
            self._flush_confirms()
        else:
            core.wait_idle()

    def _ring_full(self) -> bool:
        """No transaction can take records: the last one is closed and ``producerRing`` are open."""
        txns, view = self._txns, self._view
        return view is not None and len(txns) >= len(view.ring) and txns[-1].closed

    def _in_flight_count(self) -> int:
        return sum(t.pending for t in self._txns)

    def _advance(self, now: float) -> None:
        """Close / commit / ACK / confirm whatever is ready, in transaction order."""
        txns = self._txns
        for t in txns:
            if t.failures:
                self._abandon(f"delivery failed in harvest transaction {t.k}: {t.failures[0][0].str()}", t)
                return
        if txns:
            last = txns[-1]
            if not last.closed and (now - last.opened >= self.limits.txn_max_duration
                                    or (not self._ready and self._last_mark_short and _reported(last))):
                self._close(last)
        # Submit commits in order, one job at a time: transactions delivered while a commit runs wait
        # for it and then commit together (group commit). One job per transaction queued them behind
        # each other on the DB worker: at 500 rows/s a commit waited ~3 ms for the worker, ran ~2 ms,
        # and the producer ring filled up.
        if not any(t.commit is not None and not t.commit.done() for t in txns):
            batch = []
            for t in txns:
                if t.commit is None:
                    if not t.closed or t.pending:
                        break
                    if self._hook:
                        self._hook.hit("after_delivery_before_commit")
                    batch.append(t)
            if batch:
                self._submit_commits(batch)
        # commit results, in order
        while txns and txns[0].commit is not None and txns[0].commit.done():
            t = txns[0]
            err = t.commit.exception()  # type: ignore[union-attr]
            if err is not None:
                self._abandon(f"commit of harvest transaction {t.k} failed: {err}", None,
                              fenced=isinstance(err, FenceError))
                return
            txns.popleft()
            self.metrics.delivered += len(t.ids)
            if self.txn_limit < self.limits.txn_ceiling:
                self.txn_limit = min(self.limits.txn_ceiling, self.txn_limit + max(1, self.txn_limit // 2))
            if self._hook:
                self._hook.hit("after_commit_before_ack")
            self._enqueue_acks(t)
            if self._ack_broken:
                self._abandon(f"producing ACK_TXN of harvest transaction {t.k} failed", None)
                return
        # ACK deliveries, in order
        acking = self._acking
        if any(t.ack_failed for t in acking):
            self._ack_broken = True
        while acking and acking[0].ack_pending == 0:
            t = acking.popleft()
            if t.ack_failed:
                self._abandon(f"ACK_TXN delivery of harvest transaction {t.k} failed", None)
                return
            if t.journals:
                self._confirm_buf.append((t.producer, t.ack_clock))
        if self._confirm_buf and (len(self._confirm_buf) >= 64 or now >= self._next_confirm):
            self._flush_confirms()
        if self.core.db_futures:
            self.core.check_db()

    def _flush_confirms(self) -> None:
        db, exec_ = self.core.db, self.core.exec
        assert db is not None and exec_ is not None
        items, self._confirm_buf = self._confirm_buf, []
        self._next_confirm = time.monotonic() + max(self.limits.purge_interval, 0.2)
        self.core.db_futures.append(self.core.waker.watch(exec_.submit(db.confirm_acks, items)))

    # ------------------------------------------------------------------ transactions
    def _open(self, now: float) -> _Txn | None:
        view = self._view
        assert view is not None
        if self._txns:
            last = self._txns[-1]
            if not last.closed:
                return last
        if len(self._txns) >= len(view.ring):
            return None  # ring full: txn k must wait until ACK k-M is enqueued
        k = view.k
        view.k += 1
        view.clock.update(self.wall_clock_ns())
        t = _Txn(view, k, view.ring[k % len(view.ring)], now)
        t.first_clock = view.clock.value + TICK
        self._txns.append(t)
        return t

    def _close(self, t: _Txn) -> None:
        assert self._view is not None
        t.closed = True
        t.ack_clock = self._view.clock.tick()
        if self._hook and t.pending:
            self._hook.hit("after_publish_before_delivery", settle=0.5)

    def _fill(self, now: float) -> None:
        """Produce ready rows in id order into the open transaction(s)."""
        ready = self._ready
        producer = self.core.producer
        view = self._view
        assert producer is not None and view is not None
        limit = self.limits.in_flight_limit
        max_records = self.txn_limit
        in_flight = self._in_flight_count()
        clock = view.clock
        poison = self._poison
        verdicts = self._guard.verdicts
        event_id = self.core.event_id  # eventIdHeader: (name, value prefix) or None
        while ready and in_flight < limit and not self.core.remark:
            t = self._open(now)
            if t is None:
                return
            prod = t.producer
            rows, ids = t.rows, t.ids
            slots = self._slots
            while ready and in_flight < limit:
                row = ready[0]
                rid, topic, key, value, hkeys, hvals, bad, _attempts, _error, partition = row
                if poison and rid in poison:
                    ready.popleft()
                    reason, attempts = poison.pop(rid)
                    self._dead_letter_in(t, row, reason, attempts)
                    continue
                if bad is not None:
                    ready.popleft()
                    self._dead_letter_in(t, row, f"bad row: {bad}", 0)
                    continue
                if self._held and topic in self._held:
                    ready.popleft()
                    self.core.hold(row)
                    continue
                verdict = verdicts.get(topic)  # type: ignore[arg-type]
                if verdict is None:
                    verdict = self._guard.verdict(topic)  # type: ignore[arg-type]
                if verdict.__class__ is str:
                    ready.popleft()
                    if self.core.hold_missing and topic in self._guard.missing:
                        self.core.hold(row)
                        continue
                    self._dead_letter_in(t, row, f"cannot be sent: {verdict}", 0)
                    continue
                size = len(key) + (len(value) if value is not None else 0)  # type: ignore[arg-type]
                if size > verdict or (hkeys and size + header_bytes(hkeys, hvals) > verdict):  # type: ignore[operator,arg-type]
                    ready.popleft()
                    self._dead_letter_in(t, row, f"cannot be sent: {too_large(verdict, key, value, hkeys, hvals)}",  # type: ignore[arg-type]
                                         0)
                    continue
                c = clock.value + TICK
                headers = [("uuid", continue_uuid(prod, c))]
                if event_id is not None:
                    headers.append((event_id[0], event_id[1] + b"%d" % rid))
                if hkeys:
                    headers.extend(zip(hkeys, hvals))  # type: ignore[arg-type]
                slot = slots.pop() if slots else _Slot(slots)
                slot.txn, slot.clock = t, c
                try:
                    # By position (PRODUCE_ARGS): partition, callback, on_delivery, timestamp, headers.
                    where = ANY_PARTITION if partition is None else partition
                    producer.produce(topic, value, key, where, slot, None, 0, headers)  # type: ignore[arg-type]
                except BufferError:
                    slot.txn = None
                    slots.append(slot)  # not enqueued: no report will return it
                    producer.poll(0.005)
                    in_flight = self._in_flight_count()
                    continue
                except KafkaException as exc:
                    slot.txn = None
                    slots.append(slot)
                    err: KafkaError = exc.args[0]
                    if is_permanent(err, True):
                        ready.popleft()
                        self._sync_failures = 0
                        self._dead_letter_in(t, row, f"cannot be sent: {err.name()}: {err.str()}", 1)
                        continue
                    # A synchronous failure means the record was never enqueued: retrying it now,
                    # before any later record, keeps the log in id order, so the view survives.
                    self._sync_failures += 1
                    if self._sync_failures < self.limits.max_delivery_attempts:
                        producer.poll(min(0.001 * 2 ** self._sync_failures, 0.1))
                        continue
                    ready.popleft()
                    self._sync_failures = 0
                    self._count_failure(rid, err, False)
                    self._abandon(f"produce failed for record {rid}: {err.str()}", None)
                    return
                except (TypeError, ValueError) as exc:
                    slot.txn = None
                    slots.append(slot)
                    ready.popleft()
                    self._dead_letter_in(t, row, f"cannot produce: {exc}", 1)
                    continue
                ready.popleft()
                self._sync_failures = 0
                clock.value = c
                t.pending += 1
                rows.append(row)
                ids.append(rid)
                in_flight += 1
                if not in_flight & 1023:
                    # Let the DB worker threads have the GIL now and then (the interpreter's switch
                    # interval hands it over anyway; every 1,024 records drained ~7% faster than every 128).
                    _yield(0)
                if len(ids) >= max_records:
                    self._close(t)
                    break
            if not t.closed and not ready and self._last_mark_short:
                if _reported(t):
                    self._close(t)
                elif self._hook:
                    # The backlog is taken: the transaction closes at its first delivery report
                    # (_advance), with the rows marked meanwhile.
                    self._hook.hit("after_publish_before_delivery", settle=0.5)

    def _dead_letter_in(self, t: _Txn, row: MarkedRow, error: str, attempts: int) -> None:
        log.error("record %d (topic %r) will be moved to dead letters with harvest transaction %d: %s",
                  row[0], row[1], t.k, error)
        self.core.attempts.pop(row[0], None)
        t.dead.append((row[0], error, attempts))
        self.metrics.dead_lettered += 1

    def _take_persisted(self, persisted: dict[int, tuple[int, str | None]]) -> None:
        """Adopt the stored attempt counts of freshly marked rows; rows that used them up (in this
        or in crashed processes) are dead-lettered by the transaction that meets them."""
        limit = self.limits.max_delivery_attempts
        for rid, (n, error) in persisted.items():
            n = self.core.attempts[rid] = max(self.core.attempts.get(rid, 0), n)
            if n >= limit and rid not in self._poison:
                self._poison[rid] = (f"failed {n} delivery attempts (counted across relay restarts); "
                                     f"last error: {error}", n)

    def _count_failure(self, rid: int, err: KafkaError, asynchronous: bool) -> None:
        self.metrics.delivery_failures += 1
        attempts = self.core.attempts.get(rid, 0) + 1
        self.core.attempts[rid] = attempts
        permanent = asynchronous and is_permanent(err, False)
        if permanent or attempts >= self.limits.max_delivery_attempts:
            why = "cannot be sent" if permanent else f"failed {attempts} delivery attempts"
            self._poison[rid] = (f"{why}: {err.name()}: {err.str()}", attempts)
        self.core.attempt_buf.append((rid, attempts, f"{err.name()}: {err.str()}"))
        if err.fatal():
            self.core.producer_fatal = True

    def _submit_commits(self, batch: list[_Txn]) -> None:
        """One fenced commit job for consecutive delivered transactions (see ``_advance``)."""
        db, exec_ = self.core.db, self.core.exec
        assert db is not None and exec_ is not None and batch
        view = batch[0].view
        attempts = self.core.attempts
        parts = []
        for t in batch:
            forget: list[int] = []
            if attempts:  # rows that failed before: their stored counts go with the commit
                forget = [i for i in t.ids if attempts.pop(i, None) is not None]
            parts.append(TxnCommit(t.ids, t.dead, t.producer, t.ack_clock, sorted(t.journals), forget))
        first, last = batch[0].k, batch[-1].k

        def job() -> None:
            if view.failed:
                span = f"{first}" if first == last else f"{first}-{last}"
                raise FenceError(f"harvest transaction(s) {span} not committed: an earlier commit of its view failed")
            try:
                db.commit_txns(view.epoch, view.leader_id, parts)
            except BaseException:
                view.failed = True
                raise

        future = self.core.waker.watch(exec_.submit(job))
        for t in batch:
            t.commit = future

    def _enqueue_acks(self, t: _Txn) -> None:
        """Produce one ACK_TXN per partition the committed transaction touched, in a fixed order."""
        producer = self.core.producer
        assert producer is not None
        view = t.view
        journals = sorted(t.journals)
        if not journals or self._ack_broken:
            return
        ack = uuid_bytes(t.producer_int, t.ack_clock, _ACK)
        t.ack_pending = len(journals)
        self._acking.append(t)
        for i, (topic, part) in enumerate(journals):
            if not self._produce_ack(topic, part, ack, t.on_ack):
                t.ack_pending -= len(journals) - i - 1  # the rest are never produced
                t.ack_failed = True
                self._ack_broken = True
                return
            view.last_ack[(t.producer, topic, part)] = t.ack_clock
            if i == 0 and len(journals) > 1 and self._hook:
                producer.flush(10)
                self._hook.hit("after_some_acks")

    def _produce_ack(self, topic: str, partition: int, ack: bytes, cb: Any) -> bool:
        """Produce one ACK_TXN; False (after reporting a failure to ``cb``) if it could not be."""
        producer = self.core.producer
        assert producer is not None
        err: KafkaError | None = None
        for _ in range(10000):
            try:
                # Empty (not null) key and value: compacted topics refuse null keys, and a null value
                # would be a tombstone.
                producer.produce(topic, b"", b"", partition=partition, headers=[("uuid", ack)], on_delivery=cb)
                return True
            except BufferError:
                producer.poll(0.01)
            except KafkaException as exc:
                err = exc.args[0]
                break
        err = err or KafkaError(KafkaError._QUEUE_FULL, "local queue full")
        # The DB holds the intent (if it is one): the next view re-sends it.
        log.warning("producing ACK_TXN to %s/%s failed: %s", topic, partition, err.str())
        cb(err, _FakeMsg(topic, partition))
        return False

    # ------------------------------------------------------------------ views
    def _start_view(self) -> None:
        """New leader id + fence epoch; recover and deliver persisted ACK intents; then go."""
        db, exec_ = self.core.db, self.core.exec
        assert db is not None and exec_ is not None
        leader_id = uuid.uuid4()
        epoch, intents, floor = exec_.submit(db.start_view_with_floor, leader_id, self.config.name).result()
        if self.core.leader_id is None or self.core.stop_requested.is_set():
            return  # lost leadership meanwhile (a standby's view is harmless: it fenced nobody we know)
        counter = _Counter()
        deadline = time.monotonic() + self.limits.queue_timeout
        for _e, prod, clock, topic, part in intents:
            counter.pending += 1
            if not self._produce_ack(topic, part, uuid_bytes(int.from_bytes(prod, "big"), clock, _ACK),
                                     counter.on_delivery):
                break
        producer = self.core.producer
        assert producer is not None
        while counter.pending > 0 and time.monotonic() < deadline:
            producer.poll(0.01)
        if counter.pending or counter.failed:
            self.core.remark = True  # retry the view (and its recovery) after a backoff
            self._view_backoff_until = time.monotonic() + self.limits.io_error_backoff
            log.warning("view epoch %d: %d recovered ACK intent(s) not delivered; starting another view", epoch,
                        counter.pending + counter.failed)
            return
        if intents:
            exec_.submit(db.confirm_acks, [(p, c) for _e, p, c, _t, _p in intents]).result()
        now_ns = self.wall_clock_ns()
        if clock_from_unix_ns(now_ns) < floor:
            log.warning("%s: the wall clock is %.3fs behind the last committed ACK clock; this view's UUID clocks "
                        "continue from that clock instead (clocks never go back across views)", self.config.name,
                        (Clock(floor).as_unix_ns() - now_ns) / 1e9)
        view = self._view = _View(leader_id, epoch, self.limits.producer_ring, now_ns, floor)
        self._ack_broken = False
        self.core.leader_id = leader_id
        self.core.remark = False
        self.core.next_mark = 0.0
        self._last_mark_short = True
        self.views_started += 1
        log.info("%s: view epoch=%d leader_id=%s producers=%s recovered_acks=%d", self.config.name, epoch, leader_id,
                 ",".join(p.hex() for p in view.ring), len(intents))
        if self._refreshing:
            self._refreshing = False
            self.core.emit(LeaderRefreshed(leader_id))
        self.core.emit(ViewStarted(leader_id, epoch, len(intents), tuple(view.ring)))

    def _abandon(self, why: str, failed: _Txn | None, fenced: bool = False) -> None:
        if self.core.remark:
            return
        log.warning("%s: abandoning leader view%s: %s", self.config.name,
                    f" epoch={self._view.epoch}" if self._view else "", why)
        if failed is not None:
            self.txn_limit = max(1, self.txn_limit // 2)
            for err, msg, clock in failed.failures:
                if msg is not None and is_size_refusal(err) and msg.topic():
                    self._guard.check_sizes(msg.topic())  # the next view refuses the oversized row alone
                rid = self._find_row(failed, msg)
                if rid is None:
                    continue
                latency = msg.latency() if msg is not None else None
                if self.core.waited_out(latency):
                    # Records sent after it were acknowledged: the broker was serving (so it is
                    # poison), or not (an outage: nothing is counted). In this mode deliveries stop
                    # once the producer ring is full, so "acknowledged later" rather than "lately".
                    if not (self._view is not None and self._view.max_ok > clock):
                        log.warning("delivery of record %d timed out after %.1fs while no record was delivered "
                                    "(broker or network outage?): %s; not counted as an attempt", rid, latency,
                                    err.str())
                        if err.fatal():
                            self.core.producer_fatal = True
                        continue
                    # It held up every key for rowTimeout while the broker took other records:
                    # park it now rather than stall everything again (the bound of limits.rowTimeout).
                    self.metrics.delivery_failures += 1
                    attempts = self.core.attempts.get(rid, 0) + 1
                    self.core.attempts[rid] = attempts
                    self._poison[rid] = (f"held up other rows for limits.rowTimeout "
                                         f"({self.limits.row_timeout:g}s) while they were delivered: "
                                         f"{err.name()}: {err.str()}", attempts)
                    self.core.attempt_buf.append((rid, attempts, f"{err.name()}: {err.str()}"))
                    if err.fatal():
                        self.core.producer_fatal = True
                    continue
                self._count_failure(rid, err, True)
        if fenced:
            self._view_backoff_until = time.monotonic() + self.limits.heartbeat_timeout
        self.core.remark = True

    def _failed_txn(self) -> _Txn | None:
        """The oldest transaction with a failed delivery, if any."""
        return next((t for t in self._txns if t.failures), None)

    @staticmethod
    def _find_row(t: _Txn, msg: Message | None) -> int | None:
        if msg is None:
            return None
        key, value = msg.key(), msg.value()
        for row in t.rows:
            if row[2] == key and row[3] == value:
                return row[0]
        return None

    def _wind_down(self, commit_delivered: bool) -> None:
        """Stop producing; drain; finish (and with ``commit_delivered`` submit) commits in order;
        ACK the committed; roll back the rest; deliver ACKs; confirm. Leaves no view."""
        self.core.clear_queues()  # re-marked by the next view
        view = self._view
        producer = self.core.producer
        exec_ = self.core.exec
        budget = self.limits.max_poll_interval or 1.0
        deadline = time.monotonic() + budget  # type: ignore[operator]
        if view is not None and producer is not None:
            if self._txns and not self._txns[-1].closed:
                self._close(self._txns[-1])
            while self._in_flight_count() and time.monotonic() < deadline:
                producer.poll(0.01)
            if commit_delivered and not view.failed:
                batch = []
                for t in self._txns:
                    if t.commit is None:
                        if t.pending or t.failures:
                            break
                        batch.append(t)
                if batch:
                    self._submit_commits(batch)
            # barrier: every submitted DB job (commits in order, confirms, a pending mark)
            if exec_ is not None:
                try:
                    exec_.submit(lambda: None).result()
                except Exception:
                    pass
            if any(t.ack_failed for t in self._acking):
                self._ack_broken = True
            committed_ok = True
            for t in list(self._txns):
                ok = committed_ok and t.commit is not None and t.commit.exception() is None
                if ok:
                    self._txns.remove(t)
                    self.metrics.delivered += len(t.ids)
                    self._enqueue_acks(t)
                    continue
                committed_ok = False
                if t.commit is not None and t.commit.exception() is not None:
                    log.warning("harvest transaction %d not committed: %s", t.k, t.commit.exception())
            # Rollback ACKs for the abandoned spans we know of -- except for producers with a
            # transaction whose commit outcome is unknown: a commit that failed with anything but a
            # FenceError (which rolled back) may have committed on the server, e.g. the connection
            # died between COMMIT and its reply. Its intent is then persisted and the next view
            # re-sends its ACK; a rollback ACK at the producer's older clock would first have made
            # every reader discard that span, losing its rows. Readers keep an un-ACKed span
            # pending (as after a crash) until the next view's recovery ACKs it or it is pruned.
            unknown = {t.producer for t in self._txns
                       if t.commit is not None and t.commit.done() and t.commit.exception() is not None
                       and not isinstance(t.commit.exception(), FenceError)}
            counter = _Counter()
            for t in self._txns if not self._ack_broken else ():
                if not t.ids or t.producer in unknown:
                    continue
                for (topic, part), first in sorted(t.journals.items()):
                    # == the reader's last ACK of this producer in this partition: a clean rollback
                    clock = view.last_ack.get((t.producer, topic, part), first - 1)
                    counter.pending += 1
                    if not self._produce_ack(topic, part, uuid_bytes(t.producer_int, clock, _ACK),
                                             counter.on_delivery):
                        break
            self._txns.clear()
            end = time.monotonic() + budget  # type: ignore[operator]
            while (self._acking and any(t.ack_pending for t in self._acking) or counter.pending) and \
                    time.monotonic() < end:
                producer.poll(0.01)
            for t in self._acking:
                if t.ack_pending == 0 and not t.ack_failed and t.journals:
                    self._confirm_buf.append((t.producer, t.ack_clock))
            self._acking.clear()
            if self._in_flight_count() or len(producer) > 0:
                log.warning("records/ACKs still queued after %.1fs; replacing the Kafka producer", budget)
                try:
                    producer.purge(in_queue=True, in_flight=False)
                    producer.poll(0)
                except KafkaException:
                    pass
                self.core.producer = None
        self._txns.clear()
        self._acking.clear()
        if self.core.attempt_buf and self.core.db is not None and exec_ is not None:
            # Stored before the next view can produce these rows again: a crash from here on still
            # counts the attempt.
            tried, self.core.attempt_buf = self.core.attempt_buf, []
            try:
                exec_.submit(self.core.db.record_attempts, tried).result()
            except DatabaseError as exc:
                self.core.attempt_buf = tried + self.core.attempt_buf  # stored by the next wind-down
                log.warning("could not store %d failed delivery attempt(s) (kept in memory): %s", len(tried), exc)
        if self._confirm_buf and self.core.db is not None and exec_ is not None:
            items, self._confirm_buf = self._confirm_buf, []
            try:
                exec_.submit(self.core.db.confirm_acks, items).result()
            except DatabaseError as exc:
                log.warning("could not confirm ACK intents (the next view re-sends them): %s", exc)
        self.core.await_mark()
        for f in self.core.db_futures:
            try:
                f.result()
            except Exception as exc:
                log.warning("DB job failed during wind-down: %s", exc)
        self.core.db_futures = []
        self._view = None
        self.core.drop_fatal_producer()

    def _refresh(self) -> None:
        """Abandon the current view; the next tick starts a new one (after any backoff)."""
        self._wind_down(commit_delivered=False)
        self.core.remark = False
        self.metrics.remarks += 1
        self._refreshing = True

    def relinquish(self, why: str) -> None:
        log.info("%s: giving up leadership (%s): committing delivered harvest transactions", self.config.name, why)
        try:
            self._wind_down(commit_delivered=not self.core.remark)
        except (DatabaseError, ProducerError, KafkaException) as exc:
            log.warning("winding down the leader view failed (the next leader recovers): %s", exc)
            self._view = None
            self._txns.clear()
            self._acking.clear()
        self._poison.clear()


def _unexpected_report(err: KafkaError | None, msg: Message) -> None:
    """The producer's default delivery callback: every record and ACK this mode produces names its own."""
    log.warning("delivery report for a record produced without a callback (%s/%s): %s", msg.topic(),
                msg.partition(), err.str() if err is not None else "delivered")


class _FakeMsg:
    """Stands in for a Message in a synthesized delivery report."""

    def __init__(self, topic: str, partition: int) -> None:
        self._t, self._p = topic, partition

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def key(self) -> None:
        return None

    def value(self) -> None:
        return None
