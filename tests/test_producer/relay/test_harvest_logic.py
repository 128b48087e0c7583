"""Pure-logic tests of the relay's send path with a fake producer (no DB, no Kafka):
one record in flight per key, id order per key, throttle, reset+remark on failure, dead letters."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError
from fake_admin import FakeAdmin
from fake_producer import FakeProducer
from fake_relay import FakeMsg, leader_relay

from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.relay.at_least_once.mode import AtLeastOnceMode


def _harvest(**limits: Any) -> tuple[Harvest, FakeProducer]:
    """A leader relay in at-least-once mode with a fake producer."""
    return leader_relay(**limits)


def _relay(**limits: Any) -> tuple[AtLeastOnceMode, FakeProducer]:
    """The mode of a leader relay (:func:`_harvest`): what these tests step through."""
    h, p = _harvest(**limits)
    assert isinstance(h.mode, AtLeastOnceMode)
    return h.mode, p


def row(
    i: int, key: str, topic: str | None = "t", hk: tuple | None = None, hv: tuple | None = None, bad: str | None = None
) -> tuple:
    """A MarkedRow as the mark statement returns it (no headers: None, None)."""
    return (i, topic, key.encode(), f"v{i}".encode(), hk, hv, bad, None, None, None, 0.0)


def test_one_in_flight_per_key_and_id_order() -> None:
    relay, p = _harvest()
    h = relay.mode
    assert isinstance(h, AtLeastOnceMode)
    h._ready.extend([row(1, "a"), row(2, "b"), row(3, "a"), row(4, "a"), row(5, "c")])
    h._dispatch()
    assert [s[1] for s in p.sent] == [b"v1", b"v2", b"v5"]
    assert relay.in_flight_records == 3 and sorted(relay.in_flight_record_keys()) == ["a", "b", "c"]
    p.on_delivery(None, FakeMsg(b"a"))  # v1 acked -> v3 goes out from the callback
    assert p.sent[-1][1] == b"v3" and h._purge_buf == [1]
    p.on_delivery(None, FakeMsg(b"a"))
    assert p.sent[-1][1] == b"v4"
    assert h._waiting == {} and h._waiting_count == 0


def test_in_flight_throttle() -> None:
    h, p = _relay(max_in_flight_records=2)
    h._ready.extend([row(i, f"k{i}") for i in range(1, 6)])
    h._dispatch()
    assert len(p.sent) == 2 and len(h._ready) == 3


def test_failure_resets_blocks_key_and_requests_remark() -> None:
    h, p = _relay()
    h._ready.extend([row(1, "a"), row(2, "a"), row(3, "b")])
    h._dispatch()
    p.on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT, "timeout"), FakeMsg(b"a"))
    assert h.core.remark and h._reset_buf == [1]
    assert [s[1] for s in p.sent] == [b"v1", b"v3"]  # v2 not sent after v1 failed
    p.on_delivery(None, FakeMsg(b"b"))  # other keys' acks still purge
    assert h._purge_buf == [3]
    h._ready.append(row(9, "z"))
    h._dispatch()
    assert len(p.sent) == 2  # nothing new is sent while a remark is pending


def test_attempts_exhausted_or_permanent_error_dead_letters_and_key_moves_on() -> None:
    h, p = _relay(max_delivery_attempts=2)
    h._ready.extend([row(1, "a"), row(2, "a")])
    h._dispatch()
    h.core.attempts[1] = 1
    p.on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT, "timeout"), FakeMsg(b"a"))
    assert not h.core.remark and [d[0] for d in h._dlq_buf] == [1] and h._dlq_buf[0][2] == 2
    assert p.sent[-1][1] == b"v2"  # the key moved on
    p.on_delivery(KafkaError(KafkaError.TOPIC_EXCEPTION, "invalid"), FakeMsg(b"a"))
    assert [d[0] for d in h._dlq_buf] == [1, 2] and "TOPIC_EXCEPTION" in h._dlq_buf[1][1]


def test_an_authorization_error_at_delivery_is_not_an_attempt_and_asks_the_preflight_again() -> None:
    h, p = _relay(max_delivery_attempts=1)
    h._ready.extend([row(1, "a")])
    h._dispatch()
    h._guard.verdicts["t"] = 1000  # type: ignore[attr-defined]
    p.on_delivery(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied"), FakeMsg(b"a"))
    assert h._dlq_buf == [] and h.core.attempts == {} and h._reset_buf == [1] and h.core.remark
    assert h._guard.verdicts == {}  # type: ignore[attr-defined]


def test_unknown_topic_from_the_producer_is_an_attempt() -> None:
    # The preflight already refused topics the broker says are missing: librdkafka's "unknown
    # topic" after it is stale metadata of a topic just created, so it counts as one attempt.
    h, p = _relay(max_delivery_attempts=3)
    h._ready.extend([row(1, "a")])
    h._dispatch()
    p.on_delivery(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, "no topic"), FakeMsg(b"a"))
    assert h._dlq_buf == [] and h.core.remark and h._reset_buf == [1]


def test_rows_no_broker_takes_are_dead_lettered_before_producing() -> None:
    h, p = _relay()
    h._guard._admin_factory = lambda conf: FakeAdmin({"t": 1_048_588, "small": 500})  # type: ignore[attr-defined]
    h._ready.extend(
        [
            row(1, "a", topic="missing"),
            row(2, "a"),
            row(3, "b", topic="__consumer_offsets"),
            (4, "small", b"c", b"x" * 600, None, None, None, None, None, None, 0.0),
            (5, "small", b"c", b"x" * 10, None, None, None, None, None, None, 0.0),
            row(6, "d", topic="bad name"),
        ]
    )
    h._dispatch()
    assert [(s[0], s[1]) for s in p.sent] == [("t", b"v2"), ("small", b"x" * 10)]
    errors = {i: e for i, e, _ in h._dlq_buf}
    assert set(errors) == {1, 3, 4, 6}
    assert "'missing' does not exist" in errors[1] and "internal topics" in errors[3]
    assert "record of 601 bytes" in errors[4] and "not a legal Kafka topic name" in errors[6]


def test_broker_side_size_error_is_an_attempt_not_an_instant_dead_letter() -> None:
    # the broker rejects a whole batch: innocent records batched with an oversized one must retry
    h, p = _relay(max_delivery_attempts=3)
    h._ready.extend([row(1, "a"), row(2, "a")])
    h._dispatch()
    p.on_delivery(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too big"), FakeMsg(b"a"))
    assert h._dlq_buf == [] and h.core.remark and h._reset_buf == [1]


def test_bad_rows_dead_lettered_without_blocking() -> None:
    h, p = _relay()
    # The reasons come from the mark statement (tests/test_producer/layouts/mark/test_mark.py checks them on Postgres).
    h._ready.extend(
        [
            row(1, "a", hk=("x", "y"), hv=("1",), bad="header arrays differ in length: 2 key(s)"),
            row(2, "a"),
            row(3, "b", topic=None, bad="kafka_topic is NULL or empty"),
            row(4, "c", hk=("x", None), hv=("1", "2"), bad="kafka_header_keys contains NULL"),
        ]
    )
    h._dispatch()
    assert [s[1] for s in p.sent] == [b"v2"]
    errors = {i: e for i, e, _ in h._dlq_buf}
    assert errors == {
        1: "bad row: header arrays differ in length: 2 key(s)",
        3: "bad row: kafka_topic is NULL or empty",
        4: "bad row: kafka_header_keys contains NULL",
    }  # never published as a header named "None"


def test_headers_passed_as_pairs() -> None:
    h, p = _relay()
    h._ready.append(row(1, "a", hk=("h", "h"), hv=("1", None)))
    h._dispatch()
    assert p.sent[0][3] == [("h", "1"), ("h", None)]


def test_timeout_during_an_outage_is_not_an_attempt_but_with_others_delivered_it_is() -> None:
    # limits.rowTimeout: a record that waited out its delivery timeout while NOTHING was delivered
    # is an outage (reset + re-send, not counted: an outage must not fill the dead letters); while
    # other records were delivered, it is this row's failed attempt.
    h, p = _relay(max_delivery_attempts=1, row_timeout=2.0)
    h.core.delivered_samples.append((time.monotonic() - 5.0, 0))
    h._ready.extend([row(1, "a"), row(2, "b")])
    h._dispatch()
    p.on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT, "timeout"), FakeMsg(b"a", latency=2.0))
    assert (
        h._dlq_buf == []
        and h.core.attempts == {}
        and h.core.attempt_buf == []
        and h._reset_buf == [1]
        and h.core.remark
    )
    h2, p2 = _relay(max_delivery_attempts=1, row_timeout=2.0)
    h2.core.delivered_samples.append((time.monotonic() - 5.0, 0))
    h2._ready.extend([row(1, "a"), row(2, "b")])
    h2._dispatch()
    p2.on_delivery(None, FakeMsg(b"b"))  # another record was delivered meanwhile (late in the wait)
    p2.on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT, "timeout"), FakeMsg(b"a", latency=2.0))
    assert [d[0] for d in h2._dlq_buf] == [1]


def test_failed_attempts_are_stored_before_the_row_is_reset_and_forgotten_on_delivery() -> None:
    h, p = _relay(max_delivery_attempts=5)
    h._ready.extend([row(1, "a")])
    h._dispatch()
    p.on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT, "timeout"), FakeMsg(b"a"))
    assert h.core.attempt_buf == [(1, 1, "_MSG_TIMED_OUT: timeout")] and h._reset_buf == [1]
    # a later mark (another process) hands back the stored count: 4 stored + this failure = 5 -> parked
    h2, p2 = _relay(max_delivery_attempts=5)
    kept = h2._take_attempts([row(1, "a"), row(2, "b")], {1: (4, "x")})
    assert [r[0] for r in kept] == [1, 2] and h2.core.attempts == {1: 4}
    h2._ready.extend(kept)
    h2._dispatch()
    p2.on_delivery(None, FakeMsg(b"b"))
    p2.on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT, "timeout"), FakeMsg(b"a"))
    assert [(d[0], d[2]) for d in h2._dlq_buf] == [(1, 5)]
    # a stored count already at the limit parks the row at mark time, without producing it
    h3, _p3 = _relay(max_delivery_attempts=5)
    kept = h3._take_attempts([row(1, "a"), row(2, "b")], {1: (5, "boom")})
    assert [r[0] for r in kept] == [2] and [(d[0], d[2]) for d in h3._dlq_buf] == [(1, 5)]
    assert "counted across relay restarts" in h3._dlq_buf[0][1] and "boom" in h3._dlq_buf[0][1]
    # delivered rows with a stored count are forgotten (batched with the purge)
    h4, p4 = _relay()
    h4._take_attempts([row(1, "a")], {1: (2, "x")})
    h4._ready.extend([row(1, "a")])
    h4._dispatch()
    p4.on_delivery(None, FakeMsg(b"a"))
    assert h4._forget_buf == [1] and h4._purge_buf == [1]


def test_deliveries_only_early_in_the_wait_are_an_outage() -> None:
    # The broker froze shortly after the record was sent: others were delivered early in the wait,
    # none in its second half — an outage, not poison (nothing counted).
    h, p = _relay(max_delivery_attempts=1, row_timeout=2.0)
    now = time.monotonic()
    h.core.delivered_samples.extend([(now - 5.0, 0), (now - 1.8, 0), (now - 1.5, 7)])  # 7 delivered, early
    h.metrics.delivered = 7
    h._ready.extend([row(1, "a")])
    h._dispatch()
    p.on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT, "timeout"), FakeMsg(b"a", latency=2.0))
    assert h._dlq_buf == [] and h.core.attempt_buf == [] and h._reset_buf == [1]


def test_records_the_relay_purges_while_draining_are_not_attempts() -> None:
    h, p = _relay(max_delivery_attempts=1)
    h._ready.extend([row(1, "a")])
    h._dispatch()
    h._draining = True  # _drain gave up and purged the producer's queue
    p.on_delivery(KafkaError(KafkaError._PURGE_QUEUE, "purged"), FakeMsg(b"a"))
    assert h._dlq_buf == [] and h.core.attempts == {} and h.core.attempt_buf == [] and h._in_flight == {}


def test_a_producer_refused_its_id_for_want_of_any_acl_stops_the_relay_and_counts_nothing() -> None:
    """CLUSTER_AUTHORIZATION_FAILED, fatal (an idempotent producer gets no id: its principal may write no
    topic): the next tick raises KafkaSecurityError (the relay stops), a failed record is neither counted
    nor dead-lettered."""
    import pytest

    from harvest_outbox.producer.errors import KafkaSecurityError

    h, p = _relay(max_delivery_attempts=1)
    h._ready.extend([row(1, "a")])
    h._dispatch()
    h.core.on_producer_error(KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED, "no PID", fatal=True))
    with pytest.raises(KafkaSecurityError, match=r"may write no topic.*No row was dead-lettered"):
        p.on_delivery(KafkaError(KafkaError._FATAL, "fatal"), FakeMsg(b"a"))
    with pytest.raises(KafkaSecurityError, match="harvest acls"):
        h.tick()
    assert h._dlq_buf == [] and h.core.attempts == {}
