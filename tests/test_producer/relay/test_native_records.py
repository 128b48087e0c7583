"""The at-least-once relay's compiled per-record path (``producer/relay/at_least_once/_native.pyx``) against
the reference (``AtLeastOnceRecords._dispatch_python`` / ``_send_python`` / ``_on_delivery_python``), pure
logic, no services:

- for random sequences of marked rows of every kind the path tells apart (plain rows on a few keys, so
  keys wait behind their in-flight record; headers; a halted key; a bad row; a held, missing or refusing
  topic; a row too large; a partition out of range) and random delivery reports (delivered, failed,
  purged while draining) and ``produce()`` outcomes (queued, queue full, a transient or permanent Kafka
  error, refused arguments), under both dead-letter and both missing-topic policies, both paths produce
  the same records in the same order and leave the same keys in flight, the same parked rows, purges,
  dead letters, resets, attempt counts and counters, step after step;
- a relay uses the compiled path when it is built (a missing build fails, unless
  ``HARVEST_PURE_PYTHON=1`` asks for pure Python only).

The relay's scenario and fault tests run on the compiled path, since a built install uses it.
"""

from __future__ import annotations

import uuid
from collections import deque
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from fake_admin import FakeAdmin
from fake_relay import ROW_KINDS, FakeMsg, row_of_kind
from hypothesis import given, settings
from hypothesis import strategies as st
from native_impl import native_module

from harvest_outbox.producer.config import HarvestConfig, Limits
from harvest_outbox.producer.election.neli import StaticElection
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.kafka import produce_args
from harvest_outbox.producer.ops.preflight import TopicGuard
from harvest_outbox.producer.relay.at_least_once import _records
from harvest_outbox.producer.relay.at_least_once.mode import AtLeastOnceMode

NATIVE = "harvest_outbox.producer.relay.at_least_once._native"
KINDS = ("plain",) * 6 + ROW_KINDS
OUTCOMES = ("ok",) * 5 + ("full", "transient", "permanent", "type")
REPORTS = ("ok",) * 4 + ("transient", "permanent", "purged")
ERRORS = {
    "transient": KafkaError(KafkaError._MSG_TIMED_OUT),
    "permanent": KafkaError(KafkaError.INVALID_RECORD),
    "purged": KafkaError(KafkaError._PURGE_QUEUE),
}


class ScriptedProducer:
    """produce() takes each outcome of ``script`` in turn (then "ok"), recording what was queued."""

    def __init__(self, script: list[str]) -> None:
        self.script = deque(script)
        self.sent: list[tuple[Any, ...]] = []

    def produce(self, topic: str, value: Any = None, key: Any = None, *args: Any, **kw: Any) -> None:
        outcome = self.script.popleft() if self.script else "ok"
        if outcome == "full":
            raise BufferError("Local: Queue full")
        if outcome in ("transient", "permanent"):
            raise KafkaException(ERRORS[outcome])
        if outcome == "type":
            raise TypeError("expected bytes")
        self.sent.append((topic, value, key, produce_args(args, kw)))

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0

    def purge(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __len__(self) -> int:
        return 0


def _row(rid: int, kind: str) -> tuple[Any, ...]:
    return row_of_kind(rid, kind, keys=4)


def _side(script: list[str], policy: str, missing: str, compiled: bool) -> tuple[AtLeastOnceMode, ScriptedProducer]:
    """A leader relay's at-least-once mode on the compiled or the reference path, in a fixed state."""
    cfg = HarvestConfig(
        dead_letter_policy=policy,
        missing_topic_policy=missing,
        limits=Limits(max_in_flight_records=6, max_delivery_attempts=3),
    )
    guard = TopicGuard({}, cfg.producer_config(), admin_factory=lambda conf: FakeAdmin())
    producer = ScriptedProducer(script)
    h = Harvest(cfg, producer_factory=lambda conf, cb: producer, election=StaticElection(), topic_guard=guard)
    mode = h.mode
    assert isinstance(mode, AtLeastOnceMode)
    if not compiled:
        mode._dispatch, mode._send, mode._on_delivery = (
            mode._dispatch_python,
            mode._send_python,
            mode._on_delivery_python,
        )
    h.core.leader_id = uuid.uuid4()
    mode.ensure_producer()
    guard.verdicts.update({"t": 10_000, "u": 10_000, "small": 40, "refused": "the broker said no"})
    guard.verdicts["missing"] = "topic 'missing' does not exist"
    guard.missing.add("missing")
    guard.partition_problem = lambda topic, p, column: f"partition {p} of {topic!r} does not exist" if p >= 8 else None  # type: ignore[method-assign]
    if policy == "haltKey":
        h.core.halt.keys.add(("u", b"halted"))
    h.core.held["held"] = deque()
    return mode, producer


def _state(mode: AtLeastOnceMode, producer: ScriptedProducer) -> tuple[Any, ...]:
    core = mode.core
    return (
        producer.sent,
        list(mode._in_flight.items()),
        {k: list(v) for k, v in mode._waiting.items()},
        mode._waiting_count,
        [r[0] for r in core.ready],
        {topic: [r[0] for r in rows] for topic, rows in core.held.items()},
        mode._purge_buf,
        mode._dlq_buf,
        mode._reset_buf,
        mode._forget_buf,
        mode._hold_buf,
        [r[0] for r in mode._acked],
        dict(core.attempts),
        core.remark,
        mode.metrics.delivered,
        mode.metrics.dead_lettered,
        mode.metrics.delivery_failures,
        sorted(core.halt.keys),
    )


OPS = st.one_of(
    st.tuples(st.just("rows"), st.lists(st.sampled_from(KINDS), min_size=1, max_size=10)),
    st.tuples(st.just("report"), st.integers(0, 100), st.sampled_from(REPORTS)),
)


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(OPS, min_size=1, max_size=25),
    script=st.lists(st.sampled_from(OUTCOMES), max_size=25),
    policy=st.sampled_from(("skip", "haltKey")),
    missing=st.sampled_from(("deadLetter", "hold")),
    draining=st.booleans(),
)
def test_the_compiled_path_does_what_the_reference_does(
    ops: list[tuple[Any, ...]], script: list[str], policy: str, missing: str, draining: bool
) -> None:
    native_module(NATIVE)
    ref, ref_p = _side(script, policy, missing, compiled=False)
    com, com_p = _side(script, policy, missing, compiled=True)
    ref._draining = com._draining = draining
    rid = 0
    for op in ops:
        if op[0] == "rows":
            rows = [_row(rid + i + 1, kind) for i, kind in enumerate(op[1])]
            rid += len(rows)
            for mode in (ref, com):
                mode.core.ready.extend(rows)
                mode._dispatch()
        else:
            keys = list(ref._in_flight)
            if not keys:
                continue
            key = keys[op[1] % len(keys)]
            err = ERRORS.get(op[2])
            for mode in (ref, com):
                mode._on_delivery(err, FakeMsg(key, latency=0.01))
        assert _state(com, com_p) == _state(ref, ref_p)
    for mode in (ref, com):  # a report for a record no longer in flight, and one without a key: ignored
        mode._on_delivery(None, FakeMsg(b"not in flight"))
        mode._on_delivery(None, FakeMsg(None))  # type: ignore[arg-type]
    assert _state(com, com_p) == _state(ref, ref_p)


def test_a_relay_uses_the_compiled_path_when_it_is_built() -> None:
    native = native_module(NATIVE)
    assert _records._native is native
    mode, producer = _side([], "skip", "deadLetter", compiled=True)
    mode.core.ready.extend(_row(i, "plain") for i in range(1, 9))
    mode._dispatch()
    assert [s[2] for s in producer.sent] == [b"k1", b"k2", b"k3", b"k0"]  # one record in flight per key
    assert mode._waiting_count == 4
    mode._on_delivery(None, FakeMsg(b"k1"))
    assert producer.sent[-1][2] == b"k1" and mode._purge_buf == [1] and mode.metrics.delivered == 1
