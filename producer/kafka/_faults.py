"""A fault injector for tests: a :data:`~producer.kafka._producer.ProducerFactory` whose producers wrap *real*
ones and make ``produce()`` raise, or turn successful delivery reports into failures, at given rates.

The real broker still receives (some of) those records, which is exactly the duplicate-producing
situation at-least-once delivery must survive.

Invariant: with every rate 0 and no keys given, a producer made here behaves as the real one (each
call delegated, each delivery report passed on as it came).
"""

from __future__ import annotations

import functools
import os
import random
import signal
import threading
import time
from typing import Any

from confluent_kafka import KafkaError, Message

from harvest_outbox.producer.kafka._producer import (
    DeliveryCallback,
    KafkaProducer,
    ProducerFactory,
    confluent_producer,
    produce_args,
)


class FaultInjectingProducer:
    """Delegates to a real Producer, failing ``produce()`` / delivery reports at the given rates, and
    every delivery report of records whose key is in ``fail_keys`` (a row that can never be delivered)."""

    def __init__(
        self,
        real_factory: ProducerFactory,
        config: dict[str, Any],
        on_delivery: DeliveryCallback,
        produce_failure_rate: float,
        delivery_failure_rate: float,
        rng: random.Random,
        lock: threading.Lock,
        counters: dict[str, int],
        fail_keys: frozenset[bytes] = frozenset(),
        kill_at_produce: int = 0,
        stall_keys: frozenset[bytes] = frozenset(),
    ) -> None:
        self._rng, self._lock, self.counters = rng, lock, counters
        self._produce_rate, self._delivery_rate = produce_failure_rate, delivery_failure_rate
        self._fail_keys, self._kill_at = fail_keys, kill_at_produce
        self._stall_keys = stall_keys
        # librdkafka's delivery timeout: a stalled record is reported as timed out after it
        self._timeout = int(config.get("message.timeout.ms", config.get("delivery.timeout.ms", 300000))) / 1000
        self._stalled: list[tuple[float, _StalledMsg, DeliveryCallback]] = []
        self._on_delivery = on_delivery
        self._real = real_factory(config, self._deliver)

    def _roll(self, rate: float) -> bool:
        with self._lock:
            return self._rng.random() < rate

    def _inject(self, err: KafkaError | None, msg: Message) -> KafkaError | None:
        if err is None and (self._roll(self._delivery_rate) or (self._fail_keys and msg.key() in self._fail_keys)):
            self.counters["delivery"] += 1
            err = KafkaError(KafkaError._MSG_TIMED_OUT, "injected delivery failure", retriable=True)
        return err

    def _deliver(self, err: KafkaError | None, msg: Message) -> None:
        self._on_delivery(self._inject(err, msg), msg)

    def _deliver_to(self, callback: DeliveryCallback, err: KafkaError | None, msg: Message) -> None:
        callback(self._inject(err, msg), msg)

    def produce(
        self, topic: str, value: bytes | None = None, key: bytes | None = None, *args: Any, **kwargs: Any
    ) -> None:
        kwargs = produce_args(args, kwargs)  # by name from here on
        cb = kwargs.pop("callback", None) or kwargs.get("on_delivery")
        if cb is not None:  # a per-message callback (--uuid-sequencing) gets the same injected failures
            kwargs["on_delivery"] = functools.partial(self._deliver_to, cb)
        if self._kill_at and key in self._fail_keys:
            with self._lock:
                self.counters["fail_key_produces"] = self.counters.get("fail_key_produces", 0) + 1
                if self.counters["fail_key_produces"] >= self._kill_at:  # a crash loop on this row
                    os.kill(os.getpid(), signal.SIGKILL)
        if self._roll(self._produce_rate):
            from confluent_kafka import KafkaException

            self.counters["produce"] += 1
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "injected produce failure", retriable=True))
        if self._stall_keys and key in self._stall_keys:
            # A partition that never acknowledges this record: librdkafka would retry it until
            # its delivery timeout, then report it timed out. Nothing reaches the broker.
            self.counters["stalled"] = self.counters.get("stalled", 0) + 1
            self._stalled.append(
                (time.monotonic(), _StalledMsg(topic, key, value), kwargs.get("on_delivery") or self._deliver)
            )
            return
        self._real.produce(topic, value, key, **kwargs)

    def _expire_stalled(self) -> int:
        now = time.monotonic()
        due = [s for s in self._stalled if now - s[0] >= self._timeout]
        if due:
            self._stalled = [s for s in self._stalled if now - s[0] < self._timeout]
            for since, msg, callback in due:
                msg.waited = now - since
                callback(
                    KafkaError(KafkaError._MSG_TIMED_OUT, "Local: Message timed out (injected stall)", retriable=True),
                    msg,  # type: ignore[arg-type]  # the stalled record's stand-in: what a callback reads of a Message
                )
        return len(due)

    def poll(self, timeout: float = 0) -> int:
        if not self._stalled:
            return self._real.poll(timeout)
        return self._real.poll(min(timeout, 0.01) if timeout >= 0 else 0.01) + self._expire_stalled()

    def flush(self, timeout: float = -1) -> int:
        left = self._real.flush(timeout)
        end = time.monotonic() + (timeout if timeout >= 0 else self._timeout)
        while self._stalled and time.monotonic() < end:
            time.sleep(0.01)
            self._expire_stalled()
        return left + len(self._stalled)

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        if in_queue:
            self._stalled = []
        self._real.purge(in_queue, in_flight, blocking)

    def __len__(self) -> int:
        return len(self._real) + len(self._stalled)


class _StalledMsg:
    """The delivery report's message of a stalled record (as confluent-kafka's Message)."""

    def __init__(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        self._topic, self._key, self._value = topic, key, value
        self.waited: float | None = None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return -1

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def latency(self) -> float | None:
        return self.waited


class FaultInjector:
    """A :data:`ProducerFactory` for tests: ``Harvest(cfg, producer_factory=FaultInjector(0.05, 0.05))``."""

    def __init__(
        self,
        produce_failure_rate: float = 0.0,
        delivery_failure_rate: float = 0.0,
        seed: int = 0,
        real_factory: ProducerFactory = confluent_producer,
        fail_keys: frozenset[bytes] = frozenset(),
        kill_at_produce: int = 0,
        stall_keys: frozenset[bytes] = frozenset(),
    ) -> None:
        """``fail_keys``: every delivery of a record with one of these keys fails. ``kill_at_produce``:
        SIGKILL this process when it produces a ``fail_keys`` record for the n-th time (a row that
        crashes the relay: tests of the persisted attempt counts). ``stall_keys``: records with these
        keys are never acknowledged: they are reported timed out after the producer's
        ``message.timeout.ms`` (a partition that keeps refusing them, e.g. NOT_ENOUGH_REPLICAS)."""
        self.produce_failure_rate = produce_failure_rate
        self.delivery_failure_rate = delivery_failure_rate
        self.fail_keys, self.kill_at_produce, self.stall_keys = fail_keys, kill_at_produce, stall_keys
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._real_factory = real_factory
        self.counters = {"produce": 0, "delivery": 0}

    def __call__(self, config: dict[str, Any], on_delivery: DeliveryCallback) -> KafkaProducer:
        return FaultInjectingProducer(
            self._real_factory,
            config,
            on_delivery,
            self.produce_failure_rate,
            self.delivery_failure_rate,
            self._rng,
            self._lock,
            self.counters,
            self.fail_keys,
            self.kill_at_produce,
            self.stall_keys,
        )
