"""Gazette sequencing of raw Kafka records, as Arrow tables, inside Spark tasks.

:func:`sequence_partition` (the batch reader's path, ``mapInArrow``) takes every record a Spark
task read of one topic-partition — Spark's Kafka source reads each topic-partition's offset range
as one split, in offset order — and runs one :class:`sequencer.Sequencer` over it, restored from the
journal's checkpointed producer states: exactly ``ReadCommittedIter``'s semantics (duplicates,
partial ACKs, rollbacks, OUTSIDE messages, pruning), with no shuffle of the payload.
Output rows carry ``ack_offset``: sorting on ``(partition, ack_offset, offset)`` gives
``ReadCommittedIter``'s delivery order.

Invariants:
- a record is emitted at most once, only when its committing ACK (or itself, if OUTSIDE) lies in
  ``[start, end)`` of the read;
- records below the checkpoint's read-through offset are never emitted: they are read only to
  serve replays of spans that were still open at the checkpoint;
- key, value and headers never become Python objects: rows are selected with ``Table.take``.
"""

from __future__ import annotations

import bisect
import logging
import uuid as uuid_mod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa

from sequencer import Envelope, Flags, ProducerState, QueueOutcome, Sequencer
from spark_reader.errors import MissingUUIDError
from spark_reader.policy import UUIDPolicyName

log = logging.getLogger(__name__)

_REPLAY = QueueOutcome.ACK_COMMIT_REPLAY
_ACK = int(Flags.ACK_TXN)


@dataclass(frozen=True)
class GroupPlan:
    """What every group needs to know about the read: shipped to executors by closure."""

    topic: str
    start: Mapping[int, int]  # partition -> first offset to sequence (read-through offset)
    states: Mapping[tuple[int, bytes], ProducerState]  # (partition, producer) -> restored state
    uuid_policy: UUIDPolicyName = "deliver"
    include_acks: bool = False
    ring_size: int = 8192


@dataclass(frozen=True)
class PartitionResult:
    states: list[ProducerState]  # the journal's producer states at the end of the read, pruned


def sequence_partition(table: pa.Table, plan: GroupPlan, prune_horizon_ns: int) -> tuple[pa.Table, PartitionResult]:
    """Committed rows of one topic-partition's records (all producers), with ``ack_offset`` and
    ``clock``; plus the journal's producer states at the end, pruned by ``prune_horizon_ns``."""
    table = table.sort_by("offset")
    offsets: list[int] = table.column("offset").to_pylist()
    raw_uuids: list[bytes | None] = table.column("uuid").to_pylist()
    partition = int(table.column("partition")[0].as_py())
    journal = f"{plan.topic}/{partition}"
    start = plan.start.get(partition, 0)
    first = bisect.bisect_left(offsets, start)
    # UUIDs as 128-bit ints, 0 for unusable ones: the Sequencer's batch path reads nothing else, and
    # building a uuid.UUID per record would cost more than the sequencing itself.
    xs = [_uuid_int(raw) for raw in raw_uuids]

    states = [st for (p, _), st in plan.states.items() if p == partition]
    seq = Sequencer({journal: start}, states, plan.ring_size)
    rows: list[int] = []
    acks: list[int] = []
    entries: list[tuple[str, int, int, int, int]] = []
    unsequenced = 0
    for i in range(first, len(offsets)):
        x = xs[i]
        if x == 0:
            off = offsets[i]
            if plan.uuid_policy == "raise":
                raise MissingUUIDError(
                    f"record {journal}@{off} has no valid 'uuid' header and uuid_policy='raise'; use "
                    "uuid_policy='deliver' to deliver such records at-least-once, or 'drop' to skip them")
            unsequenced += 1
            if plan.uuid_policy == "deliver":
                rows.append(i), acks.append(off)
            continue
        off = offsets[i]
        entries.append((journal, off, off + 1, x, i))

    pos, n = 0, len(entries)
    include_acks = plan.include_acks
    while pos < n:
        pos, outcome = seq.queue_batch(entries, pos)
        if outcome is None:
            break
        if outcome == _REPLAY:
            _, begin, end = seq.replay_range()
            seq.start_replay(_replay(offsets, xs, journal, begin, end))
        sequence = [item.message if type(item) is Envelope else item for item in seq.step_many(1 << 62)]
        ack_offset = offsets[sequence[-1]]
        for idx in sequence:
            if include_acks or (xs[idx] >> 48) & 0x3FF != _ACK:
                rows.append(idx)
                acks.append(ack_offset)
    if unsequenced:
        log.warning("%s: %d records without a valid 'uuid' header (uuid_policy=%r: %s)", journal, unsequenced,
                    plan.uuid_policy, "skipped" if plan.uuid_policy == "drop" else "delivered at-least-once")
    _, end_states = seq.checkpoint(prune_horizon_ns)
    out = table.take(pa.array(rows, pa.int64()))
    out = out.append_column("ack_offset", pa.array(acks, pa.int64()))
    out = out.append_column("clock", pa.array([_clock(xs[i]) for i in rows], pa.int64()))
    return out, PartitionResult(end_states)


def _uuid_int(raw: bytes | None) -> int:
    """The header as a 128-bit int when it is a version-1 RFC 4122 UUID (what parse_uuid accepts,
    the nil UUID aside), else 0."""
    if raw is None or len(raw) != 16:
        return 0
    x = int.from_bytes(raw, "big")
    return x if (x >> 76) & 0xF == 1 and (x >> 62) & 0x3 == 2 else 0


def _clock(x: int) -> int:
    return 0 if x == 0 else (x >> 96) << 4 | ((x >> 80) & 0xFFFF) << 36 | ((x >> 64) & 0x0FFF) << 52 | (x >> 58) & 0xF


def _replay(offsets: list[int], xs: list[int], journal: str, begin: int, end: int) -> Iterator[Envelope]:
    lo = bisect.bisect_left(offsets, begin)
    hi = bisect.bisect_left(offsets, end)
    for i in range(lo, hi):
        if xs[i]:
            yield Envelope(journal, offsets[i], offsets[i] + 1, uuid_mod.UUID(int=xs[i]), i)
