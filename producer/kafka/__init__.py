"""The relay's Kafka producer: a narrow seam around confluent-kafka's Producer, its errors, its log lines,
and a fault injector for tests.

The relay only needs ``produce``, ``poll``, ``flush``, ``purge`` and ``len``; it receives
delivery reports through one callback given at construction (a global ``on_delivery``, so no
closure is allocated per message). :class:`FaultInjectingProducer` wraps a *real* producer and
makes ``produce()`` raise, or turns successful delivery reports into failures, at given rates —
the real broker still receives (some of) those records, which is exactly the duplicate-producing
situation at-least-once delivery must survive.

Error classification (:func:`is_permanent`): errors that retrying can never fix (record too large,
invalid topic) send the record to the dead-letter table at once; everything else counts as a failed
attempt, except an authorization error (:func:`is_access_denied`), which is never a row's fault: the relay
asks the preflight again (:meth:`~producer.ops.preflight.TopicGuard.denied` decides whether the topic's
rows are refused or the relay stops) and counts nothing. An unknown topic is not permanent here: :mod:`producer.ops.preflight` has
already refused rows of topics the broker says do not exist, so librdkafka's "unknown topic" for a
row that got past it is stale metadata of a topic just created (it counts as an attempt).

Each concept has a module of its own, re-exported here (``from harvest_outbox.producer.kafka import …``):
:mod:`~producer.kafka._producer` (the seam), :mod:`~producer.kafka._logs` (librdkafka's log lines through
:mod:`logging`) and :mod:`~producer.kafka._faults` (the fault injector); the error classification is this
module's own. Security has modules of its own, imported by path: :mod:`~producer.kafka.acls` (the ACLs the
relay and the readers need), :mod:`~producer.kafka.security_errors` (what a TLS, SASL or authorization
error means and its fix) and :mod:`~producer.kafka.probe` (the start-up check of the connection).
"""

from __future__ import annotations

import re

from confluent_kafka import KafkaError

from harvest_outbox.producer.kafka._faults import FaultInjectingProducer, FaultInjector
from harvest_outbox.producer.kafka._logs import LIBRDKAFKA_LOG, logged, logged_admin, serve_logs
from harvest_outbox.producer.kafka._producer import (
    ANY_PARTITION,
    PRODUCE_ARGS,
    DeliveryCallback,
    FatalErrorGuard,
    KafkaProducer,
    ProducerFactory,
    confluent_producer,
    produce_args,
)

__all__ = [
    "ANY_PARTITION",
    "BATCH_SCOPED_CODES",
    "LIBRDKAFKA_LOG",
    "PERMANENT_CODES",
    "PRODUCE_ARGS",
    "PURGED_CODES",
    "SIZE_REFUSED_TEXT",
    "DeliveryCallback",
    "FatalErrorGuard",
    "FaultInjectingProducer",
    "FaultInjector",
    "KafkaProducer",
    "ProducerFactory",
    "confluent_producer",
    "is_access_denied",
    "is_permanent",
    "is_size_refusal",
    "logged",
    "logged_admin",
    "produce_args",
    "serve_logs",
    "size_refused_topics",
]

PERMANENT_CODES = frozenset(
    code
    for code in (
        getattr(KafkaError, "MSG_SIZE_TOO_LARGE", None),
        getattr(KafkaError, "_MSG_SIZE_TOO_LARGE", None),
        getattr(KafkaError, "TOPIC_EXCEPTION", None),
        getattr(KafkaError, "INVALID_RECORD", None),
        getattr(KafkaError, "RECORD_LIST_TOO_LARGE", None),
        getattr(KafkaError, "_INVALID_ARG", None),
        getattr(KafkaError, "INVALID_TOPIC_EXCEPTION", None),
    )
    if code is not None
)


# Broker-side errors that reject a whole produce batch: an innocent record batched with an oversized
# one sees the same error. Reported asynchronously they count as an ordinary failed attempt (the
# culprit still reaches the dead letters after maxDeliveryAttempts; the innocents get through on a
# retry, batched differently). Raised synchronously by produce() they concern that record alone.
BATCH_SCOPED_CODES = frozenset(
    code
    for code in (
        getattr(KafkaError, "MSG_SIZE_TOO_LARGE", None),
        getattr(KafkaError, "RECORD_LIST_TOO_LARGE", None),
        getattr(KafkaError, "INVALID_RECORD", None),
    )
    if code is not None
)

#: Delivery reports of records the relay itself purged from the producer's queue (``purge()``).
PURGED_CODES = frozenset(
    c
    for c in (getattr(KafkaError, "_PURGE_QUEUE", None), getattr(KafkaError, "_PURGE_INFLIGHT", None))
    if c is not None
)


#: librdkafka's text for a batch the broker refused as too large, and how its fatal errors name the batch.
SIZE_REFUSED_TEXT = "Message size too large"
_BATCH_TOPIC = re.compile(r"ProduceRequest for (\S+) \[")


def is_size_refusal(err: KafkaError) -> bool:
    """The broker refused a record batch as too large (which record is to blame is not said)."""
    return err.code() in BATCH_SCOPED_CODES or SIZE_REFUSED_TEXT in err.str()


def size_refused_topics(err: KafkaError) -> list[str]:
    """The topics of the batches a fatal producer error says the broker refused as too large."""
    text = err.str()
    return _BATCH_TOPIC.findall(text) if SIZE_REFUSED_TEXT in text else []


def is_permanent(err: KafkaError, synchronous: bool = True) -> bool:
    """True if retrying this record can never succeed."""
    code = err.code()
    return code in PERMANENT_CODES and (synchronous or code not in BATCH_SCOPED_CODES)


#: Kafka's authorization errors: an ACL is missing (docs/security.md, Kafka ACLs).
ACCESS_DENIED_CODES = frozenset(
    code
    for code in (
        getattr(KafkaError, "TOPIC_AUTHORIZATION_FAILED", None),
        getattr(KafkaError, "GROUP_AUTHORIZATION_FAILED", None),
        getattr(KafkaError, "CLUSTER_AUTHORIZATION_FAILED", None),
        getattr(KafkaError, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", None),
    )
    if code is not None
)


def is_access_denied(err: KafkaError) -> bool:
    """The broker refused for want of an ACL: never the row's fault, never a dead letter by itself."""
    return err.code() in ACCESS_DENIED_CODES
