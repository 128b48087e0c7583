"""A fake Kafka Admin client for pure-logic tests of the relay (no broker)."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException


@dataclass
class _Desc:
    is_internal: bool
    #: The topic's partitions (a real TopicDescription's list of TopicPartitionInfo; only counted here).
    partitions: list[int] = field(default_factory=lambda: [0])
    #: What the principal may do on it (asked with include_authorized_operations; None when not asked).
    authorized_operations: list[Any] | None = None


@dataclass
class _Entry:
    value: str


def _done(value: Any = None, exc: BaseException | None = None) -> Future:
    f: Future = Future()
    if exc is not None:
        f.set_exception(exc)
    else:
        f.set_result(value)
    return f


class FakeAdmin:
    """Topics -> max.message.bytes; ``internal`` topics; anything else does not exist."""

    def __init__(
        self,
        topics: dict[str, int] | None = None,
        internal: tuple[str, ...] = ("__consumer_offsets",),
        fail: bool = False,
        denied: tuple[str, ...] = (),
        writable: bool = True,
    ) -> None:
        """``denied``: topics the principal may not describe (TOPIC_AUTHORIZATION_FAILED); ``writable``: the
        other topics carry WRITE among their authorized operations."""
        self.topics = {"t": 1_048_588} if topics is None else topics
        self.internal = internal
        self.fail = fail
        self.lookups: list[str] = []
        self.denied, self.writable = denied, writable

    def list_topics(self, timeout: float = 0) -> Any:
        class _Metadata:
            def __init__(self, topics: dict[str, None]) -> None:
                self.topics = topics

        return _Metadata({t: None for t in self.topics if t not in self.denied})

    def describe_topics(
        self, collection: Any, request_timeout: float = 0, include_authorized_operations: bool = False
    ) -> dict[str, Future]:
        from confluent_kafka.admin import AclOperation

        if len(collection.topic_names) > 1:  # writes_elsewhere's question
            ops = [AclOperation.WRITE] if self.writable else [AclOperation.DESCRIBE]
            return {t: _done(_Desc(False, [0], ops)) for t in collection.topic_names}
        (topic,) = collection.topic_names
        self.lookups.append(topic)
        if topic in self.denied:
            return {topic: _done(exc=KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied")))}
        if self.fail:
            return {topic: _done(exc=KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down")))}
        if topic in self.internal:
            return {topic: _done(_Desc(True))}
        if topic not in self.topics:
            return {topic: _done(exc=KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, "unknown")))}
        return {topic: _done(_Desc(False))}

    def describe_configs(self, resources: list[Any], request_timeout: float = 0) -> dict[Any, Future]:
        (res,) = resources
        return {res: _done({"max.message.bytes": _Entry(str(self.topics[res.name]))})}
