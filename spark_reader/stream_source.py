"""``readCommittedStream(..., state_location=...)``: the read-committed stream as a PySpark data
source that reads Kafka itself.

A micro-batch runs at most one task per executor core (``tasks``, the cores when the stream was
defined; a task per partition where Spark cannot tell), each over whole topic-partitions, balanced
by records (:func:`group_ranges`): a Python task costs Spark tens of milliseconds however little it
reads, and a Kafka consumer ~20 ms, so a task per partition spent more on that than on reading
small micro-batches. A task reads its partitions' new offsets with confluent-kafka inside the
executor (:func:`spark_reader.kafka_arrow.iter_ranges`: one partition after the other, each with the
consumer its Python worker kept from an earlier micro-batch when it has one,
:mod:`spark_reader.consumer_pool`) and
sequences each partition in bounded chunks (:mod:`spark_reader.split_sequencing`, the batch
reader's step: one Sequencer over every producer of the partition), starting from the producer
states the previous micro-batch's task stored (:mod:`spark_reader.stream_state`). Records cross
from Python to the JVM once, as Arrow; there is no Spark Kafka source, no shuffle and no state
store. Each partition is read from its oldest open span's ``begin`` (as the batch reader does from
a checkpoint), so spans still open at the end of a micro-batch are replayed from Kafka, not kept
in state. The driver keeps one consumer for the topic's watermarks for the query's life.

Offsets (Spark's offset log): ``{"run": <id>, "offsets": {partition: next offset}}``. ``run`` is
chosen when the query first starts and names its state files. The initial offset also carries the
starting checkpoint's producer states (``"initial"``), so that no state file is written before a
micro-batch runs (Spark may ask a restarted query for its initial offset again).

Invariants:
- a row is emitted once, in the micro-batch whose range holds its committing ACK (or itself, if
  OUTSIDE), whatever failures and restarts happen in between: a micro-batch's output is a function
  of its offsets and the states stored at its start, both fixed before it runs (Spark's offset
  log, state files written once per offset);
- the states of ``(partition, end)`` are stored before the task hands Spark any row of its ranges
  (so a task whose output Spark stops taking early has stored them too; the committed rows of a
  task's ranges are held until then: memory is bounded by the micro-batch), and files are
  deleted only below committed offsets;
- every partition with new offsets is in exactly one task of the micro-batch;
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

from harvest_outbox.kafka_access import AccessWatch
from harvest_outbox.sequencer import ProducerState
from harvest_outbox.spark_reader import offsets as offsets_mod
from harvest_outbox.spark_reader.consumer_pool import ADVANCE_BEHIND, WORKER_POOL
from harvest_outbox.spark_reader.errors import SparkReaderError
from harvest_outbox.spark_reader.kafka_arrow import iter_ranges, watermarks
from harvest_outbox.spark_reader.policy import UUIDPolicyName
from harvest_outbox.spark_reader.schema import SEQUENCED
from harvest_outbox.spark_reader.split_sequencing import Phases, SplitPlan, SplitSequencer
from harvest_outbox.spark_reader.stream_state import StreamStateFiles

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

NAME = "harvest_read_committed"


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
    # Tasks per micro-batch (the executors' cores when the stream was defined): each reads several
    # partitions with one consumer. None: a task per partition.
    tasks: int | None = None

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

    def split_plan(self) -> SplitPlan:
        return SplitPlan(
            topic=self.topic,
            uuid_policy=self.uuid_policy,
            include_acks=self.include_acks,
            ring_size=self.ring_size,
            prune_horizon_ns=self.prune_horizon_ns,
        )


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
    """One task's share of a micro-batch: topic-partitions' offsets ``[start, end)`` as
    ``(partition, start, end, initial)``. ``start`` None: a partition the query has not seen
    before, read from its first record with no state. ``initial``: the producer states at
    ``start`` (packed) when the micro-batch starts at the query's initial offset; otherwise they
    are in the state files."""

    def __init__(
        self, run: str, ranges: list[tuple[int, int | None, int, str | None]], others: dict[int, int] | None = None
    ) -> None:
        self.run, self.ranges = run, ranges
        #: The micro-batch's other partitions (read by other tasks) and their end offsets: the task
        #: advances its worker's kept consumers of them (:meth:`ConsumerPool.advance`).
        self.others = others or {}


#: How much more than the largest-first fill's heaviest group the round-robin deal's may hold and
#: still be taken (it keeps a partition in the same task index from one micro-batch to the next).
_DEALT_SLACK = 1.05


def group_ranges(
    ranges: list[tuple[int, int | None, int, str | None]], tasks: int | None
) -> list[list[tuple[int, int | None, int, str | None]]]:
    """The micro-batch's partition ranges in at most ``tasks`` groups (None: one per partition) of
    about equal records; each group in partition order, the groups in the order of their first
    partition. A Python task costs Spark tens of milliseconds whatever it reads, and a consumer
    ~20 ms: a micro-batch of 8 partitions on 2 cores reads faster as 2 tasks of 4 partitions than as 8.

    The partitions are dealt round-robin (the i-th partition in order to group ``i % tasks``) when
    that is about as balanced as filling the least loaded group largest first, so a stream whose
    partitions get equal shares reads each partition in the same task index every micro-batch: a
    Python worker that ran that index before goes on with the consumers it kept
    (:mod:`spark_reader.consumer_pool`), where the largest-first fill reshuffled the groups whenever
    one partition's range came out a record longer."""
    if tasks is None or tasks >= len(ranges):
        return [[r] for r in ranges]
    n = max(1, tasks)

    def size(r: tuple[int, int | None, int, str | None]) -> int:
        return r[2] - (r[1] or 0)

    dealt: list[list[tuple[int, int | None, int, str | None]]] = [[] for _ in range(n)]
    for i, r in enumerate(sorted(ranges)):
        dealt[i % n].append(r)
    filled: list[list[tuple[int, int | None, int, str | None]]] = [[] for _ in range(n)]
    load = [0] * n
    for r in sorted(ranges, key=lambda r: (-size(r), r[0])):
        i = load.index(min(load))
        filled[i].append(r)
        load[i] += size(r)
    dealt_load = [sum(size(r) for r in g) for g in dealt]
    biggest = max(size(r) for r in ranges)
    balanced = max(dealt_load) <= max(load) * _DEALT_SLACK and max(dealt_load) - min(dealt_load) <= biggest
    return sorted(sorted(g) for g in (dealt if balanced else filled) if g)


class CommittedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, settings: SourceSettings) -> None:
        self.settings = settings
        self.target: dict[int, int] | None = None  # availableNow: the high watermarks when it began
        # The driver's consumer for the watermarks, kept across micro-batches (Spark keeps this
        # reader for the query's life and calls stop() at its end): a new one per micro-batch cost
        # ~35-55 ms of connection set-up in every micro-batch.
        self._client: Any = None
        self._watch: AccessWatch | None = None  # the client's error_cb

    def __getstate__(self) -> dict[str, Any]:  # a consumer does not pickle, and tasks need none of it
        return {**self.__dict__, "_client": None, "_watch": None}

    def _watermarks(self) -> dict[int, tuple[int, int]]:
        from harvest_outbox.spark_reader.kafka_arrow import consumer

        if self._client is None:
            self._watch = AccessWatch()
            self._client = consumer(self.settings.kafka, watch=self._watch)
        return watermarks(self.settings.topic, self.settings.kafka, self._client, self._watch)

    def stop(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            client.close()

    # -- driver side: offsets -----------------------------------------------------------------
    def initialOffset(self) -> dict[str, Any]:
        s = self.settings
        starting = base64.b64decode(s.starting) if s.starting else None
        # the driver's kept consumer (Spark may ask twice at a query's start: a consumer each cost ~60 ms)
        rng = offsets_mod.resolve(s.topic, s.kafka, starting, "latest", marks=self._watermarks())
        by_partition: dict[int, list[ProducerState]] = {p: [] for p in rng.start}
        for (p, _), st in sorted(rng.states.items()):
            by_partition.setdefault(p, []).append(st)
        return {
            "run": StreamStateFiles.new_run(),
            "offsets": {str(p): o for p, o in sorted(rng.start.items())},
            "initial": {str(p): pack_states(sts) for p, sts in sorted(by_partition.items())},
        }

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {p: high for p, (_, high) in self._watermarks().items()}

    def getDefaultReadLimit(self) -> Any:
        n = self.settings.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
        _check_offsets(start)
        marks = self._watermarks()
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
        ranges: list[tuple[int, int | None, int, str | None]] = []
        for p, stop in end["offsets"].items():
            first = before.get(p)
            if first is None or stop > first:
                ranges.append((int(p), first, stop, initial.get(p)))
            elif p in initial:  # nothing to read yet: the next micro-batch finds the states stored
                StreamStateFiles(self.settings.state_location, end["run"]).put(
                    int(p), first, unpack_states(f"{self.settings.topic}/{p}", initial[p])
                )
        ends = {p: stop for p, _, stop, _ in ranges}
        splits = []
        for group in group_ranges(ranges, self.settings.tasks):
            mine = {r[0] for r in group}
            splits.append(KafkaSplit(end["run"], group, {p: e for p, e in ends.items() if p not in mine}))
        return splits

    def commit(self, end: dict[str, Any]) -> None:
        files = StreamStateFiles(self.settings.state_location, end["run"])
        for p, offset in end["offsets"].items():
            files.prune(int(p), offset)

    # -- executor side: read, sequence, store ---------------------------------------------------
    # (Spark hands back the partitions partitions() made: KafkaSplits)
    def read(self, split: KafkaSplit) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        s = self.settings
        phases = Phases()
        files = StreamStateFiles(s.state_location, split.run)
        sequencers: dict[int, SplitSequencer] = {}
        reads: dict[int, tuple[int | None, int]] = {}
        for p, start, end, initial in split.ranges:
            if initial is not None:
                states = unpack_states(f"{s.topic}/{p}", initial)
            elif start is not None:
                states = files.get(s.topic, p, start)
            else:
                states = []
            begins = [st.begin for st in states if st.begin >= 0]
            reads[p] = (min([start, *begins]) if start is not None else None, end)
            sequencers[p] = SplitSequencer(s.split_plan(), p, start, states, phases)
        phases.state = time.perf_counter() - phases.started
        out: list[pa.Table] = []
        pool_before = WORKER_POOL.counts()
        batches = iter_ranges(s.topic, s.kafka, reads, s.split_plan().read_batch, WORKER_POOL)
        while True:
            t = time.perf_counter()
            got = next(batches, None)
            phases.read += time.perf_counter() - t
            if not phases.first_batch:
                phases.first_batch = phases.read
            if got is None:
                break
            out.extend(sequencers[got[0]].feed(got[1]))
        for seq in sequencers.values():
            out.extend(seq.finish())
        advanced = WORKER_POOL.advanced
        for p, e in sorted(split.others.items()):
            WORKER_POOL.advance(s.kafka, s.topic, p, max(0, e - ADVANCE_BEHIND))
        phases.consumers_reused, phases.consumers_sought, phases.consumers_missed = (
            now - before for now, before in zip(WORKER_POOL.counts(), pool_before, strict=True)
        )
        phases.consumers_advanced = WORKER_POOL.advanced - advanced
        t = time.perf_counter()
        for p, seq in sequencers.items():
            files.put(p, reads[p][1], seq.end_states)
        phases.state += time.perf_counter() - t
        t = time.perf_counter()
        for table in out:
            yield from table.to_batches()
        phases.downstream += time.perf_counter() - t
        phases.log(sorted(sequencers), "stream")


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
