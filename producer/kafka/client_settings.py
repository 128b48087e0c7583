"""Which of the relay's Kafka properties (``baseKafkaConfig``) each kind of client it makes takes: one list of
the producer's own properties and one of the consumer's, so the election's consumer, the admin clients of
the start-up check, NELI, ``harvest shards`` and the dead-letter verbs all drop the same ones.

Invariants (``tests/test_producer/kafka/test_client_settings.py``):

- a consumer's properties are the base's without the producer's own; an admin client's without the
  consumer's own too; security settings (``security.protocol``, ``sasl.*``, ``ssl.*``, ``oauth_cb``) always
  pass;
- the base mapping is never changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Properties only a producer takes: a consumer or an admin client warns about (or refuses) them.
PRODUCER_ONLY = frozenset(
    {
        "acks",
        "enable.idempotence",
        "enable.gapless.guarantee",
        "linger.ms",
        "compression.type",
        "batch.size",
        "batch.num.messages",
        "delivery.timeout.ms",
        "message.timeout.ms",
        "queue.buffering.max.ms",
        "partitioner",
    }
)
#: Properties only a consumer takes.
CONSUMER_ONLY = frozenset(
    {"group.id", "auto.offset.reset", "enable.auto.commit", "max.poll.interval.ms", "session.timeout.ms"}
)


def for_consumer(base: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` without the producer's own properties."""
    return {k: v for k, v in base.items() if k not in PRODUCER_ONLY}


def for_admin(base: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` without the producer's and the consumer's own properties."""
    return {k: v for k, v in base.items() if k not in PRODUCER_ONLY and k not in CONSUMER_ONLY}
