"""Helpers for the consumer tests: writing sequenced records to real topics as
the relay would, and the pure-Sequencer reference output for the same records."""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Producer

from harvest_outbox.sequencer import NIL_UUID, Envelope, Flags, PySequencer, build_uuid, new_producer_id


# One record to write: partition, uuid header (None: no header; bytes: raw header value), value.
@dataclass
class Rec:
    partition: int
    header: Any  # uuid.UUID | bytes | None
    value: bytes
    key: bytes | None = None


def kafka_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, **extra}


def produce(bootstrap: str, topic: str, recs: Sequence[Rec]) -> dict[int, list[int]]:
    """Write ``recs`` in order (idempotent producer: per-partition order = list order).

    Returns partition -> offsets assigned, in write order.
    """
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    offsets: dict[int, list[int]] = {}
    errors: list[Any] = []

    def done(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            offsets.setdefault(msg.partition(), []).append(msg.offset())

    for r in recs:
        if r.header is None:
            headers = None
        elif isinstance(r.header, (bytes, bytearray)):
            headers = [("uuid", bytes(r.header))]
        else:
            headers = [("uuid", r.header.bytes)]
        while True:
            try:
                p.produce(topic, value=r.value, key=r.key, partition=r.partition, headers=headers, on_delivery=done)
                break
            except BufferError:
                p.poll(0.1)
        p.poll(0)
    assert p.flush(60) == 0
    assert not errors, errors
    for offs in offsets.values():
        assert offs == sorted(offs)
    return offsets


def reference(
    topic: str, recs: Sequence[Rec], offsets: dict[int, list[int]], ring_size: int
) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of what a pure Sequencer commits for ``recs``
    read in list order (ACKs included)."""
    seq = PySequencer(ring_size=ring_size)  # the pure-Python reference, whatever the reader runs
    envs: list[Envelope] = []
    next_idx: dict[int, int] = {}
    by_journal: dict[str, list[Envelope]] = {}
    for r in recs:
        i = next_idx.get(r.partition, 0)
        next_idx[r.partition] = i + 1
        off = offsets[r.partition][i]
        u = r.header if (r.header is not None and not isinstance(r.header, (bytes, bytearray))) else NIL_UUID
        env = Envelope(f"{topic}/{r.partition}", off, off + 1, u, (r.partition, off, r.value))
        envs.append(env)
        by_journal.setdefault(env.journal, []).append(env)
    out: list[tuple[int, int, bytes]] = []
    for env in envs:
        outcome = seq.queue_uncommitted(env)
        if outcome.commits:
            if outcome.name == "ACK_COMMIT_REPLAY":
                j, b, e = seq.replay_range()
                seq.start_replay([x for x in by_journal[j] if b <= x.begin < e])
            while (got := seq.step()) is not None:
                out.append(got.message)
    return out


class Gen:
    """Random relay-like traffic: producers with CONTINUE spans, ACKs (full, partial),
    rollbacks (re-sent ACKs), duplicates, OUTSIDE and unsequenced records."""

    def __init__(self, seed: int, partitions: int = 1, producers: int = 3) -> None:
        self.rnd = random.Random(seed)
        self.partitions = partitions
        self.pids = [new_producer_id() for _ in range(producers)]
        self.clock = {pid: 1000 * (i + 1) for i, pid in enumerate(self.pids)}
        self.last_ack = {(pid, p): None for pid in self.pids for p in range(partitions)}
        self.sent: list[Rec] = []
        self.n = 0

    def _tick(self, pid: bytes) -> int:
        self.clock[pid] += 16
        return self.clock[pid]

    def _value(self, tag: str) -> bytes:
        self.n += 1
        return f"{tag}-{self.n}".encode()

    def records(self, count: int) -> list[Rec]:
        rnd = self.rnd
        out: list[Rec] = []
        open_txn: dict[bytes, list[tuple[int, int]]] = {pid: [] for pid in self.pids}  # (partition, clock)
        while len(out) < count:
            pid = rnd.choice(self.pids)
            part = rnd.randrange(self.partitions)
            r = rnd.random()
            if r < 0.55:
                c = self._tick(pid)
                open_txn[pid].append((part, c))
                out.append(Rec(part, build_uuid(pid, c, Flags.CONTINUE_TXN), self._value("c")))
            elif r < 0.75 and open_txn[pid]:
                # ACK every touched partition; sometimes a partial ACK (clock below later messages).
                spans = open_txn[pid]
                if rnd.random() < 0.2 and len(spans) > 1:
                    ack_clock = spans[rnd.randrange(len(spans) - 1)][1]
                else:
                    ack_clock = self._tick(pid)
                touched = sorted({p for p, _ in spans})
                for p in touched:
                    out.append(Rec(p, build_uuid(pid, ack_clock, Flags.ACK_TXN), self._value("ack")))
                    self.last_ack[(pid, p)] = ack_clock
                open_txn[pid] = []
                self.clock[pid] = max(self.clock[pid], ack_clock)
            elif r < 0.82:
                # Rollback: re-send the last ACK (or an ACK below everything) to a partition.
                la = self.last_ack[(pid, part)]
                c = la if la is not None else self.clock[pid] - 8
                out.append(Rec(part, build_uuid(pid, c, Flags.ACK_TXN), self._value("rb")))
                open_txn[pid] = [(p, cc) for p, cc in open_txn[pid] if p != part]
            elif r < 0.9 and out:
                # Duplicate of an earlier sequenced record (a retried write).
                prev = rnd.choice(out)
                out.append(Rec(prev.partition, prev.header, prev.value))
            elif r < 0.97:
                out.append(Rec(part, build_uuid(pid, self._tick(pid), Flags.OUTSIDE_TXN), self._value("o")))
            else:
                out.append(Rec(part, None, self._value("u")))
        self.sent.extend(out)
        return out


def drain(it: Any, expect: int | None = None, idle: float = 3.0, limit: float = 60.0) -> list[Any]:
    """Poll ``it`` until ``expect`` records (then one short extra poll) or ``idle`` s without one."""
    out: list[Any] = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        wait = 0.5 if (expect is not None and len(out) >= expect) else idle
        rec = it.poll(wait)
        if rec is None:
            break
        out.append(rec)
    return out


def key(rec: Any) -> tuple[int, int, bytes]:
    return (rec.partition, rec.offset, rec.value)


def per_partition(items: Iterable[tuple[int, int, bytes]]) -> dict[int, list[tuple[int, int, bytes]]]:
    out: dict[int, list[tuple[int, int, bytes]]] = {}
    for t in items:
        out.setdefault(t[0], []).append(t)
    return out
