"""``--uuid-sequencing``: the fenced, exactly-once commit protocol (docs/design.md §5).

:class:`SequencedMode` is the relay's delivery strategy when ``config.uuid_sequencing`` is set: where
:class:`~producer.relay.at_least_once.mode.AtLeastOnceMode` purges each delivered row, it commits harvest
*transactions*. Everything runs on the relay thread except SQL, which runs on the relay's DB worker
threads (:class:`~producer.relay.core.RelayCore`: statements execute in submission order on each).
The protocol's parts, one concern each:

- :mod:`producer.relay.sequenced._view`: a view (fence epoch, leader id, clock with its floor, producer ring) and
  the UUIDs of records and ACKs;
- :mod:`producer.relay.sequenced._txn`: a harvest transaction and its records' delivery reports;
- :mod:`producer.relay.sequenced._produce`: producing marked rows into a transaction (a part the mode owns);
- :mod:`producer.relay.sequenced._poison`: the rows to dead-letter when next seen, and attempt counts (a part);
- :mod:`producer.relay.sequenced._commit`: the fenced commit job;
- :mod:`producer.relay.sequenced._acks`: ACKs (followed to delivery by a part), recovery of ACK intents, rollback ACKs;
- :mod:`producer.relay.sequenced._failure`: the decisions of abandoning and winding down a view;
- :mod:`producer.relay.sequenced._store`: the database work, as one interface (each outbox layout's relay database
  implements it; tests/test_producer/model_db.py too, for the model test);
- :mod:`producer.relay.crash_points`: the crash/pause test hooks.

Protocol, per leader *view* (a view starts on acquisition and after every failure):

1. **View start**: a new ``leader_id`` and, in ONE DB transaction, the fence epoch bumped and every
   persisted, unconfirmed ACK intent read.
2. **Recovery first**: the recovered intents are published (in commit order: epoch, clock) and
   their delivery awaited before the view publishes anything else; then they are deleted.
3. **Harvest transactions**: marked rows are produced in id order as CONTINUE_TXN records (header
   ``uuid`` = 16 raw bytes; key, value and headers untouched) through the one idempotent producer.
4. **Commit** (when every record of transaction *k* is delivered, strictly in transaction order):
   one DB transaction checks the fence, deletes exactly the transaction's ids ``AND leader_id =
   $leader``, dead-letters its poison rows and inserts its ACK intents; then one ACK_TXN per touched
   partition, in transaction order; once delivered, the intents are deleted (batched, lazily).
5. **Producer ring**: transaction *k* uses ``ring[k mod M]`` and opens only once ACK *k-M* was
   enqueued.
6. **Failure** abandons the view (:mod:`producer.relay.sequenced._failure`); then a new view starts (step 1).
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

tests/test_producer/relay/sequenced/test_protocol_model.py drives this mode on an in-memory database and log through
thousands of random schedules (crashes at every step, zombies, lost commit replies) and checks the
invariants above with the project's own Sequencer; the test_sequencing*.py suites run it on real
Postgres and Kafka.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Mapping
from concurrent.futures import wait
from typing import Any, ClassVar, cast

from confluent_kafka import KafkaError, KafkaException, Message

from harvest_outbox.producer.errors import DatabaseError, FenceError, ProducerError
from harvest_outbox.producer.kafka import KafkaProducer
from harvest_outbox.producer.relay.core import RelayCore
from harvest_outbox.producer.relay.crash_points import installed
from harvest_outbox.producer.relay.events import LeaderRefreshed, ViewStarted
from harvest_outbox.producer.relay.sequenced._acks import Acks, recover, roll_back
from harvest_outbox.producer.relay.sequenced._commit import commit_job, outcome_unknown
from harvest_outbox.producer.relay.sequenced._failure import Counts, deliverable, judge, settle
from harvest_outbox.producer.relay.sequenced._poison import PoisonBook
from harvest_outbox.producer.relay.sequenced._produce import RowProducer
from harvest_outbox.producer.relay.sequenced._store import SequencedStore
from harvest_outbox.producer.relay.sequenced._txn import Txn, reported
from harvest_outbox.producer.relay.sequenced._view import View
from harvest_outbox.sequencer import TICK, Clock
from harvest_outbox.sequencer.clock import clock_from_unix_ns

log = logging.getLogger(__name__)


class SequencedMode:
    """The relay's ``--uuid-sequencing`` mode (see module doc): a
    :class:`~producer.relay.core.RelayMode` over a :class:`~producer.relay.core.RelayCore`. It owns the
    view and its transactions and composes three parts that own their state: the
    :class:`~producer.relay.sequenced._poison.PoisonBook`, the
    :class:`~producer.relay.sequenced._produce.RowProducer`, which fills a transaction and returns what
    it ended on, and the :class:`~producer.relay.sequenced._acks.Acks`, which follows the ACKs to
    delivery; leaving a view applies the decisions of :mod:`producer.relay.sequenced._failure`."""

    #: Bytes of headers the relay adds to every record: the ``uuid`` header.
    HEADER_BYTES = len("uuid") + 16 + 10
    #: A failed ACK must not be overtaken by a later one in its partition (per-key order): librdkafka
    #: then raises a fatal error instead of leaving a gap; the view is abandoned and a fresh producer
    #: re-sends the intents in order.
    PRODUCER_SETTINGS: ClassVar[Mapping[str, Any]] = {"enable.gapless.guarantee": True}

    def __init__(self, core: RelayCore) -> None:
        self.core = core
        self.config = core.config
        self.limits = core.limits
        self.metrics = core.metrics
        self._ready = core.ready  # the same deque for the relay's life (cleared, never replaced)
        self._held = core.held
        self._guard = core.guard
        self._view: View | None = None
        self._txns: deque[Txn] = deque()  # opened, ACKs not yet enqueued, in order
        self._acks = Acks()
        self._poison = PoisonBook(core)
        self._producer = RowProducer(core, self._txns, self._poison)
        self._view_backoff_until = 0.0
        self._last_mark_short = True
        self._hook = installed()
        self._refreshing = False
        self.views_started = 0
        #: The wall clock UUID clocks follow (Unix ns). A seam: tests step it back.
        self.wall_clock_ns = time.time_ns
        #: The clock of timeouts, ages and back-offs. A seam: the model test runs on virtual time.
        self.monotonic = time.monotonic
        # Adaptive transaction size (AIMD): a delivery failure abandons every transaction in flight,
        # so under a steady error rate e, big transactions almost never commit (a transaction of n
        # records commits with probability (1-e)^n). Halve on such an abandonment, grow by half on
        # each commit, between 1 and limits.txnMaxRecords: the relay keeps making progress.
        self.txn_limit = self.limits.txn_ceiling

    def _store(self) -> SequencedStore:
        """The database the protocol's statements run on (the write connection)."""
        assert self.core.db is not None
        return cast(SequencedStore, self.core.db)

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
        core.raise_access_failure()
        if core.producer_fatal and self._view is not None:
            self._abandon("the Kafka producer hit a fatal error", self._failed_txn())
        if core.remark:  # a DB error surfaced by the main loop, or a failure: abandon the view
            self._refresh()
            return
        if self._view is None:
            now = self.monotonic()
            if now < self._view_backoff_until:
                core.stop_requested.wait(min(0.05, self._view_backoff_until - now))
                return
            self._start_view()
            return
        view = self._view
        producer.poll(0)
        now = self.monotonic()
        self._guard.expire(now)
        self._advance(now)
        if core.remark or core.leader_id is None:
            return
        if core.halt and not (self._ready or core.marks):
            self._end_halted_view()
            return
        # mark (prefetch, as in at-least-once mode)
        mark = core.take_mark()
        if mark is not None:
            rows, persisted = mark.future.result()  # DatabaseError -> main loop: back off, abandon the view
            core.mark_size.observe(mark.asked, len(rows))
            if persisted and mark.view == view.leader_id:
                self._poison.adopt(persisted)
            if mark.view == view.leader_id:
                self._ready.extend(rows)
                self._last_mark_short = short = len(rows) < mark.asked
                core.took_mark(short, now, empty=not rows)  # short: the backlog is taken, the next mark waits
                if not short and not core.halt:
                    # A full mark: more rows wait. The database marks the next batches while this
                    # thread produces the one that just arrived (not after it).
                    core.mark_ahead(len(self._ready))
        if not core.marks and len(self._ready) < 2 * core.mark_size.value and now >= core.next_mark and not core.halt:
            core.submit_mark()
            if not (self._txns or self._acks.in_flight or self._ready or self._held):
                # Nothing else to do (e.g. woken by a stasher's NOTIFY): wait for the mark here, not in
                # 1 ms polls, so its rows go out the moment it returns (idle-to-delivery latency).
                wait((core.marks[0].future,), timeout=self.limits.min_poll_interval)
                return
        if self._held:
            core.release_held(now)
        if self._ready:
            self._fill(now)
        in_flight = self._in_flight_count()
        if self._txns or self._acks.in_flight or self._ready or core.marks:
            if not self._ready or in_flight >= self.limits.in_flight_limit or self._ring_full():
                # Nothing can be produced now: wait (a busy loop here took a core at 500 rows/s
                # whenever ready rows waited for a ring slot). Only a row's report moves a transaction
                # towards its commit; with only ACKs in flight (their reports confirm intents, which
                # waits for nothing) the loop turns in 1 ms slices, not 0.2 ms: at 500 rows/s an ACK
                # was in flight most of the time and the loop turned ~2,500 times a second.
                core.await_progress(producer, reports_awaited=in_flight > 0)
            core.notified_while_idle()
        elif self._acks.confirm_buf:
            self._flush_confirms()
        else:
            core.wait_idle()

    def _ring_full(self) -> bool:
        """No transaction can take records: the last one is closed and ``producerRing`` are open."""
        txns, view = self._txns, self._view
        return view is not None and len(txns) >= len(view.ring) and txns[-1].closed

    def _in_flight_count(self) -> int:
        return self._producer.in_flight()

    def _open(self, now: float) -> Txn | None:
        """The open transaction, or a new one (None while the producer ring is full)."""
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
        t = Txn(view, k, view.ring[k % len(view.ring)], now)
        t.first_clock = view.clock.value + TICK
        self._txns.append(t)
        return t

    def _close(self, t: Txn) -> None:
        assert self._view is not None
        t.closed = True
        t.ack_clock = self._view.clock.tick()
        if self._hook and t.pending:
            self._hook.hit("after_publish_before_delivery", settle=0.5)

    def _fill(self, now: float) -> None:
        """Produce ready rows in id order into the open transaction(s): the part fills one, the mode
        applies what it ended on (close it and open the next, or abandon the view)."""
        ready, core, limit = self._ready, self.core, self.limits.in_flight_limit
        max_records = self.txn_limit
        in_flight = self._in_flight_count()
        while ready and in_flight < limit and not core.remark:
            t = self._open(now)
            if t is None:
                return
            filled = self._producer.fill(t, max_records, in_flight)
            in_flight = filled.in_flight
            if filled.abandon is not None:
                self._abandon(filled.abandon, None)
                return
            if filled.full:
                self._close(t)
                continue
            if not ready and self._last_mark_short:
                if reported(t):
                    self._close(t)
                elif self._hook:
                    # The backlog is taken: the transaction closes at its first delivery report
                    # (_advance), with the rows marked meanwhile.
                    self._hook.hit("after_publish_before_delivery", settle=0.5)

    def _advance(self, now: float) -> None:
        """Close / commit / ACK / confirm whatever is ready, in transaction order."""
        txns = self._txns
        for t in txns:
            if t.failures:
                self._abandon(f"delivery failed in harvest transaction {t.k}: {t.failures[0].err.str()}", t)
                return
        if txns:
            last = txns[-1]
            if not last.closed and (
                now - last.opened >= self.limits.txn_max_duration
                or (not self._ready and self._last_mark_short and reported(last))
            ):
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
        while txns:
            t = txns[0]
            commit = t.commit
            if commit is None or not commit.done():
                break
            err = commit.exception()
            if err is not None:
                self._abandon(
                    f"commit of harvest transaction {t.k} failed: {err}", None, fenced=isinstance(err, FenceError)
                )
                return
            txns.popleft()
            self.metrics.delivered += len(t.ids)
            if t.ids:
                self.metrics.observe_transaction(len(t.ids))
            if self.txn_limit < self.limits.txn_ceiling:
                self.txn_limit = min(self.limits.txn_ceiling, self.txn_limit + max(1, self.txn_limit // 2))
            if self._hook:
                self._hook.hit("after_commit_before_ack")
            self._enqueue_acks(t)
            if self._acks.broken:
                self._abandon(f"producing ACK_TXN of harvest transaction {t.k} failed", None)
                return
        # ACK deliveries, in order
        delivered = self._acks.delivered()
        for t in delivered.done:
            if t.rows:  # readers see them now: their dwell ends (producer.observe._histograms)
                self.metrics.observe_dwell(t.rows, now)
        if delivered.failed is not None:
            self._abandon(f"ACK_TXN delivery of harvest transaction {delivered.failed.k} failed", None)
            return
        if self._acks.confirms_due(now):
            self._flush_confirms()
        if self.core.db_futures:
            self.core.check_db()

    def _flush_confirms(self) -> None:
        exec_ = self.core.exec
        assert exec_ is not None
        items = self._acks.take_confirms(self.monotonic() + max(self.limits.purge_interval, 0.2))
        self.core.add_db_job(exec_.submit(self._store().confirm_acks, items))

    def _submit_commits(self, batch: list[Txn]) -> None:
        """One fenced commit job for consecutive delivered transactions (see ``_advance``)."""
        exec_ = self.core.exec
        assert exec_ is not None and batch
        future = self.core.waker.watch(exec_.submit(commit_job(self._store(), batch, self.core.attempts)))
        for t in batch:
            t.commit = future

    def _enqueue_acks(self, t: Txn) -> None:
        """Produce one ACK_TXN per partition the committed transaction touched, in a fixed order."""
        producer = self.core.producer
        assert producer is not None
        self._acks.enqueue(producer, t, self._hook)

    # ------------------------------------------------------------------ leaving a view (decisions: _failure)
    def _abandon(self, why: str, failed: Txn | None, fenced: bool = False) -> None:
        """Abandon the view (the next tick winds it down): count ``failed``'s delivery failures as
        :func:`~producer.relay.sequenced._failure.judge` decides."""
        core = self.core
        if core.remark:
            return
        view = self._view
        log.warning("%s: abandoning leader view%s: %s", self.config.name, f" epoch={view.epoch}" if view else "", why)
        if failed is not None:
            self.txn_limit = max(1, self.txn_limit // 2)
            decided = judge(failed, view.max_ok if view is not None else None, core.waited_out)
            for topic in decided.oversized_topics:
                self._guard.check_sizes(topic)  # the next view refuses the oversized row alone
            for r in decided.records:
                if r.counts is Counts.ATTEMPT:
                    self._poison.count_failure(r.rid, r.err, True)
                    continue
                if r.counts is Counts.OUTAGE:
                    log.warning(
                        "delivery of record %d timed out after %.1fs while no record was delivered "
                        "(broker or network outage?): %s; not counted as an attempt",
                        r.rid,
                        r.latency,
                        r.err.str(),
                    )
                else:  # HELD_UP: park it now rather than stall everything again (the bound of rowTimeout)
                    self.metrics.delivery_failures += 1
                    attempts = core.next_attempt(r.rid)
                    self._poison.park(
                        r.rid,
                        f"held up other rows for limits.rowTimeout ({self.limits.row_timeout:g}s) while they "
                        f"were delivered: {r.err.name()}: {r.err.str()}",
                        attempts,
                    )
                    core.store_attempt(r.rid, attempts, r.err)
                if r.err.fatal():
                    core.producer_failed()
        if fenced:
            self._view_backoff_until = self.monotonic() + self.limits.heartbeat_timeout
        core.request_remark()

    def _failed_txn(self) -> Txn | None:
        """The oldest transaction with a failed delivery, if any."""
        return next((t for t in self._txns if t.failures), None)

    def _wind_down(self, commit_delivered: bool) -> None:
        """Stop producing; drain; finish (and with ``commit_delivered`` submit) commits in order;
        ACK the committed; roll back the rest; deliver ACKs; confirm. Leaves no view."""
        self.core.clear_queues()  # re-marked by the next view
        view, producer, exec_ = self._view, self.core.producer, self.core.exec
        budget = self.limits.max_poll_interval or 1.0
        deadline = self.monotonic() + budget
        if view is not None and producer is not None:
            if self._txns and not self._txns[-1].closed:
                self._close(self._txns[-1])
            while self._in_flight_count() and self.monotonic() < deadline:
                producer.poll(0.01)
            if commit_delivered and not view.failed:
                batch = deliverable(self._txns)
                if batch:
                    self._submit_commits(batch)
            if exec_ is not None:  # barrier: every submitted DB job (commits in order, confirms, a pending mark)
                try:
                    exec_.submit(lambda: None).result()
                except Exception:
                    pass
            self._settle_and_roll_back(producer, view, budget)
        self._txns.clear()
        self._acks.in_flight.clear()
        self._store_on_leaving()
        self._view = None
        self.core.drop_fatal_producer()

    def _settle_and_roll_back(self, producer: KafkaProducer, view: View, budget: float) -> None:
        """Every commit job has finished: ACK the committed transactions (:func:`settle`), roll back
        the spans of the rest, and deliver both within ``budget`` seconds (else replace the producer)."""
        acks = self._acks
        if any(t.ack_failed for t in acks.in_flight):
            acks.broken = True
        settled = settle(self._txns)
        for t in settled.committed:
            self._txns.remove(t)
            self.metrics.delivered += len(t.ids)
            if t.ids:
                self.metrics.observe_transaction(len(t.ids))
            self._enqueue_acks(t)
        for t, err in settled.dropped:
            if err is not None:
                log.warning("harvest transaction %d not committed: %s", t.k, err)
        # Rollback ACKs for the abandoned spans we know of -- except for producers with a
        # transaction whose commit outcome is unknown: a commit that failed with anything but a
        # FenceError (which rolled back) may have committed on the server, e.g. the connection
        # died between COMMIT and its reply. Its intent is then persisted and the next view
        # re-sends its ACK; a rollback ACK at the producer's older clock would first have made
        # every reader discard that span, losing its rows. Readers keep an un-ACKed span
        # pending (as after a crash) until the next view's recovery ACKs it or it is pruned.
        unknown = outcome_unknown(self._txns)
        counter = roll_back(producer, view, self._txns if not acks.broken else (), unknown)
        self._txns.clear()
        end = self.monotonic() + budget
        while (
            (acks.in_flight and any(t.ack_pending for t in acks.in_flight)) or counter.pending
        ) and self.monotonic() < end:
            producer.poll(0.01)
        acked = self.monotonic()
        for t in acks.leave():
            self.metrics.observe_dwell(t.rows, acked)
        if self._in_flight_count() or len(producer) > 0:
            log.warning("records/ACKs still queued after %.1fs; replacing the Kafka producer", budget)
            try:
                producer.purge(in_queue=True, in_flight=False)
                producer.poll(0)
            except KafkaException:
                pass
            self.core.abandon_producer()

    def _store_on_leaving(self) -> None:
        """Store the failed attempts (before the next view can produce their rows again: a crash from
        here on still counts them) and the ACK confirmations; wait for the mark and every DB job."""
        core, exec_ = self.core, self.core.exec
        if core.attempt_buf and core.db is not None and exec_ is not None:
            tried = core.take_attempt_buf()
            try:
                exec_.submit(self._store().record_attempts, tried).result()
            except DatabaseError as exc:
                core.return_attempt_buf(tried)  # stored by the next wind-down
                log.warning("could not store %d failed delivery attempt(s) (kept in memory): %s", len(tried), exc)
        acks = self._acks
        if acks.confirm_buf and core.db is not None and exec_ is not None:
            items, acks.confirm_buf = acks.confirm_buf, []
            try:
                exec_.submit(self._store().confirm_acks, items).result()
            except DatabaseError as exc:
                log.warning("could not confirm ACK intents (the next view re-sends them): %s", exc)
        core.await_mark()
        for f in core.take_db_jobs():
            try:
                f.result()
            except Exception as exc:
                log.warning("DB job failed during wind-down: %s", exc)

    def _refresh(self) -> None:
        """Abandon the current view; the next tick starts a new one (after any backoff)."""
        self._wind_down(commit_delivered=False)
        self.core.remark_taken()
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
            self._acks.in_flight.clear()
        self._poison.clear()

    # ------------------------------------------------------------------ views
    def _end_halted_view(self) -> None:
        """``deadLetterPolicy: haltKey``: the rows marked before a halt are produced; commit what was
        delivered (the dead letters with it) and leave the view, so the next one's marks leave the
        halted keys' rows in the outbox (producer.relay.key_halt). Not a failure: nothing is rolled back."""
        log.info("%s: ending the view after halting %d key(s)", self.config.name, len(self.core.halt.keys))
        self._wind_down(commit_delivered=True)
        self.metrics.remarks += 1
        self._refreshing = True

    def _start_view(self) -> None:
        """New leader id + fence epoch; recover and deliver persisted ACK intents; then go."""
        store, exec_ = self._store(), self.core.exec
        assert exec_ is not None
        leader_id = uuid.uuid4()
        epoch, intents, floor = exec_.submit(store.start_view_with_floor, leader_id, self.config.name).result()
        if self.core.leader_id is None or self.core.stop_requested.is_set():
            return  # lost leadership meanwhile (a standby's view is harmless: it fenced nobody we know)
        producer = self.core.producer
        assert producer is not None
        undelivered = recover(producer, intents, self.monotonic() + self.limits.queue_timeout, self.monotonic)
        if undelivered:
            self.core.request_remark()  # retry the view (and its recovery) after a backoff
            self._view_backoff_until = self.monotonic() + self.limits.io_error_backoff
            log.warning(
                "view epoch %d: %d recovered ACK intent(s) not delivered; starting another view", epoch, undelivered
            )
            return
        if intents:
            exec_.submit(store.confirm_acks, [(p, c) for _e, p, c, _t, _p in intents]).result()
        now_ns = self.wall_clock_ns()
        if clock_from_unix_ns(now_ns) < floor:
            log.warning(
                "%s: the wall clock is %.3fs behind the last committed ACK clock; this view's UUID clocks "
                "continue from that clock instead (clocks never go back across views)",
                self.config.name,
                (Clock(floor).as_unix_ns() - now_ns) / 1e9,
            )
        view = self._view = View(leader_id, epoch, self.limits.producer_ring, now_ns, floor)
        self._acks.broken = False
        self.core.begin_view(leader_id)
        self._last_mark_short = True
        self.views_started += 1
        log.info(
            "%s: view epoch=%d leader_id=%s producers=%s recovered_acks=%d",
            self.config.name,
            epoch,
            leader_id,
            ",".join(p.hex() for p in view.ring),
            len(intents),
        )
        if self._refreshing:
            self._refreshing = False
            self.core.emit(LeaderRefreshed(leader_id))
        self.core.emit(ViewStarted(leader_id, epoch, len(intents), tuple(view.ring)))


def _unexpected_report(err: KafkaError | None, msg: Message) -> None:
    """The producer's default delivery callback: every record and ACK this mode produces names its own."""
    log.warning(
        "delivery report for a record produced without a callback (%s/%s): %s",
        msg.topic(),
        msg.partition(),
        err.str() if err is not None else "delivered",
    )
