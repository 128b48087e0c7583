"""How the ``--uuid-sequencing`` relay produces marked rows into harvest transactions
(docs/design.md §5, step 3): a part of :class:`~producer.relay.sequenced.mode.SequencedMode`, which opens and
closes the transactions; :class:`RowProducer` fills one and returns what it ended on (:class:`Filled`).

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
- failed attempts are counted per row (``core.attempts``) and queued for the DB (``attempt_buf``) by
  the :class:`~producer.relay.sequenced._poison.PoisonBook`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from confluent_kafka import KafkaError, KafkaException

from harvest_outbox.producer.db import MarkedRow
from harvest_outbox.producer.db.fence import DeadRow
from harvest_outbox.producer.kafka import ANY_PARTITION, is_permanent
from harvest_outbox.producer.ops.preflight import header_bytes, too_large
from harvest_outbox.producer.relay.core import RelayCore
from harvest_outbox.producer.relay.marked_row import ROW_ID, ROW_TOPIC
from harvest_outbox.producer.relay.sequenced._poison import PoisonBook
from harvest_outbox.producer.relay.sequenced._txn import Slot, TracedSlot, Txn
from harvest_outbox.producer.relay.sequenced._view import continue_uuid
from harvest_outbox.sequencer import TICK
from harvest_outbox.sequencer.native import load

log = logging.getLogger(__name__)
_yield = time.sleep
# The compiled fill loop (producer/relay/sequenced/_native.pyx), or None: then fill_python runs.
_native = load("harvest_outbox.producer.relay.sequenced._native")


@dataclass(frozen=True)
class Filled:
    """What filling a transaction ended on, for the mode to apply: ``full`` (it reached its size
    limit: close it, open the next), ``abandon`` (why the view must be abandoned: a synchronous
    failure used up its tries), or neither (no ready row, or the in-flight limit); ``in_flight`` is
    the fill's count of records in flight when it stopped."""

    in_flight: int
    full: bool = False
    abandon: str | None = None


class RowProducer:
    """Produces ready rows into a harvest transaction (see module doc). Owns the pool of delivery
    callbacks and the count of the head row's consecutive synchronous failures; reads the relay's
    ready and held rows and the mode's transactions (the same objects for the relay's life)."""

    def __init__(self, core: RelayCore, txns: deque[Txn], poison: PoisonBook) -> None:
        self.core = core
        self.limits = core.limits
        self.metrics = core.metrics
        self.txns = txns
        self.poison = poison
        self.slots: list[Slot] = []  # free delivery-callback slots (see _txn.Slot)
        self.sync_failures = 0  # consecutive synchronous produce failures of the row at the head of ready

    def in_flight(self) -> int:
        """Records produced and not yet reported, over every open transaction."""
        return sum(t.pending for t in self.txns)

    def fill(self, t: Txn, max_records: int, in_flight: int) -> Filled:
        """Produce ready rows in id order into ``t`` (open), while fewer than ``inFlightLimit`` records
        are in flight (``in_flight`` now): compiled when the native module is built, else
        :meth:`fill_python`."""
        if _native is None:
            return self.fill_python(t, max_records, in_flight)
        in_flight, full, abandon = _native.fill(self, t, max_records, in_flight)
        return Filled(in_flight, full, abandon)

    def fill_python(self, t: Txn, max_records: int, in_flight: int) -> Filled:
        """:meth:`fill` in Python: the reference the compiled loop (``_native.fill``) is tested against."""
        core = self.core
        ready, held, txns, guard = core.ready, core.held, self.txns, core.guard
        producer = core.producer
        assert producer is not None
        limit = self.limits.in_flight_limit
        clock = t.view.clock
        poison, parked = self.poison, self.poison.rows  # (the dict: a C-level check per row)
        halted = core.halt.keys  # haltKey: (topic, key) pairs this view dead-lettered (producer.relay.key_halt)
        verdicts = guard.verdicts
        event_id = core.event_id  # eventIdHeader: (name, value prefix) or None
        spans = core.spans  # relay spans (producer.relay.spans) or None: then no span code runs
        make_slot: Callable[[list[Slot]], Slot] = Slot if spans is None else partial(TracedSlot, spans=spans)
        prod = t.producer
        rows, ids = t.rows, t.ids
        slots = self.slots
        while ready and in_flight < limit:
            row = ready[0]
            rid, topic, key, value, hkeys, hvals, bad, _attempts, _error, partition, _created = row
            if halted and (topic, key) in halted:
                ready.popleft()  # waits: marked by this view until it ends, then left in the outbox
                t.held.append(rid)  # (outboxLayout: cursor: held by this transaction's commit)
                continue
            if parked and rid in parked:
                ready.popleft()
                reason, attempts = poison.take(rid)
                self._dead_letter_in(t, row, reason, attempts)
                continue
            if bad is not None or topic is None or key is None:  # (a NULL topic or key: the statement's bad)
                ready.popleft()
                self._dead_letter_in(t, row, f"bad row: {bad}", 0)
                continue
            if held and topic in held:
                ready.popleft()
                self.core.hold(row)
                continue
            verdict = verdicts.get(topic)
            if verdict is None:
                verdict = guard.verdict(topic)
            if isinstance(verdict, str):
                ready.popleft()
                if self.core.hold_missing and topic in guard.missing:
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
                beyond = guard.partition_problem(topic, partition, self.core.partition_column)
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
                in_flight = sum(x.pending for x in txns)
                continue
            except KafkaException as exc:
                slot.txn = None
                slots.append(slot)
                err: KafkaError = exc.args[0]
                if spans is not None:
                    self._refused_span(slot, err.name(), f"produce() refused the record: {err.str()}")
                why = self._refused(t, row, err)
                if why is not None:
                    return Filled(in_flight, abandon=why)
                continue
            except (TypeError, ValueError) as exc:
                slot.txn = None
                slots.append(slot)
                if spans is not None:
                    self._refused_span(slot, type(exc).__name__, f"produce() refused the record: {exc}")
                ready.popleft()
                self._dead_letter_in(t, row, f"cannot produce: {exc}", 1)
                continue
            ready.popleft()
            self.sync_failures = 0
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
                return Filled(in_flight, full=True)
        return Filled(in_flight)

    def _refused(self, t: Txn, row: MarkedRow, err: KafkaError) -> str | None:
        """``produce()`` refused the head ready row ``row`` with ``err`` (the record was never
        enqueued): dead-letter it when permanent, else retry it now, before any later record (the log
        stays in id order, so the view survives), up to ``maxDeliveryAttempts`` tries. Returns why the
        view must be abandoned once they are used up, else None (the row was taken, or is retried)."""
        ready, rid = self.core.ready, row[ROW_ID]
        if is_permanent(err, True):
            ready.popleft()
            self.sync_failures = 0
            self._dead_letter_in(t, row, f"cannot be sent: {err.name()}: {err.str()}", 1)
            return None
        self.sync_failures += 1
        if self.sync_failures < self.limits.max_delivery_attempts:
            producer = self.core.producer
            assert producer is not None
            producer.poll(min(0.001 * 2**self.sync_failures, 0.1))
            return None
        ready.popleft()
        self.sync_failures = 0
        self.poison.count_failure(rid, err, False)
        return f"produce failed for record {rid}: {err.str()}"

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
        t.dead.append(DeadRow(rid, error, attempts))
        self.metrics.dead_lettered += 1
