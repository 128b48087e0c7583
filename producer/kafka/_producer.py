"""A narrow seam around confluent-kafka's Producer: the relay only needs ``produce``, ``poll``, ``flush``,
``purge`` and ``len`` (:class:`KafkaProducer`), and receives delivery reports through one callback given at
construction (a global ``on_delivery``, so no closure is allocated per message).

Invariants:
- :func:`confluent_producer` is the real producer, the default; a test hands :class:`~producer.harvest.Harvest`
  another :data:`ProducerFactory` (:mod:`producer.kafka._faults`);
- a fatal error raised by ``poll()`` or ``flush()`` reaches the relay as a call of ``on_fatal``
  (:class:`FatalErrorGuard`), never as an exception out of the relay thread; ``produce`` is the wrapped
  producer's own bound method, so the per-record path pays nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Message, Producer

DeliveryCallback = Callable[["KafkaError | None", Message], None]

#: confluent-kafka's ``produce()`` parameters in order. The sequenced hot path passes them by position:
#: keyword arguments are matched by name on every call, ~0.25 µs of a record's ~0.8 µs ``produce()``.
PRODUCE_ARGS = ("topic", "value", "key", "partition", "callback", "on_delivery", "timestamp", "headers")
#: ``partition`` for "the partitioner decides" (librdkafka's RD_KAFKA_PARTITION_UA, the default).
ANY_PARTITION = -1


def produce_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments after ``topic, value, key`` of a ``produce()`` call, by name, however given."""
    # Not strict: a call gives any prefix of the positional arguments.
    return {**dict(zip(PRODUCE_ARGS[3:], args, strict=False)), **kwargs}


class KafkaProducer(Protocol):
    def produce(
        self, topic: str, value: bytes | None = None, key: bytes | None = None, *args: Any, **kwargs: Any
    ) -> None: ...

    def poll(self, timeout: float = ...) -> int: ...

    def flush(self, timeout: float = ...) -> int: ...

    def purge(self, in_queue: bool = ..., in_flight: bool = ..., blocking: bool = ...) -> None: ...

    def __len__(self) -> int: ...


ProducerFactory = Callable[[dict[str, Any], DeliveryCallback], KafkaProducer]


def confluent_producer(config: dict[str, Any], on_delivery: DeliveryCallback) -> KafkaProducer:
    """The real thing: confluent-kafka's Producer with a global delivery callback."""
    return Producer({**config, "on_delivery": on_delivery})


class FatalErrorGuard:
    """Delegates to a producer; a *fatal* error that ``poll()`` or ``flush()`` raises is handed to
    ``on_fatal`` instead (the relay then replaces the producer). confluent-kafka raises fatal errors
    from ``poll()`` — with ``enable.gapless.guarantee``, a batch the broker refused is one — and an
    exception out of the relay thread would stop the relay. ``produce`` is the wrapped producer's
    own bound method: the per-record path pays nothing."""

    def __init__(self, producer: KafkaProducer, on_fatal: Callable[[KafkaError], None]) -> None:
        self._real = producer
        self._on_fatal = on_fatal
        self.produce = producer.produce
        self.purge = producer.purge

    def _fatal(self, exc: KafkaException) -> None:
        err = exc.args[0] if exc.args else None
        if not isinstance(err, KafkaError) or not err.fatal():
            raise exc
        self._on_fatal(err)

    def poll(self, timeout: float = 0) -> int:
        try:
            return self._real.poll(timeout)
        except KafkaException as exc:
            self._fatal(exc)
            return 0

    def flush(self, timeout: float = -1) -> int:
        try:
            return self._real.flush(timeout)
        except KafkaException as exc:
            self._fatal(exc)
            return len(self._real)

    def __len__(self) -> int:
        return len(self._real)
