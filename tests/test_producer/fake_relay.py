"""A leader relay on fake Kafka clients, for pure-logic tests of the relay's send path (no DB, no
broker), and the delivery report's message those tests hand to its callback."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from fake_admin import FakeAdmin
from fake_producer import FakeProducer

from harvest_outbox.producer.config import HarvestConfig, Limits
from harvest_outbox.producer.election.neli import StaticElection
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.ops.preflight import TopicGuard


class FakeMsg:
    """A delivery report's message (as confluent-kafka's Message): its key and latency."""

    def __init__(self, key: bytes, latency: float | None = 0.01) -> None:
        self._key, self._latency = key, latency

    def key(self) -> bytes:
        return self._key

    def latency(self) -> float | None:
        """Seconds from produce() to this report (confluent-kafka's Message.latency)."""
        return self._latency


def leader_relay(producer_of: Callable[[Any], Any] = FakeProducer, **limits: Any) -> tuple[Harvest, Any]:
    """A relay that leads (a view id set, its producer made) in at-least-once mode, on the producer
    ``producer_of(on_delivery)`` makes; returns the relay and that producer."""
    box: dict[str, Any] = {}

    def factory(conf: dict, cb: Any) -> Any:
        box["p"] = producer_of(cb)
        return box["p"]

    cfg = HarvestConfig(limits=Limits(**limits))
    guard = TopicGuard({}, cfg.producer_config(), admin_factory=lambda conf: FakeAdmin())
    h = Harvest(cfg, producer_factory=factory, election=StaticElection(), topic_guard=guard)
    h.core.leader_id = uuid.uuid4()
    h.mode.ensure_producer()
    return h, box["p"]


#: The row kinds :func:`row_of_kind` makes besides ``plain``: what the compiled send paths' equivalence tests draw.
ROW_KINDS = ("headers", "halted", "bad", "null-key", "held", "missing", "small", "near-limit", "far", "refused")


def row_of_kind(rid: int, kind: str, keys: int = 3) -> tuple[Any, ...]:
    """A marked row (producer.relay.marked_row's fields) of one kind the relay's send paths tell apart, for the
    tests that hold a compiled path to its reference: ``plain`` (on ``keys`` keys), ``headers``, ``halted`` (topic
    ``u``, key ``halted``), ``bad``, ``null-key``, ``far`` (partition 99), ``near-limit`` (topic ``small``, headers
    about its size), or a topic of that name (``held``,
    ``missing``, ``small``, ``refused``: the test gives them their verdicts)."""
    key: bytes | None = b"k%d" % (rid % keys)
    topic, hkeys, hvals, bad, partition = "t", None, None, None, None
    if kind == "headers":
        hkeys, hvals = ("a", "b"), (b"1", None)
    elif kind == "halted":
        topic, key = "u", b"halted"
    elif kind == "bad":
        bad = "kafka_header_keys and kafka_header_values differ in length"
    elif kind == "null-key":
        key = None
    elif kind in ("held", "missing", "small", "refused"):
        topic = kind
    elif kind == "far":
        partition = 99
    value = b"value %d" % rid
    if kind == "near-limit":
        # topic "small" (40 bytes): 2 + 1 bytes of key and value, a header of 1 + 26, 28 or 30 bytes of UTF-8 (13-15
        # characters) + 10 of framing: 40 fits, 42 and 44 do not; counted in characters they would all fit
        topic, value = "small", b"v"
        hkeys, hvals = ("h",), ("é" * (13 + rid % 3),)
    return (rid, topic, key, value, hkeys, hvals, bad, None, None, partition, 0.0)
