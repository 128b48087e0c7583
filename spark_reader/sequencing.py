"""Gazette sequencing of one (partition, producer) group of raw Kafka records, as Arrow tables.

Spark hands each group to :func:`sequence_group` (``applyInArrow``). The group runs the real
:class:`sequencer.Sequencer`, restored from the producer's checkpointed state, so the semantics are
exactly those of ``ReadCommittedIter``: duplicates, partial ACKs, rollbacks, OUTSIDE messages.
Producers are independent in Gazette's model (a sequence is one producer's span plus its
committing message), so sequencing each producer apart gives the same committed messages; the
global order is recovered by sorting on ``(partition, ack_offset, offset)``.

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
class GroupResult:
    rows: list[int]  # indices into the (offset-sorted) group table
    ack_offsets: list[int]
    clocks: list[int]
    state: ProducerState | None  # the producer's state at the end of the read


def sequence_group(table: pa.Table, plan: GroupPlan) -> tuple[pa.Table, GroupResult]:
    """Committed rows of one group, with ``ack_offset`` and ``clock`` columns; plus its end state."""
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
            parsed.append(parse_uuid(raw) if raw is not None else None)
        except UUIDError:
            parsed.append(None)

    producer = _group_producer(parsed)
    if producer is None:
        result = _unsequenced(offsets, first, plan, journal)
    else:
        result = _sequenced(offsets, parsed, first, plan, journal, partition, producer)
    out = table.take(pa.array(result.rows, pa.int64()))
    out = out.append_column("ack_offset", pa.array(result.ack_offsets, pa.int64()))
    out = out.append_column("clock", pa.array(result.clocks, pa.int64()))
    return out, result


def _group_producer(parsed: list[uuid_mod.UUID | None]) -> bytes | None:
    for u in parsed:
        if u is not None and u.int != 0:
            return u.bytes[10:]
    return None


def _unsequenced(offsets: list[int], first: int, plan: GroupPlan, journal: str) -> GroupResult:
    """Records with no valid uuid (or the nil UUID): the missing-uuid policy decides."""
    todo = list(range(first, len(offsets)))
    if todo and plan.uuid_policy == "raise":
        raise MissingUUIDError(
            f"record {journal}@{offsets[todo[0]]} has no valid 'uuid' header and uuid_policy='raise'; "
            "use uuid_policy='deliver' to deliver such records at-least-once, or 'drop' to skip them"
        )
    if todo:
        log.warning("%s: %d records without a valid 'uuid' header from offset %d (uuid_policy=%r: %s)",
                    journal, len(todo), offsets[todo[0]], plan.uuid_policy,
                    "skipped" if plan.uuid_policy == "drop" else "delivered at-least-once")
    if plan.uuid_policy == "drop":
        return GroupResult([], [], [], None)
    return GroupResult(todo, [offsets[i] for i in todo], [0] * len(todo), None)


def _sequenced(offsets: list[int], parsed: list[uuid_mod.UUID | None], first: int, plan: GroupPlan,
               journal: str, partition: int, producer: bytes) -> GroupResult:
    state = plan.states.get((partition, producer))
    seq = Sequencer({journal: plan.start.get(partition, 0)}, [state] if state else [], plan.ring_size)
    rows: list[int] = []
    acks: list[int] = []
    clocks: list[int] = []
    pending: list[int] = []
    for i in range(first, len(offsets)):
        u = parsed[i]
        if u is None:
            # A malformed header amid a producer's records: it shares the producer's group only by
            # accident of bytes 10..15; treat it like any header-less record.
            if plan.uuid_policy == "raise":
                raise MissingUUIDError(f"record {journal}@{offsets[i]} has a malformed 'uuid' header")
            if plan.uuid_policy == "deliver":
                rows.append(i), acks.append(offsets[i]), clocks.append(0)
            continue
        off = offsets[i]
        outcome = seq.queue_uncommitted(Envelope(journal, off, off + 1, u, i))
        if outcome == _REPLAY:
            _, begin, end = seq.replay_range()
            seq.start_replay(_replay(offsets, parsed, journal, begin, end))
        while (env := seq.step()) is not None:
            pending.append(env.message)
        if pending:
            ack_offset = offsets[pending[-1]]
            for idx in pending:
                uu = parsed[idx]
                assert uu is not None
                if not plan.include_acks and flags_of(uu) == _ACK:
                    continue
                rows.append(idx), acks.append(ack_offset), clocks.append(clock_of(uu))
            pending.clear()
    _, states = seq.checkpoint(0)
    end_state = next((s for s in states if s.producer == producer), None)
    return GroupResult(rows, acks, clocks, end_state)


def _replay(offsets: list[int], parsed: list[uuid_mod.UUID | None], journal: str, begin: int,
            end: int) -> Iterator[Envelope]:
    lo = bisect.bisect_left(offsets, begin)
    hi = bisect.bisect_left(offsets, end)
    for i in range(lo, hi):
        u = parsed[i]
        if u is not None:
            yield Envelope(journal, offsets[i], offsets[i] + 1, u, i)
