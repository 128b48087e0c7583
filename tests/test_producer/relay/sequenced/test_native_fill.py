"""The compiled fill loop (``producer/relay/sequenced/_native.pyx``) against the reference
(``RowProducer.fill_python``), pure logic, no services:

- for random sequences of rows of every kind the loop tells apart (plain, with headers, a halted key,
  a parked row, a bad row, a held topic, a missing or refusing topic, too large, a partition out of
  range) and random ``produce()`` outcomes (queued, queue full, a transient or permanent Kafka error,
  refused arguments), under both dead-letter and both missing-topic policies, both produce the same
  records (same UUIDs and headers), dead-letter, hold and park the same rows, and leave the
  transaction, the clock, the slot pool, the ready queue and the counters the same, fill after fill;
- the compiled UUID is the reference encoding on random producers and clocks, and a ProducerID of the
  wrong size is refused;
- ``RowProducer.fill`` runs the compiled loop when it is built (a missing build fails, unless
  ``HARVEST_PURE_PYTHON=1`` asks for pure Python only).

The relay's scenario and fault tests (tests/test_producer/relay/sequenced/, the e2e runs) run on the
compiled loop, since a built install uses it; the pure-Python wheel (tests/test_foundation/test_wheel.py)
relays on the reference.
"""

from __future__ import annotations

import os
import uuid
from collections import deque
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from fake_admin import FakeAdmin
from fake_relay import ROW_KINDS, row_of_kind
from hypothesis import given, settings
from hypothesis import strategies as st
from native_impl import native_module

from harvest_outbox.producer.config import HarvestConfig, Limits
from harvest_outbox.producer.election.neli import StaticElection
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.kafka import ANY_PARTITION
from harvest_outbox.producer.ops.preflight import TopicGuard
from harvest_outbox.producer.relay.sequenced import _produce
from harvest_outbox.producer.relay.sequenced._produce import Filled, RowProducer
from harvest_outbox.producer.relay.sequenced._txn import Txn
from harvest_outbox.producer.relay.sequenced._view import View, continue_uuid
from harvest_outbox.producer.relay.sequenced.mode import SequencedMode

NATIVE = "harvest_outbox.producer.relay.sequenced._native"
TOPICS = {"t": 10_000, "u": 10_000, "small": 40, "refused": "cannot be sent: the broker said no"}
KINDS = ("plain",) * 3 + ROW_KINDS + ("parked",)
OUTCOMES = ("ok", "ok", "ok", "ok", "full", "transient", "permanent", "type")


class ScriptedProducer:
    """produce() takes each outcome of ``script`` in turn (then "ok"), recording what was queued."""

    def __init__(self, script: list[str]) -> None:
        self.script = deque(script)
        self.sent: list[tuple[Any, ...]] = []
        self.polls = 0

    def produce(self, topic: str, value: Any, key: Any, partition: int, on_delivery: Any, *args: Any) -> None:
        outcome = self.script.popleft() if self.script else "ok"
        if outcome == "full":
            raise BufferError("Local: Queue full")
        if outcome == "transient":
            raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT))
        if outcome == "permanent":
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
        if outcome == "type":
            raise TypeError("expected bytes")
        self.sent.append((topic, value, key, partition, on_delivery.clock, args))

    def poll(self, timeout: float = 0) -> int:
        self.polls += 1
        return 0


def _row(rid: int, kind: str) -> tuple[Any, ...]:
    return row_of_kind(rid, kind, keys=3)


def _side(script: list[str], policy: str, missing: str, parked: set[int]) -> tuple[RowProducer, Txn, ScriptedProducer]:
    """A sequenced relay's RowProducer, its open transaction and its producer, in a fixed state."""
    cfg = HarvestConfig(
        uuid_sequencing=True,
        dead_letter_policy=policy,
        missing_topic_policy=missing,
        limits=Limits(max_in_flight_records=64, max_delivery_attempts=3),
    )
    guard = TopicGuard({}, cfg.producer_config(), admin_factory=lambda conf: FakeAdmin())
    h = Harvest(
        cfg, producer_factory=lambda conf, cb: ScriptedProducer(script), election=StaticElection(), topic_guard=guard
    )
    mode = h.mode
    assert isinstance(mode, SequencedMode)
    core = h.core
    producer = ScriptedProducer(script)
    core.producer = producer  # type: ignore[assignment]
    guard.verdicts.update(TOPICS)
    guard.verdicts["missing"] = "topic 'missing' does not exist"
    guard.missing.add("missing")
    guard.partition_problem = lambda topic, p, column: f"partition {p} of {topic!r} does not exist" if p >= 8 else None  # type: ignore[method-assign]
    if policy == "haltKey":
        core.halt.keys.add(("u", b"halted"))
    core.held["held"] = deque()
    rp = mode._producer
    for rid in parked:
        rp.poison.park(rid, "out of delivery attempts", 3)
    view = View(uuid.UUID(int=7), 3, 2, 1_700_000_000_000_000_000)
    view.ring = [b"\x81\x02\x03\x04\x05\x06", b"\x81\x02\x03\x04\x05\x07"]
    t = Txn(view, 0, view.ring[0], 0.0)
    mode._txns.append(t)
    return rp, t, producer


def _state(rp: RowProducer, t: Txn, producer: ScriptedProducer) -> tuple[Any, ...]:
    core = rp.core
    return (
        producer.sent,
        producer.polls,
        [r[0] for r in core.ready],
        {topic: [r[0] for r in rows] for topic, rows in core.held.items()},
        t.rows,
        t.ids,
        t.dead,
        t.held,
        t.pending,
        t.view.clock.value,
        len(rp.slots),
        rp.sync_failures,
        rp.metrics.dead_lettered,
        dict(rp.poison.rows),
        sorted(core.halt.keys),
    )


@settings(max_examples=150, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=60),
    script=st.lists(st.sampled_from(OUTCOMES), max_size=30),
    policy=st.sampled_from(("skip", "haltKey")),
    missing=st.sampled_from(("deadLetter", "hold")),
    max_records=st.integers(1, 40),
)
def test_the_compiled_fill_does_what_the_reference_does(
    kinds: list[str], script: list[str], policy: str, missing: str, max_records: int
) -> None:
    native = native_module(NATIVE)
    rows = [_row(i + 1, kind) for i, kind in enumerate(kinds)]
    parked = {r[0] for r, kind in zip(rows, kinds, strict=True) if kind == "parked"}
    ref, ref_t, ref_p = _side(script, policy, missing, parked)
    com, com_t, com_p = _side(script, policy, missing, parked)
    ref.core.ready.extend(rows)
    com.core.ready.extend(rows)
    for _ in range(len(rows) + len(script) + 1):  # fill after fill, as the mode calls it
        in_flight = ref.in_flight()
        want = ref.fill_python(ref_t, max_records, in_flight)
        got = Filled(*native.fill(com, com_t, max_records, in_flight))
        assert got == want
        assert _state(com, com_t, com_p) == _state(ref, ref_t, ref_p)
        if want.abandon is not None or not ref.core.ready:
            break


def test_the_compiled_uuid_is_the_reference_encoding() -> None:
    native = native_module(NATIVE)
    for _ in range(2000):
        producer = os.urandom(6)
        clock = int.from_bytes(os.urandom(8), "big") >> 4
        assert native.continue_uuid(producer, clock) == continue_uuid(producer, clock)
    with pytest.raises(ValueError, match="6 bytes"):
        native.continue_uuid(b"\x01\x02", 1)


def test_the_relay_fills_with_the_compiled_loop_when_it_is_built() -> None:
    native = native_module(NATIVE)
    assert _produce._native is native
    assert native.ANY_PARTITION == ANY_PARTITION
    rp, t, producer = _side([], "skip", "deadLetter", set())
    rp.core.ready.extend(_row(i, "plain") for i in range(1, 11))
    assert rp.fill(t, 100, 0) == Filled(10)
    assert [s[0] for s in producer.sent] == ["t"] * 10 and t.ids == list(range(1, 11))
