"""readCommitted (batch) on local Spark + embedded Kafka against the pure Sequencer's output, through
both sources (harvest's own data source, the default, and Spark's Kafka source)."""

from __future__ import annotations

import pytest
from sequenced_log import read_raw, reference_read, write_log

from harvest_outbox.spark_reader import ReaderConfigError, read_committed, readCommitted
from harvest_outbox.spark_reader import offsets as offsets_mod

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _rows(df) -> list[tuple[int, int, int]]:
    return sorted(
        ((r.partition, r.offset, r.ack_offset) for r in df.select("partition", "offset", "ack_offset").collect()),
        key=lambda t: (t[0], t[2], t[1]),
    )


@pytest.mark.parametrize("seed, source", [(1, "harvest"), (2, "harvest"), (1, "spark")])
def test_batch_equals_reference_sequencer(spark, kafka_bootstrap, topic_factory, seed, source) -> None:
    topic = topic_factory(partitions=3)
    write_log(kafka_bootstrap, topic, 3, seed=seed, steps=80)
    expected = reference_read(read_raw(kafka_bootstrap, topic, 3), topic)
    df = readCommitted(spark, topic, {"kafka.bootstrap.servers": kafka_bootstrap}, source=source)
    assert _rows(df) == expected
    assert len(expected) > 20


@pytest.mark.parametrize("source", ["harvest", "spark"])
def test_small_ring_forces_replays_and_changes_nothing(spark, kafka_bootstrap, topic_factory, source) -> None:
    topic = topic_factory(partitions=2)
    write_log(kafka_bootstrap, topic, 2, seed=3, steps=60)
    expected = reference_read(read_raw(kafka_bootstrap, topic, 2), topic)
    df = readCommitted(spark, topic, {"kafka.bootstrap.servers": kafka_bootstrap}, ring_size=2, source=source)
    assert _rows(df) == expected


def test_sources_and_chunk_sizes_agree_on_rows_and_checkpoints(spark_any, kafka_bootstrap, topic_factory) -> None:
    """Incremental reads cut inside open spans: Spark's Kafka source, harvest's source in one chunk,
    and harvest's source in chunks of 3 and 7 records (open spans carried from chunk to chunk) return
    the same rows and byte-identical checkpoints; on local[2], and on local-cluster, where the chunks of 3
    (the most carrying of open spans) stand for the chunked reads (each variant costs three Spark jobs)."""
    topic = topic_factory(partitions=2)
    write_log(kafka_bootstrap, topic, 2, seed=7, steps=90)
    raw = read_raw(kafka_bootstrap, topic, 2)
    ends = {p: max(r.offset for r in raw if r.partition == p) + 1 for p in (0, 1)}
    opts = {"kafka.bootstrap.servers": kafka_bootstrap}
    variants = {
        "spark": {"source": "spark"},
        "harvest": {},
        "chunks3": {"chunk_records": 3},
        "chunks7": {"chunk_records": 7},
    }
    if spark_any.sparkContext.master.startswith("local-cluster"):
        del variants["harvest"], variants["chunks7"]
    results: dict[str, tuple[list, list[bytes]]] = {}
    for name, kwargs in variants.items():
        rows, checkpoints, checkpoint = [], [], None
        for frac in (0.3, 0.65, 1.0):
            read = read_committed(
                spark_any,
                topic,
                opts,
                starting=checkpoint,
                ending={p: int(e * frac) for p, e in ends.items()},
                **kwargs,
            )
            rows.append(_rows(read.df))
            checkpoint = read.checkpoint()
            checkpoints.append(checkpoint)
        results[name] = (rows, checkpoints)
    assert sorted(r for part in results["spark"][0] for r in part) == sorted(reference_read(raw, topic))
    for name in variants:
        assert results[name] == results["spark"], name


@pytest.mark.parametrize("source", ["harvest", "spark"])
def test_incremental_reads_chained_by_checkpoints_are_exactly_once(
    spark, kafka_bootstrap, topic_factory, source
) -> None:
    topic = topic_factory(partitions=2)
    write_log(kafka_bootstrap, topic, 2, seed=4, steps=90)
    raw = read_raw(kafka_bootstrap, topic, 2)
    expected = reference_read(raw, topic)
    ends = {p: max(r.offset for r in raw if r.partition == p) + 1 for p in (0, 1)}
    opts = {"kafka.bootstrap.servers": kafka_bootstrap}
    got: list[tuple[int, int, int]] = []
    checkpoint = None
    for frac in (0.2, 0.45, 0.7, 1.0):  # cut points land inside open spans
        ending = {p: int(e * frac) for p, e in ends.items()}
        read = read_committed(spark, topic, opts, starting=checkpoint, ending=ending, source=source, chunk_records=5)
        got.extend(_rows(read.df))
        checkpoint = read.checkpoint()
    assert sorted(got) == sorted(expected)
    assert len(got) == len(set(got))


def test_columns_and_identity(spark, kafka_bootstrap, topic_factory) -> None:
    topic = topic_factory(partitions=1)
    write_log(kafka_bootstrap, topic, 1, seed=5, steps=20, headerless=False)
    df = readCommitted(spark, topic, {"kafka.bootstrap.servers": kafka_bootstrap})
    assert df.columns == [
        "key",
        "value",
        "headers",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "uuid",
        "producer",
        "clock",
        "ack_offset",
    ]
    import uuid as uuid_mod

    from harvest_outbox.sequencer import clock_of, producer_of

    for row in df.collect():
        u = uuid_mod.UUID(row.uuid)
        assert producer_of(u) == bytes(row.producer)
        assert clock_of(u) == row.clock
        assert row.ack_offset >= row.offset
        assert [h.key for h in row.headers] == ["uuid"]


@pytest.mark.parametrize("policy, expect_plain", [("deliver", True), ("drop", False)])
def test_uuid_policy_policy(spark, kafka_bootstrap, topic_factory, policy, expect_plain) -> None:
    topic = topic_factory(partitions=1)
    write_log(kafka_bootstrap, topic, 1, seed=6, steps=40)
    df = readCommitted(spark, topic, {"kafka.bootstrap.servers": kafka_bootstrap}, uuid_policy=policy)
    values = [bytes(r.value).decode() for r in df.select("value").collect()]
    assert any(v.startswith("plain-") for v in values) is expect_plain
    assert any(v.startswith("txn-") for v in values)


def test_uuid_policy_raise(spark, kafka_bootstrap, topic_factory) -> None:
    topic = topic_factory(partitions=1)
    write_log(kafka_bootstrap, topic, 1, seed=6, steps=40)
    df = readCommitted(spark, topic, {"kafka.bootstrap.servers": kafka_bootstrap}, uuid_policy="raise")
    with pytest.raises(Exception, match="no valid 'uuid' header"):
        df.collect()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"kafka_options": {}}, "kafka.bootstrap.servers"),
        ({"kafka_options": {"kafka.bootstrap.servers": " "}}, "kafka_options has no 'kafka.bootstrap.servers'"),
        # librdkafka reads 12345 as an IPv4 address (0.0.48.57) and connects to it
        (
            {"kafka_options": {"kafka.bootstrap.servers": 12345}},
            r"kafka_options\['kafka.bootstrap.servers'\] must be a string of host:port pairs.*got 12345 \(int\): quote it",
        ),
        ({"kafka_options": {"kafka.bootstrap.servers": "x:1", "subscribe": "t"}}, "subscribe"),
        ({"uuid_policy": "ignore"}, "uuid_policy='ignore'"),
        ({"ending": "earliest"}, "ending='earliest'"),
        ({"source": "kafka"}, "source='kafka': use 'harvest'"),
        ({"chunk_records": 0}, "chunk_records=0: pass a positive int"),
        (
            {"kafka_options": {"kafka.bootstrap.servers": "x:1", "failOnDataLoss": "false"}},
            r"kafka_options\['failOnDataLoss'\] is an option of Spark's Kafka source.*source='spark'",
        ),
        (
            {"kafka_options": {"kafka.bootstrap.servers": "x:1", "kafka.sasl.jaas.config": "secret-jaas"}},
            r"kafka_options\['kafka.sasl.jaas.config'\] is a property of Kafka's Java client.*source='spark'",
        ),
    ],
)
def test_bad_arguments(spark, kafka_bootstrap, topic_factory, kwargs, message) -> None:
    topic = topic_factory(partitions=1)
    args = {"kafka_options": {"kafka.bootstrap.servers": kafka_bootstrap}, **kwargs}
    with pytest.raises(ReaderConfigError, match=message):
        readCommitted(spark, topic, **args)


def test_the_drivers_offset_lookup_leaves_the_java_clients_properties_out() -> None:
    # A stream through Spark's source with a ``starting`` checkpoint: its options hold the Java client's
    # settings for Spark and librdkafka's for the driver's lookup; librdkafka refuses a name it does not know.
    from confluent_kafka.admin import AdminClient

    java = {f"kafka.{k}": "x" for k in offsets_mod.JAVA_ONLY}
    librdkafka = {"kafka.bootstrap.servers": "127.0.0.1:1", "kafka.security.protocol": "SASL_SSL"}
    conf = offsets_mod.client_config({**java, **librdkafka})
    assert conf == {"bootstrap.servers": "127.0.0.1:1", "security.protocol": "SASL_SSL"}
    AdminClient({**conf, "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"})  # all taken


def test_unknown_topic(spark, kafka_bootstrap) -> None:
    with pytest.raises(ReaderConfigError, match="does not exist"):
        readCommitted(spark, "no-such-topic-xyz", {"kafka.bootstrap.servers": kafka_bootstrap})
