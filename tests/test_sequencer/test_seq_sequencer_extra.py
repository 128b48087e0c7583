"""Sequencer behaviour beyond Gazette's own tests: pruning across journals
with wall-clock horizons, memory release, value semantics of results."""

from __future__ import annotations

import dataclasses

import pytest
from seq_testlib import JOURNAL, Gen, expect_deque, partials, queue

from harvest_outbox.sequencer import (
    COMMITTING_OUTCOMES,
    DEFAULT_PRUNE_HORIZON_NS,
    Clock,
    Flags,
    ProducerState,
    QueueOutcome,
    Sequencer,
    journal_name,
    new_producer_id,
)

Q = QueueOutcome
HOUR_NS = 3600 * 10**9


def test_outcome_values_and_commits() -> None:
    assert [o.name for o in sorted(Q)] == [
        "OUTSIDE_ALREADY_ACKED",
        "OUTSIDE_COMMIT",
        "CONTINUE_ALREADY_ACKED",
        "CONTINUE_TXN_CLOCK_LARGER",
        "CONTINUE_BEGIN_SPAN",
        "CONTINUE_EXTEND_SPAN",
        "ACK_ROLLBACK",
        "ACK_EMPTY",
        "ACK_COMMIT_RING",
        "ACK_COMMIT_REPLAY",
    ]
    assert [int(o) for o in sorted(Q)] == list(range(10))
    assert (
        {o for o in Q if o.commits}
        == COMMITTING_OUTCOMES
        == {
            Q.OUTSIDE_COMMIT,
            Q.ACK_EMPTY,
            Q.ACK_COMMIT_RING,
            Q.ACK_COMMIT_REPLAY,
        }
    )


def test_journal_name() -> None:
    assert journal_name("orders", 3) == "orders/3"


def test_producer_state_is_frozen() -> None:
    st = ProducerState("t/0", bytes(6), 1, -1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.begin = 5  # type: ignore[misc]


def test_default_horizon_prunes_per_journal_with_wall_clocks() -> None:
    assert DEFAULT_PRUNE_HORIZON_NS == 24 * HOUR_NS
    t0 = 1_700_000_000 * 10**9

    def at(ns: int) -> int:
        return Clock.from_unix_ns(ns).value

    old, fresh, lonely = new_producer_id(), new_producer_id(), new_producer_id()
    g0, g1 = Gen("t/0"), Gen("t/1")
    seq = Sequencer()
    # In t/0: `old` last acked 25 h before `fresh`. In t/1: `lonely` acked
    # long ago too, but it is the newest producer of its own journal.
    for env in (
        g0(old, at(t0), Flags.ACK_TXN),
        g0(fresh, at(t0 + 25 * HOUR_NS), Flags.ACK_TXN),
        g1(lonely, at(t0 - 99 * HOUR_NS), Flags.ACK_TXN),
    ):
        assert seq.queue_uncommitted(env) == Q.ACK_EMPTY
        while seq.step() is not None:
            pass

    _, states = seq.checkpoint(26 * HOUR_NS)
    assert len(states) == 3  # within a 26 h horizon nothing is pruned
    _, states = seq.checkpoint(DEFAULT_PRUNE_HORIZON_NS)
    assert sorted((s.journal, s.producer) for s in states) == sorted([("t/0", fresh), ("t/1", lonely)])
    assert "t/0" in seq._partials and old.hex() not in {p.hex() for p in partials(seq, "t/0")}

    # A pruned producer that comes back is tracked afresh.
    env = g0(old, at(t0 + 30 * HOUR_NS), Flags.CONTINUE_TXN)
    assert seq.queue_uncommitted(env) == Q.CONTINUE_BEGIN_SPAN


def test_open_span_uses_max_clock_for_pruning() -> None:
    # Pruning compares each producer's *maximum* clock (its newest message),
    # so a producer with an old ACK but a recent open span survives.
    seq, gen = Sequencer(), Gen()
    A, B = new_producer_id(), new_producer_id()
    queue(seq, gen(A, 100 << 4, Flags.ACK_TXN))
    while seq.step() is not None:
        pass
    queue(seq, gen(B, 200 << 4, Flags.ACK_TXN))
    while seq.step() is not None:
        pass
    assert queue(seq, gen(A, 250 << 4, Flags.CONTINUE_TXN)) == [Q.CONTINUE_BEGIN_SPAN]
    _, states = seq.checkpoint(10 * 100)  # horizon of 10 units of 100 ns
    assert {s.producer for s in states} == {A, B}
    assert next(s for s in states if s.producer == A).last_ack == 100 << 4


def test_zero_horizon_never_prunes() -> None:
    seq = Sequencer(
        states=[ProducerState("t/0", bytes([1] * 6), 1, -1), ProducerState("t/0", bytes([3] * 6), 2**63, -1)]
    )
    assert len(seq.checkpoint(0)[1]) == 2
    assert len(seq.checkpoint(-5)[1]) == 2


def test_dequeued_ring_entries_are_released() -> None:
    seq, gen = Sequencer(ring_size=16), Gen()
    A = new_producer_id()
    envs = [gen(A, c, Flags.CONTINUE_TXN) for c in (1, 2, 3)] + [gen(A, 4, Flags.ACK_TXN)]
    queue(seq, *envs)
    expect_deque(seq, *envs)
    assert seq._ring == [None] * 16


def test_results_are_copies_and_offsets_view_is_read_only() -> None:
    seq, gen = Sequencer({"t/9": 5}), Gen()
    seq.queue_uncommitted(gen(new_producer_id(), 1, Flags.CONTINUE_TXN))
    offsets, _ = seq.checkpoint()
    offsets[JOURNAL] = 10**9
    assert seq.offsets[JOURNAL] == 100
    with pytest.raises(TypeError):
        seq.offsets["x"] = 1  # type: ignore[index]
    initial = {"a": 1}
    seq2 = Sequencer(initial)
    seq2.queue_uncommitted(Gen("a")(new_producer_id(), 1, Flags.CONTINUE_TXN))
    assert initial == {"a": 1}


def test_other_producer_is_not_blocked_by_open_span() -> None:
    # No head-of-line blocking: B commits while A's span stays open.
    seq, gen = Sequencer(), Gen()
    A, B = new_producer_id(), new_producer_id()
    a1, b1, b2 = gen(A, 1, Flags.CONTINUE_TXN), gen(B, 1, Flags.CONTINUE_TXN), gen(B, 2, Flags.ACK_TXN)
    assert queue(seq, a1, b1, b2) == [Q.CONTINUE_BEGIN_SPAN, Q.CONTINUE_BEGIN_SPAN, Q.ACK_COMMIT_RING]
    expect_deque(seq, b1, b2)
    assert seq.has_pending()
    assert partials(seq)[A] == (a1.begin, 0, 0, 0, 1)


def test_replay_may_be_any_iterable() -> None:
    seq, gen = Sequencer(ring_size=1), Gen()
    A = new_producer_id()
    a1, a2 = gen(A, 1, Flags.CONTINUE_TXN), gen(A, 2, Flags.ACK_TXN)
    assert queue(seq, a1, a2) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_COMMIT_REPLAY]
    seq.start_replay((a1,))  # a tuple, not an iterator
    assert seq.step() is a1
    assert seq.step() is a2
    assert seq.step() is None
