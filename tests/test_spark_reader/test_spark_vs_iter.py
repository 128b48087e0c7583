"""Spark's readCommitted returns exactly what ReadCommittedIter delivers, and their checkpoints interoperate."""

from __future__ import annotations

import pytest
from sequenced_log import read_committed_to_end, write_log

from harvest_outbox.consumer import ReadCommittedIter
from harvest_outbox.spark_reader import read_committed, readCommitted

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _iter_rows(bootstrap: str, topic: str, checkpoint: bytes | None = None) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) delivered by ReadCommittedIter (from ``checkpoint``) up to the topic's end."""
    records = read_committed_to_end({"bootstrap.servers": bootstrap}, [topic], checkpoint=checkpoint)
    return [(rec.partition, rec.offset, bytes(rec.value or b"")) for rec in records]


def _iter_first(bootstrap: str, topic: str, limit: int) -> tuple[list[tuple[int, int, bytes]], bytes]:
    """The first ``limit`` records ReadCommittedIter delivers, and its checkpoint after them."""
    out = []
    with ReadCommittedIter({"bootstrap.servers": bootstrap}, topics=[topic], idle_timeout=3.0) as it:
        for rec in it:
            out.append((rec.partition, rec.offset, bytes(rec.value or b"")))
            if len(out) >= limit:
                break
        return out, it.checkpoint()


def _spark_in_iter_order(df):
    rows = df.select("partition", "offset", "ack_offset", "value").collect()
    rows.sort(key=lambda r: (r.partition, r.ack_offset, r.offset))
    return [(r.partition, r.offset, bytes(r.value or b"")) for r in rows]


def test_spark_batch_equals_read_committed_iter(spark, kafka_bootstrap, topic_factory) -> None:
    topic = topic_factory(partitions=3)
    write_log(kafka_bootstrap, topic, 3, seed=21, steps=80)
    iter_rows = _iter_rows(kafka_bootstrap, topic)
    spark_rows = _spark_in_iter_order(readCommitted(spark, topic, {"kafka.bootstrap.servers": kafka_bootstrap}))
    # ReadCommittedIter interleaves partitions arbitrarily; within a partition the order must match.
    for p in range(3):
        assert [r for r in spark_rows if r[0] == p] == [r for r in iter_rows if r[0] == p]
    assert sorted(spark_rows) == sorted(iter_rows) and len(spark_rows) > 20


def test_spark_resumes_from_read_committed_iter_checkpoint(spark, kafka_bootstrap, topic_factory) -> None:
    topic = topic_factory(partitions=2)
    write_log(kafka_bootstrap, topic, 2, seed=22, steps=80)
    everything = _iter_rows(kafka_bootstrap, topic)
    first, checkpoint = _iter_first(kafka_bootstrap, topic, len(everything) // 2)
    rest = _spark_in_iter_order(
        readCommitted(spark, topic, {"kafka.bootstrap.servers": kafka_bootstrap}, starting=checkpoint)
    )
    assert sorted(first + rest) == sorted(everything)
    assert len(set(first) & set(rest)) == 0


@pytest.mark.cluster
def test_read_committed_iter_resumes_from_spark_checkpoint(spark_cluster, kafka_bootstrap, topic_factory) -> None:
    """On local-cluster, where the checkpoint's states come back from executor processes (the harder case
    of the two; local[2]'s own run repeated it: docs/tests.md)."""
    spark = spark_cluster
    topic = topic_factory(partitions=2)
    write_log(kafka_bootstrap, topic, 2, seed=23, steps=60)
    everything = _iter_rows(kafka_bootstrap, topic)
    batch = read_committed(spark, topic, {"kafka.bootstrap.servers": kafka_bootstrap})
    first = _spark_in_iter_order(batch.df)
    write_log(kafka_bootstrap, topic, 2, seed=24, steps=40)  # more arrives after the batch
    everything = _iter_rows(kafka_bootstrap, topic)
    rest = _iter_rows(kafka_bootstrap, topic, checkpoint=batch.checkpoint())
    assert sorted(first + rest) == sorted(everything)
    assert len(set(first) & set(rest)) == 0


def test_uuid_header_among_other_headers(spark, kafka_bootstrap, topic_factory) -> None:
    """The first header named 'uuid' is the one that counts, wherever it is, as for ReadCommittedIter;
    records whose headers name no 'uuid' (only the application's) are delivered at-least-once."""
    from confluent_kafka import Producer

    from harvest_outbox.sequencer import Publisher

    topic = topic_factory(partitions=1)
    pub = Publisher()
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True, "acks": "all"})
    sent: list[tuple[str, list[tuple[str, bytes]]]] = [
        ("app-headers-only", [("source", b"billing")]),
        ("no-headers", []),
        ("outside-after-another", [("source", b"x"), ("uuid", pub.publish_committed().bytes)]),
        ("bad-uuid-first", [("uuid", b"not-a-uuid"), ("uuid", pub.publish_committed().bytes)]),
        ("txn-1", [("trace", b"t1"), ("uuid", pub.publish_uncommitted(f"{topic}/0").bytes), ("source", b"y")]),
        ("app-headers-only-2", [("a", b""), ("b", b"2")]),
        ("txn-2", [("uuid", pub.publish_uncommitted(f"{topic}/0").bytes)]),
    ]
    (ack,) = pub.build_ack_intents()
    sent.append(("ack", [("x", b"1"), ("uuid", ack.uuid.bytes)]))
    for value, headers in sent:
        producer.produce(topic, value=value.encode(), partition=0, headers=headers or None)
    assert producer.flush(30) == 0

    iter_rows = _iter_rows(kafka_bootstrap, topic)
    df = readCommitted(spark, topic, {"kafka.bootstrap.servers": kafka_bootstrap})
    assert _spark_in_iter_order(df) == iter_rows
    assert [v.decode() for _, _, v in iter_rows] == [
        "app-headers-only",
        "no-headers",
        "outside-after-another",
        "bad-uuid-first",
        "app-headers-only-2",
        "txn-1",
        "txn-2",
    ]
    by_value = {bytes(r.value).decode(): r for r in df.collect()}
    assert by_value["app-headers-only"].uuid is None and by_value["bad-uuid-first"].clock == 0
    assert by_value["outside-after-another"].clock > 0 and by_value["txn-1"].producer == pub.producer_id
    assert [h.key for h in by_value["txn-1"].headers] == ["trace", "uuid", "source"]
