"""``readCommitted`` through harvest's own batch data source (the default, ``source="harvest"``).

The driver resolves the read's offsets (:mod:`spark_reader.offsets`) and plans each
topic-partition with anything to read over ``[read_from, end)``: ``read_from`` reaches back to
the oldest span open at the starting checkpoint, ``start`` is the checkpoint's read-through
offset. The ranges go to at most one task per executor core (``tasks``; balanced by records,
:func:`spark_reader.stream_source.group_ranges`: a Python task costs Spark tens of milliseconds
and a consumer ~20 ms, whatever they read). Each task reads its ranges one partition after the
other with one confluent-kafka consumer (:func:`spark_reader.kafka_arrow.iter_ranges`), sequences
each in bounded chunks (:mod:`spark_reader.split_sequencing`, the stream's step) and hands Spark
the committed rows as Arrow, then the journal's end states (:mod:`spark_reader.batch_rows`).
No Spark Kafka source, no shuffle, one Arrow crossing of the payload.

A data source gets string options: the ``kafka.*`` ones pass as they are (Spark redacts the ones
whose names look secret in plans and the UI), the plan as one JSON value.

Invariants:
- a task's rows are a function of its ranges and starting states only (Spark may run it again);
- every partition with anything to read is in exactly one task; a task holds one partition's
  chunk (and open spans) at a time, and hands what a chunk freed back to the OS before the next
  (:mod:`spark_reader.freed_memory`), so its memory does not grow with the partitions it reads;
- a partition with nothing in ``[read_from, end)`` gets no task: its starting states are carried
  into the checkpoint by the driver.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from harvest_outbox.spark_reader import freed_memory
from harvest_outbox.spark_reader.batch_rows import committed_rows, end_rows, full_schema, with_state_fields
from harvest_outbox.spark_reader.kafka_arrow import RAW_SCHEMA, iter_ranges
from harvest_outbox.spark_reader.offsets import ReadRange
from harvest_outbox.spark_reader.split_sequencing import Phases, SplitPlan, SplitSequencer
from harvest_outbox.spark_reader.stream_source import group_ranges, pack_states, unpack_states

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

NAME = "harvest_read_committed_batch"
_SETTINGS = "harvest.batch"
_SEQUENCED_ARROW = pa.schema([*RAW_SCHEMA, ("uuid", pa.binary()), ("ack_offset", pa.int64()), ("clock", pa.int64())])
_FULL_ARROW = with_state_fields(_SEQUENCED_ARROW)


@dataclass(frozen=True)
class BatchSettings:
    plan: SplitPlan
    kafka: dict[str, str]  # Spark-style ``kafka.*`` options
    ranges: list[tuple[int, int, int, int, str]]  # (partition, read_from, start, end, packed states)
    tasks: int | None = None  # at most this many tasks (None: one per partition)

    def options(self) -> dict[str, str]:
        return {
            **self.kafka,
            _SETTINGS: json.dumps({"plan": asdict(self.plan), "ranges": self.ranges, "tasks": self.tasks}),
        }

    @staticmethod
    def parse(options: Mapping[str, str]) -> BatchSettings:
        kafka = {k: v for k, v in options.items() if k.lower().startswith("kafka.")}
        rest = json.loads(options[_SETTINGS])
        return BatchSettings(SplitPlan(**rest["plan"]), kafka, [tuple(r) for r in rest["ranges"]], rest.get("tasks"))

    def __repr__(self) -> str:  # never the Kafka options: they may hold SASL / SSL secrets
        return f"BatchSettings(topic={self.plan.topic!r}, ranges={len(self.ranges)})"


def committed_batch(
    spark: SparkSession, plan: SplitPlan, kafka: Mapping[str, str], rng: ReadRange, tasks: int | None = None
) -> DataFrame:
    """The read's task rows (:func:`batch_rows.full_schema`) as a DataFrame."""
    ranges = []
    for p in sorted(rng.end):
        if rng.read_from[p] < rng.end[p]:
            states = [st for (q, _), st in sorted(rng.states.items()) if q == p]
            ranges.append((p, rng.read_from[p], rng.start[p], rng.end[p], pack_states(states)))
    settings = BatchSettings(plan, dict(kafka), ranges, tasks)
    spark.dataSource.register(CommittedBatchSource)
    return spark.read.format(NAME).options(**settings.options()).load()


class CommittedBatchSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> Any:
        return full_schema()

    def reader(self, schema: Any) -> CommittedBatchReader:
        return CommittedBatchReader(BatchSettings.parse(self.options))


class RangeSplit(InputPartition):
    """One task's topic-partitions: ``(partition, read_from, start, end, packed starting states)``
    each, read ``[read_from, end)`` and emitting from ``start``."""

    def __init__(self, ranges: list[tuple[int, int, int, int, str]]) -> None:
        self.ranges = ranges


class CommittedBatchReader(DataSourceReader):
    def __init__(self, settings: BatchSettings) -> None:
        self.settings = settings

    def partitions(self) -> list[RangeSplit]:
        by_partition = {r[0]: r for r in self.settings.ranges}
        # group_ranges balances (partition, start, end, _) by end - start: here the records read
        keyed: list[tuple[int, int | None, int, str | None]] = [
            (p, read_from, end, None) for p, read_from, _, end, _ in self.settings.ranges
        ]
        return [RangeSplit([by_partition[p] for p, *_ in group]) for group in group_ranges(keyed, self.settings.tasks)]

    def read(self, split: RangeSplit) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        s = self.settings
        phases = Phases()
        ranges = sorted(split.ranges)  # iter_ranges reads them in partition order
        reads = {p: (read_from, end) for p, read_from, _, end, _ in ranges}
        source = _ByPartition(iter_ranges(s.plan.topic, s.kafka, reads, s.plan.read_batch))
        for p, _, start, _, states in ranges:
            seq = SplitSequencer(s.plan, p, start, unpack_states(f"{s.plan.topic}/{p}", states), phases)
            for rows in seq.run(source.batches(p)):
                yield from committed_rows(rows.cast(_SEQUENCED_ARROW)).to_batches()
                del rows
                phases.release += freed_memory.release()
            if seq.records:  # nothing read (control records only): the driver carries the starting states
                yield from end_rows(p, seq.end_states, _FULL_ARROW).to_batches()
        phases.log([r[0] for r in ranges], "batch")


class _ByPartition:
    """:func:`iter_ranges`' ``(partition, batch)`` pairs (one partition after the other) as each
    partition's batches in turn."""

    def __init__(self, pairs: Iterator[tuple[int, pa.RecordBatch]]) -> None:
        self._pairs = pairs
        self._next: tuple[int, pa.RecordBatch] | None = None
        self._started = False

    def batches(self, partition: int) -> Iterator[pa.RecordBatch]:
        if not self._started:
            self._started, self._next = True, next(self._pairs, None)
        while self._next is not None and self._next[0] == partition:
            yield self._next[1]
            self._next = next(self._pairs, None)
