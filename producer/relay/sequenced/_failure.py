"""How the ``--uuid-sequencing`` relay leaves a view (docs/design.md §5, step 6): the decisions, as pure
functions of the transactions and their delivery reports; :class:`~producer.relay.sequenced.mode.SequencedMode`
applies them (``_abandon``, ``_wind_down``).

A failure (a produce or delivery failure, a refused commit, a DB error) abandons the view; leaving
it (a refresh, or giving up leadership) winds it down. Invariants:
- in-flight deliveries are drained (bounded by ``maxPollInterval``); commits already submitted
  finish and, in order, get their ACKs; on leaving leadership without a failure, delivered
  transactions are committed first (:func:`deliverable`);
- every transaction not committed is dropped (its rows stay marked by the old view: the next view
  re-marks and re-sends them in id order under new ProducerIDs; :func:`settle`), and each abandoned
  span gets a rollback ACK in every partition it is known to have touched, unless its commit's
  outcome is unknown (:func:`~producer.relay.sequenced._commit.outcome_unknown`) or an ACK of the
  view failed;
- failed delivery attempts are stored before the next view can produce their rows again; a
  failure after which records sent later were acknowledged counts as an attempt (poison), one
  during which nothing was delivered does not (an outage) (:func:`judge`);
- after a refused commit (another view exists: we are probably a zombie) the next view waits
  ``heartbeatTimeout`` first, so leader election can catch up instead of two processes bumping the
  epoch in turn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum

from confluent_kafka import KafkaError, Message

from harvest_outbox.producer.kafka import is_size_refusal
from harvest_outbox.producer.relay.marked_row import ROW_ID, ROW_KEY, ROW_VALUE
from harvest_outbox.producer.relay.sequenced._txn import Txn


class Counts(Enum):
    """What one failed delivery of an abandoned transaction counts as."""

    #: It waited its whole delivery timeout while no record was delivered (broker or network outage):
    #: not the row's fault, not an attempt.
    OUTAGE = "outage"
    #: It held up every key for ``rowTimeout`` while the broker took later records: poison, parked now.
    HELD_UP = "held_up"
    #: Any other failure: one attempt (parked once permanent or the last allowed).
    ATTEMPT = "attempt"


@dataclass(frozen=True)
class FailedRecord:
    """A failed delivery of a known row, and what it counts as."""

    rid: int
    err: KafkaError
    latency: float | None
    counts: Counts


@dataclass(frozen=True)
class Abandonment:
    """What abandoning a view after ``failed``'s delivery failures does: the topics whose size limits
    the guard re-reads (a size refusal: the next view refuses the oversized row alone), and each
    failed record of a row of the transaction."""

    oversized_topics: tuple[str, ...]
    records: tuple[FailedRecord, ...]


def judge(failed: Txn, max_ok: int | None, waited_out: Callable[[float | None], bool]) -> Abandonment:
    """The decision on ``failed``'s delivery failures; ``max_ok`` is the largest clock of a record of
    the view that was delivered (None without a view), ``waited_out`` whether a failed record waited
    (about) its whole delivery timeout."""
    topics: list[str] = []
    records: list[FailedRecord] = []
    for err, msg, clock in failed.failures:
        if msg is not None and is_size_refusal(err) and (topic := msg.topic()):
            topics.append(topic)
        rid = find_row(failed, msg)
        if rid is None:
            continue
        latency = msg.latency() if msg is not None else None
        if not waited_out(latency):
            counts = Counts.ATTEMPT
        elif max_ok is not None and max_ok > clock:
            # Records sent after it were acknowledged: the broker was serving, so it is poison. In
            # this mode deliveries stop once the producer ring is full, so "acknowledged later"
            # rather than "lately".
            counts = Counts.HELD_UP
        else:
            counts = Counts.OUTAGE
        records.append(FailedRecord(rid, err, latency, counts))
    return Abandonment(tuple(topics), tuple(records))


def find_row(t: Txn, msg: Message | None) -> int | None:
    """The id of ``t``'s row that ``msg`` (a delivery report) is the record of, or None."""
    if msg is None:
        return None
    key, value = msg.key(), msg.value()
    for row in t.rows:
        if row[ROW_KEY] == key and row[ROW_VALUE] == value:
            return row[ROW_ID]
    return None


def deliverable(txns: Iterable[Txn]) -> list[Txn]:
    """The transactions a view leaving without a failure commits: in order, each not yet submitted
    whose records were all delivered, up to the first that was not (submitted ones are passed)."""
    batch = []
    for t in txns:
        if t.commit is None:
            if t.pending or t.failures:
                break
            batch.append(t)
    return batch


@dataclass(frozen=True)
class Settlement:
    """Where a winding-down view's transactions ended, once every commit job finished: ``committed``
    (the leading ones whose commit succeeded, in order: they get their ACKs) and ``dropped`` (every
    later one: re-sent by the next view), each of those with the error its commit failed with, if any."""

    committed: tuple[Txn, ...]
    dropped: tuple[tuple[Txn, BaseException | None], ...]


def settle(txns: Iterable[Txn]) -> Settlement:
    """The :class:`Settlement` of ``txns`` (in order; every submitted commit done)."""
    committed: list[Txn] = []
    dropped: list[tuple[Txn, BaseException | None]] = []
    for t in txns:
        err = t.commit.exception() if t.commit is not None else None
        if not dropped and t.commit is not None and err is None:
            committed.append(t)
        else:
            dropped.append((t, err))
    return Settlement(tuple(committed), tuple(dropped))
