"""``readCommitted`` through harvest's own batch data source (the default, ``source="harvest"``).

The driver resolves the read's offsets (:mod:`spark_reader.offsets`) and plans one task per
topic-partition with anything to read, over ``[read_from, end)``: ``read_from`` reaches back to
the oldest span open at the starting checkpoint, ``start`` is the checkpoint's read-through
offset. Each task reads its range with confluent-kafka (:mod:`spark_reader.kafka_arrow`),
sequences it in bounded chunks (:mod:`spark_reader.split_sequencing`, the stream's step) and hands
Spark the committed rows as Arrow, then the journal's end states (:mod:`spark_reader.batch_rows`).
No Spark Kafka source, no shuffle, one Arrow crossing of the payload.

A data source gets string options: the ``kafka.*`` ones pass as they are (Spark redacts the ones
whose names look secret in plans and the UI), the plan as one JSON value.

Invariants:
- a task's rows are a function of its range and starting states only (Spark may run it again);
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

from harvest_outbox.spark_reader.batch_rows import committed_rows, end_rows, full_schema, with_state_fields
from harvest_outbox.spark_reader.kafka_arrow import RAW_SCHEMA, iter_range
from harvest_outbox.spark_reader.offsets import ReadRange
from harvest_outbox.spark_reader.split_sequencing import SplitPlan, SplitSequencer
from harvest_outbox.spark_reader.stream_source import pack_states, unpack_states

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

    def options(self) -> dict[str, str]:
        return {**self.kafka, _SETTINGS: json.dumps({"plan": asdict(self.plan), "ranges": self.ranges})}

    @staticmethod
    def parse(options: Mapping[str, str]) -> BatchSettings:
        kafka = {k: v for k, v in options.items() if k.lower().startswith("kafka.")}
        rest = json.loads(options[_SETTINGS])
        return BatchSettings(SplitPlan(**rest["plan"]), kafka, [tuple(r) for r in rest["ranges"]])

    def __repr__(self) -> str:  # never the Kafka options: they may hold SASL / SSL secrets
        return f"BatchSettings(topic={self.plan.topic!r}, ranges={len(self.ranges)})"


def committed_batch(spark: SparkSession, plan: SplitPlan, kafka: Mapping[str, str], rng: ReadRange) -> DataFrame:
    """The read's task rows (:func:`batch_rows.full_schema`) as a DataFrame."""
    ranges = []
    for p in sorted(rng.end):
        if rng.read_from[p] < rng.end[p]:
            states = [st for (q, _), st in sorted(rng.states.items()) if q == p]
            ranges.append((p, rng.read_from[p], rng.start[p], rng.end[p], pack_states(states)))
    settings = BatchSettings(plan, dict(kafka), ranges)
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
    """One topic-partition's ``[read_from, end)``, emitting from ``start``, with its starting states."""

    def __init__(self, partition: int, read_from: int, start: int, end: int, states: str) -> None:
        self.partition, self.read_from, self.start, self.end, self.states = partition, read_from, start, end, states


class CommittedBatchReader(DataSourceReader):
    def __init__(self, settings: BatchSettings) -> None:
        self.settings = settings

    def partitions(self) -> list[RangeSplit]:
        return [RangeSplit(*r) for r in self.settings.ranges]

    def read(self, split: RangeSplit) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        s = self.settings
        p = split.partition
        seq = SplitSequencer(s.plan, p, split.start, unpack_states(f"{s.plan.topic}/{p}", split.states))
        batches = iter_range(s.plan.topic, s.kafka, p, split.read_from, split.end, s.plan.read_batch)
        for rows in seq.run(batches):
            yield from committed_rows(rows.cast(_SEQUENCED_ARROW)).to_batches()
        if seq.records:  # nothing read (control records only): the driver carries the starting states
            yield from end_rows(p, seq.end_states, _FULL_ARROW).to_batches()
        seq.phases.log(p, "batch")
