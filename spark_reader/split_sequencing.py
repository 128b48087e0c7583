"""Sequencing one topic-partition's offset range in bounded chunks, inside one Spark task.

The sequencing half of harvest's own data sources (batch: :mod:`spark_reader.batch_source`,
stream: :mod:`spark_reader.stream_source`). The task's records arrive as Arrow batches in offset
order (:func:`spark_reader.kafka_arrow.iter_range`); every ``chunk_records`` of them are
sequenced by :func:`spark_reader.sequencing.sequence_partition` (column-wise, one Sequencer over
every producer of the partition), restored from the producer states the previous chunk ended
with. The records from the oldest open span's ``begin`` on are carried into the next chunk, so
open spans are replayed from memory, exactly as a read started from a checkpoint taken at the
chunk's end replays them from Kafka.

Invariants:
- the rows emitted over all chunks, and the end states, are those of one
  :func:`sequence_partition` over the whole range (a checkpoint restores a Sequencer exactly;
  pruning by ``prune_horizon_ns`` happens only at the range's end, as in one pass);
- each chunk's rows leave in log order, not the range's: a row committed in a later chunk (its
  span carried) can lie before rows an earlier chunk emitted (a DataFrame has no order anyway);
- a record below ``start`` is never emitted (it is read only to replay spans open at ``start``);
- memory is bounded by one chunk plus the open spans' records, not by the range's length.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from harvest_outbox.sequencer import ProducerState
from harvest_outbox.spark_reader.kafka_arrow import CHUNK
from harvest_outbox.spark_reader.policy import UUIDPolicyName
from harvest_outbox.spark_reader.schema import SEQUENCED
from harvest_outbox.spark_reader.sequencing import GroupPlan, header_values, sequence_partition

#: Default records per sequencing chunk: large enough that a chunk's fixed cost (restoring the
#: Sequencer, numpy set-up) is noise, small enough that a task's memory stays in the low hundreds
#: of MiB with 1 KiB records.
DEFAULT_CHUNK_RECORDS = 250_000
#: Set in an executor's environment to a folder: each task appends its phase timings there
#: (one JSON line per task; bench/bench_spark_stream.py reads them). Unset: nothing is timed.
PHASE_LOG_ENV = "HARVEST_SPARK_PHASE_LOG"


@dataclass(frozen=True)
class SplitPlan:
    """What a task needs to sequence a topic-partition's range, besides the range itself."""

    topic: str
    uuid_policy: UUIDPolicyName
    include_acks: bool
    ring_size: int
    prune_horizon_ns: int
    chunk_records: int = DEFAULT_CHUNK_RECORDS

    @property
    def read_batch(self) -> int:
        """Records per Arrow batch read from Kafka: a chunk is whole batches."""
        return min(CHUNK, self.chunk_records)


@dataclass
class Phases:
    """Seconds a task spent per phase: reading Kafka (``read``: the consume loop and building the
    Arrow batches; ``first_batch``: the part of it until the first Arrow batch of up to
    ``read_batch`` records: the consumer's connection and first fetches, and reading that batch), ``state`` (the stream's state files), ``sequence``
    (headers, uuids, Sequencer, selecting rows) and ``downstream`` (suspended at ``yield``: Spark taking the rows into the JVM and
    through the rest of the plan, e.g. the sink) and ``release`` (a batch task handing each chunk's freed
    memory back to the OS, :mod:`spark_reader.freed_memory`)."""

    read: float = 0.0
    first_batch: float = 0.0
    state: float = 0.0
    sequence: float = 0.0
    downstream: float = 0.0
    release: float = 0.0
    records: int = 0
    rows: int = 0
    peak_rss_bytes: int = 0
    #: A stream task's partition reads that went on with a kept consumer / moved one by a seek / made a
    #: new one (:mod:`spark_reader.consumer_pool`).
    consumers_reused: int = 0
    consumers_sought: int = 0
    consumers_missed: int = 0
    #: ... and kept consumers of the micro-batch's other partitions advanced to their ends.
    consumers_advanced: int = 0
    started: float = field(default_factory=time.perf_counter)
    wall_start: float = field(default_factory=time.time)

    def log(self, partition: int | list[int], kind: str) -> None:
        folder = os.environ.get(PHASE_LOG_ENV)
        if not folder:
            return
        import json
        import resource

        self.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        line = {
            "kind": kind,
            "pid": os.getpid(),
            "partition": partition,
            "total": time.perf_counter() - self.started,
            "wall_end": time.time(),
            **{k: v for k, v in vars(self).items() if k != "started"},
        }
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a") as out:
            out.write(json.dumps(line) + "\n")


class SplitSequencer:
    """Sequences one partition's records ``[read_from, end)`` (given as batches), emitting the rows
    whose committing offset is at or after ``start`` (None: the first record read). The batches
    come pulled (:meth:`run`) or pushed (:meth:`feed` each, then :meth:`finish`: a task reading
    several partitions with one consumer). After :meth:`run` is exhausted, or :meth:`finish`,
    :attr:`end_states` holds the journal's producer states at ``end`` (the starting states when
    no record was read: nothing changed them)."""

    def __init__(
        self,
        plan: SplitPlan,
        partition: int,
        start: int | None,
        states: list[ProducerState],
        phases: Phases | None = None,
    ) -> None:
        if plan.chunk_records < 1:
            raise ValueError(f"chunk_records={plan.chunk_records!r}: pass a positive int")
        self.plan, self.partition, self.start = plan, partition, start
        self.end_states: list[ProducerState] = list(states)
        self.records = 0
        self.phases = phases or Phases()
        self._carry: pa.Table | None = None  # records of the open spans, from the oldest begin on
        self._pending: list[pa.RecordBatch] = []  # the chunk being gathered
        self._pending_records = 0

    def run(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.Table]:
        """Committed rows (:data:`SEQUENCED` columns), one table per chunk."""
        ph = self.phases
        source = iter(batches)
        while True:
            t = time.perf_counter()
            batch = next(source, None)
            ph.read += time.perf_counter() - t
            if not ph.first_batch:
                ph.first_batch = ph.read
            if batch is None:
                break
            yield from self.feed(batch)
        yield from self.finish()

    def feed(self, batch: pa.RecordBatch) -> Iterator[pa.Table]:
        """The next records of the range (offset order): the rows of a chunk this completes, if any
        (a chunk is sequenced once the next batch shows it is not the range's last)."""
        if self._pending_records >= self.plan.chunk_records:
            pending, self._pending, self._pending_records = self._pending, [], 0
            yield from self._timed(self._step(pending, last=False))
        if batch.num_rows:
            self._pending.append(batch)
            self._pending_records += batch.num_rows

    def finish(self) -> Iterator[pa.Table]:
        """The range's last chunk: after it, :attr:`end_states` are the states at the range's end."""
        pending, self._pending, self._pending_records = self._pending, [], 0
        if pending:
            yield from self._timed(self._step(pending, last=True))

    def _timed(self, tables: Iterator[pa.Table]) -> Iterator[pa.Table]:
        ph = self.phases
        while True:
            t = time.perf_counter()
            table = next(tables, None)
            ph.sequence += time.perf_counter() - t
            if table is None:
                return
            ph.rows += table.num_rows
            t = time.perf_counter()
            yield table
            ph.downstream += time.perf_counter() - t

    def _step(self, pending: list[pa.RecordBatch], last: bool) -> Iterator[pa.Table]:
        fresh = pa.Table.from_batches(pending)
        self.records += fresh.num_rows
        self.phases.records += fresh.num_rows  # a task's Phases may be shared by several partitions
        first_fresh = int(fresh.column("offset")[0].as_py())
        if self.start is None:
            self.start = first_fresh
        table = fresh if self._carry is None else pa.concat_tables([self._carry, fresh])
        p = self.partition
        plan = GroupPlan(
            topic=self.plan.topic,
            # carried rows were sequenced by an earlier chunk: only replayed now, never emitted
            start={p: max(self.start, first_fresh)},
            states={(p, st.producer): st for st in self.end_states},
            uuid_policy=self.plan.uuid_policy,
            include_acks=self.plan.include_acks,
            ring_size=self.plan.ring_size,
        )
        with_uuid = table.append_column("uuid", header_values(table.column("headers"), "uuid"))
        out, result = sequence_partition(with_uuid, plan, self.plan.prune_horizon_ns if last else 0)
        self.end_states = result.states
        begins = [st.begin for st in result.states if st.begin >= 0]
        self._carry = None
        if begins and not last:
            offsets = table.column("offset").to_numpy()
            self._carry = table.slice(int(np.searchsorted(offsets, min(begins), side="left")))
        if out.num_rows:
            yield out.select(SEQUENCED.fieldNames())
