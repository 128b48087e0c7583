"""The decisions of leaving a ``--uuid-sequencing`` view (producer/relay/sequenced/_failure.py), pure logic on
real transactions and delivery reports: what each failed delivery counts as, which transactions a view
leaving without a failure commits, and which ones a winding-down view ACKs or drops."""

from __future__ import annotations

import uuid
from concurrent.futures import Future

from confluent_kafka import KafkaError, Message

from harvest_outbox.producer.errors import FenceError
from harvest_outbox.producer.relay.marked_row import MarkedRow
from harvest_outbox.producer.relay.sequenced._failure import Counts, deliverable, judge, settle
from harvest_outbox.producer.relay.sequenced._txn import DeliveryFailure, Txn
from harvest_outbox.producer.relay.sequenced._view import View

ROW_TIMEOUT = 10.0


def _txn(k: int = 0, rows: int = 3) -> Txn:
    t = Txn(View(uuid.uuid4(), 1, 4, 1_700_000_000_000_000_000), k, b"\0" * 6, 0.0)
    for i in range(rows):
        row: MarkedRow = (100 + i, "t", f"k{i}".encode(), f"v{i}".encode(), None, None, None, None, None, None, 0.0)
        t.rows.append(row)
        t.ids.append(row[0])
    return t


def _report(i: int, latency: float) -> Message:
    return Message(topic="t", partition=0, key=f"k{i}".encode(), value=f"v{i}".encode(), latency=latency)


def _waited_out(latency: float | None) -> bool:
    return latency is not None and latency >= 0.8 * ROW_TIMEOUT


def test_a_failed_delivery_counts_as_an_attempt_an_outage_or_poison_that_held_others_up() -> None:
    t = _txn()
    timed_out = KafkaError(KafkaError._MSG_TIMED_OUT, "timed out")
    t.failures += [
        DeliveryFailure(KafkaError(KafkaError.NOT_ENOUGH_REPLICAS, "no"), _report(0, 0.5), 10),  # quick: an attempt
        DeliveryFailure(timed_out, _report(1, ROW_TIMEOUT), 20),  # waited; later records delivered (max_ok 25)
        DeliveryFailure(timed_out, _report(2, ROW_TIMEOUT), 30),  # waited; nothing later delivered: an outage
        DeliveryFailure(timed_out, None, 40),  # no message: no row to blame
    ]
    decided = judge(t, 25, _waited_out)
    assert [(r.rid, r.counts) for r in decided.records] == [
        (100, Counts.ATTEMPT),
        (101, Counts.HELD_UP),
        (102, Counts.OUTAGE),
    ]
    assert decided.oversized_topics == ()
    # without a view nothing is known to have been delivered: every wait is an outage
    assert [r.counts for r in judge(t, None, _waited_out).records] == [Counts.ATTEMPT, Counts.OUTAGE, Counts.OUTAGE]


def test_a_size_refusal_names_its_topic_even_when_no_row_matches() -> None:
    t = _txn()
    refused = Message(topic="big", partition=0, key=b"other", value=b"x", latency=0.1)
    t.failures.append(DeliveryFailure(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"), refused, 5))
    decided = judge(t, 0, _waited_out)
    assert decided.oversized_topics == ("big",) and decided.records == ()


def _done(err: BaseException | None = None) -> Future[None]:
    f: Future[None] = Future()
    if err is None:
        f.set_result(None)
    else:
        f.set_exception(err)
    return f


def test_a_view_leaving_without_failure_commits_the_delivered_prefix_past_submitted_commits() -> None:
    submitted, a, b, waiting, c = (_txn(k) for k in range(5))
    submitted.commit = _done()
    waiting.pending = 1
    assert deliverable([submitted, a, b, waiting, c]) == [a, b]
    a.failures.append(DeliveryFailure(KafkaError(KafkaError._MSG_TIMED_OUT, "x"), None, 1))
    assert deliverable([submitted, a, b]) == []


def test_winding_down_acks_the_committed_prefix_and_drops_everything_after_the_first_that_was_not() -> None:
    ok1, ok2, fenced, ok3, never = (_txn(k) for k in range(5))
    ok1.commit, ok2.commit, ok3.commit = _done(), _done(), _done()
    refused = FenceError("another view")
    fenced.commit = _done(refused)
    settled = settle([ok1, ok2, fenced, ok3, never])
    assert settled.committed == (ok1, ok2)
    assert settled.dropped == ((fenced, refused), (ok3, None), (never, None))
