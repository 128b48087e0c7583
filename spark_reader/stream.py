"""``readCommittedStream``: the read-committed streaming source.

Spark's Kafka source streams the raw records; ``transformWithStateInPandas`` keyed by
(partition, producer) keeps, in Spark's state store, each producer's Gazette state (last ACK clock,
open-span begin) and the rows of its open span. Each micro-batch restores a
:class:`sequencer.Sequencer` from that state, replays the stored span rows when an ACK commits
them, and emits committed rows. With Spark's checkpointing (source offsets and state store commit
together) and an idempotent sink (file sink, Delta, ``foreachBatch`` with upserts), each committed
record is written exactly once.

Invariants:
- a row is emitted once, in the micro-batch where its committing ACK (or itself, if OUTSIDE)
  arrives; rolled-back and duplicate rows never are;
- the span list holds exactly this producer's rows from its open span's ``begin`` on, so state
  size is bounded by the open spans;
- the span list is cleared when the span commits or rolls back; what stays per producer id is two
  longs. With ``state_ttl_ms`` set, producer state idle that long (processing time) expires, like
  ``ReadCommittedIter``'s pruning horizon. TTL needs Spark's processing-time mode, in which Spark
  keeps running empty micro-batches: an ``availableNow`` query then never finishes unless
  ``spark.sql.streaming.noDataMicroBatches.enabled`` is false. Hence no TTL by default.
"""

from __future__ import annotations

import json
import uuid as uuid_mod
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import msgpack
import pandas as pd

from sequencer import Envelope, Flags, ProducerState, QueueOutcome, Sequencer, UUIDError, parse_uuid
from sequencer.identity import clock_of, flags_of
from spark_reader import offsets as offsets_mod
from spark_reader.batch import _check_options
from spark_reader.errors import MissingUUIDError, ReaderConfigError
from spark_reader.policy import check_policy

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


_STATE_SCHEMA = "last_ack LONG, begin LONG"
_SPAN_SCHEMA = ("offset LONG, uuid BINARY, key BINARY, value BINARY, headers BINARY, "
                "topic STRING, timestamp TIMESTAMP")
_OUTPUT_DDL = ("key BINARY, value BINARY, headers ARRAY<STRUCT<key: STRING, value: BINARY>>, "
               "topic STRING, partition INT, offset LONG, timestamp TIMESTAMP, uuid STRING, "
               "producer BINARY, clock LONG, ack_offset LONG")
_COLUMNS = ["key", "value", "headers", "topic", "partition", "offset", "timestamp", "uuid",
            "producer", "clock", "ack_offset"]


def readCommittedStream(spark: SparkSession, topic: str, kafka_options: Mapping[str, str] | None = None, *,
                        starting: bytes | None = None, uuid_policy: str = "deliver",
                        include_acks: bool = False, state_ttl_ms: int | None = None,
                        max_offsets_per_trigger: int | None = None) -> DataFrame:
    """A streaming DataFrame of the committed records of ``topic`` (columns as in readCommitted).

    ``starting``: a checkpoint (from ReadCommittedIter or a batch read) to start from; without
    it the stream starts at the earliest offsets. Once the query has its own Spark checkpoint,
    Spark's checkpoint wins, as for any Kafka stream.
    """
    from pyspark.sql import functions as F

    options = dict(kafka_options or {})
    _check_options(topic, options)
    policy = check_policy(uuid_policy)
    _check_state_store(spark)
    start: dict[int, int] = {}
    initial: list[tuple[int, bytes, int, int]] = []
    reader = spark.readStream.format("kafka").options(**options).option("subscribe", topic)
    if starting is not None:
        rng = offsets_mod.resolve(topic, options, starting, "latest")
        start = rng.start
        reader = reader.option("startingOffsets", json.dumps({topic: {str(p): o for p, o in rng.read_from.items()}}))
        initial = [(p, prod, st.last_ack, st.begin) for (p, prod), st in rng.states.items()]
    else:
        reader = reader.option("startingOffsets", "earliest")
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    raw = reader.option("includeHeaders", "true").load()
    # try_element_at: a record whose headers name no 'uuid' has an empty filter result, and
    # element_at fails the query on that under Spark's default ANSI mode; this is null instead,
    # and the record follows uuid_policy.
    uuid_header = F.try_element_at(F.filter("headers", lambda h: h["key"] == F.lit("uuid")), F.lit(1))["value"]
    raw = raw.select("key", "value", "headers", "topic", "partition", "offset", "timestamp",
                     uuid_header.alias("uuid"))
    raw = raw.withColumn("producer", F.when(F.length("uuid") == 16, F.substring("uuid", 11, 6)))
    processor = _CommittedProcessor(topic, start, policy, include_acks, state_ttl_ms)
    grouped = raw.groupBy("partition", "producer")
    init_grouped = None
    if initial:
        init_df = spark.createDataFrame(initial, "partition INT, producer BINARY, last_ack LONG, begin LONG")
        init_grouped = init_df.groupBy("partition", "producer")
    return grouped.transformWithStateInPandas(
        statefulProcessor=processor, outputStructType=_OUTPUT_DDL, outputMode="Append",
        timeMode="ProcessingTime" if state_ttl_ms else "None", initialState=init_grouped,
    )


_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
_STORE_CONF = "spark.sql.streaming.stateStore.providerClass"


def _check_state_store(spark: Any) -> None:
    """transformWithState runs on RocksDB state stores only: say so now, not when the query starts."""
    provider = spark.conf.get(_STORE_CONF, None)
    if provider is None or provider.rsplit(".", 1)[-1] != "RocksDBStateStoreProvider":
        raise ReaderConfigError(
            f"readCommittedStream keeps its state with transformWithStateInPandas, which needs the RocksDB "
            f"state store, but {_STORE_CONF} is {provider!r}. Fix: spark.conf.set({_STORE_CONF!r}, {_ROCKSDB!r}) "
            "(or --conf) before starting the query")


def _stateful_base() -> type:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    return StatefulProcessor


class _CommittedProcessor(_stateful_base()):  # type: ignore[misc]
    def __init__(self, topic: str, start: dict[int, int], policy: str, include_acks: bool,
                 ttl_ms: int | None) -> None:
        self.topic = topic
        self.start = start
        self.policy = policy
        self.include_acks = include_acks
        self.ttl_ms = ttl_ms

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.state = handle.getValueState("producer", _STATE_SCHEMA, self.ttl_ms or None)
        self.span = handle.getListState("span", _SPAN_SCHEMA, self.ttl_ms or None)

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: Any) -> None:
        row = initialState.iloc[-1]
        self.state.update((int(row["last_ack"]), int(row["begin"])))

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        batch = pd.concat(list(rows), ignore_index=True).sort_values("offset", kind="stable")
        partition = int(key[0])
        producer = key[1]
        journal = f"{self.topic}/{partition}"
        if producer is None:
            yield from self._unsequenced(batch, journal, partition)
            return
        producer = bytes(producer)
        start = self.start.get(partition, -1)
        restored = self.state.get() if self.state.exists() else None
        states = [ProducerState(journal, producer, int(restored[0]), int(restored[1]))] if restored else []
        # Every row this call queues fits in the ring (replays serve only the stored span rows).
        seq = Sequencer({journal: 0}, states, ring_size=len(batch) + 1)
        stored = [_span_row_from_state(r) for r in self.span.get()] if self.span.exists() else []
        fresh = [_span_row_from_input(r) for r in batch.itertuples(index=False)]
        by_offset = {r["offset"]: r for r in stored}
        by_offset.update((r["offset"], r) for r in fresh)
        replayable = sorted(by_offset.values(), key=lambda r: r["offset"])

        out: list[dict[str, Any]] = []
        for r in fresh:
            off = r["offset"]
            if off < start:
                continue  # before the starting checkpoint: kept only to replay open spans
            try:
                u = _relay_uuid(r["uuid"])
            except UUIDError:
                self._malformed(journal, off, r, out)
                continue
            outcome = seq.queue_uncommitted(Envelope(journal, off, off + 1, u, r))
            if outcome == QueueOutcome.ACK_COMMIT_REPLAY:
                _, begin, end = seq.replay_range()
                seq.start_replay(_replay(replayable, journal, begin, end))
            sequence = []
            while (env := seq.step()) is not None:
                sequence.append(env)
            if sequence:
                ack_offset = sequence[-1].begin
                for env in sequence:
                    if self.include_acks or flags_of(env.uuid) != Flags.ACK_TXN:
                        out.append(_output(env.message, partition, producer, clock_of(env.uuid), ack_offset, env.uuid))
        _, end_states = seq.checkpoint(0)
        end_state = next((s for s in end_states if s.producer == producer), None)
        if end_state is not None:
            self.state.update((end_state.last_ack, end_state.begin))
            keep = [r for r in replayable if end_state.begin >= 0 and r["offset"] >= end_state.begin]
            self.span.clear()
            if keep:
                self.span.put([_span_state_row(r) for r in keep])
        if out:
            yield pd.DataFrame(out, columns=_COLUMNS)

    def _unsequenced(self, batch: pd.DataFrame, journal: str, partition: int) -> Iterator[pd.DataFrame]:
        start = self.start.get(partition, -1)
        batch = batch[batch["offset"] >= start]
        if batch.empty or self.policy == "drop":
            return
        if self.policy == "raise":
            raise MissingUUIDError(
                f"record {journal}@{int(batch['offset'].iloc[0])} has no valid 'uuid' header and "
                "uuid_policy='raise'; use 'deliver' to deliver such records at-least-once, or 'drop'")
        out = [_output(_span_row_from_input(r), partition, None, 0, int(r.offset), None)
               for r in batch.itertuples(index=False)]
        yield pd.DataFrame(out, columns=_COLUMNS)

    def _malformed(self, journal: str, offset: int, r: dict[str, Any], out: list[dict[str, Any]]) -> None:
        if self.policy == "raise":
            raise MissingUUIDError(f"record {journal}@{offset} has a malformed 'uuid' header")
        if self.policy == "deliver":
            out.append(_output(r, int(journal.rsplit("/", 1)[1]), None, 0, offset, None))

    def close(self) -> None:
        pass


def _relay_uuid(raw: Any) -> uuid_mod.UUID:
    """``parse_uuid``, refusing what no relay writes: the readers' rule (``consumer.uuid_header``,
    ``spark_reader.sequencing.uuid_words``): a ProducerID with the multicast bit, flags 0-2."""
    u = parse_uuid(raw)
    if not (u.int >> 40) & 1 or (u.int >> 48) & 0x3FF > int(Flags.ACK_TXN):
        raise UUIDError(f"uuid {u} is not a harvest relay's (its node lacks the multicast bit, or its flags "
                        f"are reserved)")
    return u


def _replay(rows: list[dict[str, Any]], journal: str, begin: int, end: int) -> Iterator[Envelope]:
    for r in rows:
        if begin <= r["offset"] < end:
            try:
                u = _relay_uuid(r["uuid"])
            except UUIDError:
                continue
            yield Envelope(journal, r["offset"], r["offset"] + 1, u, r)


def _span_row_from_input(r: Any) -> dict[str, Any]:
    headers = r.headers
    pairs = [] if headers is None else [(h["key"], h["value"]) for h in headers]
    return {"offset": int(r.offset), "uuid": r.uuid, "key": r.key, "value": r.value, "headers": pairs,
            "topic": r.topic, "timestamp": r.timestamp}


def _span_row_from_state(r: Any) -> dict[str, Any]:
    return {"offset": int(r[0]), "uuid": r[1], "key": r[2], "value": r[3],
            "headers": [tuple(h) for h in msgpack.unpackb(r[4])], "topic": r[5], "timestamp": r[6]}


def _span_state_row(r: dict[str, Any]) -> tuple[Any, ...]:
    # Field order of _SPAN_SCHEMA.
    return (r["offset"], r["uuid"], r["key"], r["value"], msgpack.packb([list(h) for h in r["headers"]]),
            r["topic"], pd.Timestamp(r["timestamp"]).to_pydatetime())


def _output(r: dict[str, Any], partition: int, producer: bytes | None, clock: int, ack_offset: int,
            u: Any) -> dict[str, Any]:
    return {"key": r["key"], "value": r["value"],
            "headers": [{"key": k, "value": v} for k, v in r["headers"]],
            "topic": r["topic"], "partition": partition, "offset": r["offset"], "timestamp": r["timestamp"],
            "uuid": str(u) if u is not None and u.int != 0 else None, "producer": producer,
            "clock": clock, "ack_offset": ack_offset}
