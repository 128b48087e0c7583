"""The readers over SASL_SSL with the broker's certificate verified (issue #49, docs/security.md "Readers over
TLS and SASL"): as principals with only READ and DESCRIBE on the topic (and READ on the ``harvest-`` consumer
groups the readers name, never joined), ``ReadCommittedIter`` and the pipeline (SCRAM-SHA-512; the pipeline's
events query is ``readCommittedStream`` with ``state_location``, its latest-state table derived from that),
``readCommittedStream`` through Spark's own (Java) Kafka source with the Java client's settings, and
Spark's batch ``readCommitted`` (OAUTHBEARER, its tokens from ``kafka.oauth_cb``, a ``module:function``
resolved in the driver and the Python workers) read a sequenced log and get every committed record, as the
pure Sequencer does. A wrong password (ReadCommittedIter) and a CA that did not sign the broker's certificate
(readCommitted) are refused at once with librdkafka's reason and the setting to check, the password in no
message."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType
from kafka_acls import grant
from sequenced_log import read_raw, reference_read, write_log

from harvest_outbox.consumer import ReadCommittedIter
from harvest_outbox.consumer.errors import KafkaReadError
from harvest_outbox.harvest_local.kafka import EmbeddedKafka
from harvest_outbox.harvest_local.kafka_security import READER_SUBJECT, add_scram_user
from harvest_outbox.harvest_local.tls import make_server_files
from harvest_outbox.spark_reader import ReaderConfigError, readCommitted, readCommittedStream
from harvest_outbox.spark_reader.latest_table import read_latest
from harvest_outbox.spark_reader.pipeline import PipelineConfig, start_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _spark_options(config: dict[str, Any]) -> dict[str, str]:
    return {f"kafka.{k}": str(v) for k, v in config.items()}


def _iter_rows(config: dict[str, Any], topic: str, expected: int) -> list[tuple[int, int]]:
    """``expected`` records, then whatever else arrives within 0.3 s."""
    out: list[tuple[int, int]] = []
    with ReadCommittedIter(config, topics=[topic]) as it:
        while (rec := it.poll(0.3 if len(out) >= expected else 10)) is not None:
            out.append((rec.partition, rec.offset))
    return out


def _by_partition(rows: list[tuple[int, int]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for partition, offset in rows:
        out.setdefault(partition, []).append(offset)
    return out


def test_readers_read_every_committed_record_over_sasl_ssl(
    secure_kafka: EmbeddedKafka, spark: Any, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    sasl = secure_kafka.sasl
    assert sasl is not None
    topic = unique_name("readers")
    secure_kafka.create_topic(topic, partitions=2)
    user, password = f"reader-{uuid.uuid4().hex[:6]}", f"pw-{uuid.uuid4().hex}"
    add_scram_user(secure_kafka.bootstrap, user, password)
    for principal in (user, READER_SUBJECT):
        grant(
            secure_kafka.bootstrap,
            principal,
            [
                (ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, [AclOperation.READ, AclOperation.DESCRIBE]),
                (ResourceType.GROUP, "harvest-", ResourcePatternType.PREFIXED, [AclOperation.READ]),
            ],
        )
    write_log(secure_kafka.bootstrap, topic, 2, seed=49, steps=40)
    raw = read_raw(secure_kafka.bootstrap, topic, 2)
    expected = reference_read(raw, topic)  # (partition, offset, ack_offset) of every committed record
    assert len(expected) > 20
    # the latest-state table: per key, the committed record of greatest (ack_offset, offset)
    key_of = {(r.partition, r.offset): r.key for r in raw}
    newest: dict[bytes, tuple[int, int]] = {}
    for p, o, ack in expected:
        key = key_of[(p, o)]
        if key is not None and (ack, o) > newest.get(key, (-1, -1)):
            newest[key] = (ack, o)
    config = sasl.client_config(user, password)

    # ReadCommittedIter: per partition, the Sequencer's order.
    assert _by_partition(_iter_rows(config, topic, len(expected))) == _by_partition([(p, o) for p, o, _ in expected])

    # Spark's batch read as the OAUTHBEARER principal: the driver and each Python worker import the provider.
    oauth = {
        **_spark_options(sasl.oauth_client_config()),
        "kafka.oauth_cb": "harvest_outbox.harvest_local.kafka_security:reader_token",
    }
    rows = readCommitted(spark, topic, oauth).select("partition", "offset", "ack_offset").collect()
    assert sorted((r.partition, r.offset, r.ack_offset) for r in rows) == sorted(expected)

    # The pipeline, once through what the topic holds: its event table is readCommittedStream's output.
    cfg = PipelineConfig.under(str(tmp_path / "pipeline"), topic, _spark_options(config), available_now=True)
    pipeline = start_pipeline(spark, cfg)
    try:
        pipeline.latest.awaitTermination(120)
        assert pipeline.events.exception() is None and pipeline.latest.exception() is None
    finally:
        pipeline.stop()
    events = spark.read.parquet(cfg.events_path).select("partition", "offset", "ack_offset").collect()
    assert sorted((r.partition, r.offset, r.ack_offset) for r in events) == sorted(expected)
    latest = read_latest(spark, cfg.latest_path).collect()
    assert {bytes(r.key): (r.ack_offset, r.offset) for r in latest} == newest

    # readCommittedStream without state_location reads through Spark's own Kafka source, the Java client: its
    # settings are the Java client's (a JAAS line for SCRAM, a PEM trust store), verification on as well.
    java = {
        "kafka.bootstrap.servers": sasl.bootstrap,
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": (
            f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{user}" password="{password}";'
        ),
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": str(sasl.tls.ca),
        "kafka.ssl.endpoint.identification.algorithm": "https",
    }
    name = f"sasl_stream_{uuid.uuid4().hex[:8]}"
    spark.conf.set(  # transformWithStateInPandas' state store (docs/reading-spark.md)
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    )
    query = (
        readCommittedStream(spark, topic, java)
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "stream-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    streamed = spark.sql(f"SELECT partition, offset, ack_offset FROM {name}").collect()
    assert sorted((r.partition, r.offset, r.ack_offset) for r in streamed) == sorted(expected)

    # A wrong password, a CA that did not sign the broker's certificate: the reason at once, no secret.
    wrong = sasl.client_config(user, "wrong-" + password)
    with pytest.raises(KafkaReadError, match="invalid credentials") as refused:
        _iter_rows(wrong, topic, 1)
    assert "sasl.password" in str(refused.value) and password not in str(refused.value)
    with pytest.raises(KafkaReadError, match="invalid credentials") as refused_group:  # a subscribing reader too
        ReadCommittedIter({**wrong, "group.id": f"harvest-{uuid.uuid4().hex[:6]}"}, topics=[topic])
    assert password not in str(refused_group.value)
    other_ca = str(make_server_files(tmp_path / "other", ca_name="other").ca)
    with pytest.raises(ReaderConfigError, match="certificate verify failed") as refused_tls:
        readCommitted(spark, topic, _spark_options({**config, "ssl.ca.location": other_ca}))
    assert "ssl.ca.location" in str(refused_tls.value) and password not in str(refused_tls.value)
