"""How the ``--uuid-sequencing`` relay produces marked rows into harvest transactions
(docs/design.md §5, step 3): a part of :class:`~producer.relay.sequenced.mode.SequencedMode`, which owns the
state named in :class:`TxnProducer`'s annotations.

Invariants:
- ready rows are produced in id order through the one idempotent producer, into the open
  transaction; a new transaction opens only while fewer than ``producerRing`` are open (ACK *k-M*
  was enqueued), with the next ProducerID of the ring;
- every record's clock is above the previous one's; a transaction's ACK clock is ticked when it
  closes, so ACK clocks rise in transaction order;
- a transaction closes at its size limit (``txn_limit``, adaptive), at ``txnMaxDuration``, or once
  the backlog is taken and a report of it arrived (:func:`~producer.relay.sequenced._txn.reported`);
- a row that can never be produced (bad, too large, a topic no broker takes, a permanent produce
  error, or out of delivery attempts) is dead-lettered inside the current transaction's fenced
  commit, never produced; a transient synchronous failure is retried before any later row (the log
  stays in id order), and abandons the view after ``maxDeliveryAttempts`` tries;
- under ``deadLetterPolicy: haltKey`` no row of a dead-lettered row's (topic, key) is produced after it
  in the view (:mod:`producer.relay.key_halt`);
- failed attempts are counted per row (``core.attempts``) and queued for the DB (``attempt_buf``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from functools import partial

from confluent_kafka import KafkaError, KafkaException

from harvest_outbox.producer.config import Limits
from harvest_outbox.producer.db import MarkedRow
from harvest_outbox.producer.kafka import ANY_PARTITION, is_permanent
from harvest_outbox.producer.observe.metrics import Metrics
from harvest_outbox.producer.ops.preflight import TopicGuard, header_bytes, too_large
from harvest_outbox.producer.relay.core import RelayCore
from harvest_outbox.producer.relay.crash_points import CrashPoints
from harvest_outbox.producer.relay.marked_row import ROW_ID, ROW_TOPIC
from harvest_outbox.producer.relay.sequenced._txn import Slot, TracedSlot, Txn, reported
from harvest_outbox.producer.relay.sequenced._view import View, continue_uuid
from harvest_outbox.sequencer import TICK

log = logging.getLogger(__name__)
_yield = time.sleep


class TxnProducer:
    """Opening, filling and closing harvest transactions (see module doc)."""

    core: RelayCore
    limits: Limits
    metrics: Metrics
    _view: View | None
    _txns: deque[Txn]
    _ready: deque[MarkedRow]
    _held: dict[str, deque[MarkedRow]]
    _guard: TopicGuard
    _slots: list[Slot]
    _poison: dict[int, tuple[str, int]]
    _sync_failures: int
    _last_mark_short: bool
    _hook: CrashPoints
    txn_limit: int
    wall_clock_ns: Callable[[], int]
    _abandon: Callable[..., None]  # producer.relay.sequenced._failure.ViewFailure

    def _in_flight_count(self) -> int:
        return sum(t.pending for t in self._txns)

    def _open(self, now: float) -> Txn | None:
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
        halted = self.core.halt.keys  # haltKey: (topic, key) pairs this view dead-lettered (producer.relay.key_halt)
        verdicts = self._guard.verdicts
        event_id = self.core.event_id  # eventIdHeader: (name, value prefix) or None
        spans = self.core.spans  # relay spans (producer.relay.spans) or None: then no span code runs
        make_slot: Callable[[list[Slot]], Slot] = Slot if spans is None else partial(TracedSlot, spans=spans)
        while ready and in_flight < limit and not self.core.remark:
            t = self._open(now)
            if t is None:
                return
            prod = t.producer
            rows, ids = t.rows, t.ids
            slots = self._slots
            while ready and in_flight < limit:
                row = ready[0]
                rid, topic, key, value, hkeys, hvals, bad, _attempts, _error, partition, _created = row
                if halted and (topic, key) in halted:
                    ready.popleft()  # waits: marked by this view until it ends, then left in the outbox
                    t.held.append(rid)  # (outboxLayout: cursor: held by this transaction's commit)
                    continue
                if poison and rid in poison:
                    ready.popleft()
                    reason, attempts = poison.pop(rid)
                    self._dead_letter_in(t, row, reason, attempts)
                    continue
                if bad is not None or topic is None or key is None:  # (a NULL topic or key: the statement's bad)
                    ready.popleft()
                    self._dead_letter_in(t, row, f"bad row: {bad}", 0)
                    continue
                if self._held and topic in self._held:
                    ready.popleft()
                    self.core.hold(row)
                    continue
                verdict = verdicts.get(topic)
                if verdict is None:
                    verdict = self._guard.verdict(topic)
                if isinstance(verdict, str):
                    ready.popleft()
                    if self.core.hold_missing and topic in self._guard.missing:
                        self.core.hold(row)
                        continue
                    self._dead_letter_in(t, row, f"cannot be sent: {verdict}", 0)
                    continue
                size = len(key) + (len(value) if value is not None else 0)
                if size > verdict or (hkeys and hvals and size + header_bytes(hkeys, hvals) > verdict):
                    ready.popleft()
                    why = too_large(verdict, key, value, hkeys, hvals)
                    self._dead_letter_in(t, row, f"cannot be sent: {why}", 0)
                    continue
                if partition is not None:
                    # out of the topic's range: permanent, a dead letter now (not after maxDeliveryAttempts)
                    beyond = self._guard.partition_problem(topic, partition, self.core.partition_column)
                    if beyond is not None:
                        ready.popleft()
                        self._dead_letter_in(t, row, f"cannot be sent: {beyond}", 0)
                        continue
                c = clock.value + TICK
                headers: list[tuple[str, str | bytes | None]] = [("uuid", continue_uuid(prod, c))]
                if event_id is not None:
                    headers.append((event_id[0], event_id[1] + b"%d" % rid))
                if hkeys and hvals:
                    headers.extend(zip(hkeys, hvals, strict=True))
                slot = slots.pop() if slots else make_slot(slots)
                slot.txn, slot.clock = t, c
                if spans is not None and hkeys and isinstance(slot, TracedSlot):
                    # the span starts now; the record's traceparent names it (a relay with spans has only TracedSlots)
                    slot.span = spans.start(rid, topic, _created, headers)
                try:
                    # By position (PRODUCE_ARGS): partition, callback, on_delivery, timestamp, headers.
                    where = ANY_PARTITION if partition is None else partition
                    producer.produce(topic, value, key, where, slot, None, 0, headers)
                except BufferError:
                    slot.txn = None
                    if isinstance(slot, TracedSlot):
                        slot.span = None  # dropped unended (never exported): the retry starts its own
                    slots.append(slot)  # not enqueued: no report will return it
                    producer.poll(0.005)
                    in_flight = self._in_flight_count()
                    continue
                except KafkaException as exc:
                    slot.txn = None
                    slots.append(slot)
                    err: KafkaError = exc.args[0]
                    if spans is not None:
                        self._refused_span(slot, err.name(), f"produce() refused the record: {err.str()}")
                    if is_permanent(err, True):
                        ready.popleft()
                        self._sync_failures = 0
                        self._dead_letter_in(t, row, f"cannot be sent: {err.name()}: {err.str()}", 1)
                        continue
                    # A synchronous failure means the record was never enqueued: retrying it now,
                    # before any later record, keeps the log in id order, so the view survives.
                    self._sync_failures += 1
                    if self._sync_failures < self.limits.max_delivery_attempts:
                        producer.poll(min(0.001 * 2**self._sync_failures, 0.1))
                        continue
                    ready.popleft()
                    self._sync_failures = 0
                    self._count_failure(rid, err, False)
                    self._abandon(f"produce failed for record {rid}: {err.str()}", None)
                    return
                except (TypeError, ValueError) as exc:
                    slot.txn = None
                    slots.append(slot)
                    if spans is not None:
                        self._refused_span(slot, type(exc).__name__, f"produce() refused the record: {exc}")
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
                if reported(t):
                    self._close(t)
                elif self._hook:
                    # The backlog is taken: the transaction closes at its first delivery report
                    # (_advance), with the rows marked meanwhile.
                    self._hook.hit("after_publish_before_delivery", settle=0.5)

    def _refused_span(self, slot: Slot, error_type: str, why: str) -> None:
        """``produce()`` raised: no report will come, so the record's span (if it has one) ends failed."""
        if isinstance(slot, TracedSlot) and slot.span is not None:
            span, slot.span = slot.span, None
            slot.spans.fail(span, error_type, why)

    def _dead_letter_in(self, t: Txn, row: MarkedRow, error: str, attempts: int) -> None:
        rid = row[ROW_ID]
        log.error(
            "record %d (topic %r) will be moved to dead letters with harvest transaction %d: %s",
            rid,
            row[ROW_TOPIC],
            t.k,
            error,
        )
        self.core.forget_attempts(rid)
        self.core.halt.halt(row)
        t.dead.append((rid, error, attempts))
        self.metrics.dead_lettered += 1

    def _take_persisted(self, persisted: dict[int, tuple[int, str | None]]) -> None:
        """Adopt the stored attempt counts of freshly marked rows; rows that used them up (in this
        or in crashed processes) are dead-lettered by the transaction that meets them."""
        limit = self.limits.max_delivery_attempts
        for rid, (n, error) in persisted.items():
            n = self.core.adopt_attempts(rid, n)
            if n >= limit and rid not in self._poison:
                self._poison[rid] = (
                    f"failed {n} delivery attempts (counted across relay restarts); last error: {error}",
                    n,
                )

    def _count_failure(self, rid: int, err: KafkaError, asynchronous: bool) -> None:
        self.metrics.delivery_failures += 1
        attempts = self.core.next_attempt(rid)
        permanent = asynchronous and is_permanent(err, False)
        if permanent or attempts >= self.limits.max_delivery_attempts:
            why = "cannot be sent" if permanent else f"failed {attempts} delivery attempts"
            self._poison[rid] = (f"{why}: {err.name()}: {err.str()}", attempts)
        self.core.store_attempt(rid, attempts, err)
        if err.fatal():
            self.core.producer_failed()
