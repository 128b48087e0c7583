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

from sequencer import Envelope, Flags, ProducerState, QueueOutcome, Sequencer, UUIDError, parse_uuid
from sequencer.identity import clock_of, flags_of
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
    parsed: list[uuid_mod.UUID | None] = []
    for raw in raw_uuids:
        try:
            u = parse_uuid(raw) if raw is not None else None
        except UUIDError:
            u = None
        parsed.append(None if u is not None and u.int == 0 else u)

    states = [st for (p, _), st in plan.states.items() if p == partition]
    seq = Sequencer({journal: start}, states, plan.ring_size)
    rows: list[int] = []
    acks: list[int] = []
    clocks: list[int] = []
    unsequenced = 0
    for i in range(first, len(offsets)):
        u = parsed[i]
        off = offsets[i]
        if u is None:
            if plan.uuid_policy == "raise":
                raise MissingUUIDError(
                    f"record {journal}@{off} has no valid 'uuid' header and uuid_policy='raise'; use "
                    "uuid_policy='deliver' to deliver such records at-least-once, or 'drop' to skip them")
            unsequenced += 1
            if plan.uuid_policy == "deliver":
                rows.append(i), acks.append(off), clocks.append(0)
            continue
        if seq.queue_uncommitted(Envelope(journal, off, off + 1, u, i)) == _REPLAY:
            _, begin, end = seq.replay_range()
            seq.start_replay(_replay(offsets, parsed, journal, begin, end))
        sequence = seq.step_many(1 << 30)
        if sequence:
            ack_offset = sequence[-1].begin
            for env in sequence:
                if plan.include_acks or flags_of(env.uuid) != _ACK:
                    rows.append(env.message), acks.append(ack_offset), clocks.append(clock_of(env.uuid))
    if unsequenced:
        log.warning("%s: %d records without a valid 'uuid' header (uuid_policy=%r: %s)", journal, unsequenced,
                    plan.uuid_policy, "skipped" if plan.uuid_policy == "drop" else "delivered at-least-once")
    _, end_states = seq.checkpoint(prune_horizon_ns)
    out = table.take(pa.array(rows, pa.int64()))
    out = out.append_column("ack_offset", pa.array(acks, pa.int64()))
    out = out.append_column("clock", pa.array(clocks, pa.int64()))
    return out, PartitionResult(end_states)


def _replay(offsets: list[int], parsed: list[uuid_mod.UUID | None], journal: str, begin: int,
            end: int) -> Iterator[Envelope]:
    lo = bisect.bisect_left(offsets, begin)
    hi = bisect.bisect_left(offsets, end)
    for i in range(lo, hi):
        u = parsed[i]
        if u is not None:
            yield Envelope(journal, offsets[i], offsets[i] + 1, u, i)
