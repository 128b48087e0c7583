"""``readCommitted``: a read-committed batch DataFrame of a topic written with UUID sequencing.

Two ways to read the raw records of exactly the offsets of the read (see :mod:`spark_reader.offsets`):

- ``source="harvest"`` (default): harvest's own batch data source (:mod:`spark_reader.batch_source`):
  one task per topic-partition reads its range with confluent-kafka and sequences it in bounded
  chunks, the payload crossing into the JVM once, as Arrow;
- ``source="spark"``: Spark's Kafka source, for the options only it has (Java-client properties
  such as ``kafka.sasl.jaas.config``, delegation tokens, its own options such as
  ``failOnDataLoss``). It reads each topic-partition's range as one split, in offset order, so each
  Spark task sequences one journal with :func:`spark_reader.sequencing.sequence_partition` via
  ``mapInArrow``. The options that would split a topic-partition across tasks (``minPartitions``,
  ``maxRecordsPerPartition``) are refused.

Either way the partitions run in parallel, the payload is never shuffled, and the read's
checkpoint (the same bytes ``ReadCommittedIter.checkpoint()`` produces, :mod:`spark_reader.batch_rows`)
covers everything up to ``ending``: pass it as ``starting`` of the next read and the two reads
return every committed row exactly once in total.

Invariants:
- rows whose committing ACK lies at or beyond ``ending`` are not in this read; they appear in the
  next read started from this read's checkpoint;
- the checkpoint's offsets are the read's ``ending`` for every partition; its producer states are
  the end states of each journal the read covered (pruned by ``prune_horizon_ns`` by the
  Sequencer itself), plus the starting states of journals with nothing to read;
- both sources return the same rows and checkpoint for the same arguments.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute

from harvest_outbox.sequencer import DEFAULT_PRUNE_HORIZON_NS
from harvest_outbox.spark_reader import offsets as offsets_mod
from harvest_outbox.spark_reader.batch_rows import (
    assemble_checkpoint,
    committed_rows,
    end_rows,
    full_schema,
)
from harvest_outbox.spark_reader.errors import ReaderConfigError
from harvest_outbox.spark_reader.policy import check_policy
from harvest_outbox.spark_reader.schema import OUTPUT_COLUMNS
from harvest_outbox.spark_reader.sequencing import GroupPlan, header_values, sequence_partition
from harvest_outbox.spark_reader.split_sequencing import DEFAULT_CHUNK_RECORDS, SplitPlan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

SOURCES = ("harvest", "spark")
# Options of Spark's Kafka source itself (not ``kafka.*`` client properties) that it honours for a
# batch read; the harvest source has no use for them.
_SPARK_SOURCE_OPTIONS = (
    "failOnDataLoss",
    "kafkaConsumer.pollTimeoutMs",
    "fetchOffset.numRetries",
    "fetchOffset.retryIntervalMs",
    "groupIdPrefix",
    "maxOffsetsPerTrigger",
)
# ``kafka.*`` properties only the Java client understands (librdkafka has its own names for them); and a key
# store, a librdkafka name too but for PKCS#12 only: refused, so that a JKS file is not handed to librdkafka.
_JAVA_ONLY = frozenset({f"kafka.{k}" for k in offsets_mod.JAVA_ONLY} | {"kafka.ssl.keystore.location"})


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
            self._checkpoint = assemble_checkpoint(self.range, rows)
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
    source: str = "harvest",
    chunk_records: int = DEFAULT_CHUNK_RECORDS,
) -> DataFrame:
    """The committed records of ``topic`` from ``starting`` (a checkpoint) up to ``ending``.

    ``value_format`` (``"avro"`` / ``"protobuf"`` / ``"jsonSchema"``, with ``schema_registry={"url": ...}``): values
    decoded from the registry wire format to JSON text, the bytes kept as ``raw_value``
    (:mod:`spark_reader.registry_values`); omitted: values as stored.

    ``source``: ``"harvest"`` (default: harvest's own data source, Kafka read with confluent-kafka in
    the executors) or ``"spark"`` (Spark's Kafka source, for its own options and Java-client
    properties). ``chunk_records`` (harvest source): records a task sequences at a time, which
    bounds its memory (plus the records of spans still open)."""
    df = read_committed(
        spark,
        topic,
        kafka_options,
        starting=starting,
        ending=ending,
        uuid_policy=uuid_policy,
        include_acks=include_acks,
        ring_size=ring_size,
        source=source,
        chunk_records=chunk_records,
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
    source: str = "harvest",
    chunk_records: int = DEFAULT_CHUNK_RECORDS,
) -> CommittedRead:
    """Like :func:`readCommitted`, returning the DataFrame with the read's checkpoint."""
    options = dict(kafka_options or {})
    _check_options(topic, options)
    _check_source(source, options)
    if not isinstance(chunk_records, int) or isinstance(chunk_records, bool) or chunk_records < 1:
        raise ReaderConfigError(
            f"chunk_records={chunk_records!r}: pass a positive int (records a task sequences at a time; "
            f"default {DEFAULT_CHUNK_RECORDS})"
        )
    policy = check_policy(uuid_policy)
    rng = offsets_mod.resolve(topic, options, starting, ending)
    if source == "harvest":
        from harvest_outbox.spark_reader.batch_source import committed_batch

        plan = SplitPlan(
            topic=topic,
            uuid_policy=policy,
            include_acks=include_acks,
            ring_size=ring_size,
            prune_horizon_ns=prune_horizon_ns,
            chunk_records=chunk_records,
        )
        full = committed_batch(spark, plan, options, rng, executor_cores(spark))
    else:
        full = _through_spark_kafka(spark, topic, options, rng, policy, include_acks, ring_size, prune_horizon_ns)
    df = finish_columns(full.where("_kind = 0"), topic)
    return CommittedRead(df=df, range=rng, prune_horizon_ns=prune_horizon_ns, _full=full)


def _through_spark_kafka(
    spark: SparkSession,
    topic: str,
    options: dict[str, str],
    rng: offsets_mod.ReadRange,
    policy: Any,
    include_acks: bool,
    ring_size: int,
    prune_horizon_ns: int,
) -> DataFrame:
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

    return raw.mapInArrow(apply, schema=full_schema())


def executor_cores(spark: Any) -> int | None:
    """The cores tasks run on (Spark's default parallelism): harvest's data sources read a batch or
    micro-batch in at most this many tasks; None where the session has no SparkContext to ask
    (Spark Connect): a task per topic-partition."""
    try:
        cores = int(spark.sparkContext.defaultParallelism)
    except Exception:
        return None
    return cores if cores > 0 else None


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
    then the journal's end states and a sentinel row (:mod:`spark_reader.batch_rows`)."""
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
        rows = committed_rows(rows)
        yield from rows.to_batches()
        yield from end_rows(partition, result.states, rows.schema).to_batches()


def _check_source(source: str, options: Mapping[str, str]) -> None:
    if source not in SOURCES:
        raise ReaderConfigError(
            f"source={source!r}: use 'harvest' (default: harvest's own data source) or 'spark' (Spark's Kafka "
            "source, for its own options and Java-only client properties)"
        )
    if source == "spark":
        refuse_token_callback(options, "source='spark'", "pass source='harvest' (the default)")
        return
    for key in options:
        if key in _JAVA_ONLY:
            raise ReaderConfigError(
                f"kafka_options[{key!r}] is a property of Kafka's Java client, which source='harvest' (the default) "
                "does not use: it reads with librdkafka, which takes e.g. kafka.sasl.username / kafka.sasl.password "
                "and PEM files (kafka.ssl.ca.location). Fix: use librdkafka's properties, or pass source='spark'"
            )
        if not key.lower().startswith("kafka."):
            hint = (
                "an option of Spark's Kafka source" if key in _SPARK_SOURCE_OPTIONS else "not a kafka.* client property"
            )
            raise ReaderConfigError(
                f"kafka_options[{key!r}] is {hint}, which source='harvest' (the default) has no use for. Fix: "
                "remove it, or pass source='spark' to read through Spark's Kafka source"
            )


def refuse_token_callback(options: Mapping[str, str], reader: str, fix: str) -> None:
    """``kafka.oauth_cb`` is harvest's (librdkafka's token callback): Spark's Kafka source, a Java client,
    takes its own (``kafka.sasl.login.callback.handler.class``)."""
    if "kafka.oauth_cb" in options:
        raise ReaderConfigError(
            f"kafka_options['kafka.oauth_cb'] is read by harvest's own data source only; {reader} reads with "
            f"Spark's Kafka source (Kafka's Java client), which takes kafka.sasl.login.callback.handler.class "
            f"and kafka.sasl.jaas.config instead. Fix: {fix}"
        )


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
