"""The producer's error hierarchy.

Every error raised on purpose by ``producer`` derives from :class:`HarvestError`, so an embedding
application can catch one type (itself a :class:`harvest_outbox.errors.HarvestOutboxError`, the
root of every package's errors). Lower-level causes (psycopg, confluent-kafka) are always chained
with ``raise ... from`` so the original traceback survives.

Invariant: no message built here contains a secret; callers pass values through
:func:`harvest_outbox.redact.redact_dsn` / :func:`harvest_outbox.redact.redact_kafka_config` first.
"""

from __future__ import annotations

import reprlib

from harvest_outbox.errors import HarvestOutboxError

#: The most characters of a user's value an error message shows (:func:`shown`).
SHOWN_CHARS = 80
# A few levels and items of a container: a YAML value made of aliases can expand to billions of
# items, and its full repr() exhausts memory before the message is ever printed.
_CONTAINERS = reprlib.Repr()
_CONTAINERS.maxlevel, _CONTAINERS.maxdict = 3, 4
_CONTAINERS.maxlist = _CONTAINERS.maxtuple = _CONTAINERS.maxset = _CONTAINERS.maxfrozenset = 4
_CONTAINERS.maxstring = _CONTAINERS.maxother = _CONTAINERS.maxlong = SHOWN_CHARS


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` as an error message shows a user's value: at most ``limit`` characters, then
    ``…(N more chars)`` (N counts the rendering, which for a container is already abridged). Every
    message that renders a value from a config file or an argument goes through here."""
    plain = value is None or isinstance(value, (str, bytes, int, float))
    text = repr(value) if plain else _CONTAINERS.repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…({len(text) - limit} more chars)"


class HarvestError(HarvestOutboxError):
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


class KafkaSecurityError(HarvestError):
    """A Kafka connection cannot work as configured: a TLS or SASL handshake refused for a reason no retry
    fixes, or an ACL the relay needs missing (producer/kafka/security_errors.py explains which, and the fix)."""


class ProducerError(HarvestError):
    """The Kafka producer hit a fatal error (e.g. the idempotent producer was fenced)."""


class FenceError(HarvestError):
    """``--uuid-sequencing``: a harvest transaction's commit was refused because this leader view is
    no longer current (another view bumped the fence epoch, or its rows were re-marked). The view is
    abandoned; nothing of the refused transaction becomes visible to read-committed readers."""


class LayoutChanged(DatabaseError):
    """The outbox was moved to the cursor layout while this relay of the mark layout ran (``harvest init-db
    --migrate [--online]``; the new table refuses every row update and delete, producer/layouts/cursor/migrate.py):
    the relay stops rather than mark or purge rows it would not own. A relay whose ``outboxLayout`` is unset is
    started again on the new layout (producer/relay/layout_change.py)."""
