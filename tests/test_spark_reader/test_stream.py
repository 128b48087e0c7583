"""readCommittedStream on local Spark + embedded Kafka: exactly once into a file sink across restarts,
while the topic is being written to."""

from __future__ import annotations

import threading
import time

import pytest

from sequenced_log import read_raw, reference_read, write_log
from spark_reader import readCommittedStream

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _query(spark, topic, bootstrap, out_dir, chk_dir, trigger, max_offsets=None):
    sdf = readCommittedStream(spark, topic, {"kafka.bootstrap.servers": bootstrap},
                              max_offsets_per_trigger=max_offsets)
    writer = (sdf.writeStream.format("parquet").option("path", str(out_dir))
              .option("checkpointLocation", str(chk_dir)))
    return writer.trigger(**trigger).start()


def test_stream_stopped_and_restarted_while_written_to(spark, kafka_bootstrap, topic_factory, tmp_path) -> None:
    spark.conf.set("spark.sql.streaming.stateStore.providerClass",
                   "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    topic = topic_factory(partitions=2)
    out_dir, chk_dir = tmp_path / "out", tmp_path / "chk"
    write_log(kafka_bootstrap, topic, 2, seed=10, steps=20)

    def keep_writing() -> None:  # concurrent writers: open spans straddle micro-batches and the restart
        for seed in range(11, 17):
            write_log(kafka_bootstrap, topic, 2, seed=seed, steps=15)
            time.sleep(0.7)

    writer = threading.Thread(target=keep_writing)
    writer.start()
    query = _query(spark, topic, kafka_bootstrap, out_dir, chk_dir, {"processingTime": "500 milliseconds"},
                   max_offsets=30)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and sum(p["numInputRows"] for p in query.recentProgress) == 0:
        time.sleep(0.5)
    progressed = sum(p["numInputRows"] for p in query.recentProgress)
    # Stop mid-way, the writer still writing. A stop that interrupts a micro-batch makes Spark record
    # the interruption as the query's exception; that batch is not committed and is redone on restart.
    query.stop()
    writer.join()
    query = _query(spark, topic, kafka_bootstrap, out_dir, chk_dir, {"availableNow": True})
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()

    expected = reference_read(read_raw(kafka_bootstrap, topic, 2), topic)
    rows = spark.read.parquet(str(out_dir)).select("partition", "offset", "ack_offset").collect()
    got = sorted(((r.partition, r.offset, r.ack_offset) for r in rows), key=lambda t: (t[0], t[2], t[1]))
    assert progressed > 0  # the first run did process part of the stream before it was stopped
    assert got == expected
