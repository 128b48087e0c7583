"""Exceptions raised by the consumer package.

Invariants (backed by ``tests/test_consumer/test_config_and_records.py``):

* Every exception raised deliberately by this package derives from
  :class:`ConsumerError`; bad arguments also derive from ``ValueError``.
* An error caused by another exception chains it (``raise ... from exc``).
* Messages never contain credential values (see :mod:`consumer.config`).
"""

from __future__ import annotations

from harvest_outbox.errors import HarvestOutboxError

__all__ = [
    "CheckpointMismatchError",
    "CheckpointStoreError",
    "ConfigError",
    "ConsumerClosedError",
    "ConsumerError",
    "KafkaReadError",
    "MissingUUIDError",
    "OffsetLostError",
    "ReplayFailedError",
]


class ConsumerError(HarvestOutboxError):
    """Base class of every error raised by the consumer package."""


class ConfigError(ConsumerError, ValueError):
    """A Kafka client property or constructor argument is invalid (the message names it)."""


class CheckpointMismatchError(ConfigError):
    """The checkpoint given to the reader is another reader's: it covers none of the partitions this
    reader reads (another topic or partition), or partitions the topic does not have. Starting anyway
    would read every partition from ``auto.offset.reset``: re-delivering or skipping records."""


class ConsumerClosedError(ConsumerError, RuntimeError):
    """The iterator was used after ``close()`` (or after a fatal error closed it)."""


class KafkaReadError(ConsumerError):
    """librdkafka reported a fatal error, or a topic/partition cannot be read."""


class OffsetLostError(KafkaReadError):
    """A checkpointed offset is no longer in the log (retention deleted it).

    Resuming would silently skip messages, so the iterator stops instead:
    restore from a newer checkpoint, or start without one to apply the
    configured ``auto.offset.reset`` position.
    """


class ReplayFailedError(ConsumerError):
    """Re-reading a span for the Sequencer failed or timed out.

    The iterator is closed afterwards: restart it from the last checkpoint.
    """


class MissingUUIDError(ConsumerError, ValueError):
    """A record has no usable ``uuid`` header and the policy is ``UUIDPolicy.RAISE``."""


class CheckpointStoreError(ConsumerError):
    """Loading or saving a checkpoint in the store failed."""
