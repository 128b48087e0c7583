"""Spark's readCommitted returns exactly what ReadCommittedIter delivers, and their checkpoints interoperate."""

from __future__ import annotations

import pytest

from consumer import ReadCommittedIter
from sequenced_log import write_log
from spark_reader import read_committed, readCommitted

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _iter_rows(bootstrap: str, topic: str, checkpoint: bytes | None = None, limit: int | None = None):
    """(partition, offset, ack_offset-free order) delivered by ReadCommittedIter, and its checkpoint."""
    out = []
    with ReadCommittedIter({"bootstrap.servers": bootstrap}, topics=[topic], checkpoint=checkpoint,
                           idle_timeout=3.0) as it:
        for rec in it:
            out.append((rec.partition, rec.offset, bytes(rec.value or b"")))
            if limit is not None and len(out) >= limit:
                break
        return out, it.checkpoint()


def _spark_in_iter_order(df):
    rows = df.select("partition", "offset", "ack_offset", "value").collect()
    rows.sort(key=lambda r: (r.partition, r.ack_offset, r.offset))
    return [(r.partition, r.offset, bytes(r.value or b"")) for r in rows]


def test_spark_batch_equals_read_committed_iter(spark, kafka_bootstrap, topic_factory) -> None:
    topic = topic_factory(partitions=3)
    write_log(kafka_bootstrap, topic, 3, seed=21, steps=80)
    iter_rows, _ = _iter_rows(kafka_bootstrap, topic)
    spark_rows = _spark_in_iter_order(readCommitted(spark, topic, {"kafka.bootstrap.servers": kafka_bootstrap}))
    # ReadCommittedIter interleaves partitions arbitrarily; within a partition the order must match.
    for p in range(3):
        assert [r for r in spark_rows if r[0] == p] == [r for r in iter_rows if r[0] == p]
    assert sorted(spark_rows) == sorted(iter_rows) and len(spark_rows) > 20


def test_spark_resumes_from_read_committed_iter_checkpoint(spark, kafka_bootstrap, topic_factory) -> None:
    topic = topic_factory(partitions=2)
    write_log(kafka_bootstrap, topic, 2, seed=22, steps=80)
    everything, _ = _iter_rows(kafka_bootstrap, topic)
    first, checkpoint = _iter_rows(kafka_bootstrap, topic, limit=len(everything) // 2)
    rest = _spark_in_iter_order(readCommitted(spark, topic, {"kafka.bootstrap.servers": kafka_bootstrap},
                                              starting=checkpoint))
    assert sorted(first + rest) == sorted(everything)
    assert len(set(first) & set(rest)) == 0


def test_read_committed_iter_resumes_from_spark_checkpoint(spark, kafka_bootstrap, topic_factory) -> None:
    topic = topic_factory(partitions=2)
    write_log(kafka_bootstrap, topic, 2, seed=23, steps=60)
    everything, _ = _iter_rows(kafka_bootstrap, topic)
    batch = read_committed(spark, topic, {"kafka.bootstrap.servers": kafka_bootstrap})
    first = _spark_in_iter_order(batch.df)
    write_log(kafka_bootstrap, topic, 2, seed=24, steps=40)  # more arrives after the batch
    everything, _ = _iter_rows(kafka_bootstrap, topic)
    rest, _ = _iter_rows(kafka_bootstrap, topic, checkpoint=batch.checkpoint())
    assert sorted(first + rest) == sorted(everything)
    assert len(set(first) & set(rest)) == 0
