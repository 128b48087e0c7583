"""The sharded relay (``shards: S`` > 1): one outbox published by many relays at once.

Rows are split into S shards by a hash of ``kafka_key`` (:mod:`producer.shards`), so each key
lives in one shard. A :class:`ShardedHarvest` process takes part in a per-shard leader election
(:mod:`producer.shard_election`: NELI with an S-partition leader topic, or one Postgres advisory lock
per shard) and runs, for every shard it leads, one ordinary relay loop
(:class:`~producer.harvest.Harvest`, or the ``--uuid-sequencing`` relay) confined to that shard's
rows: its marks, metrics and (exactly-once mode) fence row are the shard's own. Everything the
unsharded relay guarantees holds per shard, because each shard *is* an unsharded relay over a
subset of keys: per-key order (a key never changes shard), deletion only after delivery, and in
exactly-once mode a fence epoch, producer id and ACK intents per shard view — a zombie's commit is
refused by its shard's fence.

Why one relay loop per led shard rather than one loop over all of them: a loop per shard is the
unit that moves between relays, and it is exactly the unsharded loop already proven under faults;
each has its own connections and producer, so a relay leading k shards publishes k streams in
parallel (the database and the broker batch them), and a lost shard drains alone while the others
keep publishing. A loop starts when its shard is acquired (its producer and connections then take
~0.1-1 s to open), and a relay leads at most ``ceil(S / relays)`` shards once stable.

Invariants (``tests/test_producer/test_sharded*.py``):
- a shard's relay loop runs only while this process leads the shard; the shard is released (NELI:
  the rebalance callback returns; Postgres: unlocked) only after its loop stopped publishing;
- a fatal error of any shard's loop stops the whole relay (``wait()`` re-raises it), as unsharded;
- counters survive loops: a stopped loop's delivered/dead-lettered counts stay in the totals.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from harvest_outbox.producer.config import HarvestConfig
from harvest_outbox.producer.db import OutboxDatabase
from harvest_outbox.producer.errors import ConfigError, HarvestError, SchemaError
from harvest_outbox.producer.events import EventHandler
from harvest_outbox.producer.harvest import Harvest, State
from harvest_outbox.producer.kafka import ProducerFactory
from harvest_outbox.producer.metrics import Metrics, start_prometheus
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.shard_election import NeliShardElection, ShardElection, ShardSeat
from harvest_outbox.producer.shards import Shard

log = logging.getLogger(__name__)

_COUNTERS = ("delivered", "dead_lettered", "remarks", "delivery_failures")


def _make_shard_election(config: HarvestConfig) -> ShardElection:
    if config.leader_election == "postgres":
        from harvest_outbox.producer.shard_election_postgres import PostgresShardElection

        return PostgresShardElection(config.data_source, config.outbox_table, config.name, config.shards,
                                     check_interval=config.leader_lock_check_interval)
    return NeliShardElection(
        dict(config.base_kafka_config), config.leader_topic, config.leader_group_id, config.name, config.shards,
        heartbeat_timeout=config.limits.heartbeat_timeout, min_poll_interval=config.limits.min_poll_interval,
        poll_duration=config.limits.poll_duration, replication_factor=config.leader_topic_replication_factor)


def relay_for(config: HarvestConfig, event_handler: EventHandler | None = None, **kwargs: Any) -> Harvest | ShardedHarvest:
    """The relay a config asks for: sharded when ``shards`` > 1, else the one-leader relay."""
    if config.shards > 1:
        return ShardedHarvest(config, event_handler, **kwargs)
    return Harvest(config, event_handler, **kwargs)


class ShardedHarvest:
    """``ShardedHarvest(config).start()``; ``stop()``; ``wait()`` (re-raises a fatal error). The same
    lifecycle and metrics as :class:`~producer.harvest.Harvest`; :attr:`led_shards` and
    :attr:`shard_relays` show which shards it leads."""

    def __init__(self, config: HarvestConfig, event_handler: EventHandler | None = None, *,
                 producer_factory: ProducerFactory | None = None, election: ShardElection | None = None) -> None:
        if config.shards < 2:
            raise HarvestError(f"ShardedHarvest needs shards >= 2, got {config.shards}; use Harvest")
        self.config = config
        self.limits = config.limits
        self.names = OutboxNames.parse(config.outbox_table)
        self._event_handler = event_handler
        self._producer_factory = producer_factory
        self._election = election or _make_shard_election(config)
        self.metrics = Metrics()
        self._retired = dict.fromkeys(_COUNTERS, 0)  # counts of loops that stopped
        self._relays: dict[int, Harvest] = {}  # running loops of led shards
        self._seats: dict[int, ShardSeat] = {}
        # Led shards whose loop is starting (its connections and producer open on a starter thread,
        # so the election keeps pulsing meanwhile), or waiting to retry a failed start.
        self._starting: dict[int, tuple[Harvest, ShardSeat, Future[Any]]] = {}
        self._retry_at: dict[int, float] = {}
        self._starter = ThreadPoolExecutor(4, thread_name_prefix=f"harvest-shard-start-{config.name}")
        self._state = State.CREATED
        self._stop_requested = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._prometheus: Any = None
        self._next_metrics = 0.0
        self.acquisitions = 0  # shard loops started (tests, bench)

    # ------------------------------------------------------------------ public API
    @property
    def state(self) -> State:
        return State.STOPPING if self._state is State.RUNNING and self._stop_requested.is_set() else self._state

    @property
    def is_leader(self) -> bool:
        """True while this relay leads at least one shard."""
        return bool(self._relays)

    @property
    def leader_id(self) -> None:
        return None  # one per shard view: see shard_relays

    @property
    def led_shards(self) -> frozenset[int]:
        return frozenset(self._relays)

    @property
    def shard_relays(self) -> dict[int, Harvest]:
        return dict(self._relays)

    @property
    def prometheus_port(self) -> int | None:
        return None if self._prometheus is None else int(self._prometheus[0].server_port)

    def start(self) -> ShardedHarvest:
        if self._state is not State.CREATED:
            raise HarvestError(f"cannot start a relay in state {self._state.value}")
        try:
            # Fail fast on what every shard loop would fail on: connection, schema, shard index.
            probe = OutboxDatabase(self.config.data_source, self.names, Shard(0, self.config.shards))
            try:
                _ = probe.conn
            finally:
                probe.close()
            if self.config.prometheus_port is not None:
                self._prometheus = start_prometheus(self.metrics, self.config.name, self.config.prometheus_port,
                                                    self.config.prometheus_bind_address, relay=self,
                                                    shards=self._shard_metrics)
            self._election.start(self)
        except BaseException:
            self._close_endpoint()
            self._state = State.STOPPED
            raise
        self._state = State.RUNNING
        self._thread = threading.Thread(target=self._run, name=f"harvest-shards-{self.config.name}", daemon=True)
        self._thread.start()
        log.info("relay %s started on %s with %d shards (leader election: %s)", self.config.name,
                 self.names.display, self.config.shards, self.config.leader_election)
        return self

    def stop(self) -> None:
        """Stop: every shard loop drains, then the shards are released to the other relays."""
        self._stop_requested.set()

    def wait(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False
        if self._error is not None:
            raise HarvestError(f"relay {self.config.name} failed: {self._error}") from self._error
        return True

    def __enter__(self) -> ShardedHarvest:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.wait()

    # ------------------------------------------------------------------ shard listener
    def on_shard_acquired(self, index: int) -> None:
        seat = ShardSeat(index)
        relay = Harvest(self.config.replace(name=f"{self.config.name}.s{index}", prometheus_port=None),
                        self._event_handler, producer_factory=self._producer_factory, election=seat,
                        shard=Shard(index, self.config.shards))
        self._retry_at.pop(index, None)
        self._starting[index] = (relay, seat, self._starter.submit(relay.start))

    def _started(self) -> None:
        """Grant the shards whose loop has started; schedule a retry for a transient start failure
        (the shard stays led, as the unsharded relay keeps leading through database errors)."""
        now = time.monotonic()
        for index, (relay, seat, future) in list(self._starting.items()):
            if not future.done():
                continue
            del self._starting[index]
            exc = future.exception()
            if exc is None:
                seat.grant()
                self._seats[index], self._relays[index] = seat, relay
                self.acquisitions += 1
            elif isinstance(exc, (ConfigError, SchemaError)):
                raise HarvestError(f"shard {index}/{self.config.shards} cannot start: {exc}") from exc
            else:
                log.warning("%s: shard %d's relay loop did not start (%s); retrying in %.3gs", self.config.name, index,
                            exc, self.limits.io_error_backoff)
                self._retry_at[index] = now + self.limits.io_error_backoff
        for index, at in list(self._retry_at.items()):
            if now >= at:
                self.on_shard_acquired(index)

    def on_shard_lost(self, index: int, why: str) -> None:
        self._retry_at.pop(index, None)
        starting = self._starting.pop(index, None)
        if starting is not None:  # let its start finish, then stop it like a running loop
            relay, seat, future = starting
            if future.exception() is not None:
                return
            self._relays[index], self._seats[index] = relay, seat
        relay, seat = self._relays.pop(index, None), self._seats.pop(index, None)
        if relay is None or seat is None:
            return
        seat.withdraw()  # the loop stops sending at its next pulse
        relay.stop()
        bound = (self.limits.max_poll_interval or self.limits.row_timeout) + self.limits.queue_timeout
        try:
            if not relay.wait(bound):
                log.error("%s: shard %d's relay loop did not stop within %.0fs; releasing the shard anyway", self.config.name,
                          index, bound)
        except HarvestError as exc:
            log.error("%s: shard %d's relay loop had failed: %s", self.config.name, index, exc)
            if self._error is None:
                self._error = exc.__cause__ or exc
        for name in _COUNTERS:
            self._retired[name] += getattr(relay.metrics, name)

    # ------------------------------------------------------------------ supervisor loop
    def _run(self) -> None:
        try:
            while not self._stop_requested.is_set():
                self._election.pulse()
                self._started()
                for index, relay in list(self._relays.items()):
                    if relay.state is State.STOPPED:  # died on its own: a fatal error
                        try:
                            relay.wait(0)
                        except HarvestError as exc:
                            raise HarvestError(f"shard {index}/{self.config.shards}: {exc}") from exc.__cause__
                self._aggregate()  # a handful of shards: cheap, and callers see current totals
                now = time.monotonic()
                if now >= self._next_metrics:
                    self._next_metrics = now + self.limits.min_metrics_interval
                    self.metrics.snapshot()
                self._stop_requested.wait(min(0.02, self.limits.min_poll_interval))
        except BaseException as exc:
            log.exception("relay %s failed", self.config.name)
            self._error = exc
        finally:
            self._state = State.STOPPING
            try:
                self._election.close()  # drains and stops every shard loop, then leaves
            except Exception:
                log.exception("closing the shard election")
            for index in list(self._relays):  # loops the election did not report (it failed)
                self.on_shard_lost(index, "stopping")
            for index in list(self._starting):
                self.on_shard_lost(index, "stopping")
            self._starter.shutdown(wait=True)
            self._aggregate()
            self._close_endpoint()
            self._state = State.STOPPED
            log.info("relay %s stopped", self.config.name)

    def _aggregate(self) -> None:
        relays = list(self._relays.values())
        m = self.metrics
        for name in _COUNTERS:
            setattr(m, name, self._retired[name] + sum(getattr(r.metrics, name) for r in relays))
        m.in_flight = sum(r.metrics.in_flight for r in relays)
        m.queued = sum(r.metrics.queued for r in relays)
        m.is_leader = bool(relays)
        backlogs = [r.metrics.backlog_rows for r in relays if r.metrics.backlog_rows is not None]
        m.backlog_rows = sum(backlogs) if backlogs else None
        ages = [r.metrics.oldest_unsent_age for r in relays if r.metrics.oldest_unsent_age is not None]
        m.oldest_unsent_age = max(ages) if ages else None
        dead = [r.metrics.dead_letter_rows for r in relays if r.metrics.dead_letter_rows is not None]
        m.dead_letter_rows = max(dead) if dead else None

    def _shard_metrics(self) -> dict[int, Metrics]:
        return {index: relay.metrics for index, relay in list(self._relays.items())}

    def _close_endpoint(self) -> None:
        if self._prometheus is not None:
            server, _thread = self._prometheus
            server.shutdown()
            self._prometheus = None

    def __repr__(self) -> str:
        return f"ShardedHarvest(name={self.config.name!r}, shards={self.config.shards}, led={sorted(self._relays)})"
