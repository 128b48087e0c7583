"""Which offsets a read covers: partitions and watermarks from Kafka, starts from a checkpoint.

A starting checkpoint must be this topic's: one that covers none of its partitions, or partitions
it does not have, raises :class:`ReaderConfigError` (``sequencer.check_checkpoint_scope``); entries
of other topics are carried through to the read's checkpoint, and partitions it does not cover are
named in a warning and read from the log start.

Invariant: for every partition p of the topic, ``read_from[p] <= start[p] <= end[p]``, where
``start`` is the checkpoint's read-through offset (or the low watermark when the checkpoint does
not cover p) and ``read_from`` reaches back to the oldest open span of p, so that spans still open
at the checkpoint can be replayed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harvest_outbox.kafka_access import AccessWatch, KafkaAccessError, topic_metadata
from harvest_outbox.kafka_token import with_reader_token_callback
from harvest_outbox.secret_providers import SpecError
from harvest_outbox.sequencer import CheckpointMismatchError, ProducerState, check_checkpoint_scope, decode_checkpoint
from harvest_outbox.spark_reader.errors import ReaderConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReadRange:
    topic: str
    read_from: dict[int, int]
    start: dict[int, int]
    end: dict[int, int]
    states: dict[tuple[int, bytes], ProducerState]
    foreign_offsets: dict[str, int]  # checkpoint entries of other topics, carried through
    foreign_states: list[ProducerState]


#: Client properties only Kafka's Java client understands (Spark's own Kafka source takes them): librdkafka has
#: no such names, and refuses a name it does not know, so the driver's offset lookup leaves them out.
JAVA_ONLY = frozenset(
    {
        "sasl.jaas.config",
        "security.protocol.class",
        "sasl.login.callback.handler.class",
        "sasl.client.callback.handler.class",
        "ssl.truststore.location",
        "ssl.truststore.type",
        "ssl.truststore.password",
    }
)


def client_config(kafka_options: Mapping[str, str]) -> dict[str, Any]:
    """Spark's ``kafka.``-prefixed options as a confluent-kafka (librdkafka) config. ``kafka.oauth_cb``
    (``package.module:function`` returning ``(token, expires_at)``, as the relay's
    ``kafkaOAuthTokenProvider``) is resolved here, in whichever process makes the client (the driver,
    a Python worker): a callable does not travel in string options."""
    conf: dict[str, Any] = {k[len("kafka.") :]: v for k, v in kafka_options.items() if k.startswith("kafka.")}
    servers = conf.get("bootstrap.servers")
    if servers is None or (isinstance(servers, str) and not servers.strip()):
        raise ReaderConfigError(
            "kafka_options has no 'kafka.bootstrap.servers'; pass e.g. "
            "{'kafka.bootstrap.servers': 'broker:9092'} (Spark's Kafka source option names)"
        )
    if not isinstance(servers, str):  # librdkafka would read a number such as 12345 as an IPv4 address
        raise ReaderConfigError(
            f"kafka_options['kafka.bootstrap.servers'] must be a string of host:port pairs, e.g. "
            f"'broker1:9092,broker2:9092'; got {servers!r} ({type(servers).__name__}): quote it"
        )
    # Options only the Java client understands are of no use to the offset lookup.
    for java_only in JAVA_ONLY:
        conf.pop(java_only, None)
    try:
        with_reader_token_callback(conf, "kafka_options['kafka.oauth_cb']", " (as an option: prefixed with 'kafka.')")
    except SpecError as exc:
        raise ReaderConfigError(str(exc)) from None
    return conf


def resolve(
    topic: str,
    kafka_options: Mapping[str, str],
    starting: bytes | None,
    ending: str | Mapping[int, int],
    timeout: float = 30.0,
    marks: Mapping[int, tuple[int, int]] | None = None,
) -> ReadRange:
    """The read's range. ``marks``: the topic's ``{partition: (low, high)}`` watermarks when the caller
    has them (a stream's driver asks its kept consumer); otherwise a consumer made here asks."""
    if marks is None:
        low, high = _watermarks(topic, kafka_options, timeout)
    else:
        low = {p: lo for p, (lo, _) in sorted(marks.items())}
        high = {p: hi for p, (_, hi) in sorted(marks.items())}
    return _resolve(topic, starting, ending, low, high)


def _watermarks(topic: str, kafka_options: Mapping[str, str], timeout: float) -> tuple[dict[int, int], dict[int, int]]:
    from confluent_kafka import Consumer, TopicPartition

    conf = client_config(kafka_options)
    watch = AccessWatch()  # a refused login or TLS handshake: its reason now, not a timeout in 30 s
    consumer = Consumer(
        {**conf, "group.id": "harvest-spark-reader-offsets", "enable.auto.commit": False, "error_cb": watch}
    )
    try:
        try:
            meta = topic_metadata(consumer, topic, timeout, watch, conf).topics.get(topic)
        except KafkaAccessError as exc:
            raise ReaderConfigError(f"topic {topic!r}: {exc}") from None
        if meta is None or meta.error is not None or not meta.partitions:
            raise ReaderConfigError(
                f"topic {topic!r} does not exist or has no partitions ({meta.error if meta else 'unknown'}); "
                "check the name and kafka.bootstrap.servers"
            )
        low: dict[int, int] = {}
        high: dict[int, int] = {}
        for p in sorted(meta.partitions):
            lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            low[p], high[p] = lo, hi
    finally:
        consumer.close()
    return low, high


def _resolve(
    topic: str, starting: bytes | None, ending: str | Mapping[int, int], low: dict[int, int], high: dict[int, int]
) -> ReadRange:
    offsets: dict[str, int] = {}
    states: list[ProducerState] = []
    if starting is not None:
        offsets, states = decode_checkpoint(starting)
        try:
            _, uncovered = check_checkpoint_scope(offsets, states, {topic: set(low)}, complete=True)
        except CheckpointMismatchError as exc:
            raise ReaderConfigError(f"starting: {exc}") from exc
        if uncovered:
            log.warning(
                "starting checkpoint covers no offset for %s: read from the log start (a new partition, "
                "or the checkpoint of another reader?)",
                ", ".join(uncovered[:20]),
            )
    prefix = f"{topic}/"
    ours = {int(j[len(prefix) :]): o for j, o in offsets.items() if _is_partition_journal(j, prefix)}
    start = {p: max(ours.get(p, low[p]), low[p]) for p in low}
    for p, offset in ours.items():
        if p in low and offset < low[p]:
            log.warning(
                "checkpoint offset %d of %s/%d is below the log start %d: records %d..%d were "
                "deleted by retention before this reader saw them",
                offset,
                topic,
                p,
                low[p],
                offset,
                low[p] - 1,
            )
    by_key: dict[tuple[int, bytes], ProducerState] = {}
    foreign_states: list[ProducerState] = []
    for st in states:
        if _is_partition_journal(st.journal, prefix):
            by_key[(int(st.journal[len(prefix) :]), st.producer)] = st
        else:
            foreign_states.append(st)
    read_from = dict(start)
    for (p, _), st in by_key.items():
        if st.begin >= 0 and p in read_from:
            read_from[p] = max(low[p], min(read_from[p], st.begin))

    end = _ending(topic, ending, high)
    for p in low:
        if end[p] < start[p]:
            raise ReaderConfigError(
                f"ending offset {end[p]} of {topic}/{p} is before the starting offset {start[p]} "
                "(from the checkpoint); pass a later ending or an older checkpoint"
            )
    foreign = {j: o for j, o in offsets.items() if not _is_partition_journal(j, prefix)}
    return ReadRange(topic, read_from, start, end, by_key, foreign, foreign_states)


def _ending(topic: str, ending: str | Mapping[int, int], high: dict[int, int]) -> dict[int, int]:
    if ending == "latest":
        return dict(high)
    if isinstance(ending, Mapping):
        unknown = set(ending) - set(high)
        if unknown:
            raise ReaderConfigError(f"ending names partitions {sorted(unknown)} that {topic!r} does not have")
        return {p: min(int(ending.get(p, high[p])), high[p]) for p in high}
    raise ReaderConfigError(f"ending={ending!r}: use 'latest' or a dict {{partition: offset}}")


def _is_partition_journal(journal: str, prefix: str) -> bool:
    return journal.startswith(prefix) and journal[len(prefix) :].isdigit()
