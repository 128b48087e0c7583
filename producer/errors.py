"""The producer's error hierarchy.

Every error raised on purpose by ``producer`` derives from :class:`HarvestError`, so an embedding
application can catch one type. Lower-level causes (psycopg, confluent-kafka) are always chained
with ``raise ... from`` so the original traceback survives.

Invariant: no message built here contains a secret; callers pass values through
:func:`producer.redact.redact_dsn` / :func:`producer.redact.redact_kafka_config` first.
"""

from __future__ import annotations


class HarvestError(Exception):
    """Base class of every error the producer raises on purpose."""


class ConfigError(HarvestError, ValueError):
    """Configuration is invalid: unknown key, bad value, missing field. The message names the
    field, the offending value (redacted when secret) and what would fix it."""


class SchemaError(HarvestError):
    """The outbox table (or its companions) is missing or has an unexpected shape."""


class RecordError(HarvestError, ValueError):
    """An outbox record cannot be stashed or published as it stands (e.g. header arrays of different
    lengths, no topic). Raised by the stasher; the relay turns such rows into dead letters."""


class DatabaseError(HarvestError):
    """A database operation the relay needs failed (connection lost, statement failed)."""


class ElectionError(HarvestError):
    """Leader election could not start or hit a fatal Kafka error."""


class ProducerError(HarvestError):
    """The Kafka producer hit a fatal error (e.g. the idempotent producer was fenced)."""


class FenceError(HarvestError):
    """``--uuid-sequencing``: a harvest transaction's commit was refused because this leader view is
    no longer current (another view bumped the fence epoch, or its rows were re-marked). The view is
    abandoned; nothing of the refused transaction becomes visible to read-committed readers."""
