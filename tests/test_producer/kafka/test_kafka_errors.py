"""The error classification of producer/kafka/__init__.py: which broker refusals name a batch too large, and whose.

A fatal producer error of ``--uuid-sequencing`` (a gap-less batch the broker refused) names the batches'
topics in its text; the relay then checks those topics' size limits (``RelayCore.on_producer_error``), so
the next attempt refuses the oversized row alone. No services.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from harvest_outbox.producer.kafka import is_size_refusal, size_refused_topics

REFUSED = (
    "ProduceRequest for orders [0] with 12 message(s) failed due to sequence desynchronization: "
    "Broker: Message size too large; ProduceRequest for audit.events [3] with 1 message(s) failed"
)


@pytest.mark.parametrize(
    ("text", "topics"),
    [
        (REFUSED, ["orders", "audit.events"]),
        ("ProduceRequest for orders [0] with 2 message(s) failed: Broker: Message size too large", ["orders"]),
        # another fatal error naming a batch: no size check
        ("ProduceRequest for orders [0] with 2 message(s) failed: Broker: Out of order sequence number", []),
        ("Broker: Message size too large", []),  # too large, but no batch named
    ],
)
def test_a_fatal_error_names_the_topics_of_the_batches_refused_as_too_large(text: str, topics: list[str]) -> None:
    err = KafkaError(KafkaError._FATAL, text, fatal=True)
    assert size_refused_topics(err) == topics


def test_a_size_refusal_is_told_by_its_code_or_its_text() -> None:
    assert is_size_refusal(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    assert is_size_refusal(KafkaError(KafkaError._FATAL, REFUSED, fatal=True))
    assert not is_size_refusal(KafkaError(KafkaError._MSG_TIMED_OUT, "Local: Message timed out"))
