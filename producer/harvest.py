"""The relay process: a leader election driving one relay loop, with a delivery mode as its strategy.

:class:`Harvest` owns the lifecycle (``start`` / ``stop`` / ``wait``), the election listener, the
relay thread's main loop and the meter. What it does while leading is its *mode*, a
:class:`~producer.relay.core.RelayMode` working on the shared :class:`~producer.relay.core.RelayCore`
(connections, producer, marks):

- :class:`~producer.relay.at_least_once.mode.AtLeastOnceMode` (the default): goharvest's mark-purge/reset
  algorithm, each delivered row purged;
- :class:`~producer.relay.sequenced.mode.SequencedMode` (``--uuid-sequencing``, ``config.uuid_sequencing``):
  harvest transactions committed through the fenced protocol of docs/design.md §5.

One thread (the relay thread) runs the election pulses, producing and the delivery callbacks, so
the per-record path takes no locks: confluent-kafka runs delivery callbacks inside ``poll()`` on
the caller's thread. Database statements run on the core's two worker threads.

Invariants (tested in ``tests/test_producer``):
- exactly one mode per relay, chosen by the config at construction and never changed;
- the mode works only while this relay leads: ``on_acquired`` before its first ``tick``, and
  ``relinquish`` (drain, flush or commit) before the relay reports ``LeaderRevoked`` /
  ``LeaderFenced``, stops, or lets its election hand the leadership over;
- ``standby: cold``: while it does not lead, the relay holds no statement, LISTEN or Kafka connection of its
  own (it connects when elected and lets go when its leadership ends; the fleet test counts the sessions);
- a database error in leader work never kills the relay: it backs off ``ioErrorBackoff`` and the
  mode leaves its view (re-marks); any other error stops the relay and ``wait()`` re-raises it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any

from harvest_outbox.producer.config import HarvestConfig, format_duration
from harvest_outbox.producer.election.neli import LeaderElection, NeliElection
from harvest_outbox.producer.election.sharded_neli import ShardSetSeat
from harvest_outbox.producer.errors import DatabaseError, LayoutChanged
from harvest_outbox.producer.kafka import ProducerFactory, confluent_producer
from harvest_outbox.producer.observe.metrics import MeterStats, start_prometheus
from harvest_outbox.producer.ops.preflight import TopicGuard
from harvest_outbox.producer.relay.admission import LayoutGuard
from harvest_outbox.producer.relay.at_least_once.mode import AtLeastOnceMode
from harvest_outbox.producer.relay.core import RelayCore, RelayMode, event_id_bytes
from harvest_outbox.producer.relay.events import (
    Event,
    EventHandler,
    LeaderAcquired,
    LeaderFenced,
    LeaderRevoked,
    MeterRead,
)
from harvest_outbox.producer.relay.lifecycle import RelayLifecycle, State
from harvest_outbox.producer.relay.sequenced.mode import SequencedMode

log = logging.getLogger(__name__)

#: Seconds between a cold Postgres-election standby's looks at its election (see ``Harvest._standby_pulse``).
COLD_STANDBY_PULSE = 0.2
#: deadLetterRetention: the leader deletes expired dead letters at most this many at a time (one short
#: statement between the purges on the write connection) ...
RETENTION_BATCH = 1000
#: ... once per this many seconds, and the next batch at once while batches come back full.
RETENTION_INTERVAL = 60.0


def _make_election(config: HarvestConfig, stop: threading.Event | None = None) -> LeaderElection:
    if config.leader_election == "postgres":
        from harvest_outbox.producer.election.postgres import PostgresElection

        return PostgresElection(
            config.data_source, config.outbox_table, config.name, check_interval=config.leader_lock_check_interval
        )
    return NeliElection(
        dict(config.base_kafka_config),
        config.leader_topic,
        config.leader_group_id,
        config.name,
        heartbeat_timeout=config.limits.heartbeat_timeout,
        min_poll_interval=config.limits.min_poll_interval,
        poll_duration=config.limits.poll_duration,
        replication_factor=config.leader_topic_replication_factor,
        stop=stop,
    )


class Harvest(RelayLifecycle):
    """The relay. ``Harvest(config).start()``; ``stop()``; ``wait()`` (re-raises a fatal error).

    ``producer_factory`` and ``election`` are seams for tests (fault injection) and for other
    election mechanisms; by default a real confluent Producer and the election ``config.leader_election``
    names (:class:`NeliElection`, or :class:`~producer.election.postgres.PostgresElection`) are used.
    ``layout_session``: a fleet's :class:`~producer.relay.layout_session.SharedLayoutSession` of this
    database, which holds this relay's layout lock (default: a session of its own); ``listener_factory``:
    its LISTEN connection's (producer/db/shared_listener.py; default: a connection of its own);
    ``admin_factory``: makes its preflight's Kafka admin client (a fleet's
    :class:`~producer.kafka.shared_admin.SharedAdmins`; default: a client of its own);
    ``statement_pool``: the pool of this database its statements lease connections from
    (producer/db/statement_pool.py; default: a mark and a write connection of its own).
    :attr:`mode` is the delivery strategy ``config.uuid_sequencing`` chose. ``tracer_provider``: the
    OpenTelemetry TracerProvider of relay spans (``config.tracing``), by default the global one
    (:mod:`producer.relay.spans`; read once, here). Its lifecycle (states, start, stop, wait) is
    :class:`~producer.relay.lifecycle.RelayLifecycle`'s.
    """

    _log = log

    def __init__(
        self,
        config: HarvestConfig,
        event_handler: EventHandler | None = None,
        *,
        producer_factory: ProducerFactory | None = None,
        election: LeaderElection | None = None,
        topic_guard: TopicGuard | None = None,
        shards: ShardSetSeat | None = None,
        tracer_provider: Any = None,
        layout_session: Any = None,
        listener_factory: Any = None,
        admin_factory: Callable[[dict[str, Any]], Any] | None = None,
        statement_pool: Any = None,
    ) -> None:
        self.config = config
        self.limits = config.limits
        self._event_handler = event_handler
        #: ``shards: S`` (:mod:`producer.relay.sharded`): the seat that is both this loop's election and the
        #: set of shards its views serve; None for the whole outbox.
        self._shards = shards
        if shards is not None:
            election = shards
        self._init_lifecycle()
        self._election: LeaderElection = election or _make_election(config, self._stop_requested)
        mode_type: type[AtLeastOnceMode] | type[SequencedMode] = (
            SequencedMode if config.uuid_sequencing else AtLeastOnceMode
        )
        # Rows no broker will take are dead-lettered before they are produced (producer/ops/preflight.py).
        guard = topic_guard or TopicGuard(
            config.base_kafka_config,
            config.producer_config(),
            extra_overhead=mode_type.HEADER_BYTES + event_id_bytes(config),
            own_topics=frozenset({config.leader_topic}) if config.leader_election == "neli" else frozenset(),
            admin_factory=admin_factory,
        )
        self.core = RelayCore(
            config,
            self._emit,
            producer_factory=producer_factory or confluent_producer,
            guard=guard,
            shards=shards,
            stop_requested=self._stop_requested,
            tracer_provider=tracer_provider,
            listener_factory=listener_factory,
            statement_pool=statement_pool,
        )
        self.mode: RelayMode = mode_type(self.core)
        #: Keeps relays of another shards / leaderElection off this outbox while this one runs.
        self.layout = LayoutGuard(config, layout_session)
        self.names = self.core.names
        self.metrics = self.core.metrics
        self._stats_future: Future[tuple[int, float | None, int]] | None = None
        self._next_metrics = 0.0
        self._retention_future: Future[int] | None = None
        self._next_retention = 0.0
        #: How often a standby turns its loop. NELI's pulse polls its consumer (heartbeats), so it keeps
        #: ``minPollInterval``; a cold standby of a Postgres election only looks for an acquisition, which
        #: its election thread finds at most every ``leaderLockCheckInterval`` and connecting then costs
        #: more than this wait: a fleet's idle outboxes turn their loops 5 times a second, not 20.
        cold_postgres = config.standby == "cold" and config.leader_election == "postgres"
        self._standby_pulse = COLD_STANDBY_PULSE if cold_postgres else min(0.05, self.limits.min_poll_interval)

    # ------------------------------------------------------------------ public API
    def stop(self) -> None:
        """Ask the relay to stop (it drains, flushes, leaves the election); an idle wait ends at once."""
        super().stop()
        self.core.waker.ring()

    @property
    def is_leader(self) -> bool:
        return self.core.leader_id is not None

    @property
    def leader_id(self) -> uuid.UUID | None:
        return self.core.leader_id

    @property
    def in_flight_records(self) -> int:
        return self.mode.gauges()[0]

    def in_flight_record_keys(self) -> list[str]:
        return [k.decode("utf-8", "replace") for k in self.mode.in_flight_keys()]

    def stats(self) -> MeterStats | None:
        """The latest MeterRead reading (None before the first)."""
        return self.metrics.last

    # ------------------------------------------------------------------ lifecycle steps
    def _open(self) -> None:
        self.core.open()  # fail fast: connection + schema check
        if self.config.standby == "cold":  # a standby holds no connection: they are made when elected
            self.core.release()
        self.layout.start()  # before this relay can lead: refused while relays of another layout run
        if self.config.prometheus_port is not None:
            self._prometheus = start_prometheus(
                self.metrics,
                self.config.name,
                self.config.prometheus_port,
                self.config.prometheus_bind_address,
                relay=self,
                basic_auth=self.config.prometheus_basic_auth,
            )
        # The Kafka producer (an idempotent producer first fetches its producer id) and the
        # preflight's admin client connect now, while this relay is still a standby: the first
        # record after an election goes out at once, not after ~0.5-1 s of client start-up.
        if self.config.standby == "hot":
            self.mode.ensure_producer()
            self.core.guard.connect()
        self._election.start(self)

    def _connect(self) -> None:
        """``standby: cold``, just elected: open what leading needs (connections, LISTEN, producer). A
        failure lets go of what was opened and is retried by the loop after ``ioErrorBackoff``."""
        core = self.core
        try:
            core.open()
            if self._shards is not None:
                core.use_shards(self._shards.applied)
            self.mode.ensure_producer()
            core.guard.connect()
        except BaseException:
            core.release()
            raise
        log.info("%s: connected for leading (standby: cold)", self.config.name)

    def _abandon_start(self) -> None:
        self._shutdown()  # release whatever was opened before the failure
        self._state = State.STOPPED

    def _log_started(self) -> None:
        if self.config.leader_election == "postgres":
            log.info(
                "relay %s started on %s (leader election: Postgres advisory lock)", self.config.name, self.names.display
            )
        else:
            log.info(
                "relay %s started on %s (leader group %r, topic %r)",
                self.config.name,
                self.names.display,
                self.config.leader_group_id,
                self.config.leader_topic,
            )

    def __repr__(self) -> str:
        mode = "uuid-sequencing" if self.config.uuid_sequencing else "at-least-once"
        return f"Harvest(name={self.config.name!r}, {mode}, state={self.state.value})"

    # ------------------------------------------------------------------ election listener
    def on_acquired(self) -> None:
        core = self.core
        if self._shards is not None:
            # A new view of the led shards: no statement of the previous view runs any more (it was
            # relinquished), so both connections switch to the new set here.
            core.use_shards(self._shards.applied)
            log.info(
                "%s: leads shards %s of %d",
                self.config.name,
                ",".join(map(str, sorted(self._shards.applied))),
                self._shards.count,
            )
        leader_id = uuid.uuid4()
        core.begin_view(leader_id)
        self.metrics.is_leader = True
        self.mode.on_acquired()
        log.info("%s: elected leader, leader id %s", self.config.name, leader_id)
        self._emit(LeaderAcquired(leader_id))

    def on_revoked(self) -> None:
        if self._relinquish("revoked"):
            self._emit(LeaderRevoked())

    def on_fenced(self) -> None:
        if self._relinquish("fenced"):
            self._emit(LeaderFenced())

    def _relinquish(self, why: str) -> bool:
        """Let the mode drain and finish, then drop leader state; False if we were not leader."""
        core = self.core
        if core.leader_id is None:
            return False
        self.mode.relinquish(why)
        core.end_leadership()
        self.metrics.is_leader = False
        if self.config.standby == "cold" and why != "stopping":  # stopping: _shutdown closes everything
            core.release()
        return True

    # ------------------------------------------------------------------ main loop
    def _emit(self, event: Event) -> None:
        if self._event_handler is None:
            return
        try:
            self._event_handler(event)
        except Exception:  # a handler bug must not kill the relay
            log.exception("event handler failed on %r", event)

    def _loop(self) -> None:
        core, mode = self.core, self.mode
        while not self._stop_requested.is_set():
            if self.layout.failure is not None:  # another layout took the outbox while our session was gone
                raise self.layout.failure
            try:
                if self._election.pulse() and core.leader_id is not None:
                    if not core.connected:
                        self._connect()
                    mode.tick()
                else:
                    self._stop_requested.wait(self._standby_pulse)
            except LayoutChanged:
                raise  # the outbox moved to the cursor layout under this relay: it stops (producer/relay/layout_change.py)
            except DatabaseError as exc:
                log.warning("%s (retrying in %.3gs, remarking)", exc, self.limits.io_error_backoff)
                if core.leader_id is not None:
                    core.request_remark()
                self._stop_requested.wait(self.limits.io_error_backoff)
            now = time.monotonic()
            core.sample_deliveries(now)
            if now >= self._next_metrics:
                self._next_metrics = now + self.limits.min_metrics_interval
                self._read_meter()
            elif self._stats_future is not None and self._stats_future.done():
                self._meter_stats_arrived()
            if self.config.dead_letter_retention is not None:
                self._expire_dead_letters(now, self.config.dead_letter_retention)

    def _close(self) -> None:
        self._shutdown()

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
        try:
            self.core.close()
        finally:
            self.layout.close()  # last: this relay publishes nothing more
        if self._prometheus is not None:
            server, _thread = self._prometheus
            server.shutdown()

    # ------------------------------------------------------------------ deadLetterRetention
    def _expire_dead_letters(self, now: float, retention: float) -> None:
        """The leader (sharded: shard 0's; the dead letters are the whole outbox's) deletes dead letters
        parked more than ``retention`` seconds ago, one batch at a time on the write connection; the relay
        thread never waits on it. A failure is logged and tried again after ``RETENTION_INTERVAL``."""
        future, core = self._retention_future, self.core
        if future is not None:
            if not future.done():
                return
            self._retention_future = None
            try:
                deleted = future.result()
            except DatabaseError as exc:
                log.warning("%s (deadLetterRetention; next try in %s)", exc, format_duration(RETENTION_INTERVAL))
                return
            if deleted:
                log.info(
                    "%s: deleted %d dead letter(s) parked more than %s ago (deadLetterRetention)",
                    self.config.name,
                    deleted,
                    format_duration(retention),
                )
            if deleted >= RETENTION_BATCH:
                self._next_retention = now  # more are due
            return
        leads = core.leader_id is not None and (self._shards is None or 0 in self._shards.applied)
        if now < self._next_retention or not leads or core.exec is None or core.db is None:
            return
        self._next_retention = now + RETENTION_INTERVAL
        self._retention_future = core.exec.submit(core.db.expire_dead_letters, retention, RETENTION_BATCH)

    # ------------------------------------------------------------------ meter
    def _read_meter(self) -> None:
        """Take a meter reading. The leader's backlog figures come from a query on the mark
        connection; the reading is emitted when it returns, so the relay thread never waits on it."""
        core = self.core
        if self._stats_future is None and core.leader_id is not None and core.mark_db is not None:
            assert core.mark_exec is not None
            self._stats_future = core.mark_exec.submit(core.mark_db.stats)
            if any(self.mode.gauges()):
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
            if self.core.mark_db is not None:
                m.halted_keys = self.core.mark_db.halted_keys
                m.cursor_scan = self.core.mark_db.scan  # the cursor layout's (None on the mark layout)
            if self._shards is not None and self.core.mark_db is not None:
                m.shard_backlog = dict(self.core.mark_db.shard_stats)
        except DatabaseError as exc:
            log.warning("metrics query failed: %s", exc)
        self._emit_meter()

    def _emit_meter(self) -> None:
        m = self.metrics
        m.in_flight, m.queued = self.mode.gauges()
        stats = m.snapshot()
        log.debug("%s", stats)
        self._emit(MeterRead(stats))
