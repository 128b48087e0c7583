"""readCommittedStream on local Spark + embedded Kafka: exactly once into a file sink across restarts,
while the topic is being written to; started from a ReadCommittedIter checkpoint. The tests taking
``spark_any`` run on local[2] and on local-cluster (two executor JVMs: the state stores and the
Python workers live outside the driver's process). The tests taking ``state`` run both ways of
keeping the sequencing state: Spark's state store (Spark's Kafka source and
transformWithStateInPandas) and ``state_location`` (harvest's own data source, state files). The two
restart tests split the four (master, state) pairs between them, each pair once (all four in both
took ~130 s of the suite on two cores)."""

from __future__ import annotations

import logging
import threading
import time
import uuid as uuid_mod

import pytest
from sequenced_log import read_committed_to_end, read_raw, reference_read, write_log

from harvest_outbox.spark_reader import readCommittedStream

pytestmark = [pytest.mark.integration, pytest.mark.spark]


_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


@pytest.fixture(params=["state_store", "state_location"])
def state(request: pytest.FixtureRequest, tmp_path) -> str | None:
    """``state_location`` for readCommittedStream: None (Spark's state store) or a folder."""
    return None if request.param == "state_store" else str(tmp_path / "stream-state")


def _pairs(*pairs: tuple[str, str]) -> pytest.MarkDecorator:
    """(master, state) pairs for ``spark_any`` and ``state``; the local-cluster ones marked ``cluster``."""
    params = [
        pytest.param(master, how, id=f"{master}-{how}", marks=[pytest.mark.cluster] if master == "cluster" else [])
        for master, how in pairs
    ]
    return pytest.mark.parametrize(("spark_any", "state"), params, indirect=True)


def _query(
    spark,
    topic,
    bootstrap,
    out_dir,
    chk_dir,
    trigger,
    max_offsets=None,
    starting=None,
    ring_size=8192,
    state_location=None,
):
    sdf = readCommittedStream(
        spark,
        topic,
        {"kafka.bootstrap.servers": bootstrap},
        max_offsets_per_trigger=max_offsets,
        starting=starting,
        ring_size=ring_size,
        state_location=state_location,
    )
    writer = sdf.writeStream.format("parquet").option("path", str(out_dir)).option("checkpointLocation", str(chk_dir))
    return writer.trigger(**trigger).start()


# Spark waits a fixed 10 s (PythonWorkerFactory, not configurable) for a Python worker it spawns to connect
# back; on two cores shared by the suite's services and a local-cluster's three JVMs, the driver's
# transformWithState pre-init worker has once missed it. That is the machine, not the reader: the query is
# started again from its checkpoint (a restart the stream must survive anyway) once, and only for that.
_WORKER_TIMEOUT = "Python worker failed to connect back"


def _finish(start, timeout: float = 300):
    """Start a query that ends (``availableNow``) and wait for it; fails on any query error but the one above."""
    from pyspark.errors import StreamingQueryException

    query = start()
    try:
        query.awaitTermination(timeout)
    except StreamingQueryException as err:
        if _WORKER_TIMEOUT not in str(err):
            raise
        logging.getLogger(__name__).warning("restarting the query from its checkpoint: %s", _WORKER_TIMEOUT)
        query = start()
        query.awaitTermination(timeout)
    assert query.exception() is None, query.exception()
    return query


def _available_now(spark, topic, bootstrap, tmp_path, state, timeout: float = 300, **options):
    """:func:`_finish` of an ``availableNow`` query writing to ``tmp_path / "out"``."""
    out, chk = tmp_path / "out", tmp_path / "chk"
    return _finish(
        lambda: _query(spark, topic, bootstrap, out, chk, {"availableNow": True}, state_location=state, **options),
        timeout,
    )


@pytest.mark.parametrize("state", ["state_store"], indirect=True)  # the default; state_location: the restart tests'
def test_stream_stopped_and_restarted_while_written_to(spark, kafka_bootstrap, topic_factory, tmp_path, state) -> None:
    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    )
    topic = topic_factory(partitions=2)
    out_dir, chk_dir = tmp_path / "out", tmp_path / "chk"
    write_log(kafka_bootstrap, topic, 2, seed=10, steps=20)

    def keep_writing() -> None:  # concurrent writers: open spans straddle micro-batches and the restart
        for seed in range(11, 17):
            write_log(kafka_bootstrap, topic, 2, seed=seed, steps=15)
            time.sleep(0.7)

    writer = threading.Thread(target=keep_writing)
    writer.start()
    query = _query(
        spark,
        topic,
        kafka_bootstrap,
        out_dir,
        chk_dir,
        {"processingTime": "500 milliseconds"},
        max_offsets=30,
        state_location=state,
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and sum(p["numInputRows"] for p in query.recentProgress) == 0:
        time.sleep(0.5)
    progressed = sum(p["numInputRows"] for p in query.recentProgress)
    # Stop mid-way, the writer still writing. A stop that interrupts a micro-batch makes Spark record
    # the interruption as the query's exception; that batch is not committed and is redone on restart.
    query.stop()
    writer.join()
    _finish(
        lambda: _query(spark, topic, kafka_bootstrap, out_dir, chk_dir, {"availableNow": True}, state_location=state)
    )

    expected = reference_read(read_raw(kafka_bootstrap, topic, 2), topic)
    rows = spark.read.parquet(str(out_dir)).select("partition", "offset", "ack_offset").collect()
    got = sorted(((r.partition, r.offset, r.ack_offset) for r in rows), key=lambda t: (t[0], t[2], t[1]))
    assert progressed > 0  # the first run did process part of the stream before it was stopped
    assert got == expected


def _parquet_rows(spark, out_dir):
    rows = spark.read.parquet(str(out_dir)).select("partition", "offset", "ack_offset").collect()
    return sorted(((r.partition, r.offset, r.ack_offset) for r in rows), key=lambda t: (t[0], t[2], t[1]))


@_pairs(("cluster", "state_location"), ("local", "state_store"))
def test_stream_restarted_from_its_checkpoint_is_exactly_once(
    spark_any, kafka_bootstrap, topic_factory, tmp_path, state
) -> None:
    """Small micro-batches (spans open across them, a ring of 4 forces replays of stored span rows),
    then more records and a restart from the query's checkpoint: every committed row once."""
    spark = spark_any
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", _ROCKSDB)
    topic = topic_factory(partitions=3)
    out_dir, chk_dir = tmp_path / "out", tmp_path / "chk"
    write_log(kafka_bootstrap, topic, 3, seed=40, steps=40)

    def start():
        return _query(
            spark,
            topic,
            kafka_bootstrap,
            out_dir,
            chk_dir,
            {"availableNow": True},
            max_offsets=60,
            ring_size=4,
            state_location=state,
        )

    first = _finish(start)
    batches = sum(1 for p in first.recentProgress if p["numInputRows"])
    partial = _parquet_rows(spark, out_dir)
    write_log(kafka_bootstrap, topic, 3, seed=41, steps=25)
    _finish(start)  # the same query again, from its checkpoint

    expected = reference_read(read_raw(kafka_bootstrap, topic, 3), topic)
    got = _parquet_rows(spark, out_dir)
    assert batches >= 3 and 0 < len(partial) < len(got)
    assert got == expected


@_pairs(("cluster", "state_store"), ("local", "state_location"))
def test_stream_starts_from_read_committed_iter_checkpoint(
    spark_any, kafka_bootstrap, topic_factory, tmp_path, state
) -> None:
    """ReadCommittedIter reads part of the topic (its checkpoint cuts open spans); the stream started
    from that checkpoint delivers the rest, and nothing twice."""
    from harvest_outbox.consumer import ReadCommittedIter

    spark = spark_any
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", _ROCKSDB)
    topic = topic_factory(partitions=2)
    write_log(kafka_bootstrap, topic, 2, seed=42, steps=80)
    expected = reference_read(read_raw(kafka_bootstrap, topic, 2), topic)
    first = []
    with ReadCommittedIter({"bootstrap.servers": kafka_bootstrap}, topics=[topic], idle_timeout=3.0) as it:
        for rec in it:
            first.append((rec.partition, rec.offset))
            if len(first) >= len(expected) // 2:
                break
        checkpoint = it.checkpoint()
    _available_now(spark, topic, kafka_bootstrap, tmp_path, state, max_offsets=50, starting=checkpoint)
    rest = [(p, o) for p, o, _ in _parquet_rows(spark, tmp_path / "out")]
    assert not set(first) & set(rest)
    assert sorted(first + rest) == sorted((p, o) for p, o, _ in expected)


def test_stream_delivers_records_without_uuid_header_under_ansi(
    spark, kafka_bootstrap, topic_factory, tmp_path, state
) -> None:
    """Records with only application headers (no 'uuid') and a 'uuid' header among others: the stream
    delivers what ReadCommittedIter delivers (Spark 4's ANSI mode once failed the query on the former)."""
    from confluent_kafka import Producer

    from harvest_outbox.sequencer import Publisher

    assert spark.conf.get("spark.sql.ansi.enabled") == "true"
    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    )
    topic = topic_factory(partitions=1)
    pub = Publisher()
    sent = [
        (b"app-headers-only", [("source", b"billing")]),
        (b"no-headers", None),
        (b"txn-1", [("trace", b"t1"), ("uuid", pub.publish_uncommitted(f"{topic}/0").bytes)]),
        (b"txn-2", [("uuid", pub.publish_uncommitted(f"{topic}/0").bytes)]),
        (b"never-acked", [("uuid", Publisher().publish_uncommitted(f"{topic}/0").bytes)]),
        # An application's own uuid1() ids (a MAC address as node) that look like an ACK and like a
        # CONTINUE: not identities (consumer.uuid_header), so delivered at-least-once like no header.
        (b"app-uuid1-ack-flags", [("uuid", uuid_mod.uuid1(node=0x0242AC110002, clock_seq=2).bytes)]),
        (b"app-uuid1-continue-flags", [("uuid", uuid_mod.uuid1(node=0x0242AC110002, clock_seq=1).bytes)]),
    ]
    sent += [(b"", [("uuid", a.uuid.bytes)]) for a in pub.build_ack_intents()]
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True, "acks": "all"})
    for value, headers in sent:
        producer.produce(topic, value=value, partition=0, headers=headers)
    assert producer.flush(30) == 0

    want = sorted(
        (r.partition, r.offset, bytes(r.value or b""))
        for r in read_committed_to_end({"bootstrap.servers": kafka_bootstrap}, [topic])
    )
    assert [v for _, _, v in want] == [
        b"app-headers-only",
        b"no-headers",
        b"txn-1",
        b"txn-2",
        b"app-uuid1-ack-flags",
        b"app-uuid1-continue-flags",
    ]

    _available_now(spark, topic, kafka_bootstrap, tmp_path, state, timeout=120)
    got = sorted(
        (r.partition, r.offset, bytes(r.value or b"")) for r in spark.read.parquet(str(tmp_path / "out")).collect()
    )
    assert got == want


def test_stream_without_rocksdb_state_store_is_a_clear_error(spark, kafka_bootstrap, topic_factory) -> None:
    from harvest_outbox.spark_reader.errors import ReaderConfigError

    conf = "spark.sql.streaming.stateStore.providerClass"
    before = spark.conf.get(conf, None)
    spark.conf.set(conf, "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider")
    try:
        with pytest.raises(ReaderConfigError, match=r"RocksDB.*Fix: spark\.conf\.set"):
            readCommittedStream(spark, topic_factory(partitions=1), {"kafka.bootstrap.servers": kafka_bootstrap})
    finally:
        if before is None:
            spark.conf.unset(conf)
        else:
            spark.conf.set(conf, before)


def test_stream_state_store_settings(spark, kafka_bootstrap, topic_factory, caplog) -> None:
    """Changelog checkpointing is turned on when the session left it unset, an explicit choice is
    kept (with a warning for 'false'), and more shuffle partitions than cores draw a warning naming
    the setting and its fix."""
    changelog = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
    shuffle = "spark.sql.shuffle.partitions"
    saved = {k: spark.conf.get(k, None) for k in (changelog, shuffle, "spark.sql.streaming.stateStore.providerClass")}
    topic = topic_factory(partitions=1)
    opts = {"kafka.bootstrap.servers": kafka_bootstrap}
    try:
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", _ROCKSDB)
        cores = spark.sparkContext.defaultParallelism
        spark.conf.unset(changelog)
        spark.conf.set(shuffle, str(cores))
        with caplog.at_level("INFO", logger="harvest_outbox.spark_reader.stream"):
            readCommittedStream(spark, topic, opts)
        assert spark.conf.get(changelog, None) == "true"
        assert not [
            r for r in caplog.records if r.name == "harvest_outbox.spark_reader.stream" and r.levelname == "WARNING"
        ], caplog.text

        caplog.clear()
        spark.conf.set(changelog, "false")
        spark.conf.set(shuffle, str(cores + 1))
        with caplog.at_level("WARNING", logger="harvest_outbox.spark_reader.stream"):
            readCommittedStream(spark, topic, opts)
        assert spark.conf.get(changelog, None) == "false"  # the session's explicit choice stays
        warned = caplog.text
        assert f"{changelog}=false" in warned and "Fix: spark.conf.set" in warned
        assert f"{shuffle}={cores + 1}" in warned and "min(topic partitions, executor cores)" in warned
    finally:
        for k, v in saved.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)
