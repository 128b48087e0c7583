"""Leadership per shard (``shards: S``): which of the outbox's shards this relay process leads.

A :class:`ShardElection` decides, for the whole process, which shards it leads; the sharded relay
(:mod:`producer.relay.sharded`) runs one relay loop over the led shards, and hands it a
:class:`ShardSetSeat`: the ordinary one-leader :class:`~producer.election.neli.LeaderElection` protocol,
where every change of the led set is a new leader view. So the loop is exactly the unsharded relay
(mark, send, purge or fenced commit), confined to the led shards' rows.

Two mechanisms, as for the unsharded relay:

- :class:`NeliShardElection` (``leaderElection: neli``): the leader topic has S partitions; a relay
  leads the shards whose partitions the consumer group assigns it. The ``cooperative-sticky``
  assignor spreads them evenly (at most ``ceil(S / relays)`` each) and moves only what must move
  when a relay joins or leaves. Each led partition gets NELI's heartbeat; a shard whose heartbeats
  stop coming back for ``heartbeatTimeout`` is fenced alone.
- :class:`~producer.election.sharded_postgres.PostgresShardElection` (``leaderElection: postgres``):
  one advisory lock per shard, plus one membership lock per relay, on one connection per relay.

Listener contract (both): ``on_shards_acquired(ks)`` and ``on_shards_lost(ks, why)`` run synchronously
on the thread calling :meth:`ShardElection.pulse` (or ``close``), with every shard one event moves
(one rebalance, one check); ``on_shards_lost`` returns only after the relay loop stopped publishing
those shards' rows, and only then is the shard released to other relays
(NELI: the rebalance callback returns; Postgres: the lock is unlocked). A lost shard of a fenced relay
is not released by it, but the other relays may already lead it: as for the unsharded relay, the
``--uuid-sequencing`` fence (per shard) refuses the zombie's commit.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from harvest_outbox.producer.election.neli import (
    ElectionListener,
    access_denied,
    consume_heartbeats,
    ensure_topic,
    neli_clients,
)
from harvest_outbox.producer.errors import ElectionError
from harvest_outbox.producer.kafka import is_access_denied, logged_admin, serve_logs
from harvest_outbox.producer.kafka.client_settings import for_consumer

log = logging.getLogger(__name__)


class ShardListener(Protocol):
    def on_shards_acquired(self, indices: frozenset[int]) -> None: ...

    def on_shards_lost(self, indices: frozenset[int], why: str) -> None: ...


class ShardElection(Protocol):
    @property
    def led(self) -> frozenset[int]: ...

    def start(self, listener: ShardListener) -> None: ...

    def pulse(self) -> None:
        """Keep the membership alive and report changes; cheap when called more often than needed."""
        ...

    def close(self) -> None:
        """Report every led shard lost ("stopping"), then leave (its shards move to the other relays)."""
        ...


def fair_share(shards: int, relays: int) -> int:
    """The most shards one of ``relays`` live relays leads once stable."""
    return math.ceil(shards / max(1, relays))


class ShardSetSeat:
    """The :class:`~producer.election.neli.LeaderElection` the sharded relay's one relay loop sees: the
    loop leads while the process leads at least one shard. :meth:`offer` (election side) changes the
    set; the loop's own ``pulse()`` turns a change into a new view: ``on_revoked`` (the loop drains
    and flushes everything of the old set), then the new set is applied, then ``on_acquired``.
    :meth:`wait_released` lets the election side wait until a shard is out of the applied set,
    i.e. drained, before it lets the shard go."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._offered: frozenset[int] = frozenset()
        self.applied: frozenset[int] = frozenset()  # the shards of the loop's current view
        self._leader = False
        self._closed = False
        self._cv = threading.Condition()
        self._listener: ElectionListener | None = None

    @property
    def is_leader(self) -> bool:
        return self._leader

    def offer(self, shards: frozenset[int]) -> None:
        with self._cv:
            self._offered = frozenset(shards)

    def start(self, listener: ElectionListener) -> None:
        self._listener = listener

    def pulse(self) -> bool:
        offered = self._offered
        if self._listener is None or offered == self.applied:
            return self._leader
        if self._leader:
            self._leader = False
            self._listener.on_revoked()
        with self._cv:
            self.applied = offered
            self._cv.notify_all()
        if offered:
            self._leader = True
            self._listener.on_acquired()
        return self._leader

    def wait_released(self, indices: frozenset[int], timeout: float) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: not (indices & self.applied) or self._closed, timeout)

    def close(self) -> None:
        if self._leader and self._listener is not None:
            self._leader = False
            self._listener.on_revoked()
        with self._cv:
            self.applied = frozenset()
            self._closed = True
            self._cv.notify_all()


class NeliShardElection:
    """NELI with one leader-topic partition per shard (module docstring)."""

    def __init__(
        self,
        base_kafka_config: dict[str, Any],
        leader_topic: str,
        leader_group_id: str,
        name: str,
        shards: int,
        heartbeat_timeout: float = 5.0,
        min_poll_interval: float = 0.1,
        poll_duration: float = 0.001,
        replication_factor: int = -1,
        stop: threading.Event | None = None,
    ) -> None:
        self._base = for_consumer(base_kafka_config)
        self.topic, self.group, self.name, self.shards = leader_topic, leader_group_id, name, shards
        self._stop = stop  # the relay's stop request: start() gives up waiting for Kafka once it is set
        self._heartbeat_timeout = heartbeat_timeout
        self._min_poll_interval = min_poll_interval
        self._poll_duration = poll_duration
        self._replication_factor = replication_factor
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._listener: ShardListener | None = None
        self._assigned: set[int] = set()
        self._leading: set[int] = set()
        self._last_received: dict[int, float] = {}
        self._next_poll = 0.0
        self._busy = 0.0  # seconds spent in listener callbacks since the last heartbeat check
        self._closed = False

    @property
    def led(self) -> frozenset[int]:
        return frozenset(self._leading)

    def start(self, listener: ShardListener) -> None:
        self._listener = listener
        if not ensure_topic(self._base, self.topic, self.shards, self._replication_factor, stop=self._stop):
            return  # stopped while Kafka did not answer: no clients, nothing to leave
        self._check_partitions()
        try:
            self._consumer, self._producer = neli_clients(
                self._base, self.topic, self.group, self.name, self._heartbeat_timeout, self._on_assign, self._on_revoke
            )
        except KafkaException as exc:
            self.close()
            raise ElectionError(f"cannot start shard leader election on {self.topic!r}: {exc.args[0].str()}") from exc

    def _check_partitions(self) -> None:
        admin = logged_admin(self._base)
        try:
            md = admin.list_topics(self.topic, timeout=30)
        except KafkaException as exc:
            raise ElectionError(f"cannot look up leader topic {self.topic!r}: {exc.args[0].str()}") from exc
        finally:
            serve_logs(admin)  # its librdkafka lines, through logging
        found = len(md.topics[self.topic].partitions) if self.topic in md.topics else 0
        if found != self.shards:
            raise ElectionError(
                f"leaderTopic {self.topic!r} has {found} partition(s) but shards: {self.shards} needs one per shard: "
                f"relays with another shard count may be using it. Fix: give this sharding a leader topic of its own "
                f"(leaderTopic), or, when no relay uses {self.topic!r}, delete it so it is created with "
                f"{self.shards} partitions"
            )

    # -- rebalance callbacks (inside consumer.consume / close, on the pulsing thread) --
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        now = time.monotonic()
        new = {p.partition for p in partitions if p.topic == self.topic} - self._assigned
        for p in new:
            self._assigned.add(p)
            self._last_received[p] = now
        if new:
            self._next_poll = 0.0  # heartbeat at once
            self._acquire(new)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        gone = {p.partition for p in partitions if p.topic == self.topic} & self._assigned
        self._assigned -= gone
        self._lose(gone, "revoked")

    def _acquire(self, indices: set[int]) -> None:
        new = frozenset(k for k in indices if k not in self._leading and k < self.shards)
        if not new:
            return
        self._leading |= new
        log.info(
            "%s: leads shard(s) %s of %d (partitions of %r)",
            self.name,
            ",".join(map(str, sorted(new))),
            self.shards,
            self.topic,
        )
        if self._listener is not None:
            started = time.monotonic()
            self._listener.on_shards_acquired(new)
            self._busy += time.monotonic() - started

    def _lose(self, indices: set[int], why: str) -> None:
        gone = frozenset(indices) & self._leading
        if not gone:
            return
        self._leading -= gone
        log.info(
            "%s: no longer leads shard(s) %s of %d (%s)", self.name, ",".join(map(str, sorted(gone))), self.shards, why
        )
        if self._listener is not None:
            started = time.monotonic()
            self._listener.on_shards_lost(gone, why)
            self._busy += time.monotonic() - started

    def pulse(self) -> None:
        now = time.monotonic()
        if now < self._next_poll or self._consumer is None or self._closed:
            return
        self._next_poll = now + self._min_poll_interval
        # Time this thread spent in our own callbacks (the relay loop draining a lost shard) sent no
        # heartbeat, so it says nothing about the broker: it does not count against any shard. A
        # paused process gets no such allowance: resumed, it fences at once.
        busy, self._busy = self._busy, 0.0
        if busy:
            for p in self._last_received:
                self._last_received[p] += busy
        received = consume_heartbeats(
            self._consumer,
            256,
            self._poll_duration,
            "shard leader election",
            log,
            lambda err: access_denied(err, self._base, self.topic, self.group, "READ"),
        )
        now = time.monotonic()
        resumed, fenced = set(), set()
        for p in sorted(self._assigned):
            if p in received:
                self._last_received[p] = now
                if p not in self._leading:
                    resumed.add(p)
            elif p in self._leading and now - self._last_received.get(p, now) > self._heartbeat_timeout:
                fenced.add(p)
        if fenced:
            log.warning(
                "%s: no heartbeat on shard(s) %s for more than %gs: fenced",
                self.name,
                ",".join(map(str, sorted(fenced))),
                self._heartbeat_timeout,
            )
            self._lose(fenced, "fenced")
        if resumed:
            log.info(
                "%s: heartbeats of shard(s) %s received again: resuming", self.name, ",".join(map(str, sorted(resumed)))
            )
            self._acquire(resumed)
        assert self._producer is not None
        for p in sorted(self._assigned):
            try:
                self._producer.produce(self.topic, f"{time.time_ns()}%{self.name}".encode(), partition=p)
            except KafkaException as exc:
                if is_access_denied(exc.args[0]):
                    raise access_denied(exc.args[0], self._base, self.topic, self.group, "WRITE") from exc
                log.warning("shard %d heartbeat not sent: %s", p, exc)
            except BufferError as exc:
                log.warning("shard %d heartbeat not sent: %s", p, exc)
        self._producer.poll(0)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Drain every shard before leaving the group: the partitions move only after this returns.
        self._lose(set(self._leading), "stopping")
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception as exc:  # closing: report and carry on
                log.warning("closing shard leader election consumer: %s", exc)
        self._assigned.clear()
        self._consumer = None
        if self._producer is not None:
            self._producer.flush(1.0)
            self._producer = None
