"""A fake Kafka producer for pure-logic tests of the relay (no broker): records what was produced."""

from __future__ import annotations

from typing import Any

from harvest_outbox.producer.kafka import produce_args


class FakeProducer:
    """Keeps ``sent`` as (topic, value, key, headers); ``on_delivery`` is the callback the relay gave."""

    def __init__(self, on_delivery: Any, conf: dict[str, Any] | None = None) -> None:
        self.on_delivery = on_delivery
        self.conf = conf or {}
        self.sent: list[tuple[str, bytes | None, bytes | None, Any]] = []

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, *args: Any, **kw: Any) -> None:
        self.sent.append((topic, value, key, produce_args(args, kw).get("headers")))

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0

    def purge(self, *a: Any, **k: Any) -> None:
        pass

    def __len__(self) -> int:
        return 0
