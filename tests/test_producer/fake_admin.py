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
    ) -> None:
        self.topics = {"t": 1_048_588} if topics is None else topics
        self.internal = internal
        self.fail = fail
        self.lookups: list[str] = []

    def describe_topics(self, collection: Any, request_timeout: float = 0) -> dict[str, Future]:
        (topic,) = collection.topic_names
        self.lookups.append(topic)
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
