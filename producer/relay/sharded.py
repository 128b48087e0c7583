"""The sharded relay (``shards: S`` > 1): one outbox published by many relays at once.

Rows are split into S shards by a hash of ``kafka_key`` (:mod:`producer.relay.shards`), so each key
lives in one shard. A :class:`ShardedHarvest` process takes part in a per-shard leader election
(:mod:`producer.election.sharded_neli`: NELI with an S-partition leader topic, or one Postgres advisory lock
per shard) and runs ONE ordinary relay loop (:class:`~producer.harvest.Harvest`, in either delivery
mode) over the shards it leads: its marks read only those shards' rows, its
metrics are theirs, and in exactly-once mode its view fences exactly their fence rows. Every change
of the led set is a new leader view: the loop drains and flushes (or commits) everything of the old
set, then marks anew. Everything the unsharded relay guarantees therefore holds per shard: per-key
order (a key never changes shard), deletion only after delivery, and in exactly-once mode a fence
per shard — a view's commit is refused as soon as any of its shards has a newer view — with ACK
intents recovered by whichever view next leads one of their shards.

Why one loop over the led shards rather than a loop per shard: a loop per shard means a Kafka
producer, three connections and a thread per shard, and the one-in-flight-per-key pipelines of
several loops in one process each send smaller batches to the broker; measured with 8 shards in one
process, that cost 3x the CPU per row and a fraction of one loop's rate (docs/sharding.md).
One loop per process costs what the unsharded relay costs, whatever S is; a rebalance costs one
drain of that relay's in-flight records (milliseconds), and the process's producer and connections
stay open across rebalances (a standby with no shards is ready the moment it is given one).

Invariants (``tests/test_producer/relay/test_shards.py``, ``test_sharded_failover.py``):
- the loop publishes rows of a shard only while this process leads it; ``on_shards_lost`` returns
  (NELI: the rebalance callback returns; Postgres: the lock is unlocked) only after the loop's view
  without that shard started, i.e. after its records were drained;
- a fatal error of the loop stops the whole relay (``wait()`` re-raises it), as unsharded.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from harvest_outbox.producer.config import HarvestConfig
from harvest_outbox.producer.election.sharded_neli import NeliShardElection, ShardElection, ShardSetSeat
from harvest_outbox.producer.errors import HarvestError
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.kafka import ProducerFactory
from harvest_outbox.producer.observe.metrics import Metrics, start_prometheus
from harvest_outbox.producer.relay.events import EventHandler
from harvest_outbox.producer.relay.lifecycle import RelayLifecycle, State
from harvest_outbox.producer.schema import OutboxNames

log = logging.getLogger(__name__)


def _make_shard_election(config: HarvestConfig, stop: threading.Event | None = None) -> ShardElection:
    if config.leader_election == "postgres":
        from harvest_outbox.producer.election.sharded_postgres import PostgresShardElection

        return PostgresShardElection(
            config.data_source,
            config.outbox_table,
            config.name,
            config.shards,
            check_interval=config.leader_lock_check_interval,
        )
    return NeliShardElection(
        dict(config.base_kafka_config),
        config.leader_topic,
        config.leader_group_id,
        config.name,
        config.shards,
        heartbeat_timeout=config.limits.heartbeat_timeout,
        min_poll_interval=config.limits.min_poll_interval,
        poll_duration=config.limits.poll_duration,
        replication_factor=config.leader_topic_replication_factor,
        stop=stop,
    )


def relay_for(
    config: HarvestConfig, event_handler: EventHandler | None = None, **kwargs: Any
) -> Harvest | ShardedHarvest:
    """The relay a config asks for: sharded when ``shards`` > 1, else the one-leader relay."""
    if config.shards > 1:
        return ShardedHarvest(config, event_handler, **kwargs)
    return Harvest(config, event_handler, **kwargs)


class ShardedHarvest(RelayLifecycle):
    """``ShardedHarvest(config).start()``; ``stop()``; ``wait()`` (re-raises a fatal error). The same
    lifecycle (:class:`~producer.relay.lifecycle.RelayLifecycle`, which both share) and metrics as
    :class:`~producer.harvest.Harvest`; :attr:`led_shards` shows which shards its relay loop serves."""

    _log = log
    _THREAD_PREFIX = "harvest-shards"

    def __init__(
        self,
        config: HarvestConfig,
        event_handler: EventHandler | None = None,
        *,
        producer_factory: ProducerFactory | None = None,
        election: ShardElection | None = None,
        tracer_provider: Any = None,
    ) -> None:
        if config.shards < 2:
            raise HarvestError(f"ShardedHarvest needs shards >= 2, got {config.shards}; use Harvest")
        self.config = config
        self.limits = config.limits
        self.names = OutboxNames.parse(config.outbox_table, config.table_mapping)
        self._init_lifecycle()
        self._election = election or _make_shard_election(config, self._stop_requested)
        self._seat = ShardSetSeat(config.shards)
        #: The relay loop (its ``metrics`` are this relay's).
        self.relay = Harvest(
            config.replace(prometheus_port=None),
            event_handler,
            producer_factory=producer_factory,
            shards=self._seat,
            tracer_provider=tracer_provider,  # relay spans (producer.relay.spans)
        )
        self.metrics: Metrics = self.relay.metrics

    # ------------------------------------------------------------------ public API
    @property
    def is_leader(self) -> bool:
        """True while the relay loop serves at least one shard."""
        return self.relay.is_leader

    @property
    def leader_id(self) -> uuid.UUID | None:
        return self.relay.leader_id

    @property
    def led_shards(self) -> frozenset[int]:
        """The shards of the relay loop's current view."""
        return self._seat.applied if self.relay.is_leader else frozenset()

    # ------------------------------------------------------------------ lifecycle steps
    def _open(self) -> None:
        self.relay.start()  # fails fast: connection, schema, shard index, Kafka
        if self.config.prometheus_port is not None:
            self._prometheus = start_prometheus(
                self.metrics,
                self.config.name,
                self.config.prometheus_port,
                self.config.prometheus_bind_address,
                relay=self,
                shards=self.shard_metrics,
                basic_auth=self.config.prometheus_basic_auth,
            )
        self._election.start(self)

    def _log_started(self) -> None:
        log.info(
            "relay %s started on %s with %d shards (leader election: %s)",
            self.config.name,
            self.names.display,
            self.config.shards,
            self.config.leader_election,
        )

    def _abandon_start(self) -> None:
        self.relay.stop()
        try:
            self.relay.wait(30)
        except HarvestError:
            pass
        self._close_endpoint()
        self._state = State.STOPPED

    # ------------------------------------------------------------------ shard listener
    # The election updates its led set before it calls these; the loop's view follows that set.
    def on_shards_acquired(self, indices: frozenset[int]) -> None:
        self._seat.offer(self._election.led)

    def on_shards_lost(self, indices: frozenset[int], why: str) -> None:
        """Returns once the relay loop's view no longer includes the shards (their records drained)."""
        self._seat.offer(self._election.led)
        bound = (self.limits.max_poll_interval or self.limits.row_timeout) + self.limits.queue_timeout
        if self.relay.state is not State.RUNNING:
            return  # the loop is gone (stopping or failed): it publishes nothing more
        if not self._seat.wait_released(indices, bound):
            log.error(
                "%s: the relay loop did not let shard(s) %s go within %.0fs; releasing them anyway",
                self.config.name,
                sorted(indices),
                bound,
            )

    # ------------------------------------------------------------------ supervisor loop
    def _loop(self) -> None:
        while not self._stop_requested.is_set():
            self._election.pulse()
            if self.relay.state is State.STOPPED:  # the loop died on its own: a fatal error
                self.relay.wait(0)
                raise HarvestError("relay loop stopped")
            self._stop_requested.wait(min(0.02, self.limits.min_poll_interval))

    def _fatal(self, exc: BaseException) -> BaseException:
        return exc.__cause__ if isinstance(exc, HarvestError) and exc.__cause__ else exc

    def _close(self) -> None:
        """The loop drains every shard, then the shards are released to the other relays."""
        try:
            self._election.close()
        except Exception:
            log.exception("closing the shard election")
        self.relay.stop()
        try:
            self.relay.wait(self.limits.queue_timeout + 30)
        except HarvestError as exc:
            if self._error is None:
                self._error = exc.__cause__ or exc
        self._close_endpoint()

    def shard_metrics(self) -> dict[int, Any]:
        backlog = dict(self.metrics.shard_backlog)
        return {k: backlog.get(k, (None, None)) for k in sorted(self.led_shards)}

    def _close_endpoint(self) -> None:
        if self._prometheus is not None:
            server, _thread = self._prometheus
            server.shutdown()
            self._prometheus = None

    def __repr__(self) -> str:
        return f"ShardedHarvest(name={self.config.name!r}, shards={self.config.shards}, led={sorted(self.led_shards)})"
