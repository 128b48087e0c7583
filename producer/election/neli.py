"""Leader election: a narrow interface, and NELI (goneli's 'fast' variant) as its Kafka implementation.

:class:`LeaderElection` is all the relay sees: ``start(listener)``, a cheap ``pulse()`` called from
the relay loop as often as it likes, ``is_leader`` and ``close()``. Listener callbacks
(``on_acquired`` / ``on_revoked`` / ``on_fenced``) run synchronously inside ``pulse()`` or
``close()``, on the relay's thread, so the relay needs no locks. Another mechanism only has to
implement this protocol: :mod:`producer.election.postgres` does, with a Postgres advisory lock
(``leaderElection: postgres``).

NELI as goneli does it:
- a consumer in group ``leaderGroupID`` subscribes to ``leaderTopic``; whoever is assigned
  partition 0 is the leader (the topic is created with one partition if missing);
- every ``minPollInterval`` the leader produces a heartbeat to partition 0 and consumes what came
  back; if nothing has come back for ``heartbeatTimeout`` it is *fenced* (it stops acting as
  leader, as the broker may no longer see it) and resumes when heartbeats return;
- ``session.timeout.ms`` = 3 × heartbeat timeout, so a dead leader's partition moves after that
  (:func:`neli_consumer_config`; the config bounds heartbeatTimeout to 2s-10m so the session stays
  within the brokers' default ``group.min/max.session.timeout.ms`` of 6 s / 30 min).

Differences from goneli, on purpose: the ``cooperative-sticky`` assignor, so a standby joining
does not make the leader give up and re-acquire partition 0; ``on_lost`` treated as revocation.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from harvest_outbox.producer.errors import ElectionError
from harvest_outbox.producer.kafka import is_access_denied, logged, logged_admin, serve_logs
from harvest_outbox.producer.kafka.client_settings import for_admin, for_consumer
from harvest_outbox.redact import redact_kafka_config

log = logging.getLogger(__name__)


class ElectionListener(Protocol):
    def on_acquired(self) -> None: ...

    def on_revoked(self) -> None: ...

    def on_fenced(self) -> None: ...


class LeaderElection(Protocol):
    @property
    def is_leader(self) -> bool: ...

    def start(self, listener: ElectionListener) -> None: ...

    def pulse(self) -> bool:
        """Keep the membership alive; cheap when called more often than needed. Returns is_leader."""
        ...

    def close(self) -> None: ...


class StaticElection:
    """Always leader (single relay, tests). Not safe with more than one relay per outbox."""

    def __init__(self) -> None:
        self._leader = False
        self._listener: ElectionListener | None = None

    @property
    def is_leader(self) -> bool:
        return self._leader

    def start(self, listener: ElectionListener) -> None:
        self._listener = listener

    def pulse(self) -> bool:
        if not self._leader and self._listener is not None:
            self._leader = True
            self._listener.on_acquired()
        return self._leader

    def close(self) -> None:
        if self._leader and self._listener is not None:
            self._leader = False
            self._listener.on_revoked()


# Properties that only make sense for one client type; dropped from the other to keep librdkafka quiet.


#: Seconds of each metadata request while a relay that may be stopped looks up its leader topic: a
#: stop request is seen between two, so a relay whose Kafka does not answer still stops promptly.
_LOOKUP_SLICE = 0.25
_NO_ANSWER_YET = (KafkaError._TRANSPORT, KafkaError._TIMED_OUT)


def ensure_topic(
    base: dict[str, Any],
    topic: str,
    partitions: int = 1,
    replication_factor: int = -1,
    timeout: float = 30.0,
    stop: threading.Event | None = None,
) -> bool:
    """Create ``topic`` unless it exists (auto-creation is often off on real clusters). False when
    ``stop`` was set before Kafka answered: nothing was looked up or created."""
    admin = logged_admin(for_admin(base))
    try:
        return _ensure_topic(admin, base, topic, partitions, replication_factor, timeout, stop)
    finally:
        serve_logs(admin)  # its last lines, before the client goes


def _ensure_topic(
    admin: AdminClient,
    base: dict[str, Any],
    topic: str,
    partitions: int,
    replication_factor: int,
    timeout: float,
    stop: threading.Event | None,
) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if stop is not None and stop.is_set():
            return False
        left = deadline - time.monotonic()
        try:
            md = admin.list_topics(timeout=max(0.001, left if stop is None else min(left, _LOOKUP_SLICE)))
            break
        except KafkaException as exc:
            if exc.args[0].code() in _NO_ANSWER_YET and time.monotonic() < deadline:
                continue  # the slice ended without an answer (librdkafka waits out the timeout)
            raise ElectionError(
                f"cannot reach Kafka at {base.get('bootstrap.servers')!r} to look up leader topic "
                f"{topic!r}: {exc.args[0].str()}"
            ) from exc
    if topic in md.topics and md.topics[topic].error is None:
        return True
    futures = admin.create_topics([NewTopic(topic, partitions, replication_factor)], request_timeout=timeout)
    try:
        futures[topic].result(timeout)
        log.info("created leader topic %r", topic)
    except KafkaException as exc:
        if is_access_denied(exc.args[0]):
            # Not visible in the metadata and not creatable: no READ on it (which implies DESCRIBE), or missing.
            raise ElectionError(
                f"leader topic {topic!r} is not visible to the relay's principal and it may not create it "
                f"({exc.args[0].name()}): {access_denied(exc.args[0], base, topic, '', 'READ')}; or, if the topic "
                f"does not exist, create it (one partition; S with shards: S)"
            ) from exc
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise ElectionError(
                f"cannot create leader topic {topic!r}: {exc.args[0].str()}; create it with one "
                f"partition or grant CREATE on the cluster"
            ) from exc
    return True


#: librdkafka's default max.poll.interval.ms; it must be >= session.timeout.ms.
_DEFAULT_MAX_POLL_INTERVAL_MS = 300_000


def neli_consumer_config(base: dict[str, Any], group: str, name: str, heartbeat_timeout: float) -> dict[str, Any]:
    """The election consumer's properties: ``session.timeout.ms`` = 3 x heartbeatTimeout (the config
    keeps it within the brokers' default 6 s .. 30 min), and ``max.poll.interval.ms`` raised to at least
    that, which librdkafka requires (the election polls every ``minPollInterval``, far more often)."""
    session_ms = int(heartbeat_timeout * 3000)
    max_poll_ms = max(int(base.get("max.poll.interval.ms", _DEFAULT_MAX_POLL_INTERVAL_MS)), session_ms)
    return {
        **for_consumer(base),
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "latest",
        "session.timeout.ms": session_ms,
        "max.poll.interval.ms": max_poll_ms,
        "partition.assignment.strategy": "cooperative-sticky",
        "client.id": f"harvest-neli-{name}",
    }


def neli_clients(
    base: dict[str, Any], topic: str, group: str, name: str, heartbeat_timeout: float, on_assign: Any, on_revoke: Any
) -> tuple[Consumer, Producer]:
    """A NELI election's consumer (subscribed to ``topic``; ``on_lost`` counts as a revocation) and its
    heartbeat producer (heartbeats older than ``heartbeat_timeout`` are worthless). Raises KafkaException."""
    consumer_conf = logged(neli_consumer_config(base, group, name, heartbeat_timeout))
    producer_conf = logged(
        {
            **base,
            "delivery.timeout.ms": max(int(heartbeat_timeout * 1000), 1),
            "linger.ms": 0,
            "client.id": f"harvest-neli-{name}",
        }
    )
    log.debug("NELI consumer config %s", redact_kafka_config(consumer_conf))
    consumer = Consumer(consumer_conf)
    try:
        consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
        return consumer, Producer(producer_conf)
    except BaseException:
        consumer.close()
        raise


def access_denied(err: KafkaError, base: dict[str, Any], topic: str, group: str, operation: str) -> ElectionError:
    """The :class:`ElectionError` for an authorization error of a NELI election's client: the ACL it lacks
    (READ on the group for GROUP_AUTHORIZATION_FAILED; ``operation`` on the leader ``topic`` otherwise),
    named with its principal and the command granting it. The relay stops on it: no row is touched."""
    from harvest_outbox.producer.kafka.acls import Acl
    from harvest_outbox.producer.kafka.security_errors import missing_acl, principal_of

    who = principal_of(base)
    if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
        acl = Acl("relay", who, "GROUP", group, "LITERAL", "READ", "NELI's consumer joins the leader group")
    elif operation == "WRITE":
        acl = Acl("relay", who, "TOPIC", topic, "LITERAL", "WRITE", "NELI's leader writes its heartbeats to it")
    else:
        acl = Acl(
            "relay", who, "TOPIC", topic, "LITERAL", "READ", "NELI's consumer reads the leader topic's heartbeats"
        )
    return ElectionError(f"leader election refused by Kafka: {missing_acl(acl, err.name())}")


def consume_heartbeats(
    consumer: Consumer,
    batch: int,
    timeout: float,
    what: str,
    logger: logging.Logger,
    denied: Callable[[KafkaError], ElectionError] | None = None,
) -> set[int]:
    """Drain the heartbeats waiting for a NELI election's consumer (unsharded and sharded alike): the
    partitions a heartbeat arrived on. A fatal error raises :class:`ElectionError` naming ``what``
    election, and so does an authorization error (``denied(err)``: the missing ACL); the others are logged
    on ``logger`` (the election's own)."""
    received: set[int] = set()
    try:
        while True:
            msgs = consumer.consume(num_messages=batch, timeout=timeout)
            if not msgs:
                break
            for m in msgs:
                err = m.error()
                if err is None:
                    partition = m.partition()
                    if partition is not None:  # always set on a consumed message
                        received.add(partition)
                elif err.fatal():
                    raise ElectionError(f"fatal Kafka error in {what}: {err.str()}")
                elif denied is not None and is_access_denied(err):
                    raise denied(err)
                elif err.code() != KafkaError._PARTITION_EOF:
                    logger.warning("%s consumer: %s", what, err.str())
    except KafkaException as exc:
        if denied is not None and is_access_denied(exc.args[0]):
            raise denied(exc.args[0]) from exc
        raise ElectionError(f"{what} poll failed: {exc.args[0].str()}") from exc
    return received


class NeliElection:
    """NELI over Kafka (see module docstring)."""

    def __init__(
        self,
        base_kafka_config: dict[str, Any],
        leader_topic: str,
        leader_group_id: str,
        name: str,
        heartbeat_timeout: float = 5.0,
        min_poll_interval: float = 0.1,
        poll_duration: float = 0.001,
        replication_factor: int = -1,
        stop: threading.Event | None = None,
    ) -> None:
        """``stop``: the relay's stop request; ``start()`` gives up waiting for Kafka once it is set."""
        self._base = for_consumer(base_kafka_config)
        self.topic, self.group, self.name = leader_topic, leader_group_id, name
        self._stop = stop
        self._heartbeat_timeout = heartbeat_timeout
        self._min_poll_interval = min_poll_interval
        self._poll_duration = poll_duration
        self._replication_factor = replication_factor
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._listener: ElectionListener | None = None
        self._assigned = False
        self._leader = False
        self._last_received = 0.0
        self._next_poll = 0.0
        self._closed = False

    @property
    def is_leader(self) -> bool:
        return self._leader

    def start(self, listener: ElectionListener) -> None:
        self._listener = listener
        if not ensure_topic(self._base, self.topic, 1, self._replication_factor, stop=self._stop):
            return  # stopped while Kafka did not answer: no clients, nothing to leave
        try:
            self._consumer, self._producer = neli_clients(
                self._base, self.topic, self.group, self.name, self._heartbeat_timeout, self._on_assign, self._on_revoke
            )
        except KafkaException as exc:
            self.close()
            raise ElectionError(f"cannot start leader election on {self.topic!r}: {exc.args[0].str()}") from exc

    # -- rebalance callbacks (run inside consumer.consume / close, on the relay thread) --
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if any(p.partition == 0 and p.topic == self.topic for p in partitions):
            log.info("%s: assigned partition 0 of %r: leader", self.name, self.topic)
            self._assigned = True
            self._leader = True
            self._last_received = time.monotonic()
            self._next_poll = 0.0  # heartbeat at once
            if self._listener:
                self._listener.on_acquired()

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if any(p.partition == 0 and p.topic == self.topic for p in partitions) and self._assigned:
            log.info("%s: partition 0 of %r revoked: no longer leader", self.name, self.topic)
            was_leader = self._leader
            self._assigned = False
            self._leader = False
            if self._listener and was_leader:
                self._listener.on_revoked()

    def pulse(self) -> bool:
        now = time.monotonic()
        if now < self._next_poll or self._consumer is None or self._closed:
            return self._leader
        self._next_poll = now + self._min_poll_interval
        received = bool(
            consume_heartbeats(self._consumer, 64, self._poll_duration, "leader election", log, self._denied_read)
        )
        if self._assigned:
            if received:
                self._last_received = time.monotonic()
                if not self._leader:
                    log.info("%s: heartbeat received again: resuming leadership", self.name)
                    self._leader = True
                    if self._listener:
                        self._listener.on_acquired()
            elif self._leader and time.monotonic() - self._last_received > self._heartbeat_timeout:
                log.warning("%s: no heartbeat for %.1fs: fenced", self.name, time.monotonic() - self._last_received)
                self._leader = False
                if self._listener:
                    self._listener.on_fenced()
            assert self._producer is not None
            try:
                self._producer.produce(self.topic, f"{time.time_ns()}%{self.name}".encode(), partition=0)
            except KafkaException as exc:
                if is_access_denied(exc.args[0]):
                    raise access_denied(exc.args[0], self._base, self.topic, self.group, "WRITE") from exc
                log.warning("heartbeat not sent: %s", exc)
            except BufferError as exc:
                log.warning("heartbeat not sent: %s", exc)
        if self._producer is not None:
            self._producer.poll(0)
        return self._leader

    def _denied_read(self, err: KafkaError) -> ElectionError:
        return access_denied(err, self._base, self.topic, self.group, "READ")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._consumer is not None:
            try:
                self._consumer.close()  # leaves the group: a standby is assigned partition 0 at once
            except Exception as exc:  # closing: report and carry on
                log.warning("closing leader election consumer: %s", exc)
        if self._assigned or self._leader:
            self._assigned = False
            if self._leader:
                self._leader = False
                if self._listener:
                    self._listener.on_revoked()
        if self._producer is not None:
            self._producer.flush(1.0)
