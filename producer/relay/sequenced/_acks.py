"""ACK_TXN records of the ``--uuid-sequencing`` relay: a committed transaction's ACKs, the recovery
of persisted ACK intents, and rollback ACKs of abandoned spans (docs/design.md §5, steps 2, 4, 6).

Invariants:
- ACKs are empty-keyed, empty-valued records whose only header is the ``uuid`` (a compacted topic
  refuses a null key, and a null value would be a tombstone);
- a committed transaction's ACKs go to its partitions in a fixed (sorted) order, after every earlier
  transaction's; once one fails, none of the view's later ACKs is produced (it could overtake the
  missing one in a partition): recovery re-sends every intent in order;
- recovered intents are delivered before the view produces anything else (in commit order: epoch,
  clock), and confirmed (deleted) only once delivered;
- a delivered ACK's intent is confirmed (deleted) only after every earlier transaction's ACKs were
  delivered (:class:`Acks` follows them in transaction order);
- a rollback ACK of an abandoned span carries the producer's last ACK clock in that partition, else
  the span's first clock - 1: the reader's implicit last ACK, so readers see a clean ACK_ROLLBACK.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message

from harvest_outbox.producer.kafka import KafkaProducer
from harvest_outbox.producer.relay.crash_points import CrashPoints
from harvest_outbox.producer.relay.sequenced._txn import Txn
from harvest_outbox.producer.relay.sequenced._view import ACK, View, uuid_bytes

log = logging.getLogger(__name__)

#: A persisted ACK intent as the view start reads it: (epoch, producer, clock, topic, partition).
Intent = tuple[int, bytes, int, str, int]


class AckCounter:
    """Delivery counter for recovery and rollback ACKs."""

    __slots__ = ("failed", "pending")

    def __init__(self) -> None:
        self.pending = 0
        self.failed = 0

    def on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        self.pending -= 1
        if err is not None:
            self.failed += 1
            log.warning("ACK to %s/%s failed: %s", msg.topic(), msg.partition(), err.str())


class SynthMsg:
    """Stands in for a Message in a synthesized delivery report."""

    def __init__(self, topic: str, partition: int) -> None:
        self._t, self._p = topic, partition

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def key(self) -> None:
        return None

    def value(self) -> None:
        return None


def produce_ack(producer: KafkaProducer, topic: str, partition: int, ack: bytes, cb: Any) -> bool:
    """Produce one ACK_TXN; False (after reporting a failure to ``cb``) if it could not be."""
    err: KafkaError | None = None
    for _ in range(10000):
        try:
            producer.produce(topic, b"", b"", partition=partition, headers=[("uuid", ack)], on_delivery=cb)
            return True
        except BufferError:
            producer.poll(0.01)
        except KafkaException as exc:
            err = exc.args[0]
            break
    err = err or KafkaError(KafkaError._QUEUE_FULL, "local queue full")
    # The DB holds the intent (if it is one): the next view re-sends it.
    log.warning("producing ACK_TXN to %s/%s failed: %s", topic, partition, err.str())
    cb(err, SynthMsg(topic, partition))
    return False


def enqueue_acks(producer: KafkaProducer, t: Txn, acking: deque[Txn], hook: CrashPoints) -> bool:
    """Produce one ACK_TXN per partition the committed transaction ``t`` touched, in a fixed order;
    False if one could not be produced (the view's ACKs are broken: produce none after it)."""
    view = t.view
    journals = sorted(t.journals)
    if not journals:
        return True
    ack = uuid_bytes(t.producer_int, t.ack_clock, ACK)
    t.ack_pending = len(journals)
    acking.append(t)
    for i, (topic, part) in enumerate(journals):
        if not produce_ack(producer, topic, part, ack, t.on_ack):
            t.ack_pending -= len(journals) - i - 1  # the rest are never produced
            t.ack_failed = True
            return False
        view.last_ack[(t.producer, topic, part)] = t.ack_clock
        if i == 0 and len(journals) > 1 and hook:
            producer.flush(10)
            hook.hit("after_some_acks")
    return True


def recover(producer: KafkaProducer, intents: Sequence[Intent], deadline: float, monotonic: Callable[[], float]) -> int:
    """Publish the recovered intents in order and await their delivery until ``deadline``; returns
    how many were not delivered (0: all are in the log and may be confirmed)."""
    counter = AckCounter()
    for _e, prod, clock, topic, part in intents:
        counter.pending += 1
        if not produce_ack(
            producer, topic, part, uuid_bytes(int.from_bytes(prod, "big"), clock, ACK), counter.on_delivery
        ):
            break
    while counter.pending > 0 and monotonic() < deadline:
        producer.poll(0.01)
    return counter.pending + counter.failed


def roll_back(producer: KafkaProducer, view: View, abandoned: Iterable[Txn], unknown: set[bytes]) -> AckCounter:
    """Produce a rollback ACK for every span of ``abandoned`` in every partition it is known to have
    touched, except for producers in ``unknown`` (a commit whose outcome is unknown may have committed:
    the next view's recovery ACKs it). Returns the counter of their deliveries."""
    counter = AckCounter()
    for t in abandoned:
        if not t.ids or t.producer in unknown:
            continue
        for (topic, part), first in sorted(t.journals.items()):
            # == the reader's last ACK of this producer in this partition: a clean rollback
            clock = view.last_ack.get((t.producer, topic, part), first - 1)
            if (topic, part) in t.first_failed and (t.producer, topic, part) not in view.last_ack:
                # Its first record there failed: if it is not in the log, readers see this ACK below
                # their implicit last ACK and log Gazette's "ACK_TXN which is less than last ACK"; it
                # is still a rollback to them (docs/design.md §5), so nothing is committed or lost.
                log.warning(
                    "rolling back harvest transaction %d in %s/%s at clock %d: its first record there "
                    "failed and may be missing from the log, in which case readers log 'unexpected "
                    "ACK_TXN which is less than last ACK' for producer %s: expected here, the span is "
                    "rolled back all the same",
                    t.k,
                    topic,
                    part,
                    clock,
                    t.producer.hex(),
                )
            counter.pending += 1
            if not produce_ack(producer, topic, part, uuid_bytes(t.producer_int, clock, ACK), counter.on_delivery):
                break
    return counter


@dataclass(frozen=True)
class AcksDelivered:
    """What :meth:`Acks.delivered` found: the transactions whose ACKs were all delivered since the
    last look (in order; their intents are buffered for confirming), and the first one with a failed
    ACK, if any (the view must be abandoned)."""

    done: list[Txn]
    failed: Txn | None


class Acks:
    """A view's ACK_TXN pipeline, a part of :class:`~producer.relay.sequenced.mode.SequencedMode` that owns
    it: the committed transactions whose ACKs are enqueued and not all delivered (in order), whether an
    ACK of the view failed, and the delivered ACKs whose intents wait to be confirmed (in batches)."""

    __slots__ = ("broken", "confirm_buf", "in_flight", "next_confirm")

    def __init__(self) -> None:
        self.in_flight: deque[Txn] = deque()  # ACKs enqueued, not yet all delivered, in order
        # An ACK of this view failed: produce nothing more in it (not even ACKs of later commits, which
        # could overtake the missing one in a partition); recovery re-sends every intent in order.
        self.broken = False
        self.confirm_buf: list[tuple[bytes, int]] = []  # (producer, ACK clock) of delivered ACKs
        self.next_confirm = 0.0

    def enqueue(self, producer: KafkaProducer, t: Txn, hook: CrashPoints) -> None:
        """Produce the committed ``t``'s ACKs (:func:`enqueue_acks`), unless an ACK of the view failed."""
        if not self.broken and not enqueue_acks(producer, t, self.in_flight, hook):
            self.broken = True

    def delivered(self) -> AcksDelivered:
        """Take the transactions whose ACKs were all delivered, in order, up to the first with a failed one."""
        in_flight = self.in_flight
        if any(t.ack_failed for t in in_flight):
            self.broken = True
        done: list[Txn] = []
        while in_flight and in_flight[0].ack_pending == 0:
            t = in_flight.popleft()
            if t.ack_failed:
                return AcksDelivered(done, t)
            if t.journals:
                self.confirm_buf.append((t.producer, t.ack_clock))
            done.append(t)
        return AcksDelivered(done, None)

    def confirms_due(self, now: float) -> bool:
        """Enough delivered intents wait (64), or long enough (see :meth:`take_confirms`)."""
        return bool(self.confirm_buf) and (len(self.confirm_buf) >= 64 or now >= self.next_confirm)

    def take_confirms(self, next_at: float) -> list[tuple[bytes, int]]:
        """The intents to confirm now; the next batch is due at ``next_at`` at the latest."""
        items, self.confirm_buf = self.confirm_buf, []
        self.next_confirm = next_at
        return items

    def leave(self) -> list[Txn]:
        """The view is left: the transactions whose ACKs were all delivered and touched a partition (their
        intents buffered for confirming); the others are forgotten (the next view re-sends their intents)."""
        acked = [t for t in self.in_flight if t.ack_pending == 0 and not t.ack_failed and t.journals]
        self.confirm_buf.extend((t.producer, t.ack_clock) for t in acked)
        self.in_flight.clear()
        return acked
