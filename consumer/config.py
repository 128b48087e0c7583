"""Kafka client configuration for the readers: validation, defaults, redaction.

The application passes one ordinary confluent-kafka/librdkafka config dict.
From it this module derives the config of the main (read-uncommitted) consumer
and of the replay consumer.

Invariants (backed by ``tests/test_consumer/test_config_and_records.py``):

* ``enable.auto.commit`` and ``enable.auto.offset.store`` are always false: the
  checkpoint is the source of truth, Kafka's committed offsets are never used.
  Asking for true is a :class:`ConfigError` naming the key.
* ``isolation.level`` is always ``read_uncommitted`` (the Sequencer, not the
  broker, decides what is committed); asking for ``read_committed`` is an error.
* The consumers' prefetch is bounded by :data:`PREFETCH_DEFAULTS` unless the application sets
  those keys itself (its values win): the reader's memory is then bounded by the consume batch,
  the ring and the open spans, not by how far librdkafka has read ahead of it.
* The user's ``auto.offset.reset`` picks the start of partitions that no
  checkpoint covers; librdkafka itself runs with ``auto.offset.reset=error`` so
  a checkpointed offset lost to retention raises instead of silently skipping.
* ``oauth_cb`` (OAUTHBEARER tokens) is a callable as confluent-kafka takes it, or
  ``package.module:function`` (resolved here, :func:`harvest_outbox.kafka_token.reader_token_callback`);
  with it, ``sasl.mechanism`` must be ``OAUTHBEARER`` over a SASL ``security.protocol`` (else a
  :class:`ConfigError` now, not a client that waits 10 s and fails). Both consumers get it.
* Credential values (``sasl.password``, ``ssl.key.password``, every librdkafka
  property named password/secret/key/pem/passphrase/extensions/token/credentials,
  misspellings such as ``sasl.pasword``) never appear in logs, reprs or error
  messages: :func:`redact` replaces them (``harvest_outbox.redact`` decides which).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from harvest_outbox.kafka_token import with_reader_token_callback

# One owner of "which Kafka property holds a credential" (issue #32): the producer's redactor.
from harvest_outbox.redact import REDACTED
from harvest_outbox.redact import is_secret_kafka_key as is_secret_key
from harvest_outbox.secret_providers import SpecError

from .errors import ConfigError

__all__ = [
    "MAX_BATCH_SIZE",
    "PREFETCH_DEFAULTS",
    "REDACTED",
    "REPLAY_FETCH_BYTES",
    "ReaderConfig",
    "check_batch_size",
    "check_idle_timeout",
    "is_secret_key",
    "redact",
]

#: confluent-kafka's ``Consumer.consume()`` takes at most this many messages per call.
MAX_BATCH_SIZE = 1_000_000
#: librdkafka's prefetch, bounded (issue #35 item 4). Its defaults (64 MiB of ``queued.max.messages.kbytes``
#: and 100,000 ``queued.min.messages``, per partition for assigned partitions, the bytes counted
#: before decompression) let a reader that is slower than the broker fill a queue far larger than
#: its nominal size: reading a 10M-record topic of ~150-byte lz4 records, the process's RSS
#: climbed all the way through (~240 MB after 1M records, 350-420 MB after 10M), with 110 replays.
#: With these: 70-77 MB from the first records to the last, 1-3 replays, and no slower against a
#: local broker (bench/bench_reader_memory.py, docs/reading-python.md "Memory"). The short backoff
#: keeps the small queue refilled; against a distant broker raise ``queued.max.messages.kbytes`` to
#: cover the fetch round trip.
PREFETCH_DEFAULTS: dict[str, int] = {"queued.max.messages.kbytes": 1024, "fetch.queue.backoff.ms": 10}
#: ``max.partition.fetch.bytes`` of the replay consumer (see ``ReaderConfig.replay_config``).
REPLAY_FETCH_BYTES = 64 * 1024


# auto.offset.reset spellings librdkafka accepts, mapped to where we start.
_RESET = {
    "earliest": "earliest",
    "smallest": "earliest",
    "beginning": "earliest",
    "latest": "latest",
    "largest": "latest",
    "end": "latest",
    "error": "error",
}

# Keys that only make sense for the group member, not the (group-less) replay consumer.
_GROUP_ONLY = (
    "group.id",
    "group.instance.id",
    "group.protocol",
    "group.remote.assignor",
    "partition.assignment.strategy",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "on_commit",
    "auto.commit.interval.ms",
)


def redact(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` with credential values replaced by ``<redacted>``."""
    return {k: (REDACTED if is_secret_key(str(k)) else v) for k, v in config.items()}


def _truthy(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"kafka config {key!r} must be true or false, got {value!r}")


def check_idle_timeout(value: Any) -> float | None:
    """``idle_timeout``: ``None`` (block forever) or a finite number of seconds >= 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise ConfigError(
            f"idle_timeout must be None (wait forever) or a number of seconds >= 0, e.g. 5 or 0.5; got {value!r}"
        )
    return float(value)


def check_batch_size(value: Any) -> int:
    """``batch_size``: records per ``consume()`` call, 1..:data:`MAX_BATCH_SIZE`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BATCH_SIZE:
        raise ConfigError(
            f"batch_size must be an int 1-{MAX_BATCH_SIZE:,} (records per consume() call; "
            f"confluent-kafka takes at most {MAX_BATCH_SIZE:,}), got {value!r}"
        )
    return value


def _check_bootstrap(cfg: Mapping[str, Any]) -> None:
    """``bootstrap.servers`` (or its alias) present, a non-empty string: librdkafka reads a number such as
    12345 as an IPv4 address and connects to it."""
    given = [
        key
        for key in ("bootstrap.servers", "metadata.broker.list")
        if cfg.get(key) is not None and not (isinstance(cfg[key], str) and not cfg[key].strip())
    ]
    if not given:
        raise ConfigError("kafka config 'bootstrap.servers' is required (e.g. 'broker1:9092,broker2:9092')")
    for key in given:
        if not isinstance(cfg[key], str):
            raise ConfigError(
                f"kafka config {key!r} must be a string of host:port pairs, e.g. "
                f"'broker1:9092,broker2:9092'; got {cfg[key]!r} ({type(cfg[key]).__name__}): quote it"
            )


class ReaderConfig:
    """Validated reader configuration (see module doc)."""

    __slots__ = ("base", "group_id", "start")

    def __init__(self, kafka_config: Mapping[str, Any]) -> None:
        if not isinstance(kafka_config, Mapping):
            raise ConfigError(
                f"kafka_config must be a dict of librdkafka properties, got {type(kafka_config).__name__}"
            )
        cfg: dict[str, Any] = {}
        for key, value in kafka_config.items():
            if not isinstance(key, str) or not key:
                raise ConfigError(f"kafka config keys must be non-empty str, got {key!r}")
            cfg[key] = value
        _check_bootstrap(cfg)
        try:
            with_reader_token_callback(cfg, "kafka config 'oauth_cb'")
        except SpecError as exc:
            raise ConfigError(str(exc)) from None
        for key in ("enable.auto.commit", "enable.auto.offset.store"):
            if key in cfg and _truthy(key, cfg[key]):
                raise ConfigError(
                    f"kafka config {key!r} must be false: the reader's checkpoint is the source of truth "
                    "and Kafka's committed offsets are never used"
                )
        iso = cfg.get("isolation.level")
        if iso is not None and str(iso) != "read_uncommitted":
            raise ConfigError(
                f"kafka config 'isolation.level' must be 'read_uncommitted' (got {iso!r}): the Sequencer, "
                "not the broker, decides what is committed"
            )
        reset = str(cfg.pop("auto.offset.reset", "earliest")).strip().lower()
        if reset not in _RESET:
            raise ConfigError(f"kafka config 'auto.offset.reset' must be one of {sorted(_RESET)}, got {reset!r}")
        self.start = _RESET[reset]
        group = cfg.get("group.id")
        self.group_id: str | None = str(group) if group else None
        for key, value in PREFETCH_DEFAULTS.items():
            cfg.setdefault(key, value)
        cfg.update(
            {
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "isolation.level": "read_uncommitted",
                "auto.offset.reset": "error",
                "enable.partition.eof": False,
            }
        )
        self.base = cfg

    def main_config(self) -> dict[str, Any]:
        cfg = dict(self.base)
        if self.group_id is None:
            # librdkafka wants a group.id even for assign(); it is never joined
            # (no subscribe) and nothing is ever committed to it.
            cfg["group.id"] = f"harvest-assign-{uuid.uuid4().hex}"
        return cfg

    def replay_config(self) -> dict[str, Any]:
        cfg = {k: v for k, v in self.base.items() if k not in _GROUP_ONLY and not callable(v)}
        for key in ("error_cb", "logger", "stats_cb", "throttle_cb", "oauth_cb"):
            if key in self.base:
                cfg[key] = self.base[key]
        cfg["group.id"] = f"harvest-replay-{uuid.uuid4().hex}"  # never joined
        # Replays are short reads of existing data; a long fetch wait at the
        # end of one range would delay the next range's first fetch by it.
        cfg["fetch.wait.max.ms"] = 10
        # A replay needs one span (up to a transaction's records), not a partition's 1 MB default: a
        # smaller fetch is that much less to fetch, decompress and queue per replay (bench_consumer:
        # replays ~5x faster, and the replay consumer's prefetch no longer raises the reader's RSS by
        # tens of MB). A larger record batch still comes whole (Kafka's fetch rule, KIP-74).
        cfg["max.partition.fetch.bytes"] = REPLAY_FETCH_BYTES
        cfg["client.id"] = f"{self.base.get('client.id', 'harvest-consumer')}-replay"
        return cfg

    def __repr__(self) -> str:
        return f"ReaderConfig({redact(self.base)!r}, start={self.start!r})"
