"""``readCommittedStream(..., state_location=...)``: the read-committed stream as a PySpark data
source that reads Kafka itself.

Each micro-batch's task for a topic-partition reads the partition's new offsets with
confluent-kafka inside the executor, builds Arrow columns, and sequences them with
:func:`spark_reader.sequencing.sequence_partition` (the batch reader's step: one Sequencer over
every producer of the partition), starting from the producer states the previous micro-batch's
task stored (:mod:`spark_reader.stream_state`). Records cross from Python to the JVM once, as
Arrow; there is no Spark Kafka source, no shuffle and no state store. The task reads from the
oldest open span's ``begin`` (as the batch reader does from a checkpoint), so spans still open at
the end of a micro-batch are replayed from Kafka, not kept in state.

Offsets (Spark's offset log): ``{"run": <id>, "offsets": {partition: next offset}}``. ``run`` is
chosen when the query first starts and names its state files. The initial offset also carries the
starting checkpoint's producer states (``"initial"``), so that no state file is written before a
micro-batch runs (Spark may ask a restarted query for its initial offset again).

Invariants:
- a row is emitted once, in the micro-batch whose range holds its committing ACK (or itself, if
  OUTSIDE), whatever failures and restarts happen in between: a micro-batch's output is a function
  of its offsets and the states stored at its start, both fixed before it runs (Spark's offset
  log, state files written once per offset);
- the states of ``(partition, end)`` are stored before the task hands Spark any row of the range,
  and files are deleted only below committed offsets;
- records before a micro-batch's start are read only to replay open spans; they are never emitted.
"""

from __future__ import annotations

import base64
import json
import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import msgpack
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from harvest_outbox.sequencer import ProducerState
from harvest_outbox.spark_reader import offsets as offsets_mod
from harvest_outbox.spark_reader.errors import SparkReaderError
from harvest_outbox.spark_reader.policy import UUIDPolicyName
from harvest_outbox.spark_reader.schema import SEQUENCED
from harvest_outbox.spark_reader.sequencing import GroupPlan, header_values, sequence_partition
from harvest_outbox.spark_reader.stream_state import StreamStateFiles

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

NAME = "harvest_read_committed"
_GROUP = "harvest-spark-stream"  # never joined: partitions are assigned and offsets never committed
_CHUNK = 65536  # records per Arrow chunk while reading (bounds the Python lists)
_STALL_SECONDS = 60.0  # no record and no position change for this long: fail the task, say where
_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
_TIMESTAMP = pa.timestamp("us", tz="UTC")


@dataclass(frozen=True)
class SourceSettings:
    """What the driver and every task need. A data source gets string options: the ``kafka.*``
    ones pass as they are (Spark redacts options whose names look secret, such as
    ``kafka.sasl.password``, in plans and the UI), the rest as one JSON value."""

    topic: str
    kafka: dict[str, str]  # Spark-style ``kafka.*`` options
    state_location: str
    uuid_policy: UUIDPolicyName
    include_acks: bool
    ring_size: int
    prune_horizon_ns: int
    max_offsets_per_trigger: int | None
    starting: str | None  # base64 of a checkpoint

    def options(self) -> dict[str, str]:
        rest = {k: v for k, v in asdict(self).items() if k != "kafka"}
        return {**self.kafka, _SETTINGS: json.dumps(rest)}

    @staticmethod
    def parse(options: Mapping[str, str]) -> SourceSettings:
        kafka = {k: v for k, v in options.items() if k.lower().startswith("kafka.")}
        # Spark hands a data source its options with case-insensitive keys (lower-cased): librdkafka's
        # property names are lower case, so only the prefix needs care.
        return SourceSettings(kafka=kafka, **json.loads(options[_SETTINGS]))

    def __repr__(self) -> str:  # never the Kafka options: they may hold SASL / SSL secrets
        return f"SourceSettings(topic={self.topic!r}, state_location={self.state_location!r})"


_SETTINGS = "harvest.settings"


def committed_stream(spark: SparkSession, settings: SourceSettings) -> DataFrame:
    """The raw sequenced rows (:data:`spark_reader.schema.SEQUENCED`) as a streaming DataFrame."""
    spark.dataSource.register(CommittedStreamSource)
    return spark.readStream.format(NAME).options(**settings.options()).load()


class CommittedStreamSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> Any:
        return SEQUENCED

    def streamReader(self, schema: Any) -> CommittedStreamReader:
        return CommittedStreamReader(SourceSettings.parse(self.options))


class KafkaSplit(InputPartition):
    """One topic-partition's offsets ``[start, end)`` of a micro-batch; ``start`` None: a partition
    the query has not seen before, read from its first record with no state. ``initial``: the
    producer states at ``start`` (packed) when the micro-batch starts at the query's initial
    offset; otherwise they are in the state files."""

    def __init__(self, run: str, partition: int, start: int | None, end: int, initial: str | None) -> None:
        self.run, self.partition, self.start, self.end, self.initial = run, partition, start, end, initial


class CommittedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, settings: SourceSettings) -> None:
        self.settings = settings
        self.target: dict[int, int] | None = None  # availableNow: the high watermarks when it began

    # -- driver side: offsets -----------------------------------------------------------------
    def initialOffset(self) -> dict[str, Any]:
        s = self.settings
        starting = base64.b64decode(s.starting) if s.starting else None
        rng = offsets_mod.resolve(s.topic, s.kafka, starting, "latest")
        by_partition: dict[int, list[ProducerState]] = {p: [] for p in rng.start}
        for (p, _), st in sorted(rng.states.items()):
            by_partition.setdefault(p, []).append(st)
        return {
            "run": StreamStateFiles.new_run(),
            "offsets": {str(p): o for p, o in sorted(rng.start.items())},
            "initial": {str(p): pack_states(sts) for p, sts in sorted(by_partition.items())},
        }

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {p: high for p, (_, high) in _watermarks(self.settings).items()}

    def getDefaultReadLimit(self) -> Any:
        n = self.settings.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
        _check_offsets(start)
        marks = _watermarks(self.settings)
        known = {int(p): o for p, o in start["offsets"].items()}
        high = {p: (self.target.get(p, lo) if self.target is not None else h) for p, (lo, h) in marks.items()}
        begin = {p: known.get(p, marks[p][0]) for p in high}
        available = {p: max(0, high[p] - begin[p]) for p in high}
        total = sum(available.values())
        end = dict(begin)
        if isinstance(limit, ReadMaxRows) and total > limit.max_rows:
            # Spread the limit over the partitions in proportion to what each has waiting (as
            # Spark's Kafka source does), at least one offset for a partition with any.
            for p, n in available.items():
                end[p] = begin[p] + (min(n, max(1, math.floor(limit.max_rows * n / total))) if n else 0)
        else:
            end = {p: max(begin[p], high[p]) for p in high}
        offsets = {str(p): o for p, o in sorted({**known, **end}.items())}
        return {"run": start["run"], "offsets": offsets}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[KafkaSplit]:
        _check_offsets(start)
        _check_offsets(end)
        before, initial = start["offsets"], start.get("initial", {})
        splits = []
        for p, stop in end["offsets"].items():
            first = before.get(p)
            if first is None or stop > first:
                splits.append(KafkaSplit(end["run"], int(p), first, stop, initial.get(p)))
            elif p in initial:  # nothing to read yet: the next micro-batch finds the states stored
                StreamStateFiles(self.settings.state_location, end["run"]).put(
                    int(p), first, unpack_states(f"{self.settings.topic}/{p}", initial[p])
                )
        return splits

    def commit(self, end: dict[str, Any]) -> None:
        files = StreamStateFiles(self.settings.state_location, end["run"])
        for p, offset in end["offsets"].items():
            files.prune(int(p), offset)

    # -- executor side: read, sequence, store ---------------------------------------------------
    # (Spark hands back the partitions partitions() made: KafkaSplits)
    def read(self, split: KafkaSplit) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        s = self.settings
        files = StreamStateFiles(s.state_location, split.run)
        p = split.partition
        if split.initial is not None:
            states = unpack_states(f"{s.topic}/{p}", split.initial)
        elif split.start is not None:
            states = files.get(s.topic, p, split.start)
        else:
            states = []
        begins = [st.begin for st in states if st.begin >= 0]
        read_from = min([split.start, *begins]) if split.start is not None else None
        table = _read_range(s, p, read_from, split.end)
        if table.num_rows == 0:
            files.put(p, split.end, states)
            return
        start = split.start if split.start is not None else int(table.column("offset")[0].as_py())
        table = table.append_column("uuid", header_values(table.column("headers"), "uuid"))
        plan = GroupPlan(
            topic=s.topic,
            start={p: start},
            states={(p, st.producer): st for st in states},
            uuid_policy=s.uuid_policy,
            include_acks=s.include_acks,
            ring_size=s.ring_size,
        )
        out, result = sequence_partition(table, plan, s.prune_horizon_ns)
        files.put(p, split.end, result.states)
        yield from out.select(SEQUENCED.fieldNames()).to_batches()


def _check_offsets(offsets: Any) -> None:
    """Offsets from the query's checkpoint must be this source's: a query started without
    ``state_location`` logged Spark's Kafka source offsets (``{topic: {partition: offset}}``)."""
    if not (
        isinstance(offsets, dict) and isinstance(offsets.get("run"), str) and isinstance(offsets.get("offsets"), dict)
    ):
        raise SparkReaderError(
            f"the query's checkpoint holds offsets this source did not write ({str(offsets)[:200]}): it was "
            "started by readCommittedStream without state_location (Spark's Kafka source), and a checkpoint "
            "cannot change its source. Fix: keep state_location=None for this checkpoint, or start a new query "
            "(new checkpointLocation) with state_location= and starting= a checkpoint of where the old one "
            "ended (e.g. read_committed's)"
        )


def pack_states(states: list[ProducerState]) -> str:
    return base64.b64encode(msgpack.packb([[st.producer, st.last_ack, st.begin] for st in states])).decode()


def unpack_states(journal: str, packed: str) -> list[ProducerState]:
    return [
        ProducerState(journal, bytes(p), int(last_ack), int(begin))
        for p, last_ack, begin in msgpack.unpackb(base64.b64decode(packed))
    ]


def _consumer(settings: SourceSettings) -> Any:
    from confluent_kafka import Consumer

    conf: dict[str, Any] = {
        "isolation.level": "read_uncommitted",  # as Spark's Kafka source
        **offsets_mod.client_config(settings.kafka),
        "group.id": _GROUP,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    conf.setdefault("fetch.max.bytes", 64 << 20)
    conf.setdefault("max.partition.fetch.bytes", 16 << 20)
    return Consumer(conf)


def _watermarks(settings: SourceSettings) -> dict[int, tuple[int, int]]:
    from confluent_kafka import TopicPartition

    consumer = _consumer(settings)
    try:
        meta = consumer.list_topics(settings.topic, timeout=30).topics.get(settings.topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise SparkReaderError(
                f"topic {settings.topic!r} does not exist or has no partitions ({meta.error if meta else 'unknown'})"
            )
        return {
            p: consumer.get_watermark_offsets(TopicPartition(settings.topic, p), timeout=30)
            for p in sorted(meta.partitions)
        }
    finally:
        consumer.close()


def _read_range(settings: SourceSettings, partition: int, read_from: int | None, end: int) -> pa.Table:
    """The partition's records from ``read_from`` (None: its first) up to ``end``, as Arrow."""
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

    topic = settings.topic
    consumer = _consumer(settings)
    chunks: list[pa.RecordBatch] = []
    position = read_from if read_from is not None else -1
    try:
        consumer.assign([TopicPartition(topic, partition, read_from if read_from is not None else OFFSET_BEGINNING)])
        keys: list[Any] = []
        values: list[Any] = []
        headers: list[Any] = []
        offsets: list[int] = []
        stamps: list[int] = []
        stalled_since = time.monotonic()
        while position < end:
            want = min(_CHUNK - len(offsets), end - position) if position >= 0 else _CHUNK - len(offsets)
            got = False
            for msg in consumer.consume(max(1, want), 1.0):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise SparkReaderError(f"reading {topic}/{partition} at offset {position}: {err.str()}")
                offset = msg.offset()
                if offset >= end:
                    position = end
                    break
                keys.append(msg.key())
                values.append(msg.value())
                headers.append(msg.headers())
                offsets.append(offset)
                stamps.append(msg.timestamp()[1])
                position, got = offset + 1, True
            if len(offsets) >= _CHUNK:
                chunks.append(_batch(partition, keys, values, headers, offsets, stamps))
                keys, values, headers, offsets, stamps = [], [], [], [], []
            if got:
                stalled_since = time.monotonic()
                continue
            # Nothing returned: past the end already (control records, compaction gaps)?
            now_at = consumer.position([TopicPartition(topic, partition)])[0].offset
            if now_at >= 0 and now_at >= end:
                break
            if time.monotonic() - stalled_since > _STALL_SECONDS:
                raise SparkReaderError(
                    f"reading {topic}/{partition}: no record for {_STALL_SECONDS:.0f}s at offset {position} "
                    f"(range ends at {end}); the broker is unreachable or the records were deleted "
                    "(retention, or an unclean leader election truncated the partition)"
                )
        if offsets:
            chunks.append(_batch(partition, keys, values, headers, offsets, stamps))
    finally:
        consumer.close()
    if not chunks:
        return pa.Table.from_batches([], schema=_RAW_SCHEMA)
    return pa.Table.from_batches(chunks)


_RAW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", _HEADERS),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", _TIMESTAMP),
    ]
)


def _batch(
    partition: int, keys: list[Any], values: list[Any], headers: list[Any], offsets: list[int], stamps: list[int]
) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array(headers, _HEADERS),
            pa.array([partition] * len(offsets), pa.int32()),
            pa.array(offsets, pa.int64()),
            pa.array(stamps, pa.int64()).cast(pa.timestamp("ms")).cast(_TIMESTAMP),
        ],
        schema=_RAW_SCHEMA,
    )
