"""The at-least-once mode's records (:class:`~producer.relay.at_least_once.mode.AtLeastOnceMode` is the mode): their
queues, sending them, their delivery reports, and the write-behind of the outcomes (purges, resets,
dead letters, attempt counts) to the database.

The mode decides (a failed delivery: a counted attempt, an outage, a dead letter; when to mark, to
remark, to give up a view: :mod:`producer.relay.at_least_once.mode`); this part carries the records through.

Invariants:
- at most one record of a key is in flight; a key's later records wait in its FIFO, in id order, and
  go out from the delivery report of their predecessor, so a key's records are produced in id order;
- a row is purged only after its delivery report said delivered (or it is dead-lettered);
- the write-behind hands its buffers to the database worker as one job, in the order dead letters,
  purges, forgotten counts, attempt counts, then resets: a failed attempt is stored before its row is
  reset, i.e. before it can be sent again; a step that succeeded is not repeated by a retry.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message

from harvest_outbox.producer.db import MarkedRow
from harvest_outbox.producer.errors import DatabaseError
from harvest_outbox.producer.kafka import ANY_PARTITION, PURGED_CODES, KafkaProducer
from harvest_outbox.producer.ops.preflight import header_bytes, too_large
from harvest_outbox.producer.relay.core import RelayCore
from harvest_outbox.producer.relay.marked_row import ROW_ID, ROW_KEY, ROW_TOPIC
from harvest_outbox.producer.relay.spans import RecordSpan
from harvest_outbox.sequencer.native import load

# The mode's logger: the lines logged here had its name before the split, and a user's log filter keeps working.
log = logging.getLogger("harvest_outbox.producer.relay.at_least_once.mode")
# The compiled per-record path (producer/relay/at_least_once/_native.pyx), or None: the *_python methods run.
_native = load("harvest_outbox.producer.relay.at_least_once._native")


class AtLeastOnceRecords(ABC):
    """The records of an at-least-once relay: per-record delivery and batched purges (see module doc)."""

    def __init__(self, core: RelayCore) -> None:
        self.core = core
        self.limits = core.limits
        self.metrics = core.metrics
        self._ready = core.ready  # the same deque for the relay's life (cleared, never replaced)
        self._guard = core.guard
        self._verdicts = core.guard.verdicts  # the same dict for the guard's life (read per record)
        self._attempts = core.attempts  # the same dict for the relay's life (cleared, never replaced)
        self._held = core.held
        self._halted = core.halt.keys  # haltKey: (topic, key) pairs this view dead-lettered (producer.relay.key_halt)
        self._event_id = core.event_id  # eventIdHeader: (name, value prefix) or None
        # Relay spans (producer.relay.spans): None unless configured, and then _send and the delivery
        # callback run exactly the code they ran before spans existed (no per-record check).
        self._spans = core.spans
        self._traced: dict[bytes, RecordSpan] = {}  # key -> the span of its in-flight record
        self._rich_headers = self._event_id is not None or self._spans is not None
        self._waiting: dict[bytes, deque[MarkedRow]] = {}  # key -> records behind the in-flight one
        self._waiting_count = 0
        self._in_flight: dict[bytes, MarkedRow] = {}  # key -> the one unacknowledged record of that key
        self._forget_buf: list[int] = []  # delivered ids that had a persisted attempt count
        self._acked: list[MarkedRow] = []  # delivered since the last _observe_acked (the dwell histogram)
        self._purge_buf: list[int] = []
        self._reset_buf: list[int] = []
        self._dlq_buf: list[tuple[int, str, int]] = []
        # haltKey: rows dropped for a key this view halted, for the store to hold where the layout asks
        # (the cursor layout: producer/layouts/cursor/held.py, so the cursor passes them); the mark layout
        # leaves them marked
        self._hold_buf: list[int] = []
        self._draining = False
        self._next_flush = 0.0
        # The per-record path: compiled when built (the same decisions: the cold branches call this
        # class's methods), else the reference methods below.
        self._dispatch: Callable[[], None]
        self._send: Callable[[MarkedRow], bool]
        self._on_delivery: Callable[[KafkaError | None, Message], None]
        if _native is None:
            self._dispatch, self._send = self._dispatch_python, self._send_python
            self._on_delivery = self._on_delivery_python
        else:
            self._dispatch, self._send = partial(_native.dispatch, self), partial(_native.send, self)
            self._on_delivery = partial(_native.on_delivery, self)

    @abstractmethod
    def _failed(self, row: MarkedRow, err: KafkaError, synchronous: bool, latency: float | None = None) -> bool:
        """The mode's decision on a failed produce or delivery (:meth:`~producer.relay.at_least_once.mode.AtLeastOnceMode._failed`): False if
        the record was dead-lettered (its key is free), True if the relay will reset and remark."""

    # ------------------------------------------------------------------ sending
    def _dispatch_python(self) -> None:
        """Send ready records in id order while in-flight room remains; park busy keys' records."""
        ready, in_flight, waiting = self._ready, self._in_flight, self._waiting
        limit = self.limits.in_flight_limit
        send = self._send
        core = self.core
        while ready and len(in_flight) < limit and not core.remark:
            row = ready.popleft()
            key = row[ROW_KEY]
            if key in in_flight:
                parked = waiting.get(key)
                if parked is None:
                    waiting[key] = deque((row,))
                else:
                    parked.append(row)
                self._waiting_count += 1
            else:
                send(row)
                if not len(in_flight) & 127:
                    time.sleep(0)

    def _send_python(self, row: MarkedRow) -> bool:
        """Produce one record whose key is free. True if it is now in flight (or the relay must
        remark); False if it was dead-lettered on the spot (the key is still free)."""
        rid, topic, key, value, hkeys, hvals, bad, _attempts, _error, partition, _created = row
        if self._halted and (topic, key) in self._halted:
            layout = self.core.layout  # the one open() chose (outboxLayout unset: the table's)
            if layout is not None and layout.holds_dropped_rows:
                self._hold_buf.append(rid)
            return False  # haltKey: waits (marked by this view until it ends, then in the outbox)
        if bad is not None or topic is None or key is None:  # (a NULL topic or key: the statement's bad)
            self._dead_letter(row, f"bad row: {bad}", 0)
            return False
        if self._held and topic in self._held:
            self.core.hold(row)  # behind the same topic's held rows
            return False
        verdict = self._verdicts.get(topic)
        if verdict is None:
            verdict = self._guard.verdict(topic)
        if isinstance(verdict, str):
            if self.core.hold_missing and topic in self._guard.missing:
                self.core.hold(row)
                return False
            self._dead_letter(row, f"cannot be sent: {verdict}", 0)
            return False
        size = len(key) + (len(value) if value is not None else 0)
        if size > verdict or (hkeys and hvals and size + header_bytes(hkeys, hvals) > verdict):
            self._dead_letter(row, f"cannot be sent: {too_large(verdict, key, value, hkeys, hvals)}", 0)
            return False
        if partition is not None:
            # out of the topic's range: permanent, so a dead letter now, not after maxDeliveryAttempts
            beyond = self._guard.partition_problem(topic, partition, self.core.partition_column)
            if beyond is not None:
                self._dead_letter(row, f"cannot be sent: {beyond}", 0)
                return False
        producer = self.core.producer
        assert producer is not None
        self._in_flight[key] = row
        # One produce() per delivery report, so this is the relay's hottest line: no retry loop is set
        # up unless the local queue is full.
        try:
            if partition is not None or self._rich_headers:
                # a mapped table's partition column (producer.mapping.table), eventIdHeader, relay spans
                producer.produce(
                    topic,
                    value,
                    key,
                    ANY_PARTITION if partition is None else partition,
                    headers=self._headers(row, topic, key),
                )
            elif hkeys and hvals:
                producer.produce(topic, value, key, headers=list(zip(hkeys, hvals, strict=True)))
            else:
                producer.produce(topic, value, key)
            return True
        except BufferError:
            return self._send_when_room(row, producer, topic, key)
        except (KafkaException, TypeError, ValueError) as exc:
            return self._refused(row, key, exc)

    def _headers(self, row: MarkedRow, topic: str, key: bytes) -> list[tuple[str, Any]] | None:
        """The record's headers: the row's, after the event id header when eventIdHeader is set; with
        relay spans, the ``traceparent`` of the record's span, started here (producer.relay.spans).
        ``topic`` and ``key`` are the row's (checked not NULL by :meth:`_send`)."""
        row_id, _topic, _key, _value, hkeys, hvals, *_rest, created = row
        # (hvals is not None when hkeys is not, and no header key is None: the mark dead-letters such rows)
        headers: list[tuple[str, Any]] | None = list(zip(hkeys, hvals, strict=True)) if hkeys and hvals else None
        if self._spans is not None and headers:
            traced = self._spans.start(row_id, topic, created, headers)
            if traced is not None:
                # (replaces, unended and so never exported, the span of a produce() refused as queue-full)
                self._traced[key] = traced
        if self._event_id is None:
            return headers
        name, prefix = self._event_id
        return [(name, prefix + b"%d" % row_id), *(headers or ())]

    def _send_when_room(self, row: MarkedRow, producer: KafkaProducer, topic: str, key: bytes) -> bool:
        """:meth:`_send` found librdkafka's queue full: serve callbacks and retry, for ~10 s at most,
        then give up the view (remark). ``row`` is already in flight under its key."""
        _id, _topic, _key, value, *_rest, partition, _created = row
        headers = self._headers(row, topic, key)
        where = ANY_PARTITION if partition is None else partition
        for _ in range(1000):
            producer.poll(0.01)
            if self._acked:
                self._observe_acked()
            try:
                producer.produce(topic, value, key, where, headers=headers)
                return True
            except BufferError:
                continue
            except (KafkaException, TypeError, ValueError) as exc:
                return self._refused(row, key, exc)
        del self._in_flight[key]
        if self._traced:
            self._end_unreported("queue_full", "not produced: the producer's queue stayed full", key)
        self.core.request_remark()
        return True

    def _refused(self, row: MarkedRow, key: bytes, exc: Exception) -> bool:
        """``produce()`` refused ``row`` (no record was enqueued): it is no longer in flight. A Kafka
        error is a failed attempt; bad arguments (a value of the wrong type) can never be sent."""
        del self._in_flight[key]
        if self._traced:
            kind = exc.args[0].name() if isinstance(exc, KafkaException) else type(exc).__name__
            self._end_unreported(kind, f"produce() refused the record: {exc}", key)
        if isinstance(exc, KafkaException):
            return self._failed(row, exc.args[0], synchronous=True)
        self._dead_letter(row, f"cannot produce: {exc}", 1)
        return False

    def _on_delivery_python(self, err: KafkaError | None, msg: Message) -> None:
        """A record's delivery report: purge it, or count the failure; send its key's next record."""
        key = msg.key()
        if key is None:
            return  # not ours: every record this mode produces has a key
        row = self._in_flight.pop(key, None)
        if row is None:  # not ours any more (view abandoned after a drain timeout)
            return
        if err is None:
            rid = row[ROW_ID]
            self._purge_buf.append(rid)
            self._acked.append(row)
            self.metrics.delivered += 1
            if self._attempts and self._attempts.pop(rid, None) is not None:
                self._forget_buf.append(rid)
            parked = self._waiting.get(key)
            if parked and not self.core.remark:  # (an empty queue is never kept; this reads it safely anyway)
                # _release inlined for its usual case (one report, one send): this runs per record
                nxt = parked.popleft()
                self._waiting_count -= 1
                if not parked:
                    del self._waiting[key]
                if not self._send(nxt):  # dead-lettered on the spot: the key is still free
                    self._release(key)
        elif self._draining and err.code() in PURGED_CODES:
            return  # we gave up on it (drain timed out): the next view re-marks it; not an attempt
        elif not self._failed(row, err, synchronous=False, latency=msg.latency()):
            self._release(key)

    def _on_delivery_traced(self, err: KafkaError | None, msg: Message) -> None:
        """:meth:`_on_delivery` with relay spans: also ends the record's span. The span is taken first:
        the report may send the key's next record, whose span then takes the key's place."""
        key = msg.key()
        traced = self._traced.pop(key, None) if key is not None else None
        self._on_delivery(err, msg)
        if traced is not None and self._spans is not None:
            self._spans.end(traced, err, msg)

    def _end_unreported(self, error_type: str, why: str, key: bytes | None = None) -> None:
        """No report will come for ``key``'s record (every in-flight record's, without a key): its span
        ends as failed."""
        assert self._spans is not None
        if key is None:
            traced, self._traced = list(self._traced.values()), {}
        else:
            one = self._traced.pop(key, None)
            traced = [one] if one is not None else []
        for record in traced:
            self._spans.fail(record, error_type, why)

    def _observe_acked(self, now: float | None = None) -> None:
        """Count the dwell of the records acknowledged since the last call (right after the polls that
        served their reports: one histogram update per batch, not per record)."""
        self.metrics.observe_dwell(self._acked, time.monotonic() if now is None else now)
        self._acked.clear()

    def _release(self, key: bytes) -> None:
        """``key`` has nothing in flight: send its next parked record(s)."""
        parked = self._waiting.get(key)
        while parked and not self.core.remark:
            row = parked.popleft()
            self._waiting_count -= 1
            if not parked:
                del self._waiting[key]
            if self._send(row):
                return

    def _dead_letter(self, row: MarkedRow, error: str, attempts: int) -> None:
        rid = row[ROW_ID]
        log.error("record %d (topic %r) moved to dead letters: %s", rid, row[ROW_TOPIC], error)
        self.core.forget_attempts(rid)
        self.core.halt.halt(row)
        self._dlq_buf.append((rid, error, attempts))
        self.metrics.dead_lettered += 1

    # ------------------------------------------------------------------ write-behind
    def _has_writes(self) -> bool:
        return bool(
            self._purge_buf
            or self._dlq_buf
            or self._reset_buf
            or self.core.attempt_buf
            or self._forget_buf
            or self._hold_buf
        )

    def _flush_db(self, wait: bool = False) -> None:
        """Hand buffered dead letters, purges, attempt counts and resets to the DB worker (in that
        order, one job: a failed attempt is stored before its row is reset, i.e. before it can be
        re-sent). With ``wait``, block until every submitted job (and any pending mark) is done;
        raise the first error."""
        core = self.core
        if self._has_writes():
            db, exec_ = core.db, core.exec
            assert db is not None and exec_ is not None
            dlq, purge, reset = self._dlq_buf, self._purge_buf, self._reset_buf
            tried, forget, hold = core.take_attempt_buf(), self._forget_buf, self._hold_buf
            self._dlq_buf, self._purge_buf, self._reset_buf = [], [], []
            self._forget_buf, self._hold_buf = [], []
            backoff = self.limits.io_error_backoff

            # In this order; a step that succeeded empties its buffer, so a retry does not repeat it.
            steps: tuple[tuple[list[Any], Any], ...] = (
                (dlq, db.dead_letter),
                (hold, db.hold),  # (only ever filled on the cursor layout; before the purge that passes them)
                (purge, db.purge),
                (forget, db.forget_attempts),
                (tried, db.record_attempts),
            )

            def job() -> None:
                for attempt in range(3):  # short retries: a blip must not cost a remark
                    try:
                        for buf, write in steps:
                            if buf:
                                write(buf)
                                buf.clear()
                        if reset:
                            db.reset(reset)
                        return
                    except DatabaseError:
                        if attempt == 2:
                            raise
                        time.sleep(backoff)

            core.add_db_job(exec_.submit(job))
        if wait:
            core.await_mark()
            futures = core.take_db_jobs()
            for f in futures:
                err = f.exception()  # waits for it
                if err is not None:
                    raise err

    def _clear_queues(self) -> None:
        self.core.clear_queues()
        self._waiting.clear()
        self._waiting_count = 0
