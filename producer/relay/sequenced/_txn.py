"""One harvest transaction of the ``--uuid-sequencing`` relay and the delivery reports of its records
(docs/design.md §5, step 3).

Invariants:
- a transaction belongs to one view and one ProducerID of its ring; its records are produced in id
  order, each stamped with a clock above the previous one;
- ``pending`` counts its records produced and not yet reported; ``journals`` holds, per
  (topic, partition) it touched, the clock of its first record there (reports of one partition
  arrive in log order), which is what its ACKs and rollback ACKs are sent to;
- every record's delivery callback is a pooled :class:`Slot` that reports exactly once to the
  transaction and clock it was bound to, then returns to the pool (a :class:`TracedSlot` also ends
  the record's relay span, when it has one).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import NamedTuple

from confluent_kafka import KafkaError, Message

from harvest_outbox.producer.db import MarkedRow
from harvest_outbox.producer.db.fence import DeadRow
from harvest_outbox.producer.relay.sequenced._view import View
from harvest_outbox.producer.relay.spans import RecordSpan, RelaySpans

log = logging.getLogger(__name__)


def reported(t: Txn) -> bool:
    """A delivery report of one of ``t``'s records has arrived (or it has none): once the backlog is
    taken, the transaction closes then. Rows marked while its first records were on their way have
    joined it (its commit could not start before that report anyway), and rows marked later go to the
    next one: at a trickle, a transaction per delivery round trip instead of one per row, and no
    record waits more than about one round trip longer for its commit."""
    return t.pending < len(t.ids) or not t.pending


class DeliveryFailure(NamedTuple):
    """A record of a transaction whose delivery failed: the error, the report's message (None when
    librdkafka gave none) and the clock the record was stamped with."""

    err: KafkaError
    msg: Message | None
    clock: int


class Txn:
    """One harvest transaction."""

    __slots__ = (
        "ack_clock",
        "ack_failed",
        "ack_pending",
        "closed",
        "commit",
        "dead",
        "failures",
        "first_clock",
        "first_failed",
        "held",
        "ids",
        "journals",
        "k",
        "opened",
        "pending",
        "producer",
        "producer_int",
        "rows",
        "view",
    )

    def __init__(self, view: View, k: int, producer: bytes, now: float) -> None:
        self.view = view
        self.k = k
        self.producer = producer
        self.producer_int = int.from_bytes(producer, "big")
        self.opened = now
        self.rows: list[MarkedRow] = []
        self.ids: list[int] = []
        self.dead: list[DeadRow] = []
        # haltKey: rows of a key this view halted, dropped unsent (in read order, between this transaction's
        # rows); the cursor layout's fenced commit holds them, the mark layout leaves them marked
        self.held: list[int] = []
        self.pending = 0  # produced, delivery report not yet seen
        # touched (topic, partition) -> clock of the first record there (from delivery reports)
        self.journals: dict[tuple[str, int], int] = {}
        # partitions whose first record's delivery failed: it may or may not be in the log
        self.first_failed: set[tuple[str, int]] = set()
        self.failures: list[DeliveryFailure] = []
        self.first_clock = 0
        self.ack_clock = 0
        self.closed = False
        self.commit: Future[None] | None = None
        self.ack_pending = 0
        self.ack_failed = False

    def on_delivery(self, clock: int, err: KafkaError | None, msg: Message) -> None:
        """Delivery report of the record stamped ``clock`` (bound per record by a :class:`Slot`:
        librdkafka's delivery reports carry no headers, so the clock cannot be read back from them;
        the poison-or-outage rule needs every record's clock)."""
        self.pending -= 1
        if err is None:
            if clock > self.view.max_ok:
                self.view.max_ok = clock
        else:
            self.failures.append(DeliveryFailure(err, msg, clock))
            if msg is None:
                return
        topic, partition = msg.topic(), msg.partition()
        if topic is None or partition is None or partition < 0:
            return  # (a failed record with a known partition may be in the log anyway; a delivered one has both)
        j = (topic, partition)
        if j not in self.journals:  # once per partition per transaction: reports arrive in log order
            # The first clock of this producer in this partition: a rollback ACK at clock - 1 equals
            # the reader's implicit last ACK, so it is a clean ACK_ROLLBACK. Unless that record failed
            # and is not in the log: the reader's implicit last ACK is then the first *written* clock - 1,
            # which the relay cannot know; clock - 1 is still the safe choice (never above the reader's
            # last ACK, so it never commits the span), see seq_acks.roll_back.
            self.journals[j] = clock
            if err is not None:
                self.first_failed.add(j)

    def on_ack(self, err: KafkaError | None, msg: Message) -> None:
        self.ack_pending -= 1
        if err is not None:
            log.warning(
                "ACK_TXN of harvest transaction %d to %s/%s failed: %s (its intent stays; the next view re-sends it)",
                self.k,
                msg.topic(),
                msg.partition(),
                err.str(),
            )
            self.ack_failed = True


class Slot:
    """The delivery callback of one in-flight record: calls ``txn.on_delivery(clock, err, msg)``.

    Slots are pooled and reused (a free list owned by the relay), not allocated per record: a
    ``functools.partial`` per record lived until its delivery report, so thousands of them at a time
    survived into Python's oldest GC generation and triggered a full collection every few thousand
    records (10-20 ms each, every Python thread stopped). A slot returns to the pool when its report
    arrives (librdkafka calls each record's callback exactly once); slots of a producer that is
    dropped without reports are simply freed with it."""

    __slots__ = ("clock", "pool", "txn")

    def __init__(self, pool: list[Slot]) -> None:
        self.pool = pool
        self.txn: Txn | None = None
        self.clock = 0

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        t, clock = self.txn, self.clock
        self.txn = None
        self.pool.append(self)
        # A slot is called only while bound (librdkafka reports each record exactly once): a None
        # check per report would guard nothing.
        t.on_delivery(clock, err, msg)  # type: ignore[union-attr]


class TracedSlot(Slot):
    """A :class:`Slot` of a relay with relay spans (producer.relay.spans): its report also ends the
    record's span, if it has one. Only such a relay makes these, so a plain slot's report runs no
    span code."""

    __slots__ = ("span", "spans")

    def __init__(self, pool: list[Slot], spans: RelaySpans) -> None:
        super().__init__(pool)
        self.spans = spans
        self.span: RecordSpan | None = None

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        span = self.span
        if span is not None:
            self.span = None
            self.spans.end(span, err, msg)
        Slot.__call__(self, err, msg)
