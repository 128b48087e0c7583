"""``readCommitted``: a read-committed batch DataFrame of a topic written with UUID sequencing.

Raw records come from Spark's own Kafka source over exactly the offsets of the read (see
:mod:`spark_reader.offsets`). That source reads each topic-partition's range as one split, in
offset order, so each Spark task sequences one journal (all its producers, Gazette's per-producer
state machines) with :func:`spark_reader.sequencing.sequence_partition` via ``mapInArrow``: the
partitions run in parallel and the payload is never shuffled. The options that would split a
topic-partition across tasks (``minPartitions``, ``maxRecordsPerPartition``) are refused. The read's checkpoint (the same bytes
``ReadCommittedIter.checkpoint()`` produces) covers everything up to ``ending``: pass it as
``starting`` of the next read and the two reads return every committed row exactly once in total.

Invariants:
- rows whose committing ACK lies at or beyond ``ending`` are not in this read; they appear in the
  next read started from this read's checkpoint;
- the checkpoint's offsets are the read's ``ending`` for every partition; its producer states are
  the end states of each journal the read covered (pruned by ``prune_horizon_ns`` by the
  Sequencer itself), plus the starting states of journals with nothing to read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute

from harvest_outbox.sequencer import DEFAULT_PRUNE_HORIZON_NS, ProducerState, encode_checkpoint
from harvest_outbox.spark_reader import offsets as offsets_mod
from harvest_outbox.spark_reader.errors import ReaderConfigError
from harvest_outbox.spark_reader.policy import check_policy
from harvest_outbox.spark_reader.schema import OUTPUT_COLUMNS, SEQUENCED
from harvest_outbox.spark_reader.sequencing import GroupPlan, header_values, sequence_partition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

_STATE_FIELDS = ("_kind", "_state_last_ack", "_state_begin")
# _kind: 0 = a committed row, 1 = a producer state at the end of the read, 2 = "this partition was
# read" (so its starting states, possibly all pruned, are not carried over).


@dataclass
class CommittedRead:
    """A batch read: ``df`` (lazy) and, on demand, the checkpoint for the read's ``ending``."""

    df: DataFrame
    range: offsets_mod.ReadRange
    prune_horizon_ns: int
    _full: DataFrame = field(repr=False)
    _checkpoint: bytes | None = field(default=None, repr=False)

    @property
    def ending(self) -> dict[int, int]:
        return dict(self.range.end)

    def checkpoint(self) -> bytes:
        """Checkpoint bytes for ``ending`` (runs a Spark job the first time)."""
        if self._checkpoint is None:
            rows = (
                self._full.where("_kind > 0")
                .select("_kind", "partition", "_state_producer", "_state_last_ack", "_state_begin")
                .collect()
            )
            self._checkpoint = _assemble_checkpoint(self.range, rows, self.prune_horizon_ns)
        return self._checkpoint


def readCommitted(
    spark: SparkSession,
    topic: str,
    kafka_options: Mapping[str, str] | None = None,
    *,
    starting: bytes | None = None,
    ending: str | Mapping[int, int] = "latest",
    uuid_policy: str = "deliver",
    include_acks: bool = False,
    ring_size: int = 8192,
    value_format: str | None = None,
    schema_registry: Mapping[str, Any] | None = None,
) -> DataFrame:
    """The committed records of ``topic`` from ``starting`` (a checkpoint) up to ``ending``.

    ``value_format`` (``"avro"`` / ``"protobuf"`` / ``"jsonSchema"``, with ``schema_registry={"url": ...}``): values
    decoded from the registry wire format to JSON text, the bytes kept as ``raw_value``
    (:mod:`spark_reader.registry_values`); omitted: values as stored."""
    df = read_committed(
        spark,
        topic,
        kafka_options,
        starting=starting,
        ending=ending,
        uuid_policy=uuid_policy,
        include_acks=include_acks,
        ring_size=ring_size,
    ).df
    if value_format is None:
        return df
    from harvest_outbox.spark_reader.registry_values import decode_values

    return decode_values(df, value_format, schema_registry or {})


def read_committed(
    spark: SparkSession,
    topic: str,
    kafka_options: Mapping[str, str] | None = None,
    *,
    starting: bytes | None = None,
    ending: str | Mapping[int, int] = "latest",
    uuid_policy: str = "deliver",
    include_acks: bool = False,
    ring_size: int = 8192,
    prune_horizon_ns: int = DEFAULT_PRUNE_HORIZON_NS,
) -> CommittedRead:
    """Like :func:`readCommitted`, returning the DataFrame with the read's checkpoint."""
    options = dict(kafka_options or {})
    _check_options(topic, options)
    policy = check_policy(uuid_policy)
    rng = offsets_mod.resolve(topic, options, starting, ending)
    plan = GroupPlan(
        topic=topic,
        start=rng.start,
        states=rng.states,
        uuid_policy=policy,
        include_acks=include_acks,
        ring_size=ring_size,
    )

    raw = (
        spark.read.format("kafka")
        .options(**options)
        .option("assign", _assign_json(topic, rng.read_from))
        .option("startingOffsets", _offsets_json(topic, rng.read_from))
        .option("endingOffsets", _offsets_json(topic, rng.end))
        .option("includeHeaders", "true")
        .load()
    )
    # Only what the output needs crosses into Python and back (mapInArrow is opaque to column
    # pruning): topic is a constant and producer is part of uuid, both added back afterwards. The
    # uuid header is picked out of the headers in Python (sequencing.header_values): Spark's
    # element_at(filter(headers, ...)) before mapInArrow cost more than all of the Python side.
    raw = raw.select("key", "value", "headers", "partition", "offset", "timestamp")

    def apply(batches: Any) -> Any:
        yield from _sequence_partitions(batches, plan, prune_horizon_ns)

    full = raw.mapInArrow(apply, schema=_full_schema())
    df = finish_columns(full.where("_kind = 0"), topic)
    return CommittedRead(df=df, range=rng, prune_horizon_ns=prune_horizon_ns, _full=full)


def finish_columns(sequenced_rows: DataFrame, topic: str) -> DataFrame:
    """Rows of the sequencing step (:data:`spark_reader.schema.SEQUENCED`: raw ``uuid`` bytes, no
    topic) -> the reader's output columns: ``topic`` and ``producer`` added back, ``uuid`` as text
    (both null for records delivered without a valid uuid, whose clock is 0)."""
    from pyspark.sql import functions as F

    hexed = F.lower(F.hex("uuid"))
    sequenced = F.col("clock") != 0
    return (
        sequenced_rows.withColumn("topic", F.lit(topic))
        .withColumn("producer", F.when(sequenced, F.substring("uuid", 11, 6)))
        .withColumn(
            "uuid",
            F.when(
                sequenced,
                F.concat_ws(
                    "-",
                    F.substring(hexed, 1, 8),
                    F.substring(hexed, 9, 4),
                    F.substring(hexed, 13, 4),
                    F.substring(hexed, 17, 4),
                    F.substring(hexed, 21, 12),
                ),
            ),
        )
        .select(*OUTPUT_COLUMNS)
    )


def _sequence_partitions(batches: Any, plan: GroupPlan, prune_horizon_ns: int) -> Iterator[Any]:
    """One Spark task: its record batches (normally all of one topic-partition) -> committed rows,
    then the journal's end states and a sentinel row."""
    batches = list(batches)
    if not batches:
        return  # an empty range: the driver carries this journal's starting states over
    table = pa.Table.from_batches(batches)
    if table.num_rows == 0:
        return
    table = table.append_column("uuid", header_values(table.column("headers"), "uuid"))
    partitions = pa.compute.unique(table.column("partition")).to_pylist()
    for partition in partitions:
        part = table if len(partitions) == 1 else table.filter(pa.compute.equal(table.column("partition"), partition))
        rows, result = sequence_partition(part, plan, prune_horizon_ns)
        n = rows.num_rows
        rows = rows.append_column("_kind", pa.array(np.zeros(n, np.int8)))
        rows = rows.append_column("_state_producer", pa.nulls(n, pa.binary()))
        for name in _STATE_FIELDS[1:]:
            rows = rows.append_column(name, pa.nulls(n, pa.int64()))
        extra: dict[str, list[Any]] = {name: [] for name in rows.column_names}
        for st in result.states:
            for name in rows.column_names:
                extra[name].append(None)
            extra["partition"][-1], extra["_state_producer"][-1], extra["_kind"][-1] = partition, st.producer, 1
            extra["_state_last_ack"][-1], extra["_state_begin"][-1] = st.last_ack, st.begin
        for name in rows.column_names:
            extra[name].append(None)
        extra["partition"][-1], extra["_kind"][-1] = partition, 2
        yield from pa.concat_tables([rows, pa.Table.from_pydict(extra, schema=rows.schema)]).to_batches()


def _full_schema() -> Any:
    from pyspark.sql.types import BinaryType, ByteType, LongType, StructField, StructType

    return StructType(
        [
            *SEQUENCED.fields,
            StructField("_kind", ByteType()),
            StructField("_state_producer", BinaryType()),
            *(StructField(n, LongType()) for n in _STATE_FIELDS[1:]),
        ]
    )


def _assemble_checkpoint(rng: offsets_mod.ReadRange, rows: list, horizon_ns: int) -> bytes:
    read = {int(row["partition"]) for row in rows if row["_kind"] == 2}
    states: dict[tuple[int, bytes], ProducerState] = {
        key: st
        for key, st in rng.states.items()
        if key[0] not in read  # journals with nothing to read
    }
    for row in rows:
        if row["_kind"] == 1:
            key = (int(row["partition"]), bytes(row["_state_producer"]))
            states[key] = ProducerState(
                f"{rng.topic}/{key[0]}", key[1], int(row["_state_last_ack"]), int(row["_state_begin"])
            )
    kept = [st for _, st in sorted(states.items())]
    offsets = {f"{rng.topic}/{p}": o for p, o in rng.end.items()}
    offsets.update(rng.foreign_offsets)
    return encode_checkpoint(offsets, kept + list(rng.foreign_states))


def _check_options(topic: str, options: dict[str, str]) -> None:
    if not topic or not isinstance(topic, str):
        raise ReaderConfigError(f"topic={topic!r}: pass the name of one Kafka topic")
    for owned in (
        "subscribe",
        "subscribePattern",
        "assign",
        "startingOffsets",
        "endingOffsets",
        "startingOffsetsByTimestamp",
        "endingOffsetsByTimestamp",
        "includeHeaders",
        "minPartitions",
        "maxRecordsPerPartition",
    ):
        if owned in options:
            raise ReaderConfigError(
                f"kafka_options[{owned!r}] is set by readCommitted itself; remove it (use topic=, "
                "starting= (a checkpoint) and ending= instead)"
            )
    offsets_mod.client_config(options)  # validates kafka.bootstrap.servers


def _assign_json(topic: str, partitions: Mapping[int, int]) -> str:
    import json

    return json.dumps({topic: sorted(partitions)})


def _offsets_json(topic: str, offsets: Mapping[int, int]) -> str:
    import json

    return json.dumps({topic: {str(p): o for p, o in sorted(offsets.items())}})
