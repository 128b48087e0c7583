"""``readCommittedStream``: the read-committed streaming source.

With ``state_location=`` the stream is harvest's own data source (:mod:`spark_reader.stream_source`:
Kafka read in the executors, the state in files next to the checkpoint, no shuffle). Without it,
what follows: Spark's Kafka source and Spark's state store.

Spark's Kafka source streams the raw records; each micro-batch of one topic-partition is sequenced
by :func:`spark_reader.sequencing.sequence_partition`, the batch reader's column-wise step (one
:class:`sequencer.Sequencer` holding every producer of the partition), with the partition's state
carried between micro-batches in Spark's state store by ``transformWithStateInPandas`` keyed by
the partition alone. Three steps, per micro-batch:

1. ``mapInArrow`` (narrow: one task per Kafka split, i.e. per topic-partition) packs the split's
   records into a few Arrow IPC blobs of up to ``_BLOB_ROWS`` records and about ``_BLOB_BYTES``:
   rows ``(partition, first offset, blob)``.
2. ``groupBy("partition").transformWithStateInPandas`` gets a partition's blobs (a handful of rows:
   PySpark's worker handles the stateful operator's input and output row by row, in Python, so a
   row per record would cost more than all the sequencing), prepends the stored rows of the
   partition's open spans, sequences, keeps in state the producer states and the rows from the
   oldest open span's ``begin`` on, and emits the committed rows, packed again.
3. ``mapInArrow`` (narrow) unpacks them into the output columns of ``readCommitted``.

The shuffle between 1 and 2 moves the blobs: a few large binary values per partition and
micro-batch, not a row per record.

Beyond the raw stream's work, a micro-batch costs one Arrow round trip of the payload (out in 1,
back in 3) and, per state store (one per shuffle partition of the stateful step,
``spark.sql.shuffle.partitions`` when the query first started), a load and a commit, which were
the largest fixed part before changelog checkpointing. A RocksDB commit without changelog checkpointing flushes
a snapshot and copies its files into the checkpoint every micro-batch; with it (Spark's
``...rocksdb.changelogCheckpointing.enabled``), a commit writes one small changelog file and
snapshots are made in the background. ``readCommittedStream`` turns changelog checkpointing on
when the session has not set it, and warns when there are more shuffle partitions than the
executors' cores (each extra one is a store loaded and committed per micro-batch, mostly empty:
only the topic's partitions carry keys).

With Spark's checkpointing (source offsets and state store commit together) and an idempotent
sink (file sink, Delta, ``foreachBatch`` with upserts), each committed record is written exactly
once, across stops and restarts.

Invariants:
- a row is emitted once, in the micro-batch where its committing ACK (or itself, if OUTSIDE)
  arrives; rolled-back and duplicate rows never are;
- the stored span of a partition holds exactly its records from the oldest open span's ``begin``
  on (none when no span is open), so state size is bounded by the open spans; what stays per
  producer id is its two longs, until the Sequencer prunes it (``prune_horizon_ns``, Gazette's
  clock-based horizon, as ``ReadCommittedIter``: no processing-time mode needed);
- records before the starting checkpoint's read-through offset are read only to replay the spans
  that were open at the checkpoint; they are never emitted.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute

from harvest_outbox.sequencer import DEFAULT_PRUNE_HORIZON_NS, ProducerState
from harvest_outbox.spark_reader import offsets as offsets_mod
from harvest_outbox.spark_reader.batch import _check_options, executor_cores, finish_columns, refuse_token_callback
from harvest_outbox.spark_reader.errors import ReaderConfigError
from harvest_outbox.spark_reader.policy import check_policy
from harvest_outbox.spark_reader.sequencing import GroupPlan, header_values, sequence_partition
from harvest_outbox.spark_reader.stream_state import check_state_location

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

_PACKED_DDL = "partition INT, first LONG, blob BINARY"
_STATE_DDL = "producers BINARY"  # msgpack [[producer, last_ack, begin], ...]
_SPAN_DDL = "first LONG, blob BINARY"  # the stored span, as Arrow IPC chunks
_INITIAL_DDL = "partition INT, producers BINARY"
# Rows per blob: large enough that PySpark's row-at-a-time handling of the stateful operator's
# input and output costs nothing, small enough that a blob stays far below Arrow's 2 GiB per
# binary column of a batch even with large records.
_BLOB_ROWS = 65536
_BLOB_BYTES = 32 << 20
_RAW_COLUMNS = ["key", "value", "headers", "partition", "offset", "timestamp"]

_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
_STORE_CONF = "spark.sql.streaming.stateStore.providerClass"
_CHANGELOG_CONF = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
_SHUFFLE_CONF = "spark.sql.shuffle.partitions"

log = logging.getLogger(__name__)


def readCommittedStream(
    spark: SparkSession,
    topic: str,
    kafka_options: Mapping[str, str] | None = None,
    *,
    starting: bytes | None = None,
    uuid_policy: str = "deliver",
    include_acks: bool = False,
    max_offsets_per_trigger: int | None = None,
    ring_size: int = 8192,
    prune_horizon_ns: int = DEFAULT_PRUNE_HORIZON_NS,
    state_location: str | None = None,
) -> DataFrame:
    """A streaming DataFrame of the committed records of ``topic`` (columns as in readCommitted).

    ``starting``: a checkpoint (from ReadCommittedIter or a batch read) to start from; without
    it the stream starts at the earliest offsets. Once the query has its own Spark checkpoint,
    Spark's checkpoint wins, as for any Kafka stream. ``prune_horizon_ns``: a producer id whose
    newest clock is this far behind its partition's newest ACK is forgotten (0: never).

    ``state_location``: a folder (path or URI every executor and the driver can reach, e.g. next
    to the query's checkpoint) for the sequencing state between micro-batches. With it the stream
    is read by harvest's own data source (:mod:`spark_reader.stream_source`: Kafka read in the
    executors, at most one task per executor core as counted when this is called, no shuffle, no
    state store, several times faster); without it, by Spark's Kafka
    source and ``transformWithStateInPandas`` with the state in Spark's state store (RocksDB).
    """
    options = dict(kafka_options or {})
    _check_options(topic, options)
    policy = check_policy(uuid_policy)
    if state_location is not None:
        state_location = check_state_location(state_location)
    if state_location is None:
        refuse_token_callback(options, "readCommittedStream without state_location", "pass state_location=")
        _check_state_store(spark)
        _tune_state_store(spark)
        log.info(
            "readCommittedStream(%r): Spark's Kafka source and state store; pass state_location= (a folder "
            "next to the query's checkpoint) for harvest's own data source, several times faster",
            topic,
        )
    if max_offsets_per_trigger is not None and (
        not isinstance(max_offsets_per_trigger, int) or max_offsets_per_trigger <= 0
    ):
        raise ReaderConfigError(
            f"max_offsets_per_trigger={max_offsets_per_trigger!r}: pass a positive int "
            "(records per micro-batch over all partitions) or None (no limit)"
        )
    if not isinstance(ring_size, int) or ring_size < 1:
        raise ReaderConfigError(f"ring_size={ring_size!r}: pass a positive int (default 8192)")
    if not isinstance(prune_horizon_ns, int) or prune_horizon_ns < 0:
        raise ReaderConfigError(f"prune_horizon_ns={prune_horizon_ns!r}: pass an int >= 0 (0: never prune)")
    if state_location is not None:
        from harvest_outbox.spark_reader.stream_source import SourceSettings, committed_stream

        settings = SourceSettings(
            topic=topic,
            kafka=options,
            state_location=state_location,
            uuid_policy=policy,
            include_acks=include_acks,
            ring_size=ring_size,
            prune_horizon_ns=prune_horizon_ns,
            max_offsets_per_trigger=max_offsets_per_trigger,
            starting=base64.b64encode(starting).decode() if starting is not None else None,
            tasks=executor_cores(spark),
        )
        return finish_columns(committed_stream(spark, settings), topic)
    start: dict[int, int] = {}
    initial: list[tuple[int, bytes]] = []
    reader = spark.readStream.format("kafka").options(**options).option("subscribe", topic)
    if starting is not None:
        rng = offsets_mod.resolve(topic, options, starting, "latest")
        start = rng.start
        reader = reader.option("startingOffsets", json.dumps({topic: {str(p): o for p, o in rng.read_from.items()}}))
        by_partition: dict[int, list[ProducerState]] = {}
        for (p, _), st in sorted(rng.states.items()):
            by_partition.setdefault(p, []).append(st)
        initial = [(p, _pack_states(sts)) for p, sts in by_partition.items()]
    else:
        reader = reader.option("startingOffsets", "earliest")
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    raw = reader.option("includeHeaders", "true").load().select(*_RAW_COLUMNS)

    packed = raw.mapInArrow(_pack_splits, schema=_PACKED_DDL)
    plan = GroupPlan(
        topic=topic, start=start, states={}, uuid_policy=policy, include_acks=include_acks, ring_size=ring_size
    )
    processor = _PartitionProcessor(plan, prune_horizon_ns)
    init_grouped = None
    if initial:
        init_grouped = spark.createDataFrame(initial, _INITIAL_DDL).groupBy("partition")
    committed = packed.groupBy("partition").transformWithStateInPandas(
        statefulProcessor=processor,
        outputStructType=_PACKED_DDL,
        outputMode="Append",
        timeMode="None",
        initialState=init_grouped,
    )
    return finish_columns(committed.mapInArrow(_unpack, schema=_sequenced_schema()), topic)


def _check_state_store(spark: Any) -> None:
    """transformWithState runs on RocksDB state stores only: say so now, not when the query starts."""
    provider = spark.conf.get(_STORE_CONF, None)
    if provider is None or provider.rsplit(".", 1)[-1] != "RocksDBStateStoreProvider":
        raise ReaderConfigError(
            f"readCommittedStream keeps its state with transformWithStateInPandas, which needs the RocksDB "
            f"state store, but {_STORE_CONF} is {provider!r}. Fix: spark.conf.set({_STORE_CONF!r}, {_ROCKSDB!r}) "
            "(or --conf) before starting the query"
        )


def _tune_state_store(spark: Any) -> None:
    """Changelog checkpointing on unless the session chose otherwise; a warning when the stateful
    step would run more state stores than there are cores.

    Changelog checkpointing only changes how RocksDB state is written to the checkpoint (Spark
    reads checkpoints written either way, so turning it on for an existing query is safe); it is
    a session setting, read when a query starts, so setting it here affects this session's later
    queries on RocksDB state too, which gain the same way."""
    chosen = spark.conf.get(_CHANGELOG_CONF, None)
    if chosen is None:
        spark.conf.set(_CHANGELOG_CONF, "true")
        log.info(
            "readCommittedStream: set %s=true (a RocksDB commit per micro-batch then writes a changelog "
            "file instead of a snapshot)",
            _CHANGELOG_CONF,
        )
    elif chosen.strip().lower() != "true":
        log.warning(
            "readCommittedStream: %s=%s: every micro-batch commits a full RocksDB snapshot per state "
            "store, the largest fixed cost of a micro-batch. Fix: spark.conf.set(%r, 'true')",
            _CHANGELOG_CONF,
            chosen,
            _CHANGELOG_CONF,
        )
    try:
        shuffle = int(spark.conf.get(_SHUFFLE_CONF))
        cores = int(spark.sparkContext.defaultParallelism)
    except Exception:
        return
    if shuffle > cores:
        log.warning(
            "readCommittedStream: %s=%d, so a new query's stateful step runs %d state stores, each "
            "loaded and committed every micro-batch, on %d cores (only the topic's partitions carry "
            "data). Fix: set %s to min(topic partitions, executor cores) before the query's first "
            "start (its checkpoint keeps the number it started with)",
            _SHUFFLE_CONF,
            shuffle,
            shuffle,
            cores,
            _SHUFFLE_CONF,
        )


def _sequenced_schema() -> Any:
    from harvest_outbox.spark_reader.schema import SEQUENCED

    return SEQUENCED


# -- step 1: pack each Kafka split ------------------------------------------------------------


def _pack_splits(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One task's record batches (one topic-partition's offsets of this micro-batch, in order) ->
    rows ``(partition, first offset, Arrow IPC blob of up to _BLOB_ROWS records)``."""
    pending: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        pending.append(batch)
        rows += batch.num_rows
        if rows >= _BLOB_ROWS:
            yield from _pack_table(pa.Table.from_batches(pending))
            pending, rows = [], 0
    if pending:
        yield from _pack_table(pa.Table.from_batches(pending))


def _pack_table(table: pa.Table) -> Iterator[pa.RecordBatch]:
    partitions = pa.compute.unique(table.column("partition")).to_pylist()
    for partition in partitions:
        part = table if len(partitions) == 1 else table.filter(pa.compute.equal(table.column("partition"), partition))
        part = part.drop_columns(["partition"])
        firsts, blobs = [], []
        for chunk in _chunks(part):
            firsts.append(chunk.column("offset")[0].as_py())
            blobs.append(_ipc(chunk))
        yield pa.RecordBatch.from_pydict(
            {
                "partition": pa.array([partition] * len(blobs), pa.int32()),
                "first": pa.array(firsts, pa.int64()),
                "blob": pa.array(blobs, pa.binary()),
            }
        )


def _chunks(table: pa.Table) -> Iterator[pa.Table]:
    """Slices of at most _BLOB_ROWS rows and about _BLOB_BYTES bytes (a Spark binary value, and an
    Arrow batch of them, must stay below 2 GiB; Kafka records are up to a few MiB each)."""
    n = table.num_rows
    if n == 0:
        return
    step = max(1, min(_BLOB_ROWS, _BLOB_BYTES // max(1, table.nbytes // n)))
    for i in range(0, n, step):
        yield table.slice(i, step)


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _from_ipc(blob: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(blob)).read_all()


# -- step 2: sequence a partition, state in the state store ------------------------------------


def _stateful_base() -> type:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    return StatefulProcessor


class _PartitionProcessor(_stateful_base()):  # type: ignore[misc]
    """State per topic-partition: ``producers`` (every producer's Gazette state, msgpack) and
    ``span`` (the partition's records from the oldest open span's ``begin`` on, Arrow IPC)."""

    def __init__(self, plan: GroupPlan, prune_horizon_ns: int) -> None:
        self.plan = plan
        self.prune_horizon_ns = prune_horizon_ns

    def init(self, handle: Any) -> None:
        self.producers = handle.getValueState("producers", _STATE_DDL)
        self.span = handle.getListState("span", _SPAN_DDL)

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: Any) -> None:
        self.producers.update((bytes(initialState["producers"].iloc[-1]),))

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        import pandas as pd

        partition = int(key[0])
        plan = self.plan
        journal = f"{plan.topic}/{partition}"
        fresh = sorted(
            ((int(f), bytes(b)) for frame in rows for f, b in zip(frame["first"], frame["blob"], strict=True))
        )
        tables = [_from_ipc(b) for _, b in fresh]
        first_new = fresh[0][0]
        stored = (
            [_from_ipc(bytes(r[1])) for r in sorted(self.span.get(), key=lambda r: r[0])] if self.span.exists() else []
        )
        # Rows of the stored span lie before this micro-batch's; a replayed micro-batch (after a
        # failure) starts from the state committed with the batch before it, so they never overlap.
        table = pa.concat_tables([*stored, *tables]) if len(stored) + len(tables) > 1 else tables[0]
        offsets = table.column("offset").to_numpy()
        if len(offsets) > 1 and not bool((offsets[1:] > offsets[:-1]).all()):
            table = table.sort_by("offset")  # Spark's Kafka source reads a split in offset order: rare
        states = _unpack_states(journal, bytes(self.producers.get()[0])) if self.producers.exists() else []
        start = max(plan.start.get(partition, 0), first_new)
        step = GroupPlan(
            topic=plan.topic,
            start={partition: start},
            states={(partition, st.producer): st for st in states},
            uuid_policy=plan.uuid_policy,
            include_acks=plan.include_acks,
            ring_size=plan.ring_size,
        )
        with_uuid = table.append_column("uuid", header_values(table.column("headers"), "uuid"))
        with_uuid = with_uuid.append_column("partition", pa.array([partition] * table.num_rows, pa.int32()))
        out, result = sequence_partition(with_uuid, step, self.prune_horizon_ns)

        self.producers.update((_pack_states(result.states),))
        self._keep_span(table, result.states)
        if out.num_rows:
            out = out.select(_sequenced_schema().fieldNames())
            firsts, blobs = [], []
            for chunk in _chunks(out):
                firsts.append(chunk.column("offset")[0].as_py())
                blobs.append(_ipc(chunk))
            yield pd.DataFrame({"partition": [partition] * len(blobs), "first": firsts, "blob": blobs})

    def _keep_span(self, table: pa.Table, states: list[ProducerState]) -> None:
        begins = [st.begin for st in states if st.begin >= 0]
        self.span.clear()
        if not begins:
            return
        offsets = table.column("offset").to_numpy()
        keep = table.slice(int(np.searchsorted(offsets, min(begins), side="left")))
        if keep.num_rows:
            self.span.put([(chunk.column("offset")[0].as_py(), _ipc(chunk)) for chunk in _chunks(keep)])

    def close(self) -> None:
        pass


def _pack_states(states: list[ProducerState]) -> bytes:
    return msgpack.packb([[st.producer, st.last_ack, st.begin] for st in states])


def _unpack_states(journal: str, blob: bytes) -> list[ProducerState]:
    return [ProducerState(journal, bytes(p), int(last_ack), int(begin)) for p, last_ack, begin in msgpack.unpackb(blob)]


# -- step 3: unpack the committed rows ---------------------------------------------------------


def _unpack(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        for blob in batch.column("blob").to_pylist():
            yield from _from_ipc(blob).to_batches()
