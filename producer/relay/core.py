"""What both delivery modes of the relay share while leading: connections, the producer, the marks.

:class:`~producer.harvest.Harvest` is the relay process (lifecycle, election, main loop, meter); the
way it delivers is a :class:`~producer.relay._mode.RelayMode` strategy: :class:`~producer.relay.at_least_once.mode.AtLeastOnceMode`
(goharvest's per-record purge) or :class:`~producer.relay.sequenced.mode.SequencedMode` (``--uuid-sequencing``:
fenced harvest transactions). Both work on one :class:`RelayCore`, which owns what neither mode
decides alone:

- two database connections, each with a single-thread executor (statements run in submission
  order on each): marks and the meter's backlog query on one, purges / resets / dead letters /
  commits on the other, so the database works on a mark and a write at once (in a fleet, each
  worker leases a connection of its database's pool per unit of work instead: producer/db/statement_pool.py);
- the LISTEN connection a stasher's NOTIFY arrives on, and the :class:`~producer.relay._waker.Waker` that
  finished jobs ring;
- the Kafka producer (replaced after a fatal error or an abandoned drain) and the preflight
  :class:`~producer.ops.preflight.TopicGuard`;
- the current view (``leader_id``) and whether the mode must re-mark (``remark``);
- the mark prefetch (up to :data:`MARKS_AHEAD` marks queued on the mark connection, sized by
  :class:`~producer.layouts.mark.marksize.MarkSize`), the queue of marked rows not yet looked at (``ready``, id
  order) and rows held for missing topics;
- the failed-attempt counts per row id, and the samples that tell poison from an outage.

Invariants (tested in ``tests/test_producer``):
- at most ``MARKS_AHEAD`` marks are pending; they run one after another on the mark connection and
  are taken in the order they were asked for, so rows reach ``ready`` in the order the marks claimed
  them; a mark's rows are used only by the view that asked for it (``PendingMark.view``); rows
  marked for an abandoned view are re-marked by the next one;
- held rows keep id order per topic and go back to the head of ``ready`` when their topic exists;
- ``await_progress`` never busy-waits: it returns on a delivery report, a finished job, a NOTIFY
  it would act on, or after about a millisecond;
- only the mark connection commits asynchronously (a mark lost in a database crash only un-claims
  its rows; test_async_mark.py crashes Postgres to show it); every write that must last commits
  synchronously on the write connection;
- nothing here imports a mode: modes depend on the core, the core on neither;
- a fatal authorization error of the producer (no producer id: its principal may write no topic) stops the
  relay at the next tick (:meth:`RelayCore.raise_access_failure`), and no row is counted or dead-lettered
  for it (test_harvest_logic.py).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple, Protocol

import psycopg
from confluent_kafka import KafkaError

from harvest_outbox.producer.config import MARK_FLOOR, HarvestConfig
from harvest_outbox.producer.db import Listener, MarkedAttempts, MarkedRow, StatementPool
from harvest_outbox.producer.election.sharded_neli import ShardSetSeat
from harvest_outbox.producer.encode.serialization import RowEncoder
from harvest_outbox.producer.errors import DatabaseError, KafkaSecurityError
from harvest_outbox.producer.kafka import (
    LIBRDKAFKA_LOG,
    DeliveryCallback,
    FatalErrorGuard,
    KafkaProducer,
    ProducerFactory,
    is_access_denied,
    size_refused_topics,
)
from harvest_outbox.producer.kafka.security_errors import principal_of
from harvest_outbox.producer.layouts.choice import layout_for, layout_of
from harvest_outbox.producer.layouts.layout import OutboxLayout, RelayDatabase
from harvest_outbox.producer.layouts.mark.marksize import MarkSize
from harvest_outbox.producer.observe.metrics import Metrics
from harvest_outbox.producer.ops.preflight import TopicGuard

# RelayMode is re-exported: its import path before the modes' interface had a module of its own.
from harvest_outbox.producer.relay._mode import RelayMode as RelayMode
from harvest_outbox.producer.relay._waker import Waker
from harvest_outbox.producer.relay.key_halt import KeyHalt
from harvest_outbox.producer.relay.marked_row import ROW_ID, ROW_TOPIC
from harvest_outbox.producer.relay.spans import relay_spans
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.redact import redact_dsn, redact_error, redact_kafka_config

log = logging.getLogger(__name__)

# At most this many records in librdkafka's hands: rows trickle in, and the relay waits in slices of
# _TRICKLE_SLICE seconds on its waker instead of in 1 ms polls (see RelayCore.await_progress).
_TRICKLE_RECORDS = 64
_TRICKLE_SLICE = 0.0002
# ... when a delivery report would unblock nothing (no row waits for one): the reports can wait a
# millisecond, and the loop turns 5x less often. At 500 rows/s of at-least-once on the mark layout the
# relay process's CPU went from ~0.31 to ~0.26 of a core (bench: relay_cpu_share) with this slice.
_QUIET_SLICE = 0.001

#: Marks queued on the mark connection while a backlog drains. With one, the connection sat idle
#: from the end of each mark until the relay thread, busy producing, got round to asking for the
#: next: 10-20 % of a drain (measured, sequenced mode ~22 %). With two, the next mark is already
#: queued behind the running one. Only after a full mark: a trickle still marks one at a time.
MARKS_AHEAD = 2


class NotifyListener(Protocol):
    """What the relay waits on for a stasher's NOTIFY: :class:`~producer.db.Listener` (a connection of its
    own) or a fleet's :class:`~producer.db.shared_listener.SharedListener`."""

    def wait(self, timeout: float) -> bool: ...

    def pending(self) -> bool: ...

    def fileno(self) -> int | None: ...

    def close(self) -> None: ...


#: (dataSource, channel) -> a listener on a shared connection.
ListenerFactory = Callable[[str, str], NotifyListener]


class PendingMark(NamedTuple):
    """A mark asked of the mark worker: its result, the view it marks for, and the rows it asked for."""

    future: Future[tuple[list[MarkedRow], MarkedAttempts]]
    view: uuid.UUID
    asked: int


def event_id_bytes(config: HarvestConfig) -> int:
    """Bytes the ``eventIdHeader`` header adds to a record at most (name, ``<outbox>/``, a 19-digit id)."""
    if not config.event_id_header:
        return 0
    return len(config.event_id_header.encode()) + len(OutboxNames.parse(config.outbox_table).display.encode()) + 20


class RelayCore:
    """The shared state of a relay (see module doc). Built by :class:`~producer.harvest.Harvest`;
    a mode reads and writes its attributes from the relay thread only, except where noted."""

    def __init__(
        self,
        config: HarvestConfig,
        emit: Any,
        *,
        producer_factory: ProducerFactory,
        guard: TopicGuard,
        shards: ShardSetSeat | None,
        stop_requested: threading.Event,
        tracer_provider: Any = None,
        listener_factory: ListenerFactory | None = None,
        statement_pool: StatementPool | None = None,
    ) -> None:
        self.config = config
        #: A fleet's statement connections of this database (producer/db/statement_pool.py), which both
        #: workers lease per unit of work; None: two connections of this relay's own.
        self.statement_pool = statement_pool
        #: A fleet's LISTEN connection of this database (producer/db/shared_listener.py); None: a LISTEN
        #: connection of this relay's own.
        self.listener_factory = listener_factory
        self.limits = config.limits
        self.names = OutboxNames.parse(config.outbox_table, config.table_mapping)
        #: ``outboxLayout``: the layout the databases are opened on (producer/layouts/, chosen once); unset, the
        #: table's, looked up by every :meth:`open` (a cold standby elected after a migration opens the new one).
        self.layout: OutboxLayout | None = layout_for(config) if config.outbox_layout is not None else None
        #: ``eventIdHeader``: (header name, value prefix); a record's value is the prefix + its row id.
        self.event_id: tuple[str, bytes] | None = (
            (config.event_id_header, f"{self.names.display}/".encode()) if config.event_id_header else None
        )
        self.metrics = Metrics()
        #: ``emit(event)``: hands an event to the user's handler (a handler's error is logged, not raised).
        self.emit = emit
        self.stop_requested = stop_requested
        #: Relay spans (producer.relay.spans), decided once here: None without a configured OpenTelemetry
        #: SDK (or with ``tracing.spans: false``), and then the modes run no span code at all.
        self.spans = relay_spans(config.tracing, tracer_provider)
        #: ``shards: S``: the seat whose led shards the views serve; None for the whole outbox.
        self.shards = shards
        self.producer_factory = producer_factory
        self.guard = guard
        #: ``serialization:`` (producer.encode.serialization): encodes marked rows in the mark worker; None
        #: without a topic to encode (then the registry client is never imported).
        self.encoder: RowEncoder | None = RowEncoder(config.serialization) if config.serialization.enabled else None
        # connections and their workers (open() .. close())
        self.db: RelayDatabase | None = None  # writes: purges, resets, dead letters, commits, views
        self.exec: ThreadPoolExecutor | None = None
        self.mark_db: RelayDatabase | None = None  # marks and metrics queries
        self.mark_exec: ThreadPoolExecutor | None = None
        self.listener: NotifyListener | None = None
        # finished marks and write jobs wake a relay thread that waits outside librdkafka's poll
        self.waker = Waker()
        self.db_futures: list[Future[Any]] = []  # write-behind jobs not yet checked
        self.producer: KafkaProducer | None = None
        #: The idle wait may last until the next mark is due instead of ``minPollInterval``. An idle leader's
        #: loop turns for its election's pulse and for a NOTIFY; a Postgres election's pulse reads what its
        #: election thread verified (no I/O), and a fleet's shared LISTEN hub reconnects on its own: with both
        #: (unsharded), nothing needs the loop meanwhile (a fleet of 100 idle outboxes turned 1,000 loops a second).
        self.long_idle = config.leader_election == "postgres" and shards is None and listener_factory is not None
        #: librdkafka reported a fatal error: the mode leaves its view and drops the producer.
        self.producer_fatal = False
        #: The producer's fatal error was an authorization one (no topic writable: no producer id): the relay
        #: stops with it at the next tick (:meth:`raise_access_failure`), touching no row.
        self.access_failure: KafkaSecurityError | None = None
        # the view
        self.leader_id: uuid.UUID | None = None
        #: Leave the current view and re-mark (set by a failure, a DB error, a fatal producer error).
        self.remark = False
        # marked rows
        self.ready: deque[MarkedRow] = deque()  # marked, not yet looked at, id order
        # missingTopicPolicy: hold -- rows of missing topics, by topic, in id order (marked by this
        # view; dropped with it and re-marked by the next one)
        self.hold_missing = config.missing_topic_policy == "hold"
        self.held: dict[str, deque[MarkedRow]] = {}
        self.held_count = 0
        self._next_hold_check = 0.0
        #: deadLetterPolicy: haltKey -- keys this view dead-lettered a row of (producer.relay.key_halt)
        self.halt = KeyHalt(config.dead_letter_policy == "haltKey")
        #: The column a Debezium mapping places in the record's partition (its rows' partition is not None)
        self.partition_column = config.table_mapping.partition_column or "partition"
        # the mark prefetch: pending marks, oldest first
        self.marks: deque[PendingMark] = deque()
        ceiling = self.limits.mark_ceiling
        self.mark_size = MarkSize(min(MARK_FLOOR, ceiling), ceiling)
        self.next_mark = 0.0
        #: The last mark took the whole backlog: the next one waits for a NOTIFY or markBackoff.
        self.idle = False
        #: Empty marks in a row with a LISTEN open: each waits twice as long for the next (the idle backoff).
        self.empty_marks = 0
        # failed attempts
        self.attempts: dict[int, int] = {}  # id -> failed attempts (persisted ones included, from the mark)
        self.attempt_buf: list[tuple[int, int, str]] = []  # (id, attempts, error) to persist
        # (monotonic time, metrics.delivered) samples, ~4 per second over the last rowTimeout: did
        # anything get delivered while a failed record was waiting (poison) or not (outage)?
        self.delivered_samples: deque[tuple[float, int]] = deque()

    # ------------------------------------------------------------------ resources
    def open(self) -> None:
        """Connect (fail fast: connection, layout and schema checks) and start the two DB workers."""
        shard_count = self.shards.count if self.shards is not None else None
        layout = self.layout
        if layout is None or self.config.outbox_layout is None:
            layout = self.layout = self._table_layout()
        self.db, self.mark_db = layout.open_databases(
            self.config.data_source,
            self.names,
            shard_count,
            halt_keys=self.halt.enabled,
            sequenced=self.config.uuid_sequencing,
            pool=self.statement_pool,
        )
        self.exec = ThreadPoolExecutor(1, thread_name_prefix=f"harvest-db-{self.config.name}")
        self.mark_exec = ThreadPoolExecutor(1, thread_name_prefix=f"harvest-mark-{self.config.name}")
        self.listener = self._listener()

    def _table_layout(self) -> OutboxLayout:
        """``outboxLayout`` unset: the layout of the outbox table (the cursor layout's for none yet: the
        relay's own check then names ``harvest init-db``)."""
        from harvest_outbox.producer.db import connect

        try:
            with connect(self.config.data_source) as conn:
                return layout_of(conn, self.names, self.config)
        except psycopg.Error as exc:
            raise DatabaseError(
                f"cannot read the layout of outbox {self.names.display!r} ({redact_dsn(self.config.data_source)}): "
                f"{redact_error(str(exc), self.config.data_source).strip()}"
            ) from exc

    def _listener(self) -> NotifyListener | None:
        """The LISTEN connection for a stasher's NOTIFY; none with ``wakeup: poll`` (the outbox has no
        trigger, so two-phase-commit writers can prepare: the idle relay marks every idle poll instead)."""
        if self.config.wakeup_mode == "poll":
            return None
        if self.listener_factory is not None:
            return self.listener_factory(self.config.data_source, self.names.channel)
        return Listener(self.config.data_source, self.names)

    @property
    def connected(self) -> bool:
        """The leader's resources are open (:meth:`open` ran and :meth:`release` did not since)."""
        return self.db is not None

    def release(self) -> None:
        """Let go of what only a leader needs (``standby: cold``): flush and drop the producer, stop the
        workers, close the connections and the LISTEN; :meth:`open` makes them again."""
        if self.producer is not None:
            self.producer.flush(5.0)
            self.producer = None
        for executor in (self.exec, self.mark_exec):
            if executor is not None:
                executor.shutdown(wait=True)
        self.exec = self.mark_exec = None
        self.guard.close()
        for closeable in (self.listener, self.db, self.mark_db):
            if closeable is not None:
                closeable.close()
        self.listener = self.db = self.mark_db = None
        self.marks.clear()
        self.db_futures.clear()

    def close(self) -> None:
        """Flush and drop the producer, stop the workers, close every connection."""
        self.release()
        if self.encoder is not None:
            self.encoder.close()
        self.waker.close()

    def use_shards(self, applied: frozenset[int]) -> None:
        """A new view of the led shards: both connections mark / purge within ``applied`` from now on."""
        for db in (self.db, self.mark_db):
            if db is not None:
                db.set_shards(applied)
        self.metrics.shard_backlog = {}

    # ------------------------------------------------------------------ the producer
    def ensure_producer(self, settings: Mapping[str, Any], on_delivery: DeliveryCallback) -> KafkaProducer:
        """The producer; created when there is none (after a fatal error or an abandoned drain):
        the config's settings, then the mode's ``settings`` where the user set none."""
        if self.producer is not None:
            return self.producer
        conf = self.config.producer_config()
        conf.setdefault("client.id", f"harvest-{self.config.name}")
        for name, value in settings.items():
            conf.setdefault(name, value)
        conf.setdefault("error_cb", self.on_producer_error)
        conf.setdefault("logger", LIBRDKAFKA_LOG)
        log.debug("creating producer %s", redact_kafka_config(conf))
        self.producer = FatalErrorGuard(self.producer_factory(conf, on_delivery), self.on_producer_error)
        return self.producer

    def on_producer_error(self, err: KafkaError) -> None:
        """librdkafka's global errors (served inside ``poll()``). A fatal one (with
        ``--uuid-sequencing``, a gap-less guarantee the broker broke by refusing a batch) makes the
        producer unusable: the mode leaves the view and builds a new producer, instead of letting
        ``poll()`` raise and the relay die on one row, again after every restart."""
        if not err.fatal():
            log.debug("Kafka producer: %s", err.str())  # librdkafka logs these itself
            return
        if is_access_denied(err):
            self.access_failure = KafkaSecurityError(
                f"the Kafka producer was refused ({err.name()}: {err.str()}): {principal_of(self.config.producer_config())} "
                f"may write no topic, and an idempotent producer gets its id only with WRITE on a topic (Kafka 3.0 "
                f"and later) or IDEMPOTENT_WRITE on the cluster; grant the relay's ACLs (`harvest acls`). No row was "
                f"dead-lettered"
            )
        log.error("the Kafka producer hit a fatal error (%s: %s); replacing it and re-marking", err.name(), err.str())
        self.producer_fatal = True
        for topic in size_refused_topics(err):
            self.guard.check_sizes(topic)

    def raise_access_failure(self) -> None:
        """Stop the relay (raise) if the producer was refused for want of an ACL no row can do without. The
        preflight names the ACL of the waiting rows' topics first (``WRITE on TOPIC 'orders'``: it raises for
        a topic its principal may not write when no topic is writable); with no row waiting, the error says
        what is missing in general."""
        failure = self.access_failure
        if failure is None:
            return
        topics = [row[ROW_TOPIC] for row in self.ready]
        for mark in self.marks:  # the rows about to come (their mark is read again when taken)
            try:
                rows, _attempts = mark.future.result(5.0)
            except Exception:  # a failed or slow mark: its rows are none of this error's business
                continue
            topics += [row[ROW_TOPIC] for row in rows]
        self.guard.forget()
        for topic in list(dict.fromkeys(t for t in topics if t))[:10]:
            self.guard.verdict(topic)  # raises KafkaSecurityError naming WRITE on the topic
        raise failure

    def drop_fatal_producer(self) -> None:
        """After a fatal producer error, once the view is left: flush briefly and drop the producer."""
        if self.producer_fatal:
            self.producer_fatal = False
            if self.producer is not None:
                self.producer.flush(1.0)
            self.producer = None

    # ------------------------------------------------------------------ marks
    def submit_mark(self) -> None:
        """Ask the mark worker for the next ``mark_size`` rows of the current view."""
        assert self.mark_exec is not None and self.mark_db is not None and self.leader_id is not None
        view, asked = self.leader_id, self.mark_size.value
        mark: Any = self.mark_db.mark_with_attempts
        future = self.mark_exec.submit(mark, view, asked)
        if self.encoder is not None:  # serialization: encoded on the encoder's thread while the next mark runs
            future = self.encoder.after(future)
        future = self.waker.watch(future)
        self.marks.append(PendingMark(future, view, asked))

    def mark_ahead(self, unsent: int) -> None:
        """After a full mark (more rows wait): queue marks up to :data:`MARKS_AHEAD`, while fewer
        than two marks' worth of rows (``unsent``) wait to be produced."""
        while len(self.marks) < MARKS_AHEAD and unsent < 2 * self.mark_size.value:
            self.submit_mark()

    def take_mark(self) -> PendingMark | None:
        """The oldest pending mark if it has finished (no longer pending), else None. Its
        ``future.result()`` raises the mark's :class:`DatabaseError`."""
        if self.marks and self.marks[0].future.done():
            return self.marks.popleft()
        return None

    def await_mark(self) -> None:
        """Wait out the pending marks (their rows stay marked for a view about to be left)."""
        while self.marks:
            try:
                self.marks.popleft().future.result()
            except DatabaseError:
                pass

    def await_progress(self, producer: KafkaProducer, reports_awaited: bool = True) -> None:
        """Wait (about a millisecond at most) for what moves a busy relay on: a delivery report, a
        finished mark or write job, a stasher's NOTIFY.

        Only a delivery report ends ``producer.poll(timeout)`` early, and only the waker's select ends
        on the others. Streaming a backlog, librdkafka always holds many records and reports arrive
        back to back: poll. Trickling (few records held), the next row's NOTIFY or mark usually
        finishes first, and waiting it out inside a 1 ms poll is most of a row's idle-to-delivery
        latency: select on the waker in short slices, and serve reports between them. The slices are
        short only while ``reports_awaited`` (the mode says a report would unblock a row or a commit);
        otherwise the waker's events still end the wait at once, and reports are served within 1 ms."""
        held = len(producer)
        if held > _TRICKLE_RECORDS:
            producer.poll(0.001)
            return
        # The LISTEN socket only while a NOTIFY would be acted on (idle, no mark in flight): otherwise
        # nothing reads it, it stays readable, and every wait would return at once (a busy loop).
        fd = None
        if self.idle and not self.marks and self.listener is not None:
            fd = self.listener.fileno()
        self.waker.wait(_TRICKLE_SLICE if held and reports_awaited else _QUIET_SLICE, fd)
        producer.poll(0)

    def notified_while_idle(self) -> None:
        """A stasher committed while the relay waited out ``markBackoff``: mark now."""
        if self.idle and not self.marks and self.listener is not None and self.listener.pending():
            self.mark_now()

    def wait_idle(self) -> None:
        """Nothing to do: sleep until a stasher commits (NOTIFY) or the fallback poll / next pulse is due.
        A NOTIFY marks at the next turn; otherwise the next mark waits for ``next_mark`` (see
        :meth:`took_mark`): without a NOTIFY (``wakeup: poll``, or a table without the trigger) that is the
        poll. With :attr:`long_idle` the wait lasts until ``next_mark`` (at most ``idlePollInterval``)."""
        listener = self.listener
        fd = listener.fileno() if listener is not None and self.long_idle else None
        if listener is not None and fd is not None:
            # Nothing needs the loop to turn before the next mark is due: only a NOTIFY, a finished job or a
            # stop (Harvest.stop rings the waker) ends the wait early. A fleet's idle outboxes then turn their
            # loops every idlePollInterval (1 s; a fleet's default 5 s), not every minPollInterval.
            due = max(self.limits.min_poll_interval, self.next_mark - time.monotonic())
            self.waker.wait(min(self.limits.idle_poll_interval, due), fd)
            if listener.pending():
                self.mark_now()
            return
        timeout = min(self.limits.idle_poll_interval, self.limits.min_poll_interval)
        if self.listener is None:
            self.waker.wait(timeout)  # a finished job still ends the wait early
        elif self.listener.wait(timeout):
            self.mark_now()

    def mark_now(self) -> None:
        """A stasher committed (NOTIFY): the next turn marks, and the idle backoff starts over."""
        self.next_mark = 0.0
        self.empty_marks = 0

    # ------------------------------------------------------------------ held rows (missingTopicPolicy: hold)
    def hold(self, row: MarkedRow) -> None:
        """Keep ``row`` (its topic does not exist) until the topic does."""
        topic = row[ROW_TOPIC]
        if topic is None:
            raise ValueError(f"row {row[ROW_ID]} has no topic: a bad row is dead-lettered, never held")
        held = self.held.get(topic)
        if held is None:
            log.warning(
                "topic %r does not exist: holding its rows until it does (missingTopicPolicy: hold); "
                "rows of other topics flow",
                topic,
            )
            held = self.held[topic] = deque()
        held.append(row)
        self.held_count += 1

    def release_held(self, now: float) -> None:
        """Every ``missing_ttl``: topics that exist now get their held rows back, ahead of the
        ready queue (they are older than anything of their topic queued after them)."""
        if now < self._next_hold_check:
            return
        self._next_hold_check = now + self.guard.missing_ttl
        for topic in list(self.held):
            verdict = self.guard.verdict(topic)
            if topic in self.guard.missing:
                continue
            rows = self.held.pop(topic)
            self.held_count -= len(rows)
            log.info(
                "topic %r exists now (%s): releasing %d held row(s)",
                topic,
                "ok" if verdict.__class__ is not str else verdict,
                len(rows),
            )
            self.ready.extendleft(reversed(rows))

    def clear_queues(self) -> None:
        """Forget marked rows not yet sent (still marked by the old view: the next view re-marks them)
        and the keys the view halted (the next view's marks leave them in the outbox)."""
        self.halt.clear()
        self.held.clear()
        self.held_count = 0
        self.ready.clear()

    # ------------------------------------------------------------------ the view: the modes decide, the core records
    def begin_view(self, leader_id: uuid.UUID) -> None:
        """A new view serves from now on: its id, no re-mark pending, the first mark at once."""
        self.leader_id = leader_id
        self.remark = False
        self.mark_now()

    def end_leadership(self) -> None:
        """Leadership is gone (the mode has drained): no view; the next leader reads the stored
        attempt counts back with its marks."""
        self.attempts.clear()
        self.leader_id = None
        self.remark = False

    def request_remark(self) -> None:
        """Leave the current view at the next tick (a failure, a DB error, a refused send, a halt)."""
        self.remark = True

    def remark_taken(self) -> None:
        """The mode left the view the remark asked it to leave (its next view starts later)."""
        self.remark = False

    def producer_failed(self) -> None:
        """librdkafka reported a fatal error for the producer: replaced once the view is left."""
        self.producer_fatal = True

    def abandon_producer(self) -> None:
        """Forget the producer unflushed: its late delivery reports must not reach a later view."""
        self.producer = None

    def took_mark(self, short: bool, now: float, empty: bool = False) -> None:
        """A mark's rows arrived; a short (or empty) one took the whole backlog, so the next mark waits
        for a stasher's NOTIFY or ``markBackoff`` instead of running at once to come back empty.

        With a LISTEN open, every new row's commit sends a NOTIFY, so an *empty* mark's successor only
        guards against a lost one (and moves the cursor layout's snapshots on): it waits
        ``minPollInterval``, doubled after each further empty mark, up to ``idlePollInterval``. An idle
        relay then marks about once a second, not at every election pulse (10 marks a second, each a
        few statements on the primary: per outbox, so a fleet of idle outboxes kept Postgres busy)."""
        self.idle = short
        if not short:
            self.empty_marks = 0
            return
        wait = self.limits.mark_backoff
        if empty and self.listener is not None:
            limits = self.limits
            wait = max(wait, min(limits.idle_poll_interval, limits.min_poll_interval * 2 ** min(self.empty_marks, 16)))
            self.empty_marks += 1
        else:
            self.empty_marks = 0
        self.next_mark = now + wait

    # ------------------------------------------------------------------ attempt counting
    def next_attempt(self, rid: int) -> int:
        """Count one more failed delivery attempt of row ``rid``; returns its count."""
        attempts = self.attempts.get(rid, 0) + 1
        self.attempts[rid] = attempts
        return attempts

    def adopt_attempts(self, rid: int, stored: int) -> int:
        """A freshly marked row's stored count (from crashed or earlier processes): the larger wins."""
        n = self.attempts[rid] = max(self.attempts.get(rid, 0), stored)
        return n

    def store_attempt(self, rid: int, attempts: int, err: KafkaError) -> None:
        """Queue a failed attempt for the database (stored before the row can be sent again)."""
        self.attempt_buf.append((rid, attempts, f"{err.name()}: {err.str()}"))

    def forget_attempts(self, rid: int) -> None:
        """The row is delivered or dead-lettered: its count is no longer needed in memory."""
        self.attempts.pop(rid, None)

    def take_attempt_buf(self) -> list[tuple[int, int, str]]:
        """The queued attempts, handed to a write (which returns them if it fails)."""
        tried, self.attempt_buf = self.attempt_buf, []
        return tried

    def return_attempt_buf(self, tried: list[tuple[int, int, str]]) -> None:
        """A write of ``tried`` failed: they go ahead of anything queued since."""
        self.attempt_buf = tried + self.attempt_buf

    # ------------------------------------------------------------------ write-behind jobs
    def add_db_job(self, future: Future[Any]) -> None:
        """A write-behind job: its end wakes the relay thread; :meth:`check_db` surfaces its error."""
        self.db_futures.append(self.waker.watch(future))

    def take_db_jobs(self) -> list[Future[Any]]:
        """Every write-behind job not yet checked, for the caller to await."""
        futures, self.db_futures = self.db_futures, []
        return futures

    def check_db(self) -> None:
        """Surface errors of finished write-behind jobs (raised in the relay thread)."""
        futures = self.db_futures
        if not futures or not futures[0].done():
            return
        done = [f for f in futures if f.done()]
        self.db_futures = [f for f in futures if not f.done()]
        for f in done:
            err = f.exception()
            if err is not None:
                raise err

    # ------------------------------------------------------------------ poison or outage
    def sample_deliveries(self, now: float) -> None:
        """Keep ~4 samples a second of ``metrics.delivered`` over the last ``rowTimeout`` (+1 s)."""
        samples = self.delivered_samples
        if not samples or now - samples[-1][0] >= 0.25:
            samples.append((now, self.metrics.delivered))
            while now - samples[0][0] > self.limits.row_timeout + 1.0:
                samples.popleft()

    def waited_out(self, latency: float | None) -> bool:
        """Did a failed record wait (about) its whole delivery timeout?"""
        return latency is not None and latency >= 0.8 * self.limits.row_timeout
