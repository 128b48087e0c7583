"""The relay: goharvest's mark-purge/reset (MP/R) algorithm driven by a leader election.

One thread (the relay thread) runs the election pulses, producing and the delivery callbacks, so
the per-record path takes no locks: confluent-kafka runs delivery callbacks inside ``poll()`` on
the caller's thread. Database statements run on TWO worker threads, each a single-thread executor
with its own connection (so each executes in submission order): marks (and the meter's backlog
query) on one, purges, resets, dead letters and commits on the other. The relay thread keeps
producing while the next mark is prefetched and the purges of delivered rows are written behind,
and the database works on a mark and a purge at once. Barriers (refresh, relinquish, stop) wait for
both workers to finish everything submitted before they change the leader id.

While leader, with ``leader_id`` the current *view*:
1. **mark**: when fewer than twice the mark size are queued, one UPDATE … RETURNING claims the next
   rows (ordered by id) not already owned by this view; rows of a dead or deposed leader are claimed
   too (salvage). Late-committing rows with lower ids are simply picked up by a later mark — there
   is no offset to skip past them. The mark size adapts to the backlog
   (:class:`~producer.marksize.MarkSize`: from goharvest's 100 up to ``markQueryRecords``).
   Rows no broker will take (missing, internal or illegal topic, too large for the topic) are
   dead-lettered before producing (:mod:`producer.preflight`).
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
   delete + insert) and its key moves on; other keys never wait for it.
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
  ``maxPollInterval``), flushes purges, then reports the event;
- the commit seam (``_on_delivery`` / ``_flush_db``) is where ``--uuid-sequencing``
  replaces per-record purge with per-transaction commits: ``Harvest(config)`` with
  ``config.uuid_sequencing`` returns a :class:`producer.sequencing.SequencedHarvest`.
"""

from __future__ import annotations

import enum
import logging
import re
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message

from harvest_outbox.producer.config import MARK_FLOOR, HarvestConfig
from harvest_outbox.producer.db import Listener, MarkedAttempts, MarkedRow, OutboxDatabase
from harvest_outbox.producer.election import LeaderElection, NeliElection
from harvest_outbox.producer.errors import DatabaseError, HarvestError
from harvest_outbox.producer.events import (Event, EventHandler, LeaderAcquired, LeaderFenced, LeaderRefreshed, LeaderRevoked,
                                            MeterRead)
from harvest_outbox.producer.kafka import (FatalErrorGuard, KafkaProducer, ProducerFactory, confluent_producer, is_permanent,
                                           is_size_refusal)
from harvest_outbox.producer.marksize import MarkSize
from harvest_outbox.producer.preflight import TopicGuard, header_bytes, too_large
from harvest_outbox.producer.metrics import Metrics, MeterStats, start_prometheus
from harvest_outbox.producer.redact import redact_kafka_config
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.shard_election import ShardSetSeat
from harvest_outbox.producer.waker import Waker

log = logging.getLogger(__name__)

# Delivery reports of records the relay itself purged from the producer's queue.
_PURGED = frozenset(c for c in (getattr(KafkaError, "_PURGE_QUEUE", None), getattr(KafkaError, "_PURGE_INFLIGHT", None))
                    if c is not None)


# At most this many records in librdkafka's hands: rows trickle in, and the relay waits in slices of
# _TRICKLE_SLICE seconds on its waker instead of in 1 ms polls (see Harvest._await_progress).
_TRICKLE_RECORDS = 64
_TRICKLE_SLICE = 0.0002


class State(enum.Enum):
    CREATED = "created"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


def _bad_row_reason(row: MarkedRow) -> str | None:
    _id, topic, key, _value, hkeys, hvals = row
    if topic is None or topic == "":
        return "kafka_topic is NULL or empty: the row has nowhere to go; fix kafka_topic and requeue"
    if key is None:
        return "kafka_key is NULL: goharvest's schema requires a key; set kafka_key and requeue"
    if hkeys is None or hvals is None:
        return "kafka_header_keys/kafka_header_values is NULL: use empty arrays '{}' for no headers"
    if len(hkeys) != len(hvals):
        return (f"header arrays differ in length: {len(hkeys)} key(s) {hkeys!r} but {len(hvals)} value(s); "
                f"each header needs one key and one value")
    if any(k is None for k in hkeys):
        return "kafka_header_keys contains NULL: header names must not be NULL"
    return None


# librdkafka's text for a batch the broker refused as too large, and how its fatal errors name the batch.
_SIZE_REFUSED = "Message size too large"
_BATCH_TOPIC = re.compile(r"ProduceRequest for (\S+) \[")


def _topics_in(error_text: str) -> list[str]:
    return _BATCH_TOPIC.findall(error_text)


def _make_election(config: HarvestConfig) -> LeaderElection:
    if config.leader_election == "postgres":
        from harvest_outbox.producer.election_postgres import PostgresElection

        return PostgresElection(config.data_source, config.outbox_table, config.name,
                                check_interval=config.leader_lock_check_interval)
    return NeliElection(
        dict(config.base_kafka_config), config.leader_topic, config.leader_group_id, config.name,
        heartbeat_timeout=config.limits.heartbeat_timeout, min_poll_interval=config.limits.min_poll_interval,
        poll_duration=config.limits.poll_duration, replication_factor=config.leader_topic_replication_factor)


class Harvest:
    """The relay. ``Harvest(config).start()``; ``stop()``; ``wait()`` (re-raises a fatal error).

    ``producer_factory`` and ``election`` are seams for tests (fault injection) and for other
    election mechanisms; by default a real confluent Producer and the election ``config.leader_election``
    names (:class:`NeliElection`, or :class:`~producer.election_postgres.PostgresElection`) are used.
    """

    def __new__(cls, config: HarvestConfig, *args: Any, **kwargs: Any) -> Harvest:
        # ``Harvest(config)`` with ``config.uuid_sequencing`` builds the exactly-once relay.
        if cls is Harvest and getattr(config, "uuid_sequencing", False):
            from harvest_outbox.producer.sequencing import SequencedHarvest

            return super().__new__(SequencedHarvest)
        return super().__new__(cls)

    def __init__(self, config: HarvestConfig, event_handler: EventHandler | None = None, *,
                 producer_factory: ProducerFactory | None = None, election: LeaderElection | None = None,
                 topic_guard: TopicGuard | None = None, shards: ShardSetSeat | None = None) -> None:
        self.config = config
        #: ``shards: S`` (:mod:`producer.sharded`): the seat that is both this loop's election and the
        #: set of shards its views serve; None for the whole outbox.
        self._shards = shards
        if shards is not None:
            election = shards
        self.limits = config.limits
        self._event_handler = event_handler
        self._producer_factory = producer_factory or confluent_producer
        self._election: LeaderElection = election or _make_election(config)
        # Rows no broker will take are dead-lettered before they are produced (producer/preflight.py).
        self._guard = topic_guard or TopicGuard(config.base_kafka_config, config.producer_config(),
                                                extra_overhead=self._own_header_bytes())
        self.names = OutboxNames.parse(config.outbox_table)
        self.metrics = Metrics()
        self._state = State.CREATED
        self._stop_requested = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._db: OutboxDatabase | None = None  # writes: purges, resets, dead letters, commits, views
        self._mark_db: OutboxDatabase | None = None  # marks and metrics queries, on a connection of their own
        self._listener: Listener | None = None
        self._producer: KafkaProducer | None = None
        self._prometheus: Any = None
        # leader state (relay thread only)
        self._leader_id: uuid.UUID | None = None
        self._ready: deque[MarkedRow] = deque()  # marked, not yet looked at, id order
        self._waiting: dict[bytes, deque[MarkedRow]] = {}  # key -> records behind the in-flight one
        self._waiting_count = 0
        self._in_flight: dict[bytes, MarkedRow] = {}  # key -> the one unacknowledged record of that key
        self._attempts: dict[int, int] = {}  # id -> failed attempts (persisted ones included, from the mark)
        self._attempt_buf: list[tuple[int, int, str]] = []  # (id, attempts, error) to persist
        self._forget_buf: list[int] = []  # delivered ids that had a persisted attempt count
        self._purge_buf: list[int] = []
        self._reset_buf: list[int] = []
        self._dlq_buf: list[tuple[int, str, int]] = []
        # missingTopicPolicy: hold — rows of missing topics, by topic, in id order (marked by this
        # view; dropped with it and re-marked by the next one)
        self._hold_missing = config.missing_topic_policy == "hold"
        self._held: dict[str, deque[MarkedRow]] = {}
        self._held_count = 0
        self._next_hold_check = 0.0
        self._remark = False
        self._producer_fatal = False
        self._draining = False
        self._next_flush = 0.0
        self._exec: ThreadPoolExecutor | None = None
        self._mark_exec: ThreadPoolExecutor | None = None
        self._mark_future: Future[tuple[list[MarkedRow], MarkedAttempts]] | None = None
        self._mark_view: uuid.UUID | None = None
        ceiling = self.limits.mark_ceiling
        self.mark_size = MarkSize(min(MARK_FLOOR, ceiling), ceiling)
        self._mark_asked = 0
        self._stats_future: Future[tuple[int, float | None, int]] | None = None
        self._db_futures: list[Future[None]] = []
        # finished marks and write jobs wake a relay thread that waits outside librdkafka's poll
        self._waker = Waker()
        self._next_mark = 0.0
        self._idle = False
        self._next_metrics = 0.0
        # (monotonic time, metrics.delivered) samples, ~4 per second over the last rowTimeout: did
        # anything get delivered while a failed record was waiting (poison) or not (outage)?
        self._delivered_samples: deque[tuple[float, int]] = deque()

    def _own_header_bytes(self) -> int:
        """Bytes of headers the relay adds to every record (none in at-least-once mode)."""
        return 0

    # ------------------------------------------------------------------ public API
    @property
    def state(self) -> State:
        return State.STOPPING if self._state is State.RUNNING and self._stop_requested.is_set() else self._state

    @property
    def is_leader(self) -> bool:
        return self._leader_id is not None

    @property
    def leader_id(self) -> uuid.UUID | None:
        return self._leader_id

    @property
    def in_flight_records(self) -> int:
        return len(self._in_flight)

    def in_flight_record_keys(self) -> list[str]:
        return [k.decode("utf-8", "replace") for k in list(self._in_flight)]

    @property
    def prometheus_port(self) -> int | None:
        """The port the Prometheus endpoint listens on (useful with ``prometheus_port=0``)."""
        return None if self._prometheus is None else int(self._prometheus[0].server_port)

    def stats(self) -> MeterStats | None:
        """The latest MeterRead reading (None before the first)."""
        return self.metrics.last

    def start(self) -> Harvest:
        if self._state is not State.CREATED:
            raise HarvestError(f"cannot start a relay in state {self._state.value}")
        try:
            shard_count = self._shards.count if self._shards is not None else None
            self._db = OutboxDatabase(self.config.data_source, self.names, shard_count)
            _ = self._db.conn  # fail fast: connection + schema check
            # Two connections, two worker threads: the next mark runs while purges / commits of
            # earlier rows run, so the database works on both at once (each worker keeps its own
            # statements in submission order).
            self._exec = ThreadPoolExecutor(1, thread_name_prefix=f"harvest-db-{self.config.name}")
            self._mark_db = OutboxDatabase(self.config.data_source, self.names, shard_count)
            self._mark_exec = ThreadPoolExecutor(1, thread_name_prefix=f"harvest-mark-{self.config.name}")
            self._listener = Listener(self.config.data_source, self.names)
            if self.config.prometheus_port is not None:
                self._prometheus = start_prometheus(self.metrics, self.config.name, self.config.prometheus_port,
                                                    self.config.prometheus_bind_address, relay=self)
            # The Kafka producer (an idempotent producer first fetches its producer id) and the
            # preflight's admin client connect now, while this relay is still a standby: the first
            # record after an election goes out at once, not after ~0.5-1 s of client start-up.
            self._ensure_producer()
            self._guard.connect()
            self._election.start(self)
        except BaseException:
            self._shutdown()  # release whatever was opened before the failure
            self._state = State.STOPPED
            raise
        self._state = State.RUNNING
        self._thread = threading.Thread(target=self._run, name=f"harvest-{self.config.name}", daemon=True)
        self._thread.start()
        if self.config.leader_election == "postgres":
            log.info("relay %s started on %s (leader election: Postgres advisory lock)", self.config.name,
                     self.names.display)
        else:
            log.info("relay %s started on %s (leader group %r, topic %r)", self.config.name, self.names.display,
                     self.config.leader_group_id, self.config.leader_topic)
        return self

    def stop(self) -> None:
        """Ask the relay to stop: it drains in-flight records, flushes purges, leaves the group."""
        self._stop_requested.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the relay to stop; True if it did. Re-raises the error that killed it, if any."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False
        if self._error is not None:
            raise HarvestError(f"relay {self.config.name} failed: {self._error}") from self._error
        return True

    def __enter__(self) -> Harvest:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.wait()

    # ------------------------------------------------------------------ election listener
    def on_acquired(self) -> None:
        if self._shards is not None:
            # A new view of the led shards: no statement of the previous view runs any more (it was
            # relinquished), so both connections switch to the new set here.
            for db in (self._db, self._mark_db):
                if db is not None:
                    db.set_shards(self._shards.applied)
            self.metrics.shard_backlog = {}
            log.info("%s: leads shards %s of %d", self.config.name, ",".join(map(str, sorted(self._shards.applied))),
                     self._shards.count)
        self._leader_id = uuid.uuid4()
        self.metrics.is_leader = True
        self._remark = False
        self._next_mark = 0.0
        log.info("%s: elected leader, leader id %s", self.config.name, self._leader_id)
        self._emit(LeaderAcquired(self._leader_id))

    def on_revoked(self) -> None:
        if self._relinquish("revoked"):
            self._emit(LeaderRevoked())

    def on_fenced(self) -> None:
        if self._relinquish("fenced"):
            self._emit(LeaderFenced())

    # ------------------------------------------------------------------ main loop
    def _emit(self, event: Event) -> None:
        if self._event_handler is None:
            return
        try:
            self._event_handler(event)
        except Exception:  # a handler bug must not kill the relay
            log.exception("event handler failed on %r", event)

    def _run(self) -> None:
        try:
            while not self._stop_requested.is_set():
                try:
                    if self._election.pulse() and self._leader_id is not None:
                        self._leader_tick()
                    else:
                        self._stop_requested.wait(min(0.05, self.limits.min_poll_interval))
                except DatabaseError as exc:
                    log.warning("%s (retrying in %.3gs, remarking)", exc, self.limits.io_error_backoff)
                    if self._leader_id is not None:
                        self._remark = True
                    self._stop_requested.wait(self.limits.io_error_backoff)
                now = time.monotonic()
                samples = self._delivered_samples
                if not samples or now - samples[-1][0] >= 0.25:
                    samples.append((now, self._delivered_count()))
                    while now - samples[0][0] > self.limits.row_timeout + 1.0:
                        samples.popleft()
                if now >= self._next_metrics:
                    self._next_metrics = now + self.limits.min_metrics_interval
                    self._read_meter()
                elif self._stats_future is not None and self._stats_future.done():
                    self._meter_stats_arrived()
        except BaseException as exc:  # fatal: remember it for wait(), then shut down
            log.exception("relay %s failed", self.config.name)
            self._error = exc
        finally:
            self._state = State.STOPPING
            self._shutdown()
            self._state = State.STOPPED
            log.info("relay %s stopped", self.config.name)

    def _shutdown(self) -> None:
        try:
            if self._relinquish("stopping"):
                self._emit(LeaderRevoked())
        except Exception:
            log.exception("draining on stop")
        try:
            self._election.close()  # leave the group: a standby takes over now, not after a session timeout
        except Exception:
            log.exception("closing leader election")
        if self._producer is not None:
            self._producer.flush(5.0)
            self._producer = None
        for executor in (self._exec, self._mark_exec):
            if executor is not None:
                executor.shutdown(wait=True)
        self._guard.close()
        for closeable in (self._listener, self._db, self._mark_db, self._waker):
            if closeable is not None:
                closeable.close()
        if self._prometheus is not None:
            server, _thread = self._prometheus
            server.shutdown()

    def _gauges(self) -> tuple[int, int]:
        """(in-flight records, queued records) for the meter."""
        return len(self._in_flight), len(self._ready) + self._waiting_count + self._held_count

    def _read_meter(self) -> None:
        """Take a meter reading. The leader's backlog figures come from a query on the mark
        connection; the reading is emitted when it returns, so the relay thread never waits on it."""
        if self._stats_future is None and self._leader_id is not None and self._mark_db is not None:
            assert self._mark_exec is not None
            self._stats_future = self._mark_exec.submit(self._mark_db.stats)
            if any(self._gauges()):
                return  # busy: emitted by the main loop when the query returns
            if wait([self._stats_future], timeout=self.limits.queue_timeout).done:  # idle: nothing waits on us
                self._meter_stats_arrived()
            return
        self._emit_meter()

    def _meter_stats_arrived(self) -> None:
        future, self._stats_future = self._stats_future, None
        assert future is not None
        try:
            m = self.metrics
            m.backlog_rows, m.oldest_unsent_age, m.dead_letter_rows = future.result()
            if self._shards is not None and self._mark_db is not None:
                m.shard_backlog = dict(self._mark_db.shard_stats)
        except DatabaseError as exc:
            log.warning("metrics query failed: %s", exc)
        self._emit_meter()

    def _emit_meter(self) -> None:
        m = self.metrics
        m.in_flight, m.queued = self._gauges()
        stats = m.snapshot()
        log.debug("%s", stats)
        self._emit(MeterRead(stats))

    # ------------------------------------------------------------------ leader work
    def _ensure_producer(self) -> KafkaProducer:
        if self._producer is None:
            conf = self.config.producer_config()
            conf.setdefault("client.id", f"harvest-{self.config.name}")
            conf.setdefault("error_cb", self._on_producer_error)
            log.debug("creating producer %s", redact_kafka_config(conf))
            self._producer = FatalErrorGuard(self._producer_factory(conf, self._on_delivery), self._on_producer_error)
        return self._producer

    def _on_producer_error(self, err: KafkaError) -> None:
        """librdkafka's global errors (served inside ``poll()``). A fatal one (with
        ``--uuid-sequencing``, a gap-less guarantee the broker broke by refusing a batch) makes the
        producer unusable: the relay leaves the view and builds a new producer, instead of letting
        ``poll()`` raise and the relay die on one row, again after every restart."""
        if not err.fatal():
            log.debug("Kafka producer: %s", err.str())  # librdkafka logs these itself
            return
        log.error("the Kafka producer hit a fatal error (%s: %s); replacing it and re-marking", err.name(),
                  err.str())
        self._producer_fatal = True
        if _SIZE_REFUSED in err.str():
            for topic in _topics_in(err.str()):
                self._guard.check_sizes(topic)

    def _leader_tick(self) -> None:
        producer = self._ensure_producer()
        if self._producer_fatal:
            self._remark = True  # the refresh replaces the producer
        if self._remark:
            self._refresh()
            return
        self._guard.expire(time.monotonic())
        if self._held:
            self._release_held(time.monotonic())
        if self._ready:
            self._dispatch()
        producer.poll(0)
        now = time.monotonic()
        if self._db_futures:
            self._check_db()
        # Write-behind with at most one write job at a time: while the database deletes one batch
        # the next one grows, so the batch size follows the database's speed (group commit).
        if (self._purge_buf or self._dlq_buf or self._reset_buf or self._attempt_buf) and not self._db_futures and (
                now >= self._next_flush or len(self._purge_buf) >= self.limits.purge_batch_records):
            self._flush_db()
            self._next_flush = now + self.limits.purge_interval
        if self._remark or self._leader_id is None:
            return
        mark = self._mark_future
        if mark is not None:
            if mark.done():
                self._mark_future = None
                rows, persisted = mark.result()  # DatabaseError -> main loop: back off, remark
                self.mark_size.observe(self._mark_asked, len(rows))
                if self._mark_view != self._leader_id:
                    return  # marked for an abandoned view; the current view re-marks them
                short = len(rows) < self._mark_asked
                if persisted:
                    rows = self._take_attempts(rows, persisted)
                if rows:
                    self._ready.extend(rows)
                    # A short mark took the whole backlog: like an empty one, the next waits for a
                    # stasher's NOTIFY (or markBackoff), not runs at once to come back empty (that
                    # doubled the marks of a trickle: two per row at 500 rows/s).
                    self._idle = short
                    if short:
                        self._next_mark = now + self.limits.mark_backoff
                    if len(rows) >= self._mark_asked and len(self._ready) + self._waiting_count < 2 * self.mark_size.value:
                        # A full mark: more rows wait. Ask for them now, so the database marks the next
                        # batch while this thread produces this one (not after: that serialised them).
                        self._submit_mark()
                    self._dispatch()
                    producer.poll(0)
                    return
                self._idle = True
                self._next_mark = now + self.limits.mark_backoff
        elif len(self._ready) + self._waiting_count < 2 * self.mark_size.value and now >= self._next_mark:
            self._submit_mark()
            if not (self._in_flight or self._ready):
                # nothing else to do: wait for the mark result right here
                self._mark_future.result()  # type: ignore[union-attr]
            return
        if self._in_flight or self._ready or self._waiting_count or self._mark_future is not None:
            # Busy: wait for acknowledgements (they arrive as callbacks inside poll), a mark, a NOTIFY.
            self._await_progress(producer)
            if self._idle and self._mark_future is None and self._listener is not None and self._listener.pending():
                self._next_mark = 0.0  # a stasher committed: mark now rather than after markBackoff
        elif self._purge_buf or self._dlq_buf or self._reset_buf or self._attempt_buf or self._forget_buf:
            self._flush_db()
        else:
            # Idle: sleep until a stasher commits (NOTIFY) or the fallback poll / next pulse is due.
            assert self._listener is not None
            if self._listener.wait(min(self.limits.idle_poll_interval, self.limits.min_poll_interval)):
                self._next_mark = 0.0

    def _await_progress(self, producer: KafkaProducer) -> None:
        """Wait (about a millisecond at most) for what moves a busy relay on: a delivery report, a
        finished mark or write job, a stasher's NOTIFY.

        Only a delivery report ends ``producer.poll(timeout)`` early, and only the waker's select ends
        on the others. Streaming a backlog, librdkafka always holds many records and reports arrive
        back to back: poll. Trickling (few records held), the next row's NOTIFY or mark usually
        finishes first, and waiting it out inside a 1 ms poll is most of a row's idle-to-delivery
        latency: select on the waker in short slices, and serve reports between them."""
        held = len(producer)
        if held > _TRICKLE_RECORDS:
            producer.poll(0.001)
            return
        # The LISTEN socket only while a NOTIFY would be acted on (idle, no mark in flight): otherwise
        # nothing reads it, it stays readable, and every wait would return at once (a busy loop).
        fd = None
        if self._idle and self._mark_future is None and self._listener is not None:
            fd = self._listener.fileno()
        self._waker.wait(0.001 if held == 0 else _TRICKLE_SLICE, fd)
        producer.poll(0)

    def _submit_mark(self) -> None:
        assert self._mark_exec is not None and self._mark_db is not None and self._leader_id is not None
        self._mark_view = self._leader_id
        self._mark_asked = self.mark_size.value
        self._mark_future = self._waker.watch(
            self._mark_exec.submit(self._mark_db.mark_with_attempts, self._leader_id, self._mark_asked))

    def _take_attempts(self, rows: list[MarkedRow], persisted: MarkedAttempts) -> list[MarkedRow]:
        """Adopt the stored attempt counts of freshly marked rows; dead-letter (and drop from
        ``rows``) those that already used up ``maxDeliveryAttempts`` — e.g. in processes that crashed."""
        limit = self.limits.max_delivery_attempts
        attempts = self._attempts
        spent: set[int] = set()
        for rid, (n, error) in persisted.items():
            attempts[rid] = max(attempts.get(rid, 0), n)
            if attempts[rid] >= limit:
                spent.add(rid)
        if not spent:
            return rows
        kept = []
        for row in rows:
            if row[0] in spent:
                n, error = persisted[row[0]]
                self._dead_letter(row, f"failed {attempts[row[0]]} delivery attempts (counted across relay "
                                       f"restarts); last error: {error}", attempts[row[0]])
            else:
                kept.append(row)
        return kept

    def _dispatch(self) -> None:
        """Send ready records in id order while in-flight room remains; park busy keys' records."""
        ready, in_flight, waiting = self._ready, self._in_flight, self._waiting
        limit = self.limits.in_flight_limit
        send = self._send
        while ready and len(in_flight) < limit and not self._remark:
            row = ready.popleft()
            key = row[2]
            if key in in_flight:
                parked = waiting.get(key)  # type: ignore[arg-type]
                if parked is None:
                    waiting[key] = deque((row,))  # type: ignore[index]
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
        _id, topic, key, value, hkeys, hvals = row
        if hvals is None or hkeys is None or len(hkeys) != len(hvals) or topic is None or key is None or (
                        hkeys and None in hkeys):
            reason = _bad_row_reason(row)
            if reason is not None:
                self._dead_letter(row, f"bad row: {reason}", 0)
                return False
        if self._held and topic in self._held:
            self._hold(row)  # behind the same topic's held rows
            return False
        verdict = self._guard.verdicts.get(topic)  # type: ignore[arg-type]
        if verdict is None:
            verdict = self._guard.verdict(topic)  # type: ignore[arg-type]
        if verdict.__class__ is str:
            if self._hold_missing and topic in self._guard.missing:
                self._hold(row)
                return False
            self._dead_letter(row, f"cannot be sent: {verdict}", 0)
            return False
        size = len(key) + (len(value) if value is not None else 0)  # type: ignore[arg-type]
        if size > verdict or (hkeys and size + header_bytes(hkeys, hvals) > verdict):  # type: ignore[operator,arg-type]
            self._dead_letter(row, f"cannot be sent: {too_large(verdict, key, value, hkeys, hvals)}", 0)  # type: ignore[arg-type]
            return False
        producer = self._producer
        assert producer is not None
        self._in_flight[key] = row  # type: ignore[index]
        for _ in range(1000):
            try:
                if hkeys:
                    producer.produce(topic, value, key, headers=list(zip(hkeys, hvals)))  # type: ignore[arg-type]
                else:
                    producer.produce(topic, value, key)  # type: ignore[arg-type]
                return True
            except BufferError:  # local queue full: serve callbacks, then retry
                producer.poll(0.01)
            except KafkaException as exc:
                del self._in_flight[key]  # type: ignore[arg-type]
                err: KafkaError = exc.args[0]
                return self._failed(row, err, synchronous=True)
            except (TypeError, ValueError) as exc:
                del self._in_flight[key]  # type: ignore[arg-type]
                self._dead_letter(row, f"cannot produce: {exc}", 1)
                return False
        del self._in_flight[key]  # type: ignore[arg-type]
        self._remark = True
        return True

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        key = msg.key()
        row = self._in_flight.pop(key, None)
        if row is None:  # not ours any more (view abandoned after a drain timeout)
            return
        if err is None:
            self._purge_buf.append(row[0])
            self.metrics.delivered += 1
            if self._attempts and self._attempts.pop(row[0], None) is not None:
                self._forget_buf.append(row[0])
            if key in self._waiting and not self._remark:
                self._release(key)
        elif self._draining and err.code() in _PURGED:
            return  # we gave up on it (drain timed out): the next view re-marks it; not an attempt
        elif not self._failed(row, err, synchronous=False, latency=msg.latency()):
            self._release(key)

    def _waited_out(self, latency: float | None) -> bool:
        """Did a failed record wait (about) its whole delivery timeout?"""
        return latency is not None and latency >= 0.8 * self.limits.row_timeout

    def _delivered_count(self) -> int:
        """Records acknowledged so far (sampled to tell poison from outage)."""
        return self.metrics.delivered

    def _served_meanwhile(self, latency: float) -> bool:
        """Did the broker acknowledge other records during the second half of a failed record's
        ``latency`` wait? (Only the second half: a broker that froze shortly after the record was
        sent has delivered records early in the wait, yet it is an outage, not poison.)"""
        start = time.monotonic() - latency / 2
        before = None
        for t, n in self._delivered_samples:
            if t > start:
                break
            before = n
        return before is not None and self._delivered_count() > before

    def _release(self, key: bytes) -> None:
        """``key`` has nothing in flight: send its next parked record(s)."""
        parked = self._waiting.get(key)
        while parked and not self._remark:
            row = parked.popleft()
            self._waiting_count -= 1
            if not parked:
                del self._waiting[key]
            if self._send(row):
                return

    def _failed(self, row: MarkedRow, err: KafkaError, synchronous: bool, latency: float | None = None) -> bool:
        """A produce/delivery failure. Returns False if the record was dead-lettered (key free),
        True if the relay will reset + remark (key stays blocked until then)."""
        self.metrics.delivery_failures += 1
        if not synchronous and self._waited_out(latency) and not self._served_meanwhile(latency):  # type: ignore[arg-type]
            # Nothing was delivered while this record waited: an outage, not this row's fault.
            log.warning("delivery of record %d timed out after %.1fs while no record was delivered (broker or "
                        "network outage?): %s; re-sending it later, not counted as an attempt", row[0], latency,
                        err.str())
            if err.fatal():
                self._producer_fatal = True
            self._reset_buf.append(row[0])
            self._remark = True
            return True
        attempts = self._attempts.get(row[0], 0) + 1
        self._attempts[row[0]] = attempts
        if is_size_refusal(err) and row[1]:
            self._guard.check_sizes(row[1])  # the next attempt refuses the oversized row alone
        permanent = is_permanent(err, synchronous)
        if permanent or attempts >= self.limits.max_delivery_attempts:
            why = "cannot be sent" if permanent else f"failed {attempts} delivery attempts"
            self._dead_letter(row, f"{why}: {err.name()}: {err.str()}", attempts)
            return False
        log.warning("%s failed for record %d (attempt %d/%d): %s; resetting and remarking",
                    "produce" if synchronous else "delivery", row[0], attempts, self.limits.max_delivery_attempts,
                    err.str())
        if err.fatal():
            self._producer_fatal = True
        self._attempt_buf.append((row[0], attempts, f"{err.name()}: {err.str()}"))
        self._reset_buf.append(row[0])
        self._remark = True
        return True

    def _hold(self, row: MarkedRow) -> None:
        """missingTopicPolicy hold: keep ``row`` (its topic does not exist) until the topic does."""
        topic: str = row[1]  # type: ignore[assignment]
        held = self._held.get(topic)
        if held is None:
            log.warning("topic %r does not exist: holding its rows until it does (missingTopicPolicy: hold); "
                        "rows of other topics flow", topic)
            held = self._held[topic] = deque()
        held.append(row)
        self._held_count += 1

    def _release_held(self, now: float) -> None:
        """Every ``missing_ttl``: topics that exist now get their held rows back, ahead of the
        ready queue (they are older than anything of their topic queued after them)."""
        if now < self._next_hold_check:
            return
        self._next_hold_check = now + self._guard.missing_ttl
        for topic in list(self._held):
            verdict = self._guard.verdict(topic)
            if topic in self._guard.missing:
                continue
            rows = self._held.pop(topic)
            self._held_count -= len(rows)
            log.info("topic %r exists now (%s): releasing %d held row(s)", topic,
                     "ok" if verdict.__class__ is not str else verdict, len(rows))
            self._ready.extendleft(reversed(rows))

    def _dead_letter(self, row: MarkedRow, error: str, attempts: int) -> None:
        log.error("record %d (topic %r) moved to dead letters: %s", row[0], row[1], error)
        self._attempts.pop(row[0], None)
        self._dlq_buf.append((row[0], error, attempts))
        self.metrics.dead_lettered += 1

    def _flush_db(self, wait: bool = False) -> None:
        """Hand buffered dead letters, purges, attempt counts and resets to the DB worker (in that
        order, one job: a failed attempt is stored before its row is reset, i.e. before it can be
        re-sent). With ``wait``, block until every submitted job (and any pending mark) is done;
        raise the first error."""
        if self._dlq_buf or self._purge_buf or self._reset_buf or self._attempt_buf or self._forget_buf:
            db, exec_ = self._db, self._exec
            assert db is not None and exec_ is not None
            dlq, purge, reset = self._dlq_buf, self._purge_buf, self._reset_buf
            tried, forget = self._attempt_buf, self._forget_buf
            self._dlq_buf, self._purge_buf, self._reset_buf = [], [], []
            self._attempt_buf, self._forget_buf = [], []
            backoff = self.limits.io_error_backoff

            def job() -> None:
                for attempt in range(3):  # short retries: a blip must not cost a remark
                    try:
                        if dlq:
                            db.dead_letter(dlq)
                            dlq.clear()
                        if purge:
                            db.purge(purge)
                            purge.clear()
                        if forget:
                            db.forget_attempts(forget)
                            forget.clear()
                        if tried:
                            db.record_attempts(tried)
                            tried.clear()
                        if reset:
                            db.reset(reset)
                        return
                    except DatabaseError:
                        if attempt == 2:
                            raise
                        time.sleep(backoff)

            self._db_futures.append(self._waker.watch(exec_.submit(job)))
        if wait:
            if self._mark_future is not None:
                try:
                    self._mark_future.result()
                except DatabaseError:
                    pass  # its rows stay marked for a view we are about to leave
                self._mark_future = None
            futures, self._db_futures = self._db_futures, []
            errors = [f.exception() for f in futures]
            for err in errors:
                if err is not None:
                    raise err

    def _check_db(self) -> None:
        """Surface errors of finished write-behind jobs (raised in the relay thread)."""
        futures = self._db_futures
        if not futures[0].done():
            return
        done = [f for f in futures if f.done()]
        self._db_futures = [f for f in futures if not f.done()]
        for f in done:
            err = f.exception()
            if err is not None:
                raise err

    def _drain(self, budget: float) -> None:
        """Stop sending; wait up to ``budget`` seconds for in-flight acknowledgements."""
        producer = self._producer
        self._draining = True
        try:
            deadline = time.monotonic() + budget
            while self._in_flight and producer is not None and time.monotonic() < deadline:
                producer.poll(0.01)
            if self._in_flight and producer is not None:
                log.warning("%d record(s) still in flight after %.1fs; abandoning them (they will be re-marked)",
                            len(self._in_flight), budget)
                try:
                    producer.purge(in_queue=True, in_flight=False)
                    producer.poll(0)
                except KafkaException:
                    pass
                self._in_flight.clear()
                # The old producer may still report these later; a fresh one keeps views apart.
                self._producer = None
        finally:
            self._draining = False

    def _clear_queues(self) -> None:
        self._held.clear()  # still marked by the old view: the next view re-marks them
        self._held_count = 0
        self._ready.clear()
        self._waiting.clear()
        self._waiting_count = 0

    def _refresh(self) -> None:
        """Reset + forceRemark: drain, flush, new leader id. On a DB error the remark stays pending."""
        self._clear_queues()
        self._drain(self.limits.max_poll_interval)  # type: ignore[arg-type]
        self._flush_db(wait=True)
        if self._producer_fatal:
            self._producer_fatal = False
            if self._producer is not None:
                self._producer.flush(1.0)
            self._producer = None
        self._leader_id = uuid.uuid4()
        self._remark = False
        self._next_mark = 0.0
        self.metrics.remarks += 1
        log.info("%s: refreshed leader id %s", self.config.name, self._leader_id)
        self._emit(LeaderRefreshed(self._leader_id))

    def _relinquish(self, why: str) -> bool:
        """Drain and drop leader state; False if we were not leader."""
        if self._leader_id is None:
            return False
        log.info("%s: giving up leadership (%s): draining %d in-flight record(s)", self.config.name, why,
                 len(self._in_flight))
        self._clear_queues()
        self._remark = True  # no more sends
        self._drain(self.limits.max_poll_interval)  # type: ignore[arg-type]
        try:
            self._flush_db(wait=True)
        except DatabaseError as exc:
            # The rows stay marked by a leader id nobody will use again: the next leader re-marks them.
            log.warning("could not flush purges while giving up leadership (records will be re-sent): %s", exc)
            self._purge_buf, self._dlq_buf, self._reset_buf = [], [], []
            self._attempt_buf, self._forget_buf = [], []
        self._attempts.clear()
        self._leader_id = None
        self._remark = False
        self.metrics.is_leader = False
        return True
