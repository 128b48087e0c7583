"""The relay's at-least-once mode: goharvest's mark-purge/reset (MP/R) algorithm.

A :class:`~producer.relay_core.RelayMode` over a :class:`~producer.relay_core.RelayCore`. While
leader, with ``leader_id`` the current *view*:

1. **mark**: when fewer than twice the mark size are queued, one UPDATE … RETURNING claims the next
   rows (ordered by id) not already owned by this view; rows of a dead or deposed leader are claimed
   too (salvage). Late-committing rows with lower ids are simply picked up by a later mark — there
   is no offset to skip past them. The mark size adapts to the backlog
   (:class:`~producer.marksize.MarkSize`: from goharvest's 100 up to ``markQueryRecords``), and the
   next mark runs while this thread produces the previous one's rows. Rows no broker will take
   (missing, internal or illegal topic, too large for the topic) are dead-lettered before producing
   (:mod:`producer.preflight`).
2. **send**: records go out in id order, at most ``maxInFlightRecords`` unacknowledged and at most
   ONE per key; a record whose key is busy waits in that key's FIFO and is sent from the delivery
   callback of its predecessor. Hence per-key order = id order, even across retries.
3. **purge**: delivered ids are buffered and deleted in batches (``purgeBatchRecords`` or every
   ``purgeInterval``, one write job at a time, so a batch grows while the database is busy) —
   never one round trip per record.
4. **reset + remark**: on a failed delivery (or a produce/mark error) the record is reset
   (``leader_id=NULL``), sending stops, in-flight records drain, buffers are flushed, and a new
   ``leader_id`` is taken (``LeaderRefreshed``), so the next mark re-claims every unpurged row,
   the failed one first for its key.
5. **dead letters**: a record that failed ``maxDeliveryAttempts`` times, or can never be sent (bad
   row, record too large, invalid/unknown topic), is moved to the dead-letter table (one statement:
   delete + insert) and its key moves on; other keys never wait for it. Under ``deadLetterPolicy:
   haltKey`` its key's later rows wait instead: not sent in this view, which ends (a remark) once
   the rows marked before the halt are out; later marks leave them in the outbox (producer.key_halt).
6. **outage or poison**: a record that waited out its delivery timeout (``limits.rowTimeout``,
   which ``message.timeout.ms`` derives from) counts as a failed attempt only if other records were
   delivered meanwhile; if nothing was (broker or network outage) it is reset and re-sent without
   counting, so an outage never fills the dead-letter table.
7. **attempt counts are persisted**: every failed attempt is written to the delivery-attempts
   table with the write-behind job that also resets the row, i.e. before the row can be sent again;
   the mark returns each row's stored count. So relay restarts, crashes and leader changes do not
   reset the count: a row that keeps failing reaches the dead letters whichever process tries it.

Invariants (tested in ``tests/test_producer``):
- a row is deleted from the outbox only after Kafka acknowledged it (or it was dead-lettered);
- for any key at most one record is unacknowledged, and records of a key are produced in id order;
- losing leadership (revoke, fence, stop) stops sending, drains in-flight records (bounded by
  ``maxPollInterval``), flushes purges, then the relay reports the event.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Mapping
from typing import Any, ClassVar

from confluent_kafka import KafkaError, KafkaException, Message

from harvest_outbox.producer.db import ROW_CREATED, MarkedAttempts, MarkedRow
from harvest_outbox.producer.errors import DatabaseError
from harvest_outbox.producer.events import LeaderRefreshed
from harvest_outbox.producer.kafka import ANY_PARTITION, KafkaProducer, is_permanent, is_size_refusal
from harvest_outbox.producer.preflight import header_bytes, too_large
from harvest_outbox.producer.relay_core import RelayCore
from harvest_outbox.producer.relay_spans import RecordSpan

log = logging.getLogger(__name__)

# Delivery reports of records the relay itself purged from the producer's queue.
_PURGED = frozenset(
    c
    for c in (getattr(KafkaError, "_PURGE_QUEUE", None), getattr(KafkaError, "_PURGE_INFLIGHT", None))
    if c is not None
)


class AtLeastOnceMode:
    """Per-record delivery and batched purges (see module doc)."""

    #: Bytes of headers the relay adds to every record: none.
    HEADER_BYTES = 0
    #: Producer settings this mode needs (where the user set none): none beyond the config's.
    PRODUCER_SETTINGS: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, core: RelayCore) -> None:
        self.core = core
        self.limits = core.limits
        self.metrics = core.metrics
        self._ready = core.ready  # the same deque for the relay's life (cleared, never replaced)
        self._guard = core.guard
        self._verdicts = core.guard.verdicts  # the same dict for the guard's life (read per record)
        self._attempts = core.attempts  # the same dict for the relay's life (cleared, never replaced)
        self._held = core.held
        self._halted = core.halt.keys  # haltKey: (topic, key) pairs this view dead-lettered (producer.key_halt)
        self._event_id = core.event_id  # eventIdHeader: (name, value prefix) or None
        # Relay spans (producer.relay_spans): None unless configured, and then _send and the delivery
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
        self._draining = False
        self._next_flush = 0.0

    # ------------------------------------------------------------------ RelayMode
    def ensure_producer(self) -> KafkaProducer:
        report = self._on_delivery if self._spans is None else self._on_delivery_traced
        return self.core.ensure_producer(self.PRODUCER_SETTINGS, report)

    def on_acquired(self) -> None:
        pass

    def gauges(self) -> tuple[int, int]:
        return len(self._in_flight), len(self._ready) + self._waiting_count + self.core.held_count

    def in_flight_keys(self) -> list[bytes]:
        return list(self._in_flight)

    def tick(self) -> None:
        core = self.core
        producer = self.ensure_producer()
        if core.producer_fatal:
            core.request_remark()  # the refresh replaces the producer
        if self._acked:
            self._observe_acked()
        if core.remark:
            self._refresh()
            return
        self._guard.expire(time.monotonic())
        if self._held:
            core.release_held(time.monotonic())
        if self._ready:
            self._dispatch()
        producer.poll(0)
        now = time.monotonic()
        if self._acked:
            self._observe_acked(now)
        if core.db_futures:
            core.check_db()
        # Write-behind with at most one write job at a time: while the database deletes one batch
        # the next one grows, so the batch size follows the database's speed (group commit).
        if (
            self._has_writes()
            and not core.db_futures
            and (now >= self._next_flush or len(self._purge_buf) >= self.limits.purge_batch_records)
        ):
            self._flush_db()
            self._next_flush = now + self.limits.purge_interval
        if core.remark or core.leader_id is None:
            return
        if self._halted and not (self._ready or self._waiting_count or core.marks):
            # haltKey: what was marked before the halt is out; a new view's marks leave the key's rows
            core.request_remark()
            return
        if core.marks:
            mark = core.take_mark()
            if mark is not None:
                rows, persisted = mark.future.result()  # DatabaseError -> main loop: back off, remark
                core.mark_size.observe(mark.asked, len(rows))
                if mark.view != core.leader_id:
                    return  # marked for an abandoned view; the current view re-marks them
                short = len(rows) < mark.asked
                if persisted:
                    rows = self._take_attempts(rows, persisted)
                if rows:
                    self._ready.extend(rows)
                    # A short mark took the whole backlog: like an empty one, the next waits for a
                    # stasher's NOTIFY (or markBackoff), not runs at once to come back empty (that
                    # doubled the marks of a trickle: two per row at 500 rows/s).
                    core.took_mark(short, now)
                    if not short and not self._halted:
                        # A full mark: more rows wait. Ask for them now, so the database marks the next
                        # batches while this thread produces this one (not after: that serialised them).
                        core.mark_ahead(len(self._ready) + self._waiting_count)
                    self._dispatch()
                    producer.poll(0)
                    return
                core.took_mark(True, now)
        elif (
            len(self._ready) + self._waiting_count < 2 * core.mark_size.value
            and now >= core.next_mark
            and not self._halted
        ):
            core.submit_mark()
            if not (self._in_flight or self._ready):
                # nothing else to do: wait for the mark result right here
                core.marks[0].future.result()
            return
        if self._in_flight or self._ready or self._waiting_count or core.marks:
            # Busy: wait for acknowledgements (they arrive as callbacks inside poll), a mark, a NOTIFY.
            core.await_progress(producer)
            core.notified_while_idle()
        elif self._has_writes():
            self._flush_db()
        else:
            core.wait_idle()

    def relinquish(self, why: str) -> None:
        log.info(
            "%s: giving up leadership (%s): draining %d in-flight record(s)",
            self.core.config.name,
            why,
            len(self._in_flight),
        )
        self._clear_queues()
        self.core.request_remark()  # no more sends
        self._drain(self.limits.max_poll_interval)  # type: ignore[arg-type]
        try:
            self._flush_db(wait=True)
        except DatabaseError as exc:
            # The rows stay marked by a leader id nobody will use again: the next leader re-marks them.
            log.warning("could not flush purges while giving up leadership (records will be re-sent): %s", exc)
            self._purge_buf, self._dlq_buf, self._reset_buf = [], [], []
            self.core.take_attempt_buf()
            self._forget_buf = []

    # ------------------------------------------------------------------ marks
    def _take_attempts(self, rows: list[MarkedRow], persisted: MarkedAttempts) -> list[MarkedRow]:
        """Adopt the stored attempt counts of freshly marked rows; dead-letter (and drop from
        ``rows``) those that already used up ``maxDeliveryAttempts`` — e.g. in processes that crashed."""
        limit = self.limits.max_delivery_attempts
        attempts = self.core.attempts  # read here; counted by the core
        spent: set[int] = set()
        for rid, (n, _error) in persisted.items():
            if self.core.adopt_attempts(rid, n) >= limit:
                spent.add(rid)
        if not spent:
            return rows
        kept = []
        for row in rows:
            if row[0] in spent:
                _n, error = persisted[row[0]]
                self._dead_letter(
                    row,
                    f"failed {attempts[row[0]]} delivery attempts (counted across relay restarts); last error: {error}",
                    attempts[row[0]],
                )
            else:
                kept.append(row)
        return kept

    # ------------------------------------------------------------------ sending
    def _dispatch(self) -> None:
        """Send ready records in id order while in-flight room remains; park busy keys' records."""
        ready, in_flight, waiting = self._ready, self._in_flight, self._waiting
        limit = self.limits.in_flight_limit
        send = self._send
        core = self.core
        while ready and len(in_flight) < limit and not core.remark:
            row = ready.popleft()
            key = row[2]
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

    def _send(self, row: MarkedRow) -> bool:
        """Produce one record whose key is free. True if it is now in flight (or the relay must
        remark); False if it was dead-lettered on the spot (the key is still free)."""
        _id, topic, key, value, hkeys, hvals, bad, _attempts, _error, partition, _created = row
        if self._halted and (topic, key) in self._halted:
            return False  # haltKey: waits (marked by this view until it ends, then in the outbox)
        if bad is not None:
            self._dead_letter(row, f"bad row: {bad}", 0)
            return False
        if self._held and topic in self._held:
            self.core.hold(row)  # behind the same topic's held rows
            return False
        verdict = self._verdicts.get(topic)  # type: ignore[arg-type]
        if verdict is None:
            verdict = self._guard.verdict(topic)  # type: ignore[arg-type]
        if verdict.__class__ is str:
            if self.core.hold_missing and topic in self._guard.missing:
                self.core.hold(row)
                return False
            self._dead_letter(row, f"cannot be sent: {verdict}", 0)
            return False
        size = len(key) + (len(value) if value is not None else 0)  # type: ignore[arg-type]
        if size > verdict or (hkeys and size + header_bytes(hkeys, hvals) > verdict):  # type: ignore[operator,arg-type]
            self._dead_letter(row, f"cannot be sent: {too_large(verdict, key, value, hkeys, hvals)}", 0)  # type: ignore[arg-type]
            return False
        producer = self.core.producer
        assert producer is not None
        self._in_flight[key] = row  # type: ignore[index]  # a good row's key is not None (NULL: bad)
        # One produce() per delivery report, so this is the relay's hottest line: no retry loop is set
        # up unless the local queue is full.
        try:
            if partition is not None or self._rich_headers:
                # a mapped table's partition column (producer.table_mapping), eventIdHeader, relay spans
                producer.produce(
                    topic,  # type: ignore[arg-type]  # None only in a bad row, dead-lettered above
                    value,
                    key,
                    ANY_PARTITION if partition is None else partition,
                    headers=self._headers(row),
                )
            elif hkeys:
                producer.produce(topic, value, key, headers=list(zip(hkeys, hvals, strict=True)))  # type: ignore[arg-type]
            else:
                producer.produce(topic, value, key)  # type: ignore[arg-type]
            return True
        except BufferError:
            return self._send_when_room(row, producer)
        except (KafkaException, TypeError, ValueError) as exc:
            return self._refused(row, exc)

    def _headers(self, row: MarkedRow) -> list[tuple[str, Any]] | None:
        """The record's headers: the row's, after the event id header when eventIdHeader is set; with
        relay spans, the ``traceparent`` of the record's span, started here (producer.relay_spans)."""
        row_id, topic, key, _value, hkeys, hvals = row[:6]
        # (hvals is not None when hkeys is not, and no header key is None: the mark dead-letters such rows)
        headers: list[tuple[str, Any]] | None = list(zip(hkeys, hvals, strict=True)) if hkeys else None  # type: ignore[arg-type]
        if self._spans is not None and headers:
            traced = self._spans.start(row_id, topic, row[ROW_CREATED], headers)  # type: ignore[arg-type]
            if traced is not None:
                # (replaces, unended and so never exported, the span of a produce() refused as queue-full)
                self._traced[key] = traced  # type: ignore[index]
        if self._event_id is None:
            return headers
        name, prefix = self._event_id
        return [(name, prefix + b"%d" % row_id), *(headers or ())]

    def _send_when_room(self, row: MarkedRow, producer: KafkaProducer) -> bool:
        """:meth:`_send` found librdkafka's queue full: serve callbacks and retry, for ~10 s at most,
        then give up the view (remark). ``row`` is already in flight under its key."""
        _id, topic, key, value, *_rest, partition, _created = row
        headers = self._headers(row)
        where = ANY_PARTITION if partition is None else partition
        for _ in range(1000):
            producer.poll(0.01)
            if self._acked:
                self._observe_acked()
            try:
                producer.produce(topic, value, key, where, headers=headers)  # type: ignore[arg-type]
                return True
            except BufferError:
                continue
            except (KafkaException, TypeError, ValueError) as exc:
                return self._refused(row, exc)
        del self._in_flight[key]  # type: ignore[arg-type]
        if self._traced:
            self._end_unreported("queue_full", "not produced: the producer's queue stayed full", key)
        self.core.request_remark()
        return True

    def _refused(self, row: MarkedRow, exc: Exception) -> bool:
        """``produce()`` refused ``row`` (no record was enqueued): it is no longer in flight. A Kafka
        error is a failed attempt; bad arguments (a value of the wrong type) can never be sent."""
        del self._in_flight[row[2]]  # type: ignore[arg-type]
        if self._traced:
            kind = exc.args[0].name() if isinstance(exc, KafkaException) else type(exc).__name__
            self._end_unreported(kind, f"produce() refused the record: {exc}", row[2])
        if isinstance(exc, KafkaException):
            return self._failed(row, exc.args[0], synchronous=True)
        self._dead_letter(row, f"cannot produce: {exc}", 1)
        return False

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        key = msg.key()
        row = self._in_flight.pop(key, None)  # type: ignore[arg-type]  # ours all have keys
        if row is None:  # not ours any more (view abandoned after a drain timeout)
            return
        if err is None:
            self._purge_buf.append(row[0])
            self._acked.append(row)
            self.metrics.delivered += 1
            if self._attempts and self._attempts.pop(row[0], None) is not None:
                self._forget_buf.append(row[0])
            parked = self._waiting.get(key)  # type: ignore[arg-type]
            if parked and not self.core.remark:  # (an empty queue is never kept; this reads it safely anyway)
                # _release inlined for its usual case (one report, one send): this runs per record
                nxt = parked.popleft()
                self._waiting_count -= 1
                if not parked:
                    del self._waiting[key]  # type: ignore[arg-type]
                if not self._send(nxt):  # dead-lettered on the spot: the key is still free
                    self._release(key)  # type: ignore[arg-type]
        elif self._draining and err.code() in _PURGED:
            return  # we gave up on it (drain timed out): the next view re-marks it; not an attempt
        elif not self._failed(row, err, synchronous=False, latency=msg.latency()):
            self._release(key)  # type: ignore[arg-type]

    def _on_delivery_traced(self, err: KafkaError | None, msg: Message) -> None:
        """:meth:`_on_delivery` with relay spans: also ends the record's span. The span is taken first:
        the report may send the key's next record, whose span then takes the key's place."""
        traced = self._traced.pop(msg.key(), None)  # type: ignore[arg-type]
        self._on_delivery(err, msg)
        if traced is not None:
            self._spans.end(traced, err, msg)  # type: ignore[union-attr]

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

    def _served_meanwhile(self, latency: float) -> bool:
        """Did the broker acknowledge other records during the second half of a failed record's
        ``latency`` wait? (Only the second half: a broker that froze shortly after the record was
        sent has delivered records early in the wait, yet it is an outage, not poison.)"""
        start = time.monotonic() - latency / 2
        before = None
        for t, n in self.core.delivered_samples:
            if t > start:
                break
            before = n
        return before is not None and self.metrics.delivered > before

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

    def _failed(self, row: MarkedRow, err: KafkaError, synchronous: bool, latency: float | None = None) -> bool:
        """A produce/delivery failure. Returns False if the record was dead-lettered (key free),
        True if the relay will reset + remark (key stays blocked until then)."""
        core = self.core
        self.metrics.delivery_failures += 1
        if not synchronous and core.waited_out(latency) and not self._served_meanwhile(latency):  # type: ignore[arg-type]
            # Nothing was delivered while this record waited: an outage, not this row's fault.
            log.warning(
                "delivery of record %d timed out after %.1fs while no record was delivered (broker or "
                "network outage?): %s; re-sending it later, not counted as an attempt",
                row[0],
                latency,
                err.str(),
            )
            if err.fatal():
                core.producer_failed()
            self._reset_buf.append(row[0])
            core.request_remark()
            return True
        attempts = core.next_attempt(row[0])
        if is_size_refusal(err) and row[1]:
            self._guard.check_sizes(row[1])  # the next attempt refuses the oversized row alone
        permanent = is_permanent(err, synchronous)
        if permanent or attempts >= self.limits.max_delivery_attempts:
            why = "cannot be sent" if permanent else f"failed {attempts} delivery attempts"
            self._dead_letter(row, f"{why}: {err.name()}: {err.str()}", attempts)
            return False
        log.warning(
            "%s failed for record %d (attempt %d/%d): %s; resetting and remarking",
            "produce" if synchronous else "delivery",
            row[0],
            attempts,
            self.limits.max_delivery_attempts,
            err.str(),
        )
        if err.fatal():
            core.producer_failed()
        core.store_attempt(row[0], attempts, err)
        self._reset_buf.append(row[0])
        core.request_remark()
        return True

    def _dead_letter(self, row: MarkedRow, error: str, attempts: int) -> None:
        log.error("record %d (topic %r) moved to dead letters: %s", row[0], row[1], error)
        self.core.forget_attempts(row[0])
        self.core.halt.halt(row)
        self._dlq_buf.append((row[0], error, attempts))
        self.metrics.dead_lettered += 1

    # ------------------------------------------------------------------ write-behind
    def _has_writes(self) -> bool:
        return bool(self._purge_buf or self._dlq_buf or self._reset_buf or self.core.attempt_buf or self._forget_buf)

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
            tried, forget = core.take_attempt_buf(), self._forget_buf
            self._dlq_buf, self._purge_buf, self._reset_buf = [], [], []
            self._forget_buf = []
            backoff = self.limits.io_error_backoff

            # In this order; a step that succeeded empties its buffer, so a retry does not repeat it.
            steps: tuple[tuple[list[Any], Any], ...] = (
                (dlq, db.dead_letter),
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

    # ------------------------------------------------------------------ leaving a view
    def _drain(self, budget: float) -> None:
        """Stop sending; wait up to ``budget`` seconds for in-flight acknowledgements."""
        producer = self.core.producer
        self._draining = True
        try:
            deadline = time.monotonic() + budget
            while self._in_flight and producer is not None and time.monotonic() < deadline:
                producer.poll(0.01)
                if self._acked:
                    self._observe_acked()
            if self._in_flight and producer is not None:
                log.warning(
                    "%d record(s) still in flight after %.1fs; abandoning them (they will be re-marked)",
                    len(self._in_flight),
                    budget,
                )
                try:
                    producer.purge(in_queue=True, in_flight=False)
                    producer.poll(0)
                except KafkaException:
                    pass
                self._in_flight.clear()
                if self._traced:
                    self._end_unreported("abandoned", f"no delivery report within {budget:.1f}s; re-sent later")
                # The old producer may still report these later; a fresh one keeps views apart.
                self.core.abandon_producer()
        finally:
            self._draining = False

    def _clear_queues(self) -> None:
        self.core.clear_queues()
        self._waiting.clear()
        self._waiting_count = 0

    def _refresh(self) -> None:
        """Reset + forceRemark: drain, flush, new leader id. On a DB error the remark stays pending."""
        core = self.core
        self._clear_queues()
        self._drain(self.limits.max_poll_interval)  # type: ignore[arg-type]
        self._flush_db(wait=True)
        core.drop_fatal_producer()
        leader_id = uuid.uuid4()
        core.begin_view(leader_id)
        self.metrics.remarks += 1
        log.info("%s: refreshed leader id %s", core.config.name, leader_id)
        core.emit(LeaderRefreshed(leader_id))
