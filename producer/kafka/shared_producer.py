"""One Kafka producer per process for a fleet's at-least-once outboxes, not one per relay (issue #48).

A relay owns its producer: it produces, polls it for delivery reports (a global ``on_delivery``), flushes it
when it gives up leadership and, when a drain is abandoned or the producer hit a fatal error, drops it and
makes another. Ten relays of a fleet each sent a tenth of the rows with a producer of their own: ten
librdkafka instances (threads, broker connections, idle wake-ups) and batches a tenth the size, which cost
CPU per row. :class:`SharedProducers` gives every at-least-once relay of a process that reaches Kafka with
the same settings a :class:`ProducerLane` over one confluent-kafka producer. A lane behaves, for its relay,
as the producer it had: ``produce``, ``poll`` (its own delivery reports, on its own thread), ``flush`` (its
own records), ``len`` (its own records not yet reported) and ``purge``.

Off by default (``fleet.sharedProducer``): relays that share a producer share its connection to each broker
and its few requests in flight, so one outbox's burst holds up another's trickle (measured: docs/fleet.md).

Why only at-least-once: a ``--uuid-sequencing`` relay's producer belongs to one view (its idempotent
producer id and the sequence of its transactions' records fence a zombie's; see docs/design.md), so sequenced
outboxes keep a producer each.

Invariants (tests/test_producer/kafka/test_shared_producer.py):
- a lane's relay sees each of its own delivery reports once and no other's, on the thread that polls the
  lane: each record carries its lane's router (a per-message ``on_delivery``); a report served by another
  thread polling the shared producer is only appended to its lane's queue, one served by the lane's own
  thread goes to its relay at once when none waits in the queue (the common case of a busy relay, which
  polls for its own reports), else behind them;
- ``len(lane)`` counts the lane's records produced and not yet served to its relay; ``flush`` waits for those
  only, and returns how many are left;
- ``purge`` cannot take one relay's records out of a producer others use: it takes none out, and cuts the lane
  off its relay. A relay purges when it abandons a drain, and abandons the producer with it
  (``RelayCore.abandon_producer``): its next lane is new, and the old lane's late reports reach no relay, even
  when the relay's own thread serves them through its new lane (a late report handed to the relay could free a
  key, or purge a row, of its new view); the old lane's queued records are still sent (duplicates,
  which at-least-once allows; per key the first arrivals stay in id order, since the new view sends a key's
  records after the old copies in librdkafka's partition queue) or time out;
- equal settings share one producer, others get their own (a ``client.id`` the user set is a setting, a
  relay's default one is not); a producer that reported a fatal error tells
  every lane's relay (its ``error_cb``) and is used by no new lane;
- :meth:`SharedProducers.close` flushes each producer, bounded.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from harvest_outbox.producer.kafka._producer import ANY_PARTITION, DeliveryCallback

log = logging.getLogger(__name__)

#: Settings a relay gives its producer that are its own, not the producer's: left out when deciding which
#: relays share one. ``error_cb`` is the relay's and reaches it through its lane.
_PER_RELAY = frozenset({"error_cb", "on_delivery"})
#: The longest a lane's ``poll(timeout)`` waits inside the shared producer at once: another thread may serve
#: the lane's report meanwhile, and the lane looks at its queue between slices.
_SLICE = 0.001
Make = Callable[[dict[str, Any]], Any]
#: ``queue.buffering.max.messages`` of a shared producer unless set: librdkafka's default (100,000) bounded one
#: relay's records, and a record that finds the queue full waits (``BufferError``: the relay retries for ~10 s,
#: then re-marks). Each relay still bounds its own records in flight (``maxInFlightRecords``); this bounds
#: their sum, so that ten outboxes draining at once do not wait for each other's room.
SHARED_QUEUE_MESSAGES = 1_000_000


class ProducerLane:
    """A relay's view of a shared producer (see module doc): its records, its reports, its relay's errors."""

    def __init__(self, shared: _Shared, on_delivery: DeliveryCallback, error_cb: Callable[[KafkaError], None] | None):
        self._real = shared.producer
        self._produce = shared.producer.produce
        self._on_delivery = on_delivery
        self.error_cb = error_cb
        reports: deque[tuple[KafkaError | None, Message]] = deque()
        self._reports = reports
        self._held = 0
        #: The thread that polls this lane (its relay's): a report served there, none queued before it, goes to
        #: the relay at once; one served by another thread waits in the queue (deque.append is atomic). None
        #: once the relay purged the lane (:meth:`purge`): its reports then reach nobody.
        self._owner: int | None = threading.get_ident()
        queue, here = reports.append, threading.get_ident

        def route(err: KafkaError | None, msg: Message) -> None:
            owner = self._owner
            if owner is None:
                return  # a purged lane's late report: its relay has left the view it belonged to
            if not reports and here() == owner:
                self._held -= 1
                on_delivery(err, msg)
            else:
                queue((err, msg))

        self._route = route

    def produce(
        self, topic: str, value: bytes | None = None, key: bytes | None = None, *args: Any, **kwargs: Any
    ) -> None:
        # The relay's hottest call: the bound method and the router were looked up once, in __init__.
        if args or kwargs:
            if len(args) > 1:  # callback / on_delivery by position: the lane routes reports itself
                raise TypeError("a shared producer's lane takes produce() arguments after partition by name")
            self._produce(topic, value, key, *args, on_delivery=self._route, **kwargs)
        else:  # by position: confluent-kafka matches keyword arguments by name at every call
            self._produce(topic, value, key, ANY_PARTITION, self._route)
        self._held += 1

    def poll(self, timeout: float = 0) -> int:
        """Serve this lane's delivery reports to its relay; wait up to ``timeout`` seconds for one."""
        reports, real, held = self._reports, self._real, self._held
        if self._owner is None:
            reports.clear()  # purged: nothing reaches the relay any more
            real.poll(0)
            return 0
        self._owner = threading.get_ident()
        real.poll(0)
        if not reports and timeout > 0:
            deadline = time.monotonic() + timeout
            while not reports:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                real.poll(min(left, _SLICE))
        served = 0
        on_delivery, take = self._on_delivery, reports.popleft
        try:
            while reports:
                err, msg = take()
                served += 1
                on_delivery(err, msg)
        finally:
            self._held -= served
        return held - self._held

    def flush(self, timeout: float = -1) -> int:
        """Wait until this lane's records are reported (``timeout`` < 0: however long); how many are left."""
        deadline = None if timeout < 0 else time.monotonic() + timeout
        while self._held:
            left = 0.01 if deadline is None else min(0.01, deadline - time.monotonic())
            if left <= 0:
                break
            self.poll(left)
        return self._held

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        """Take nothing out of the producer's queues (they hold other relays' records too), but cut the lane off
        its relay: no report of its records reaches the relay from now on, whichever thread serves it. A relay
        purges when it abandons a drain, and drops the producer with it (module doc)."""
        self._owner = None
        self._reports.clear()

    def __len__(self) -> int:
        return self._held


class _Shared:
    """One producer and the lanes over it; made by ``make`` with ``settings``, and its ``error_cb``."""

    def __init__(self, make: Make, settings: dict[str, Any]) -> None:
        self.fatal = False
        self.lanes: weakref.WeakSet[ProducerLane] = weakref.WeakSet()
        self.producer = make({**settings, "error_cb": self.error})

    def error(self, err: KafkaError) -> None:
        """librdkafka's error for this producer: a fatal one reaches every lane's relay (each leaves its view and
        asks for a new producer, which no longer is this one)."""
        if not err.fatal():
            log.debug("shared Kafka producer: %s", err.str())  # librdkafka logs these itself
            return
        self.fatal = True
        for lane in list(self.lanes):
            if lane.error_cb is not None:
                lane.error_cb(err)


class SharedProducers:
    """A process's shared producers by their settings; :meth:`factory` is a relay's ``producer_factory``."""

    def __init__(self, client_id: str, make: Make = Producer) -> None:
        self._client_id = client_id
        self._make = make
        self._lock = threading.Lock()
        self._shared: dict[tuple[tuple[str, str], ...], _Shared] = {}

    def for_relay(self, name: str) -> Callable[[dict[str, Any], DeliveryCallback], ProducerLane]:
        """The ``producer_factory`` of the relay named ``name``: a ``client.id`` the user set is the producer's
        (Kafka's quotas go by it: only relays with the same one share), the relay's default (``harvest-<name>``)
        is not."""
        default = f"harvest-{name}"

        def factory(config: dict[str, Any], on_delivery: DeliveryCallback) -> ProducerLane:
            if config.get("client.id") == default:
                config = {k: v for k, v in config.items() if k != "client.id"}
            return self.factory(config, on_delivery)

        return factory

    def factory(self, config: dict[str, Any], on_delivery: DeliveryCallback) -> ProducerLane:
        """A lane for a relay whose producer would have had ``config`` and ``on_delivery`` (its ``client.id``
        included: :meth:`for_relay` leaves a relay's default out)."""
        settings = {k: v for k, v in config.items() if k not in _PER_RELAY}
        key = tuple(sorted((str(k), repr(v)) for k, v in settings.items()))
        with self._lock:
            shared = self._shared.get(key)
            if shared is None or shared.fatal:
                settings.setdefault("client.id", self._client_id)
                settings.setdefault("queue.buffering.max.messages", SHARED_QUEUE_MESSAGES)
                shared = self._shared[key] = _Shared(self._make, settings)
            lane = ProducerLane(shared, on_delivery, config.get("error_cb"))
            shared.lanes.add(lane)
        return lane

    def __len__(self) -> int:
        with self._lock:
            return len(self._shared)

    def close(self, timeout: float = 5.0) -> None:
        """Flush every producer (each within ``timeout``) and drop them."""
        with self._lock:
            shared, self._shared = list(self._shared.values()), {}
        for one in shared:
            left = one.producer.flush(timeout)
            if left:
                log.warning("%d record(s) of a shared Kafka producer were not delivered within %.1fs", left, timeout)
