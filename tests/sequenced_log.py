"""Hand-crafted sequenced Kafka logs and a reference read-committed reader, for reader tests.

``write_log`` writes a deterministic (seeded) mix of what readers must handle: transactions of
several producers interleaved across partitions, duplicates (re-sent records with the same UUID),
partial ACKs (an ACK clock inside the span), rollbacks (an ACK re-sent at the last ACK's clock),
spans that are never acknowledged, OUTSIDE messages and records without a ``uuid`` header.
``reference_read`` reads the topic back and runs the pure :class:`sequencer.Sequencer` over each
partition: the output every read-committed reader must reproduce. ``read_committed_to_end`` reads a topic
with :class:`consumer.ReadCommittedIter` up to the end it has when the read starts (no idle timeout to wait
out, no early stop on a slow fetch).
"""

from __future__ import annotations

import random
import time
import uuid as uuid_mod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from harvest_outbox.consumer import ReadCommittedIter, Record
from harvest_outbox.harvest_local.kafka import topic_ends
from harvest_outbox.sequencer import (
    Envelope,
    Flags,
    Publisher,
    QueueOutcome,
    Sequencer,
    UUIDError,
    build_uuid,
    clock_of,
    decode_checkpoint,
    flags_of,
    parse_uuid,
)


@dataclass(frozen=True)
class RawRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    uuid: bytes | None


def write_log(
    bootstrap: str,
    topic: str,
    partitions: int,
    seed: int = 1,
    steps: int = 60,
    producers: int = 3,
    headerless: bool = True,
) -> int:
    """Write the log; returns the number of records written."""
    rng = random.Random(seed)
    kafka = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 2})
    pubs = [Publisher() for _ in range(producers)]
    last_ack: dict[tuple[int, int], int] = {}  # (producer index, partition) -> last ACK clock
    count = 0
    n = 0

    def send(partition: int, u: uuid_mod.UUID | None, value: str) -> None:
        nonlocal count
        headers = [("uuid", u.bytes)] if u is not None else []
        kafka.produce(
            topic, key=f"k{rng.randrange(5)}".encode(), value=value.encode(), partition=partition, headers=headers
        )
        count += 1

    for _ in range(steps):
        action = rng.random()
        i = rng.randrange(producers)
        pub = pubs[i]
        if action < 0.12:
            n += 1
            send(rng.randrange(partitions), pub.publish_committed(), f"outside-{n}")
        elif action < 0.17 and headerless:
            n += 1
            send(rng.randrange(partitions), None, f"plain-{n}")
        else:
            sent: list[tuple[int, uuid_mod.UUID, str]] = []
            for _ in range(rng.randint(1, 6)):
                n += 1
                p = rng.randrange(partitions)
                u = pub.publish_uncommitted(f"{topic}/{p}")
                sent.append((p, u, f"txn-{n}"))
                send(p, u, f"txn-{n}")
                if rng.random() < 0.15:  # a duplicate, re-sent later in the same span
                    sent.append((p, u, f"txn-{n}"))
                    send(p, u, f"txn-{n}")
            kind = rng.random()
            for intent in pub.build_ack_intents():
                p = int(intent.journal.rsplit("/", 1)[1])
                ack = intent.uuid
                if kind < 0.1:
                    continue  # never acknowledged: a stalled span
                if kind < 0.2:  # rollback: the ACK re-sent at the last ACK's clock
                    first = min(clock_of(u) for q, u, _ in sent if q == p)
                    ack = build_uuid(pub.producer_id, last_ack.get((i, p), first - 1), Flags.ACK_TXN)
                elif kind < 0.3:  # partial: commit only the span's first half
                    clocks = sorted(clock_of(u) for q, u, _ in sent if q == p)
                    ack = build_uuid(pub.producer_id, clocks[(len(clocks) - 1) // 2], Flags.ACK_TXN)
                send(p, ack, "ack")
                last_ack[(i, p)] = clock_of(ack)
                if rng.random() < 0.1:  # a re-sent ACK intent (recovery), harmless
                    send(p, ack, "ack")
        kafka.poll(0)
    assert kafka.flush(30) == 0
    return count


def offsets_by_partition(bootstrap: str, topic: str, partitions: int) -> dict[int, list[int]]:
    """Each partition's record offsets, in order (:func:`read_raw`'s; a partition without records is left out)."""
    by: dict[int, list[int]] = {}
    for r in read_raw(bootstrap, topic, partitions):
        by.setdefault(r.partition, []).append(r.offset)
    return by


def read_raw(bootstrap: str, topic: str, partitions: int) -> list[RawRecord]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
    out: list[RawRecord] = []
    try:
        for p in range(partitions):
            lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if hi <= lo:
                continue
            consumer.assign([TopicPartition(topic, p, lo)])
            while not out or out[-1].partition != p or out[-1].offset < hi - 1:
                msg = consumer.poll(5)
                assert msg is not None, f"timed out reading {topic}/{p}"
                if msg.error():
                    continue
                u = dict(msg.headers() or []).get("uuid")
                out.append(RawRecord(p, msg.offset(), msg.key(), msg.value(), u))
    finally:
        consumer.close()
    return out


def reference_read(
    records: list[RawRecord], topic: str, include_acks: bool = False, uuid_policy: str = "deliver"
) -> list[tuple[int, int, int]]:
    """(partition, offset, ack_offset) of every committed record, in ReadCommittedIter order."""
    out: list[tuple[int, int, int]] = []
    for p in sorted({r.partition for r in records}):
        seq = Sequencer(ring_size=1 << 20)
        journal = f"{topic}/{p}"
        for r in (r for r in records if r.partition == p):
            try:
                u = parse_uuid(r.uuid) if r.uuid is not None else None
            except UUIDError:
                u = None
            if u is None or u.int == 0:
                if uuid_policy == "deliver":
                    out.append((p, r.offset, r.offset))
                continue
            outcome = seq.queue_uncommitted(Envelope(journal, r.offset, r.offset + 1, u, r))
            assert outcome != QueueOutcome.ACK_COMMIT_REPLAY  # the ring holds everything
            seq_msgs = []
            while (env := seq.step()) is not None:
                seq_msgs.append(env)
            if seq_msgs:
                ack_offset = seq_msgs[-1].begin
                for env in seq_msgs:
                    if include_acks or flags_of(env.uuid) != Flags.ACK_TXN:
                        out.append((p, env.begin, ack_offset))
    return out


def read_through(it: ReadCommittedIter, ends: dict[str, int]) -> bool:
    """Whether ``it``'s checkpoint has read through every end of :func:`topic_ends` (every record
    before them queued, every commit among them delivered)."""
    read = decode_checkpoint(it.checkpoint())[0]
    return all(read.get(journal, 0) >= end for journal, end in ends.items())


def drain_to_end(
    it: ReadCommittedIter, ends: dict[str, int], step: Callable[[], list[Any]] | None = None, timeout: float = 60.0
) -> list[Any]:
    """What ``step()`` (a short poll_batch of ``it``; by default a 0.2 s poll) returns until ``it`` has read through
    ``ends`` and nothing more is ready: every record in the log up to them, a surplus or a duplicate included,
    without waiting out an idle timeout. Raises TimeoutError if the ends are not reached in ``timeout``
    seconds (a short read must not pass for a whole one)."""
    if step is None:

        def step() -> list[Any]:
            rec = it.poll(0.2)
            return [] if rec is None else [rec]

    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while True:
        got = step()
        if got:
            out += got
        elif read_through(it, ends):
            while got := step():  # anything made ready by the last records read
                out += got
            return out
        elif time.monotonic() > deadline:
            raise TimeoutError(f"read {len(out)} records in {timeout}s, not through {ends}")


def read_committed_to_end(
    config: dict[str, Any], topics: list[str], timeout: float = 60.0, checkpoint: bytes | None = None, **kw: Any
) -> list[Record]:
    """What a :class:`ReadCommittedIter` (``kw``: its other arguments) delivers of ``topics`` from their start
    (or ``checkpoint``) up to the high watermarks taken first (:func:`drain_to_end`)."""
    ends = topic_ends(config["bootstrap.servers"], topics)
    with ReadCommittedIter(config, topics=topics, checkpoint=checkpoint, **kw) as it:
        return drain_to_end(it, ends, timeout=timeout)
