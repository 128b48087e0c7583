"""The relay's at-least-once mode: goharvest's mark-purge/reset (MP/R) algorithm.

A :class:`~producer.relay.core.RelayMode` over a :class:`~producer.relay.core.RelayCore`. While
leader, with ``leader_id`` the current *view*:

1. **mark**: when fewer than twice the mark size are queued, one UPDATE … RETURNING claims the next
   rows (ordered by id) not already owned by this view; rows of a dead or deposed leader are claimed
   too (salvage). Late-committing rows with lower ids are simply picked up by a later mark — there
   is no offset to skip past them. The mark size adapts to the backlog
   (:class:`~producer.layouts.mark.marksize.MarkSize`: from goharvest's 100 up to ``markQueryRecords``), and the
   next mark runs while this thread produces the previous one's rows. Rows no broker will take
   (missing, internal or illegal topic, too large for the topic) are dead-lettered before producing
   (:mod:`producer.ops.preflight`).
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
   the rows marked before the halt are out; later marks leave them in the outbox (producer.relay.key_halt).
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
from collections.abc import Mapping
from typing import Any, ClassVar

from confluent_kafka import KafkaError, KafkaException

from harvest_outbox.producer.db import MarkedAttempts, MarkedRow
from harvest_outbox.producer.errors import DatabaseError
from harvest_outbox.producer.kafka import KafkaProducer, is_access_denied, is_permanent, is_size_refusal
from harvest_outbox.producer.relay.at_least_once._records import AtLeastOnceRecords
from harvest_outbox.producer.relay.events import LeaderRefreshed
from harvest_outbox.producer.relay.marked_row import ROW_ID, ROW_TOPIC

log = logging.getLogger(__name__)


class AtLeastOnceMode(AtLeastOnceRecords):
    """Per-record delivery and batched purges (see module doc): the mode's decisions, over its records
    (:class:`~producer.relay.at_least_once._records.AtLeastOnceRecords`)."""

    #: Bytes of headers the relay adds to every record: none.
    HEADER_BYTES = 0
    #: Producer settings this mode needs (where the user set none): none beyond the config's.
    PRODUCER_SETTINGS: ClassVar[Mapping[str, Any]] = {}

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
        core.raise_access_failure()
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
                core.took_mark(True, now, empty=not rows)
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
            # A report is awaited when a ready row waits for one: its key's in-flight record, or room
            # under maxInFlightRecords.
            core.await_progress(producer, reports_awaited=bool(self._ready or self._waiting_count))
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
        self._drain(self.limits.max_poll_interval or 1.0)  # (set by Limits; 1.0 as the sequenced mode's wind-down)
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
            rid = row[ROW_ID]
            if rid in spent:
                _n, error = persisted[rid]
                self._dead_letter(
                    row,
                    f"failed {attempts[rid]} delivery attempts (counted across relay restarts); last error: {error}",
                    attempts[rid],
                )
            else:
                kept.append(row)
        return kept

    # ------------------------------------------------------------------ failures
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

    def _failed(self, row: MarkedRow, err: KafkaError, synchronous: bool, latency: float | None = None) -> bool:
        """A produce/delivery failure. Returns False if the record was dead-lettered (key free),
        True if the relay will reset + remark (key stays blocked until then)."""
        core, rid, topic = self.core, row[ROW_ID], row[ROW_TOPIC]
        self.metrics.delivery_failures += 1
        core.raise_access_failure()
        if is_access_denied(err):
            # An ACL missing (or removed since the preflight's verdict): not the row's fault. The preflight asks
            # again when the row comes back, and refuses the topic or stops the relay (TopicGuard.denied).
            log.error(
                "%s for record %d of topic %r: asking the broker again; not counted as an attempt",
                err.name(),
                rid,
                topic,
            )
            self._guard.forget()
            self._reset_buf.append(rid)
            core.request_remark()
            return True
        if not synchronous and latency is not None and core.waited_out(latency) and not self._served_meanwhile(latency):
            # Nothing was delivered while this record waited: an outage, not this row's fault.
            log.warning(
                "delivery of record %d timed out after %.1fs while no record was delivered (broker or "
                "network outage?): %s; re-sending it later, not counted as an attempt",
                rid,
                latency,
                err.str(),
            )
            if err.fatal():
                core.producer_failed()
            self._reset_buf.append(rid)
            core.request_remark()
            return True
        attempts = core.next_attempt(rid)
        if is_size_refusal(err) and topic:
            self._guard.check_sizes(topic)  # the next attempt refuses the oversized row alone
        permanent = is_permanent(err, synchronous)
        if permanent or attempts >= self.limits.max_delivery_attempts:
            why = "cannot be sent" if permanent else f"failed {attempts} delivery attempts"
            self._dead_letter(row, f"{why}: {err.name()}: {err.str()}", attempts)
            return False
        log.warning(
            "%s failed for record %d (attempt %d/%d): %s; resetting and remarking",
            "produce" if synchronous else "delivery",
            rid,
            attempts,
            self.limits.max_delivery_attempts,
            err.str(),
        )
        if err.fatal():
            core.producer_failed()
        core.store_attempt(rid, attempts, err)
        self._reset_buf.append(rid)
        core.request_remark()
        return True

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

    def _refresh(self) -> None:
        """Reset + forceRemark: drain, flush, new leader id. On a DB error the remark stays pending."""
        core = self.core
        self._clear_queues()
        self._drain(self.limits.max_poll_interval or 1.0)  # (set by Limits; 1.0 as the sequenced mode's wind-down)
        self._flush_db(wait=True)
        core.drop_fatal_producer()
        leader_id = uuid.uuid4()
        core.begin_view(leader_id)
        self.metrics.remarks += 1
        log.info("%s: refreshed leader id %s", core.config.name, leader_id)
        core.emit(LeaderRefreshed(leader_id))
