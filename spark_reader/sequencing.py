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
- rows leave in offset order (selected with Arrow's chunk-wise filter: a partition's table is never
  concatenated, so its key/value bytes are not capped at 2 GiB);
- key, value and headers never become Python objects;
- per record, only what the Sequencer's interface needs becomes Python objects (with the native
  Sequencer, the row index; with the pure-Python one, the entry tuple and its 128-bit int); header
  validation, flags, clocks and the output's selection and columns are computed column-wise with
  numpy.
"""

from __future__ import annotations

import gc
import logging
import uuid as uuid_mod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import repeat

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from harvest_outbox.sequencer import EntryBatch, Envelope, Flags, ProducerState, QueueOutcome, Sequencer
from harvest_outbox.sequencer.uuid_layout import clock_of_halves, flags_of_lo, is_relay_halves
from harvest_outbox.spark_reader.errors import MissingUUIDError
from harvest_outbox.spark_reader.policy import UUIDPolicyName

log = logging.getLogger(__name__)

_REPLAY = QueueOutcome.ACK_COMMIT_REPLAY
_ACK = int(Flags.ACK_TXN)
_BYTE_LANES = np.arange(16, dtype=np.int64)
_TAKE_WINDOW = 65536


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
    # Nothing built here holds reference cycles, and the collector's passes over the million
    # tuples and ints of a large partition would cost as much as building them.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _sequence_partition(table, plan, prune_horizon_ns)
    finally:
        if gc_was_enabled:
            gc.enable()


def _sequence_partition(table: pa.Table, plan: GroupPlan, prune_horizon_ns: int) -> tuple[pa.Table, PartitionResult]:
    offsets = _int64s(table.column("offset"))
    if len(offsets) > 1 and not bool((offsets[1:] > offsets[:-1]).all()):
        table = table.sort_by("offset")  # Spark's Kafka source reads a split in offset order: rare
        offsets = _int64s(table.column("offset"))
    valid, hi, lo = uuid_words(table.column("uuid"))
    partition = int(table.column("partition")[0].as_py())
    journal = f"{plan.topic}/{partition}"
    start = plan.start.get(partition, 0)
    first = int(np.searchsorted(offsets, start, side="left"))

    unsequenced = np.flatnonzero(~valid[first:]) + first
    if unsequenced.size and plan.uuid_policy == "raise":
        raise MissingUUIDError(
            f"record {journal}@{int(offsets[unsequenced[0]])} has no valid 'uuid' header and uuid_policy='raise'; "
            "use uuid_policy='deliver' to deliver such records at-least-once, or 'drop' to skip them"
        )
    entries = _entries(journal, offsets, hi, lo, np.flatnonzero(valid[first:]) + first)

    states = [st for (p, _), st in plan.states.items() if p == partition]
    seq = Sequencer({journal: start}, states, plan.ring_size)
    delivered: list[int] = []  # row indices of every dequeued sequence, concatenated
    ends: list[int] = []  # len(delivered) after each sequence: its last row is its committing message
    pos, n = 0, len(entries)
    while pos < n:
        pos, outcome = seq.queue_batch(entries, pos)
        if outcome is None:
            break
        if outcome == _REPLAY:
            _, begin, end = seq.replay_range()
            seq.start_replay(_replay(offsets, valid, hi, lo, journal, begin, end))
            delivered += [item.message if type(item) is Envelope else item for item in seq.step_many(1 << 62)]
        else:
            delivered += seq.step_many(1 << 62)  # ring entries only: the row indices themselves
        ends.append(len(delivered))
    del entries
    _, end_states = seq.checkpoint(prune_horizon_ns)

    rows = np.array(delivered, dtype=np.int64)
    del delivered
    bounds = np.array(ends, dtype=np.int64)
    acks = np.repeat(offsets[rows[bounds - 1]], np.diff(bounds, prepend=0)) if len(bounds) else rows
    if not plan.include_acks:
        keep = flags_of_lo(lo[rows]) != _ACK
        rows, acks = rows[keep], acks[keep]
    if unsequenced.size:
        log.warning(
            "%s: %d records without a valid 'uuid' header (uuid_policy=%r: %s)",
            journal,
            unsequenced.size,
            plan.uuid_policy,
            "skipped" if plan.uuid_policy == "drop" else "delivered at-least-once",
        )
        if plan.uuid_policy == "deliver":  # committed at once: their own ack_offset
            rows = np.concatenate([unsequenced, rows])
            acks = np.concatenate([offsets[unsequenced], acks])
    # Rows leave in log order, not delivery order (a DataFrame has none; sort on (partition,
    # ack_offset, offset) for ReadCommittedIter's): ascending rows are a chunk-wise filter, with no
    # concatenation of the partition's table, whose 32-bit offsets would cap its bytes at 2 GiB.
    order = np.argsort(rows, kind="stable")
    rows, acks = rows[order], acks[order]
    out = take_rows(table, rows)
    out = out.append_column("ack_offset", pa.array(acks, pa.int64()))
    out = out.append_column("clock", pa.array(clocks(hi[rows], lo[rows]), pa.int64()))
    return out, PartitionResult(end_states)


def _entries(journal: str, offsets: np.ndarray, hi: np.ndarray, lo: np.ndarray, rows: np.ndarray):
    """The Sequencer's entries for ``rows``: ``(journal, offset, offset + 1, uuid as a 128-bit int,
    row index)`` each. The native Sequencer takes them as an ``EntryBatch`` filled from the columns
    (no tuple or 128-bit int per record); the pure-Python one as a list of tuples."""
    if EntryBatch is not None:
        return EntryBatch.from_columns(journal, offsets, hi, lo, rows)
    begins = offsets[rows]
    return list(
        zip(repeat(journal), begins.tolist(), (begins + 1).tolist(), uuid_ints(hi[rows], lo[rows]), rows.tolist())
    )


def take_rows(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """``table.take(rows)``, faster: Arrow's take of a chunked table concatenates every chunk first,
    and one large take copies variable-width values (key, value) slowly. Rows in log order (no
    interleaved transactions) are a filter, which works chunk by chunk; others are taken from the
    concatenated table in windows of ``_TAKE_WINDOW`` rows."""
    if len(rows) < 2 or bool((rows[1:] > rows[:-1]).all()):
        mask = np.zeros(table.num_rows, np.bool_)
        mask[rows] = True
        return table.filter(pa.array(mask))
    whole = table.combine_chunks()
    return pa.concat_tables(
        [whole.take(pa.array(rows[i : i + _TAKE_WINDOW], pa.int64())) for i in range(0, len(rows), _TAKE_WINDOW)]
    )


def header_values(headers: pa.Array | pa.ChunkedArray, key: str) -> pa.ChunkedArray:
    """The value of each record's first header named ``key`` (null when it has none), from Spark's
    Kafka ``headers`` column (``list<struct<key: string, value: binary>>``): Spark's
    ``element_at(filter(headers, h -> h.key = key), 1).value``, computed column-wise here because
    that expression, evaluated before ``mapInArrow``, costs more than shipping the headers alone."""
    chunks = headers.chunks if isinstance(headers, pa.ChunkedArray) else [headers]
    out = []
    for arr in chunks:
        bounds = arr.offsets.to_numpy(zero_copy_only=False)  # into arr.values, this slice's n + 1
        lo = int(bounds[0])
        flat = arr.values.slice(lo, int(bounds[-1]) - lo)  # a null record's range may be non-empty
        pos = np.flatnonzero(
            pc.fill_null(pc.equal(pc.struct_field(flat, "key"), key), False).to_numpy(zero_copy_only=False)
        )
        parents = np.searchsorted(bounds, pos + lo, side="right") - 1
        if arr.null_count:
            keep = arr.is_valid().to_numpy(zero_copy_only=False)[parents]
            pos, parents = pos[keep], parents[keep]
        first = np.ones(len(pos), np.bool_)  # parents ascend: a record's first match starts a run
        first[1:] = parents[1:] != parents[:-1]
        idx = np.full(len(arr), -1, np.int64)
        idx[parents[first]] = pos[first]
        out.append(pc.struct_field(flat, "value").take(pa.array(idx, mask=idx < 0)))
    return pa.chunked_array(out, headers.type.value_type.field("value").type)


def uuid_words(column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(valid, hi, lo)`` of a binary column of ``uuid`` header values: ``valid`` marks the values
    a relay can have written (``consumer.uuid_header.parse_header_value``'s rule: 16 bytes, version
    nibble 1, variant bits 0b10, multicast ProducerID, flags 0-2); ``hi``/``lo`` are their big-endian
    64-bit halves (uint64),
    0 where not valid. The 128-bit int of row ``i`` is ``hi[i] << 64 | lo[i]``."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(arr)
    if not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):
        raise TypeError(f"uuid column must be binary, got {arr.type}")
    hi = np.zeros(n, np.uint64)
    lo = np.zeros(n, np.uint64)
    sixteen = pc.fill_null(pc.binary_length(arr), 0).to_numpy(zero_copy_only=False) == 16
    if not sixteen.any():
        return sixteen, hi, lo
    _, offsets_buf, data_buf = arr.buffers()
    starts = np.frombuffer(
        offsets_buf,
        np.int64 if pa.types.is_large_binary(arr.type) else np.int32,
        count=n,
        offset=arr.offset * (8 if pa.types.is_large_binary(arr.type) else 4),
    )
    data = np.frombuffer(data_buf, np.uint8)
    if sixteen.all():  # the common case: one contiguous run of 16-byte values
        words = data[int(starts[0]) : int(starts[0]) + 16 * n].view(">u8").reshape(n, 2)
        hi[:], lo[:] = words[:, 0], words[:, 1]
    else:
        sel = np.flatnonzero(sixteen)
        words = data[starts[sel].astype(np.int64)[:, None] + _BYTE_LANES].view(">u8")
        hi[sel], lo[sel] = words[:, 0], words[:, 1]
    valid = sixteen & is_relay_halves(hi, lo)
    hi[~valid] = 0
    lo[~valid] = 0
    return valid, hi, lo


def uuid_ints(hi: np.ndarray, lo: np.ndarray) -> list[int]:
    """The 128-bit ints ``hi << 64 | lo`` as Python ints (what ``Sequencer.queue_batch`` reads)."""
    # 16 big-endian bytes per row, each row one bytes object, int.from_bytes mapped over them in C:
    # faster than shifting and or-ing Python ints (object arrays or a comprehension).
    words = np.empty((len(hi), 2), ">u8")
    words[:, 0], words[:, 1] = hi, lo
    return list(map(int.from_bytes, words.view("V16").ravel().tolist(), repeat("big")))  # type: ignore[arg-type]  # (byteorder: a Literal)


def clocks(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """Gazette clocks (int64) of the UUIDs ``hi << 64 | lo``, 0 for 0: the 60-bit timestamp shifted
    left 4, plus the low 4 bits of the clock sequence (as ``sequencer.clock_of``)."""
    c = clock_of_halves(hi, lo)
    if len(c) and int(c.max()) >= 1 << 63:
        i = int(c.argmax())
        raise OverflowError(
            f"uuid clock {int(c[i])} (uuid {uuid_mod.UUID(int=int(hi[i]) << 64 | int(lo[i]))}) "
            "does not fit the int64 'clock' column"
        )
    return c.view(np.int64)


def _int64s(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return arr.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _replay(
    offsets: np.ndarray, valid: np.ndarray, hi: np.ndarray, lo: np.ndarray, journal: str, begin: int, end: int
) -> Iterator[Envelope]:
    lo_i = int(np.searchsorted(offsets, begin, side="left"))
    hi_i = int(np.searchsorted(offsets, end, side="left"))
    for i in (np.flatnonzero(valid[lo_i:hi_i]) + lo_i).tolist():
        off = int(offsets[i])
        yield Envelope(journal, off, off + 1, uuid_mod.UUID(int=int(hi[i]) << 64 | int(lo[i])), i)
