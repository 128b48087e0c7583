"""An in-memory Kafka topic and an idempotent, gap-less producer, for the protocol's model test
(test_protocol_model.py): what librdkafka guarantees with ``enable.idempotence`` and
``enable.gapless.guarantee``, with every choice (when a record is written, whether it fails, what a
crash leaves in the log) made by the test's scheduler.

- Records of one producer in one partition are written in produce order; a delivery report is
  served by ``poll()`` after its record was decided, in that order per partition.
- A failed record may or may not be in the log (a timeout after the broker wrote it); when it is
  not, every later record of that producer in that partition fails unwritten too, including records
  produced after the failure (no gaps: the relay relies on the gap-less guarantee).
- A crash (``lose``) writes a random prefix of each partition's in-flight records and reports none.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError

from harvest_outbox.producer.kafka import ANY_PARTITION, produce_args


@dataclass
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    uuid: bytes | None


@dataclass
class Topic:
    """The log: per partition, the records in offset order."""

    name: str
    partitions: int
    log: dict[int, list[Record]] = field(default_factory=dict)

    def append(self, partition: int, key: bytes | None, value: bytes | None, u: bytes | None) -> None:
        records = self.log.setdefault(partition, [])
        records.append(Record(partition, len(records), key, value, u))

    def records(self) -> list[Record]:
        return [r for p in sorted(self.log) for r in self.log[p]]


class ModelMsg:
    """A delivery report's message (as confluent-kafka's Message)."""

    def __init__(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
        self._t, self._p, self._k, self._v = topic, partition, key, value

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def key(self) -> bytes | None:
        return self._k

    def value(self) -> bytes | None:
        return self._v

    def latency(self) -> float:
        return 0.01


@dataclass
class _InFlight:
    msg: ModelMsg
    uuid: bytes | None
    cb: Callable[[KafkaError | None, Any], None]


class ModelProducer:
    """One relay's producer over a :class:`Topic`. ``on_call(what)`` runs first on every call: the
    scheduler may crash the relay there (by raising), make broker progress, or refuse a produce
    (by returning an exception to raise)."""

    def __init__(
        self,
        topic: Topic,
        on_call: Callable[[ModelProducer, str], BaseException | None],
        advance: Callable[[float], None],
        pick: Callable[[int], int],
    ) -> None:
        self.topic = topic
        self.pick = pick  # pick(n): how many of n records in flight reach the log
        self.on_call = on_call
        self.advance = advance
        self.in_flight: dict[int, deque[_InFlight]] = {}
        self.gap: set[int] = set()  # partitions where a record failed unwritten: nothing more is written
        self.reports: deque[tuple[Callable[..., None], KafkaError | None, ModelMsg]] = deque()

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, *args: Any, **kw: Any) -> None:
        refused = self.on_call(self, "produce")
        if refused is not None:
            raise refused
        a = produce_args(args, kw)
        part = a.get("partition", ANY_PARTITION)
        if part == ANY_PARTITION:
            part = zlib.crc32(key or b"") % self.topic.partitions
        cb = a.get("callback") or a.get("on_delivery")
        u = dict(a.get("headers") or []).get("uuid")
        self.in_flight.setdefault(part, deque()).append(_InFlight(ModelMsg(topic, part, key, value), u, cb))

    def busy(self) -> list[int]:
        return [p for p, q in self.in_flight.items() if q]

    def deliver(self, part: int) -> None:
        """The broker writes the head record of ``part``; its report is ready."""
        if part in self.gap:
            self.fail(part, written=False)
            return
        f = self.in_flight[part].popleft()
        self.topic.append(part, f.msg.key(), f.msg.value(), f.uuid)
        self.reports.append((f.cb, None, f.msg))

    def fail(self, part: int, written: bool) -> None:
        """The head record of ``part`` fails (timed out); ``written``: it is in the log anyway."""
        queue = self.in_flight[part]
        f = queue.popleft()
        err = KafkaError(KafkaError._MSG_TIMED_OUT, "Local: Message timed out")
        self.reports.append((f.cb, err, f.msg))
        if written:
            self.topic.append(part, f.msg.key(), f.msg.value(), f.uuid)
            return
        self.gap.add(part)  # gap-less: nothing after an unwritten record is written
        for g in queue:
            self.reports.append((g.cb, err, g.msg))
        queue.clear()

    def lose(self) -> None:
        """The process died: ``pick(n)`` of each partition's n in-flight records reach the log."""
        for part, queue in self.in_flight.items():
            for f in list(queue)[: 0 if part in self.gap else self.pick(len(queue))]:
                self.topic.append(part, f.msg.key(), f.msg.value(), f.uuid)
        self.in_flight.clear()
        self.reports.clear()

    def _serve(self) -> int:
        n = 0
        while self.reports:
            cb, err, msg = self.reports.popleft()
            cb(err, msg)
            n += 1
        return n

    def poll(self, timeout: float = 0) -> int:
        self.on_call(self, "poll")
        n = self._serve()
        if not n:
            self.advance(timeout)
        return n

    def flush(self, timeout: float = -1) -> int:
        self.poll(0)
        return len(self)

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        """Records still queued fail with _PURGE_QUEUE; unless ``in_flight``, a prefix of each
        partition's records may already be on the wire: they are written, reported never (the relay
        drops a producer it purged)."""
        err = KafkaError(KafkaError._PURGE_QUEUE, "Local: Purged in queue")
        for part, queue in self.in_flight.items():
            sent = 0 if in_flight or part in self.gap else self.pick(len(queue))
            for i, f in enumerate(queue):
                if i < sent:
                    self.topic.append(part, f.msg.key(), f.msg.value(), f.uuid)
                else:
                    self.reports.append((f.cb, err, f.msg))
            queue.clear()

    def __len__(self) -> int:
        return sum(len(q) for q in self.in_flight.values()) + len(self.reports)
