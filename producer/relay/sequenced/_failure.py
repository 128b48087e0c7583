"""How the ``--uuid-sequencing`` relay leaves a view (docs/design.md §5, step 6): a part of
:class:`~producer.relay.sequenced.mode.SequencedMode`, which owns the state named in :class:`ViewFailure`'s
annotations.

A failure (a produce or delivery failure, a refused commit, a DB error) abandons the view; leaving
it (a refresh, or giving up leadership) winds it down. Invariants:
- in-flight deliveries are drained (bounded by ``maxPollInterval``); commits already submitted
  finish and, in order, get their ACKs; on leaving leadership without a failure, delivered
  transactions are committed first;
- every transaction not committed is dropped (its rows stay marked by the old view: the next view
  re-marks and re-sends them in id order under new ProducerIDs), and each abandoned span gets a
  rollback ACK in every partition it is known to have touched, unless its commit's outcome is
  unknown (:func:`~producer.relay.sequenced._commit.outcome_unknown`) or an ACK of the view failed;
- failed delivery attempts are stored before the next view can produce their rows again; a
  failure after which records sent later were acknowledged counts as an attempt (poison), one
  during which nothing was delivered does not (an outage);
- after a refused commit (another view exists: we are probably a zombie) the next view waits
  ``heartbeatTimeout`` first, so leader election can catch up instead of two processes bumping the
  epoch in turn.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from confluent_kafka import KafkaException, Message

from harvest_outbox.producer.config import HarvestConfig, Limits
from harvest_outbox.producer.errors import DatabaseError, ProducerError
from harvest_outbox.producer.kafka import is_size_refusal
from harvest_outbox.producer.observe.metrics import Metrics
from harvest_outbox.producer.ops.preflight import TopicGuard
from harvest_outbox.producer.relay.core import RelayCore
from harvest_outbox.producer.relay.marked_row import ROW_ID, ROW_KEY, ROW_VALUE
from harvest_outbox.producer.relay.sequenced._acks import roll_back
from harvest_outbox.producer.relay.sequenced._commit import outcome_unknown
from harvest_outbox.producer.relay.sequenced._store import SequencedStore
from harvest_outbox.producer.relay.sequenced._txn import Txn
from harvest_outbox.producer.relay.sequenced._view import View

log = logging.getLogger(__name__)


class ViewFailure:
    """Abandoning and winding down a view (see module doc)."""

    core: RelayCore
    config: HarvestConfig
    limits: Limits
    metrics: Metrics
    _view: View | None
    _txns: deque[Txn]
    _acking: deque[Txn]
    _confirm_buf: list[tuple[bytes, int]]
    _poison: dict[int, tuple[str, int]]
    _guard: TopicGuard
    _ack_broken: bool
    _view_backoff_until: float
    _refreshing: bool
    txn_limit: int
    monotonic: Callable[[], float]
    # producer.relay.sequenced._produce.TxnProducer and producer.relay.sequenced.mode.SequencedMode
    _close: Callable[[Txn], None]
    _in_flight_count: Callable[[], int]
    _count_failure: Callable[..., None]
    _submit_commits: Callable[[list[Txn]], None]
    _enqueue_acks: Callable[[Txn], None]
    _store: Callable[[], SequencedStore]

    def _abandon(self, why: str, failed: Txn | None, fenced: bool = False) -> None:
        if self.core.remark:
            return
        log.warning(
            "%s: abandoning leader view%s: %s",
            self.config.name,
            f" epoch={self._view.epoch}" if self._view else "",
            why,
        )
        if failed is not None:
            self.txn_limit = max(1, self.txn_limit // 2)
            for err, msg, clock in failed.failures:
                if msg is not None and is_size_refusal(err) and (topic := msg.topic()):
                    self._guard.check_sizes(topic)  # the next view refuses the oversized row alone
                rid = self._find_row(failed, msg)
                if rid is None:
                    continue
                latency = msg.latency() if msg is not None else None
                if self.core.waited_out(latency):
                    # Records sent after it were acknowledged: the broker was serving (so it is
                    # poison), or not (an outage: nothing is counted). In this mode deliveries stop
                    # once the producer ring is full, so "acknowledged later" rather than "lately".
                    if not (self._view is not None and self._view.max_ok > clock):
                        log.warning(
                            "delivery of record %d timed out after %.1fs while no record was delivered "
                            "(broker or network outage?): %s; not counted as an attempt",
                            rid,
                            latency,
                            err.str(),
                        )
                        if err.fatal():
                            self.core.producer_failed()
                        continue
                    # It held up every key for rowTimeout while the broker took other records:
                    # park it now rather than stall everything again (the bound of limits.rowTimeout).
                    self.metrics.delivery_failures += 1
                    attempts = self.core.next_attempt(rid)
                    self._poison[rid] = (
                        f"held up other rows for limits.rowTimeout "
                        f"({self.limits.row_timeout:g}s) while they were delivered: "
                        f"{err.name()}: {err.str()}",
                        attempts,
                    )
                    self.core.store_attempt(rid, attempts, err)
                    if err.fatal():
                        self.core.producer_failed()
                    continue
                self._count_failure(rid, err, True)
        if fenced:
            self._view_backoff_until = self.monotonic() + self.limits.heartbeat_timeout
        self.core.request_remark()

    def _failed_txn(self) -> Txn | None:
        """The oldest transaction with a failed delivery, if any."""
        return next((t for t in self._txns if t.failures), None)

    @staticmethod
    def _find_row(t: Txn, msg: Message | None) -> int | None:
        if msg is None:
            return None
        key, value = msg.key(), msg.value()
        for row in t.rows:
            if row[ROW_KEY] == key and row[ROW_VALUE] == value:
                return row[ROW_ID]
        return None

    def _wind_down(self, commit_delivered: bool) -> None:
        """Stop producing; drain; finish (and with ``commit_delivered`` submit) commits in order;
        ACK the committed; roll back the rest; deliver ACKs; confirm. Leaves no view."""
        self.core.clear_queues()  # re-marked by the next view
        view = self._view
        producer = self.core.producer
        exec_ = self.core.exec
        budget = self.limits.max_poll_interval or 1.0
        deadline = self.monotonic() + budget
        if view is not None and producer is not None:
            if self._txns and not self._txns[-1].closed:
                self._close(self._txns[-1])
            while self._in_flight_count() and self.monotonic() < deadline:
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
                    if t.ids:
                        self.metrics.observe_transaction(len(t.ids))
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
            unknown = outcome_unknown(self._txns)
            counter = roll_back(producer, view, self._txns if not self._ack_broken else (), unknown)
            self._txns.clear()
            end = self.monotonic() + budget
            while (
                (self._acking and any(t.ack_pending for t in self._acking)) or counter.pending
            ) and self.monotonic() < end:
                producer.poll(0.01)
            acked = self.monotonic()
            for t in self._acking:
                if t.ack_pending == 0 and not t.ack_failed and t.journals:
                    self._confirm_buf.append((t.producer, t.ack_clock))
                    self.metrics.observe_dwell(t.rows, acked)
            self._acking.clear()
            if self._in_flight_count() or len(producer) > 0:
                log.warning("records/ACKs still queued after %.1fs; replacing the Kafka producer", budget)
                try:
                    producer.purge(in_queue=True, in_flight=False)
                    producer.poll(0)
                except KafkaException:
                    pass
                self.core.abandon_producer()
        self._txns.clear()
        self._acking.clear()
        if self.core.attempt_buf and self.core.db is not None and exec_ is not None:
            # Stored before the next view can produce these rows again: a crash from here on still
            # counts the attempt.
            tried = self.core.take_attempt_buf()
            try:
                exec_.submit(self._store().record_attempts, tried).result()
            except DatabaseError as exc:
                self.core.return_attempt_buf(tried)  # stored by the next wind-down
                log.warning("could not store %d failed delivery attempt(s) (kept in memory): %s", len(tried), exc)
        if self._confirm_buf and self.core.db is not None and exec_ is not None:
            items, self._confirm_buf = self._confirm_buf, []
            try:
                exec_.submit(self._store().confirm_acks, items).result()
            except DatabaseError as exc:
                log.warning("could not confirm ACK intents (the next view re-sends them): %s", exc)
        self.core.await_mark()
        for f in self.core.take_db_jobs():
            try:
                f.result()
            except Exception as exc:
                log.warning("DB job failed during wind-down: %s", exc)
        self._view = None
        self.core.drop_fatal_producer()

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
            self._acking.clear()
        self._poison.clear()
