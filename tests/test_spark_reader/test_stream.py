"""readCommittedStream on local Spark + embedded Kafka: exactly once into a file sink across restarts."""

from __future__ import annotations

import pytest

from sequenced_log import read_raw, reference_read, write_log
from spark_reader import readCommittedStream

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _run_once(spark, topic, bootstrap, out_dir, chk_dir, max_offsets=None):
    sdf = readCommittedStream(spark, topic, {"kafka.bootstrap.servers": bootstrap},
                              max_offsets_per_trigger=max_offsets)
    query = (sdf.writeStream.format("parquet").option("path", str(out_dir))
             .option("checkpointLocation", str(chk_dir)).trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()


def test_stream_restarted_mid_way_writes_each_committed_row_once(spark, kafka_bootstrap, topic_factory, tmp_path) -> None:
    spark.conf.set("spark.sql.streaming.stateStore.providerClass",
                   "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    topic = topic_factory(partitions=2)
    out_dir, chk_dir = tmp_path / "out", tmp_path / "chk"
    write_log(kafka_bootstrap, topic, 2, seed=11, steps=40)
    _run_once(spark, topic, kafka_bootstrap, out_dir, chk_dir, max_offsets=25)  # several micro-batches
    write_log(kafka_bootstrap, topic, 2, seed=12, steps=40)  # more arrives while the query is down
    _run_once(spark, topic, kafka_bootstrap, out_dir, chk_dir, max_offsets=40)

    expected = reference_read(read_raw(kafka_bootstrap, topic, 2), topic)
    rows = spark.read.parquet(str(out_dir)).select("partition", "offset", "ack_offset").collect()
    got = sorted(((r.partition, r.offset, r.ack_offset) for r in rows), key=lambda t: (t[0], t[2], t[1]))
    assert got == expected
