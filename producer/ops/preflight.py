"""Before a row is produced: will any broker take it? Rows no broker will take are refused here.

Some rows can never be delivered: a topic that does not exist (auto-creation is off on most
production clusters), an internal topic (``__consumer_offsets``), an illegal topic name, a record
larger than its topic's ``max.message.bytes``. Produced anyway, they cost far more than a dead
letter: librdkafka holds a record for a missing topic up to ``topic.metadata.propagation.max.ms``
(30 s) while every row behind it waits, a broker-side size rejection fails the whole batch its
innocent neighbours travel in, and with ``--uuid-sequencing`` (idempotence with
``enable.gapless.guarantee``) a permanent rejection is a *fatal* producer error.

:class:`TopicGuard` asks the broker once per topic (Admin API: describe the topic and its
``max.message.bytes``) and caches the answer as a *verdict*: either the payload budget in bytes (the
most key + value + header bytes a record of that topic may carry) or the reason the topic takes no
records. The relay checks each row against the cached verdict (a dict lookup and a length sum).

Invariants (tests/test_producer/ops/test_preflight.py, tests/test_producer/ops/test_poison.py):
- a verdict that refuses a topic names the topic, what is wrong and the fix;
- a lookup that fails (broker down, timeout, no permission to describe) never refuses a row: the
  row is produced and the producer's own errors apply — the guard only ever removes certain losers;
- a refused (missing) topic is asked about again after ``missing_ttl`` seconds, a good one after
  ``ttl``: creating a topic and requeueing its dead letters works within seconds;
- a topic the relay's principal may not write (TOPIC_AUTHORIZATION_FAILED on its description, or WRITE not among
  its authorized operations) is refused, naming the missing ACL, only when the principal may write another
  topic (the broker's own answer: :meth:`TopicGuard.writes_elsewhere`): then it is about this topic's rows
  alone. Otherwise the ACLs are missing wholesale (a fresh deployment, a wrong principal): the lookup raises
  :class:`~producer.errors.KafkaSecurityError` and the relay stops, dead-lettering nothing
  (tests/test_security/test_relay_sasl.py);
- with compression configured the size check is skipped (the compressed size is unknown up front)
  until the broker refuses a batch of a topic as too large: from then on that topic's records are
  checked at their uncompressed size (:meth:`TopicGuard.check_sizes`), so the record that no
  compression saves is refused alone and its batch-mates go through.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from harvest_outbox.producer._kafka_names import LEGAL_NAME, NAME_RULE
from harvest_outbox.producer.errors import HarvestError, KafkaSecurityError, shown
from harvest_outbox.producer.kafka.acls import topic_describe_configs, topic_write
from harvest_outbox.producer.kafka.security_errors import missing_acl, principal_of

log = logging.getLogger(__name__)

# Kafka's own topics: refused by name too (they may not exist yet, e.g. before the first group).
INTERNAL_TOPICS = frozenset(
    {"__consumer_offsets", "__transaction_state", "__share_group_state", "__cluster_metadata", "__remote_log_metadata"}
)
# A record batch holding one record, uncompressed: 61 bytes of batch header plus at most 36 of
# record framing (length, attributes, timestamp and offset deltas, key/value lengths, header count).
RECORD_OVERHEAD = 97
HEADER_OVERHEAD = 10  # two length varints per header
DEFAULT_PRODUCER_MAX_BYTES = 1_000_000  # librdkafka's message.max.bytes


#: UTF-8 takes at most this many bytes per character: ``HEADER_BYTES_PER_CHAR * len(s)`` bounds a header's
#: bytes without encoding it (the compiled relay paths call :func:`header_bytes` only past that bound).
HEADER_BYTES_PER_CHAR = 4


def header_bytes(hkeys: Sequence[str], hvals: Sequence[Any]) -> int:
    """Bytes the headers add to a record (key and value lengths as sent, UTF-8 for text, plus their framing)."""
    return sum(
        len(k.encode()) + (0 if v is None else len(v.encode()) if isinstance(v, str) else len(v)) + HEADER_OVERHEAD
        for k, v in zip(hkeys, hvals, strict=True)
    )


def topic_name_problem(topic: Any) -> str | None:
    """Why no broker will ever take records of ``topic`` by its name alone (illegal, internal), or None."""
    if not isinstance(topic, str) or not LEGAL_NAME.match(topic) or topic in (".", ".."):
        return (
            f"kafka_topic {shown(topic)} is not a legal Kafka topic name ({NAME_RULE}, not '.' or '..'); "
            "fix kafka_topic and requeue"
        )
    if topic in INTERNAL_TOPICS:
        return _internal(topic)
    return None


def _internal(topic: str) -> str:
    return (
        f"topic {topic!r} is one of Kafka's internal topics, which take no application records; fix "
        f"kafka_topic and requeue"
    )


def _admin(config: dict[str, Any]) -> Any:
    from harvest_outbox.producer.kafka import logged_admin  # its librdkafka lines through logging

    return logged_admin(config)


class TopicGuard:
    """Cached per-topic verdicts (see module doc). Not thread-safe: the relay thread owns it."""

    def __init__(
        self,
        admin_config: Mapping[str, Any],
        producer_config: Mapping[str, Any],
        *,
        extra_overhead: int = 0,
        ttl: float = 60.0,
        missing_ttl: float = 2.0,
        timeout: float = 5.0,
        admin_factory: Callable[[dict[str, Any]], Any] | None = None,
        own_topics: frozenset[str] = frozenset(),
    ) -> None:
        """``own_topics``: topics the relay writes for itself (NELI's leader topic): being allowed to write
        them says nothing of the rows' topics (:meth:`writes_elsewhere`)."""
        self._admin_config = {k: v for k, v in admin_config.items()}
        self._own_topics = own_topics
        self._principal = principal_of(admin_config)
        self._elsewhere: tuple[float, bool] | None = None  # (asked at, answer) of writes_elsewhere
        self._config_denied: set[str] = set()  # topics whose DESCRIBE_CONFIGS refusal was logged
        self._admin_factory = admin_factory or _admin  # (a fleet shares one: producer.kafka.shared_admin)
        self._admin: Any = None
        self._producer_max = int(producer_config.get("message.max.bytes", DEFAULT_PRODUCER_MAX_BYTES))
        compression = str(producer_config.get("compression.type", producer_config.get("compression.codec", "none")))
        self._check_size = compression.lower() in ("none", "")
        # the relay's own header (the UUID with --uuid-sequencing) travels in every record
        self._overhead = RECORD_OVERHEAD + extra_overhead
        self.ttl, self.missing_ttl, self.timeout = ttl, missing_ttl, timeout
        self.verdicts: dict[str, int | str] = {}  # the relay reads this directly (hot path)
        self.missing: set[str] = set()  # topics whose verdict is "does not exist" (for the hold policy)
        self._was_missing = False
        self._expires: dict[str, float] = {}
        self._next_expiry = float("inf")
        self._sized: set[str] = set()  # topics whose records are checked uncompressed (see check_sizes)
        #: Partitions per described topic (its verdict's lookup), for rows that name their partition.
        self.partitions: dict[str, int] = {}

    def verdict(self, topic: str) -> int | str:
        """The cached verdict for ``topic``, asking the broker on a miss."""
        got = self.verdicts.get(topic)
        if got is not None:
            return got
        self._was_missing = False
        got, ttl = self._lookup(topic)
        if self._was_missing:
            self.missing.add(topic)
        else:
            self.missing.discard(topic)
        self.verdicts[topic] = got
        expires = time.monotonic() + ttl
        self._expires[topic] = expires
        self._next_expiry = min(self._next_expiry, expires)
        return got

    def expire(self, now: float) -> None:
        """Forget verdicts past their time-to-live (cheap when none is due)."""
        if now < self._next_expiry:
            return
        for topic in [t for t, at in self._expires.items() if at <= now]:
            del self._expires[topic]
            self.verdicts.pop(topic, None)
        self._next_expiry = min(self._expires.values(), default=float("inf"))

    def partition_problem(self, topic: str, partition: int, column: str) -> str | None:
        """Why a record of ``topic`` placed in ``partition`` (from the outbox's ``column``) can never be
        delivered, or None. Called after :meth:`verdict` accepted the topic. A partition at or above the
        topic's count is refused by librdkafka as an unknown partition, which the relay would retry as
        transient until maxDeliveryAttempts; partitions can only be added, so a count that says no is asked
        again before the answer stands (a topic grown since its verdict is not refused on a stale count)."""
        count = self.partitions.get(topic)
        if count is None or partition < count:
            return None  # no count (the lookup failed): the producer's own errors decide
        self.verdicts.pop(topic, None)
        self._expires.pop(topic, None)
        self.verdict(topic)
        count = self.partitions.get(topic)
        if count is None or partition < count:
            return None
        return (
            f"{column} (table.fields.additional.placement {column}:partition) is {partition}, but topic {topic!r} "
            f"has {count} partition(s) (0-{count - 1}); set {column} below {count} or NULL (the partitioner, by "
            f"key), or add partitions to the topic, and requeue"
        )

    def forget(self) -> None:
        """Forget every verdict: the producer was refused a topic the verdict allowed (an ACL removed since)."""
        self.verdicts.clear()
        self._expires.clear()
        self._next_expiry = float("inf")
        self._elsewhere = None

    def denied(self, topic: str) -> str:
        """The verdict for ``topic``, which its principal may not write (module doc): a reason that refuses its
        rows when the principal writes another topic; else raises :class:`KafkaSecurityError`."""
        reason = missing_acl(topic_write(self._principal, topic), "TOPIC_AUTHORIZATION_FAILED")
        if self.writes_elsewhere(topic):
            return f"{reason}, then requeue (the principal writes other topics: this topic's rows alone are refused)"
        raise KafkaSecurityError(
            f"{reason}. It may write no other topic either, so the relay's ACLs are missing wholesale: the relay "
            f"stops, and no row is dead-lettered; grant the ACLs and start it again"
        )

    def writes_elsewhere(self, topic: str) -> bool:
        """May the relay's principal write a topic other than ``topic`` and its own (the broker's answer:
        the authorized operations of the topics it may describe)? Cached ``ttl``; False when not known."""
        now = time.monotonic()
        if self._elsewhere is not None and now - self._elsewhere[0] < self.ttl:
            return self._elsewhere[1]
        answer = False
        try:
            from confluent_kafka import TopicCollection
            from confluent_kafka.admin import AclOperation

            if self._admin is None:
                self._admin = self._admin_factory(self._admin_config)
            listed = self._admin.list_topics(timeout=self.timeout).topics
            others = [t for t in listed if t != topic and t not in INTERNAL_TOPICS and t not in self._own_topics][:200]
            if others:
                found = self._admin.describe_topics(
                    TopicCollection(others), request_timeout=self.timeout, include_authorized_operations=True
                )
                for future in found.values():
                    try:
                        ops = future.result(self.timeout).authorized_operations or []
                    except KafkaException:
                        continue
                    if AclOperation.WRITE in ops:
                        answer = True
                        break
        except Exception as exc:  # not known: the safe side (nothing dead-lettered)
            log.warning("could not ask Kafka which topics the relay may write: %s", exc)
        self._elsewhere = (now, answer)
        return answer

    def connect(self) -> None:
        """Create the admin client now (it connects in the background), so the first lookup is quick."""
        if self._admin is None:
            try:
                self._admin = self._admin_factory(self._admin_config)
            except Exception as exc:  # the first lookup tries again and, failing, lets the row through
                log.warning("could not create the Kafka admin client for the preflight: %s", exc)

    def check_sizes(self, topic: str) -> None:
        """The broker refused a batch of ``topic`` as too large: check its records' uncompressed size
        from now on (forgets the cached verdict, so the next row asks the broker again)."""
        if topic in self._sized or self._check_size:
            return
        log.warning(
            "the broker refused a batch of topic %r as too large; checking that topic's records "
            "at their uncompressed size from now on",
            topic,
        )
        self._sized.add(topic)
        self.verdicts.pop(topic, None)
        self._expires.pop(topic, None)

    def close(self) -> None:
        self._admin = None

    # ------------------------------------------------------------------ the broker's answers
    def _budget(self, max_bytes: int, topic: str) -> int:
        return max(0, max_bytes - self._overhead) if self._check_size or topic in self._sized else 1 << 62

    def _lookup(self, topic: str) -> tuple[int | str, float]:
        by_name = topic_name_problem(topic)
        if by_name is not None:
            return by_name, self.ttl
        try:
            from confluent_kafka import TopicCollection
            from confluent_kafka.admin import AclOperation, ConfigResource, ResourceType

            if self._admin is None:
                self._admin = self._admin_factory(self._admin_config)
            try:
                desc = self._admin.describe_topics(
                    TopicCollection([topic]), request_timeout=self.timeout, include_authorized_operations=True
                )[topic].result(self.timeout)
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
                    self._was_missing = True
                    return (
                        f"topic {topic!r} does not exist (and the broker does not create topics on first "
                        f"use); create it, then `harvest dead-letters requeue`",
                        self.missing_ttl,
                    )
                if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    raise _Denied from exc
                raise
            if desc.is_internal:
                return _internal(topic), self.ttl
            if desc.authorized_operations is not None and AclOperation.WRITE not in desc.authorized_operations:
                raise _Denied  # described (an explicit DESCRIBE), not writable
            self.partitions[topic] = len(desc.partitions)
            if not (self._check_size or topic in self._sized):
                return self._budget(self._producer_max, topic), self.ttl
            resource = ConfigResource(ResourceType.TOPIC, topic)
            try:
                entries = self._admin.describe_configs([resource], request_timeout=self.timeout)[resource].result(
                    self.timeout
                )
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    raise
                self._configs_denied(topic)
                return self._budget(self._producer_max, topic), self.ttl
            entry = entries.get("max.message.bytes")
            topic_max = int(entry.value) if entry is not None and entry.value is not None else self._producer_max
            return self._budget(min(topic_max, self._producer_max), topic), self.ttl
        except _Denied:
            pass
        except Exception as exc:  # no answer is not a "no": produce, and let the producer's errors decide
            log.warning("could not look up topic %r before producing (%s); producing without the check", topic, exc)
            return self._budget(self._producer_max, topic), self.missing_ttl
        return self.denied(topic), self.missing_ttl  # raises when no topic at all is writable

    def _configs_denied(self, topic: str) -> None:
        """DESCRIBE_CONFIGS refused: the size check is skipped for ``topic`` (rows are produced unchecked);
        said once per topic."""
        if topic in self._config_denied:
            return
        self._config_denied.add(topic)
        log.error(
            "%s; until then records of %r are produced without the size check",
            missing_acl(topic_describe_configs(self._principal, topic), "TOPIC_AUTHORIZATION_FAILED"),
            topic,
        )


class _Denied(HarvestError):
    """The principal may not write the topic looked up (raised and caught inside the lookup)."""


def too_large(
    budget: int, key: bytes, value: bytes | None, hkeys: Sequence[str] | None, hvals: Sequence[Any] | None
) -> str | None:
    """The reason a record does not fit ``budget`` (a verdict's payload budget), or None. No header
    arrays (a marked row without headers has None for both) add nothing."""
    size = len(key) + (len(value) if value is not None else 0) + (header_bytes(hkeys, hvals) if hkeys and hvals else 0)
    if size <= budget:
        return None
    return (
        f"record of {size} bytes (key + value + headers) exceeds what its topic accepts ({budget} bytes "
        f"after framing: the smaller of the topic's max.message.bytes and the producer's message.max.bytes); "
        f"shrink the value or raise max.message.bytes, then requeue"
    )
