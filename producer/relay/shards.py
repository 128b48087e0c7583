"""Shards: how one outbox is split between relays (``shards: S``).

A row belongs to shard ``h(kafka_key) mod S``, where ``h`` is the first 32 bits of the MD5 of the key
(its UTF-8 bytes), read as an unsigned big-endian integer. MD5 because Postgres and Python compute it
identically on every version and platform (unlike ``hashtext``, whose values Postgres does not
promise to keep); the hash is not a security boundary. Every row of a key is in one shard, so
per-key order needs nothing beyond what one relay loop already guarantees. A NULL key (an outbox
without goharvest's NOT NULL) hashes as the empty key: the row is in a shard, whose leader marks it
and dead-letters it like any malformed row, and every other key keeps the shard it always had.

The database computes the shard with :func:`shard_expression`; ``harvest init-db`` with ``shards: S``
creates an expression index on ``(shard, id)``, so a shard's mark reads its rows in id order from
that index instead of filtering the whole outbox.

Invariants (``tests/test_producer/relay/test_shards.py``):
- :func:`shard_of` (Python) and :func:`shard_expression` (SQL) agree on every key, None/NULL too;
- every row is in exactly one shard (the expression is never NULL);
- ``S = 1`` means no sharding: one shard, today's tables, locks and leader topic; nothing to migrate;
- a shard count is ``1 <= S <= MAX_SHARDS`` (:func:`check_shard_count`, at config time).
"""

from __future__ import annotations

import hashlib

from psycopg import sql

from harvest_outbox.producer.errors import ConfigError, shown

#: More shards than this buys nothing on any machine a relay runs on (each shard a relay leads is a
#: relay loop with its own connections and producer) and multiplies leader-topic partitions and locks.
MAX_SHARDS = 256


def check_shard_count(value: object, field_name: str = "shards") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SHARDS:
        raise ConfigError(
            f"{field_name}: {shown(value)} must be a whole number of shards 1-{MAX_SHARDS} (1, the "
            f"default, is one active relay for the whole outbox)"
        )
    return value


def key_hash(key: bytes | str | None) -> int:
    """The 32-bit shard hash of a Kafka key (``str`` keys are hashed as UTF-8, None as the empty key)."""
    data = key.encode() if isinstance(key, str) else (key or b"")
    return int.from_bytes(hashlib.md5(data, usedforsecurity=False).digest()[:4], "big")


def shard_of(key: bytes | str | None, count: int) -> int:
    return key_hash(key) % count


#: The default outbox's Kafka key column (a table mapping passes its own).
_KAFKA_KEY = sql.SQL("kafka_key")


def shard_expression(count: int, key: sql.Composable = _KAFKA_KEY) -> sql.Composable:
    """SQL computing a row's shard; written exactly like this in the index and in the mark, so the
    planner matches them. ``'x' || 8 hex digits`` cast to ``bit(32)`` reads them as a bit string;
    the ``bigint`` cast of a ``bit(32)`` is unsigned. ``key``: the row's Kafka key as text (the table
    mapping's :meth:`~producer.mapping.protocol.TableMapping.shard_key`). A new expression needs a new
    index name (``OutboxNames.shard_index_name``): deployed indexes are on the old one."""
    check_shard_count(count)
    # mod(), not %: the expression goes into statements with psycopg placeholders. coalesce(): md5(NULL)
    # is NULL, and a row whose shard is NULL is in no shard's mark.
    return sql.SQL("mod(('x' || substr(md5(coalesce({}, '')), 1, 8))::bit(32)::bigint, {})").format(
        key, sql.Literal(count)
    )
