"""Every scenario of Gazette's ``message/sequencer_test.go``, case for case.

Gazette's ring grows to its capacity while ours is allocated up front (empty
slots are ``None``); otherwise ring indices, links, partial sequences,
outcomes, replay ranges, dequeue order, offsets and pending flags are compared
exactly as Gazette does.
"""

from __future__ import annotations

import pytest
from seq_testlib import (
    JOURNAL,
    Gen,
    ListReplay,
    expect_deque,
    expect_replay,
    partials,
    queue,
)

from harvest_outbox.sequencer import (
    NIL_UUID,
    Flags,
    ProducerState,
    QueueOutcome,
    ReplayError,
    Sequencer,
    new_producer_id,
)

Q = QueueOutcome
CONT, ACK, OUTSIDE = Flags.CONTINUE_TXN, Flags.ACK_TXN, Flags.OUTSIDE_TXN


def by_producer(states: list[ProducerState]) -> list[ProducerState]:
    return sorted(states, key=lambda s: s.producer)


def test_ring_add_and_evict() -> None:
    seq, gen = Sequencer(None, None, 5), Gen()
    A, B = new_producer_id(), new_producer_id()
    e1 = gen(A, 100, CONT)
    e2 = gen(B, 200, CONT)
    e3 = gen(A, 300, CONT)
    e4 = gen(A, 400, CONT)
    e5, e6, e7, e8 = (gen(B, c, CONT) for c in (500, 600, 700, 800))
    e9, e10, e11 = (gen(B, c, CONT) for c in (900, 1000, 1100))

    # Initial ring is empty.
    assert seq._ring == [None] * 5 and seq._head == 0
    assert partials(seq) == {}
    assert not seq.has_pending()

    assert seq.queue_uncommitted(e1) == Q.CONTINUE_BEGIN_SPAN  # A
    assert seq._ring[:1] == [e1] and seq._next[:1] == [-1] and seq._head == 1
    assert partials(seq) == {A: (e1.begin, 0, 0, 99, 100)}
    assert seq.has_pending()
    # Continuations always update read-through offsets.
    assert seq.offsets == {JOURNAL: e1.end}

    assert seq.queue_uncommitted(e2) == Q.CONTINUE_BEGIN_SPAN  # B
    assert seq._ring[:2] == [e1, e2] and seq._next[:2] == [-1, -1] and seq._head == 2
    assert partials(seq) == {A: (e1.begin, 0, 0, 99, 100), B: (e2.begin, 1, 1, 199, 200)}
    assert len(seq._pending) == 2  # Two pending sequences.

    assert seq.queue_uncommitted(e3) == Q.CONTINUE_EXTEND_SPAN  # A
    assert seq._ring[:3] == [e1, e2, e3] and seq._next[:3] == [2, -1, -1] and seq._head == 3  # e1 => e3
    assert partials(seq) == {A: (e1.begin, 0, 2, 99, 300), B: (e2.begin, 1, 1, 199, 200)}

    assert seq.queue_uncommitted(e4) == Q.CONTINUE_EXTEND_SPAN  # A
    assert seq._ring[:4] == [e1, e2, e3, e4] and seq._next[:4] == [2, -1, 3, -1] and seq._head == 4
    assert partials(seq) == {A: (e1.begin, 0, 3, 99, 400), B: (e2.begin, 1, 1, 199, 200)}

    assert seq.queue_uncommitted(e5) == Q.CONTINUE_EXTEND_SPAN  # B
    assert seq._ring == [e1, e2, e3, e4, e5] and seq._next == [2, 4, 3, -1, -1] and seq._head == 0
    assert partials(seq) == {A: (e1.begin, 0, 3, 99, 400), B: (e2.begin, 1, 4, 199, 500)}

    assert seq.queue_uncommitted(e6) == Q.CONTINUE_EXTEND_SPAN  # B, evicts e1
    assert seq._ring == [e6, e2, e3, e4, e5] and seq._next == [-1, 4, 3, -1, 0] and seq._head == 1
    assert partials(seq) == {A: (e1.begin, 2, 3, 99, 400), B: (e2.begin, 1, 0, 199, 600)}

    assert queue(seq, e7, e8) == [Q.CONTINUE_EXTEND_SPAN] * 2  # B
    assert seq._ring == [e6, e7, e8, e4, e5] and seq._next == [1, 2, -1, -1, 0] and seq._head == 3
    assert partials(seq) == {A: (e1.begin, 3, 3, 99, 400), B: (e2.begin, 4, 2, 199, 800)}

    assert seq.queue_uncommitted(e9) == Q.CONTINUE_EXTEND_SPAN  # B, evicts A's final entry
    assert seq._ring == [e6, e7, e8, e9, e5] and seq._next == [1, 2, 3, -1, 0] and seq._head == 4
    # A's begin is still tracked, but it's no longer in the ring.
    assert partials(seq) == {A: (e1.begin, -1, -1, 99, 400), B: (e2.begin, 4, 3, 199, 900)}

    assert seq.queue_uncommitted(e10) == Q.CONTINUE_EXTEND_SPAN  # B
    assert seq._ring == [e6, e7, e8, e9, e10] and seq._next == [1, 2, 3, 4, -1] and seq._head == 0
    assert partials(seq) == {A: (e1.begin, -1, -1, 99, 400), B: (e2.begin, 0, 4, 199, 1000)}

    assert seq.queue_uncommitted(e11) == Q.CONTINUE_EXTEND_SPAN  # B
    assert seq._ring == [e11, e7, e8, e9, e10] and seq._next == [-1, 2, 3, 4, 0] and seq._head == 1
    assert partials(seq) == {A: (e1.begin, -1, -1, 99, 400), B: (e2.begin, 1, 0, 199, 1100)}

    assert seq.offsets == {JOURNAL: e11.end}


def test_txn_sequence_cases() -> None:
    seq, gen = Sequencer(None, None, 3), Gen()
    A, B = new_producer_id(), new_producer_id()

    # Case: sequence with internal duplicates served from the ring.
    a1, a2, a1_dup, a2_dup = gen(A, 1, CONT), gen(A, 2, CONT), gen(A, 1, CONT), gen(A, 2, CONT)
    a3_ack = gen(A, 3, ACK)
    assert queue(seq, a1, a2, a1_dup, a2_dup, a3_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.ACK_COMMIT_RING,
    ]
    expect_deque(seq, a1, a2, a3_ack)
    assert not seq.has_pending()

    # Case: ACK without a preceding CONTINUE. Unusual but allowed.
    a4_ack = gen(A, 4, ACK)
    assert queue(seq, a4_ack) == [Q.ACK_EMPTY]
    expect_deque(seq, a4_ack)

    # Case: partial ACK of preceding messages.
    a5, a7_no_ack, a6_ack = gen(A, 5, CONT), gen(A, 7, CONT), gen(A, 6, ACK)
    assert queue(seq, a5, a7_no_ack, a6_ack) == [Q.CONTINUE_BEGIN_SPAN, Q.CONTINUE_EXTEND_SPAN, Q.ACK_COMMIT_RING]
    expect_deque(seq, a5, a6_ack)
    assert not seq.has_pending()

    # Case: rollback with interleaved producer B.
    b1 = gen(B, 1, CONT)  # evicted
    a7_rollback = gen(A, 7, CONT)  # evicted
    a8_rollback = gen(A, 8, CONT)
    b2 = gen(B, 2, CONT)
    a6_abort = gen(A, 6, ACK)  # aborts back to clock 6
    assert queue(seq, a7_rollback, b1, a7_rollback, a8_rollback, b2, a6_abort) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_ROLLBACK,
    ]
    assert seq._emit is None  # nothing to dequeue
    assert seq.step() is None
    assert seq.has_pending()  # B is still pending
    assert partials(seq) == {A: (-1, -1, -1, 6, 6), B: (b1.begin, 1, 1, 0, 2)}

    # Case: interleaved producer ACKs. A replay is required due to eviction.
    b3_ack = gen(B, 3, ACK)
    assert queue(seq, b3_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq, b1.begin, b2.begin, b1, a7_rollback, a8_rollback)
    expect_deque(seq, b1, b2, b3_ack)
    assert not seq.has_pending()

    # Case: a sequence which requires replay, with duplicates internal to the
    # sequence and from before it, met both in the ring and during replay.
    b4 = gen(B, 4, CONT)  # evicted
    b1_dup = gen(B, 1, CONT)
    b4_dup = gen(B, 4, CONT)
    b5 = gen(B, 5, CONT)  # evicted
    b6 = gen(B, 6, CONT)
    b2_dup = gen(B, 2, CONT)
    b7 = gen(B, 7, CONT)
    b8_ack = gen(B, 8, ACK)
    assert queue(seq, b4, b1_dup, b4_dup, b5, b6, b2_dup, b7, b8_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_ALREADY_ACKED,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_ALREADY_ACKED,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, b4.begin, b6.begin, b4, b1_dup, b4_dup, b5)
    expect_deque(seq, b4, b5, b6, b7, b8_ack)
    assert not seq.has_pending()

    # Case: partial rollback where all ring entries are skipped.
    b9 = gen(B, 9, CONT)  # evicted
    b11_no_ack = gen(B, 11, CONT)  # evicted
    b12_no_ack = gen(B, 12, CONT)
    b13_no_ack = gen(B, 13, CONT)
    b10_ack = gen(B, 10, ACK)
    assert queue(seq, b9, b11_no_ack, b12_no_ack, b13_no_ack, b10_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, b9.begin, b12_no_ack.begin, b9, b11_no_ack)
    expect_deque(seq, b9, b10_ack)
    assert not seq.has_pending()

    # Case: interleaved ACK'd sequences requiring two replays.
    b11 = gen(B, 11, CONT)  # evicted
    a7 = gen(A, 7, CONT)  # evicted
    a8 = gen(A, 8, CONT)
    b12 = gen(B, 12, CONT)
    a9_ack = gen(A, 9, ACK)
    b13_ack = gen(B, 13, ACK)
    assert queue(seq, b11, a7, a8, b12, a9_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, a7.begin, a8.begin, a7)
    expect_deque(seq, a7, a8, a9_ack)
    assert seq.has_pending()

    assert queue(seq, b13_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq, b11.begin, b12.begin, b11, a7, a8)
    expect_deque(seq, b11, b12, b13_ack)
    assert not seq.has_pending()

    # Case: reset to an earlier ACK, followed by re-use of clocks.
    b8_ack_reset, b9_reuse, b10_ack_reuse = gen(B, 8, ACK), gen(B, 9, CONT), gen(B, 10, ACK)
    assert queue(seq, b8_ack_reset, b9_reuse, b10_ack_reuse) == [
        Q.ACK_ROLLBACK,
        Q.CONTINUE_BEGIN_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    expect_deque(seq, b9_reuse, b10_ack_reuse)
    assert not seq.has_pending()


def test_txn_without_buffer() -> None:
    seq, gen = Sequencer(None, None, 0), Gen()  # clamped to a ring of one
    A, B = new_producer_id(), new_producer_id()
    a1, a2, b1 = gen(A, 1, CONT), gen(A, 2, CONT), gen(B, 1, CONT)
    a1_dup, a2_dup, a3_ack = gen(A, 1, CONT), gen(A, 2, CONT), gen(A, 3, ACK)
    b2, b3_ack = gen(B, 2, CONT), gen(B, 3, ACK)

    assert queue(seq, a1, a2, b1, a1_dup, a2_dup, a3_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, a1.begin, a3_ack.begin, a1, a2, b1, a1_dup, a2_dup)
    expect_deque(seq, a1, a2, a3_ack)
    assert seq.has_pending()  # B still pending

    assert queue(seq, b2, b3_ack) == [Q.CONTINUE_EXTEND_SPAN, Q.ACK_COMMIT_REPLAY]
    expect_replay(seq, b1.begin, b3_ack.begin, b1, a1_dup, a2_dup, a3_ack, b2)
    expect_deque(seq, b1, b2, b3_ack)
    assert not seq.has_pending()


def test_outside_txn_cases(caplog: pytest.LogCaptureFixture) -> None:
    seq, gen = Sequencer(None, None, 0), Gen()
    A = new_producer_id()

    # Case: OUTSIDE_TXN messages immediately dequeue.
    a1, a2 = gen(A, 1, OUTSIDE), gen(A, 2, OUTSIDE)
    assert queue(seq, a1) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, a1)
    assert queue(seq, a2) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, a2)
    assert not seq.has_pending()
    assert seq.offsets == {JOURNAL: a2.end}

    # Case: duplicates are ignored.
    a1_dup, a2_dup = gen(A, 1, OUTSIDE), gen(A, 2, OUTSIDE)
    assert queue(seq, a1_dup, a2_dup) == [Q.OUTSIDE_ALREADY_ACKED, Q.OUTSIDE_ALREADY_ACKED]
    assert seq._emit is None
    assert seq.offsets == {JOURNAL: a2_dup.end}

    # Case: any preceding CONTINUE_TXN messages are aborted.
    a3_discard, a4_discard, a5 = gen(A, 3, CONT), gen(A, 4, CONT), gen(A, 5, OUTSIDE)
    assert queue(seq, a3_discard, a4_discard, a5) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.OUTSIDE_COMMIT,
    ]
    expect_deque(seq, a5)
    assert not seq.has_pending()
    assert seq.offsets == {JOURNAL: a5.end}

    # Case: messages with unknown flags are treated as OUTSIDE_TXN (and logged).
    a6_discard, a7_bad_bits, a7_bad_bits_dup = gen(A, 6, CONT), gen(A, 7, 0x100), gen(A, 7, 0x100)
    caplog.clear()
    assert queue(seq, a6_discard, a7_bad_bits) == [Q.CONTINUE_BEGIN_SPAN, Q.OUTSIDE_COMMIT]
    assert any("unexpected UUID flags" in r.getMessage() for r in caplog.records)
    expect_deque(seq, a7_bad_bits)
    assert queue(seq, a7_bad_bits_dup) == [Q.OUTSIDE_ALREADY_ACKED]
    assert seq._emit is None

    # Case: messages with a zero UUID always dequeue.
    z1, z2 = gen(bytes(6), 0, 0), gen(bytes(6), 0, 0)
    z1.uuid = z2.uuid = NIL_UUID
    assert queue(seq, z1) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, z1)
    assert queue(seq, z2) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, z2)
    assert not seq.has_pending()

    # A producer for the zero-valued UUID is not tracked, but it still updates offsets.
    assert partials(seq) == {A: (-1, -1, -1, 7, 7)}
    assert seq.offsets == {JOURNAL: z2.end}


def test_producer_states_round_trip() -> None:
    seq1, gen = Sequencer(None, None, 12), Gen()
    A, B, C = new_producer_id(), new_producer_id(), new_producer_id()
    a1, a2, b1, b2 = gen(A, 1, CONT), gen(A, 2, CONT), gen(B, 1, CONT), gen(B, 2, CONT)
    c1_ack, b3_ack, c2, c1_rollback = gen(C, 1, ACK), gen(B, 3, ACK), gen(C, 2, CONT), gen(C, 1, ACK)
    a3_ack = gen(A, 3, ACK)
    z1 = gen(bytes(6), 0, 0)
    z1.uuid = NIL_UUID

    assert queue(seq1, a1, a2, b1, b2, c1_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_EMPTY,
    ]
    expect_deque(seq1, c1_ack)
    assert seq1.has_pending()

    assert queue(seq1, z1) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq1, z1)

    # Taking a checkpoint makes pending sequences no longer pending: to be
    # pending they must have been started *since* the last checkpoint.
    assert seq1.has_pending()
    offsets, states = seq1.checkpoint(0)
    assert not seq1.has_pending()

    # Recover a new Sequencer from the persisted states and offsets.
    seq2 = Sequencer(offsets, states, 12)
    _, states2 = seq2.checkpoint(0)
    assert not seq2.has_pending()

    expect = by_producer(
        [
            ProducerState(JOURNAL, A, 0, a1.begin),
            ProducerState(JOURNAL, B, 0, b1.begin),
            ProducerState(JOURNAL, C, 1, -1),
        ]
    )
    assert by_producer(states) == expect
    assert by_producer(states2) == expect
    assert offsets == {JOURNAL: z1.end}

    # Both Sequencers produce the same output from here, though seq2 needs
    # replays where seq1 does not.
    assert queue(seq1, b3_ack) == [Q.ACK_COMMIT_RING]
    assert queue(seq2, b3_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, b1.begin, b3_ack.begin, b1, b2, c1_ack)
    expect_deque(seq1, b1, b2, b3_ack)
    expect_deque(seq2, b1, b2, b3_ack)

    assert queue(seq1, c2, c1_rollback) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_ROLLBACK]
    assert queue(seq2, c2, c1_rollback) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_ROLLBACK]
    assert seq1._emit is None and seq2._emit is None

    assert queue(seq1, a3_ack) == [Q.ACK_COMMIT_RING]
    assert queue(seq2, a3_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, a1.begin, a3_ack.begin, a1, a2, b1, b2, c1_ack)
    expect_deque(seq1, a1, a2, a3_ack)
    expect_deque(seq2, a1, a2, a3_ack)


def test_producer_states_round_trip_during_dequeue() -> None:
    seq1, gen = Sequencer(None, None, 12), Gen()
    A = new_producer_id()
    a1, a2, a3_ack = gen(A, 1, CONT), gen(A, 2, CONT), gen(A, 3, ACK)
    a4, a5, a6_ack = gen(A, 4, CONT), gen(A, 5, CONT), gen(A, 6, ACK)

    assert queue(seq1, a1, a2, a3_ack) == [Q.CONTINUE_BEGIN_SPAN, Q.CONTINUE_EXTEND_SPAN, Q.ACK_COMMIT_RING]
    assert seq1.step() is a1
    # Suppose the program crashes here, without having processed a1.
    offsets, states = seq1.checkpoint(0)

    # Restore twice, to check unchanged states round-trip exactly.
    seq2 = Sequencer(offsets, states, 12)
    offsets, states = seq2.checkpoint(0)
    seq2 = Sequencer(offsets, states, 12)

    # States are as immediately before a3_ack was read.
    for seq in (seq1, seq2):
        assert seq.checkpoint(0) == ({JOURNAL: a2.end}, [ProducerState(JOURNAL, A, 0, a1.begin)])

    # seq2 begins by reading a3_ack again.
    assert queue(seq2, a3_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, a1.begin, a3_ack.begin, a1, a2)

    # Now both are dequeuing.
    assert seq1.step() is a2
    assert seq1.step() is a3_ack
    assert seq1.step() is None
    expect_deque(seq2, a1, a2, a3_ack)

    # seq1 checkpoints part way through dequeue of the next sequence.
    assert queue(seq1, a4, a5, a6_ack) == [Q.CONTINUE_BEGIN_SPAN, Q.CONTINUE_EXTEND_SPAN, Q.ACK_COMMIT_RING]
    assert seq1.step() is a4
    assert seq1.step() is a5  # crash here

    offsets, states = seq1.checkpoint(0)
    seq2 = Sequencer(offsets, states, 12)
    offsets, states = seq2.checkpoint(0)
    seq2 = Sequencer(offsets, states, 12)

    # States are as immediately before a6_ack, tightened to a4's processing.
    for seq in (seq1, seq2):
        assert seq.checkpoint(0) == ({JOURNAL: a5.end}, [ProducerState(JOURNAL, A, 4, a5.begin)])

    # seq2 reads a6_ack again, then dequeues from a5 (and not a4).
    assert queue(seq2, a6_ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, a5.begin, a6_ack.begin, a5)
    expect_deque(seq2, a5, a6_ack)


def test_producer_states_straddle_duplicate() -> None:
    seq1, gen = Sequencer(None, None, 12), Gen()
    A = new_producer_id()
    a1, a2, a3 = gen(A, 1, CONT), gen(A, 2, CONT), gen(A, 3, CONT)
    a1_dup, a2_dup, a3_dup = gen(A, 1, CONT), gen(A, 2, CONT), gen(A, 3, CONT)
    a4_ack = gen(A, 4, ACK)

    assert queue(seq1, a1, a2, a3) == [Q.CONTINUE_BEGIN_SPAN, Q.CONTINUE_EXTEND_SPAN, Q.CONTINUE_EXTEND_SPAN]
    assert seq1._emit is None

    # Checkpoint and restore.
    offsets, states = seq1.checkpoint(0)
    seq2 = Sequencer(offsets, states, 12)

    assert queue(seq1, a1_dup, a2_dup, a3_dup, a4_ack) == [
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.ACK_COMMIT_RING,
    ]
    # The restored Sequencer knows only the last ACK, so it accepts the duplicates...
    assert queue(seq2, a1_dup, a2_dup, a3_dup, a4_ack) == [
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq2, a1.begin, a1_dup.begin, a1, a2, a3)
    # ...and drops them while dequeuing.
    expect_deque(seq1, a1, a2, a3, a4_ack)
    expect_deque(seq2, a1, a2, a3, a4_ack)


def test_producer_pruning() -> None:
    seq1, gen = Sequencer(None, None, 12), Gen()
    A, B, C = new_producer_id(), new_producer_id(), new_producer_id()
    # Clock units are 100s of nanos, with 4 LSBs of sequence counter.
    a_cont = gen(A, 10 << 4, CONT)
    b_cont = gen(B, 19 << 4, CONT)
    b_ack = gen(B, 20 << 4, ACK)
    c_cont = gen(C, 30 << 4, CONT)

    assert queue(seq1, a_cont, b_cont, b_ack) == [Q.CONTINUE_BEGIN_SPAN, Q.CONTINUE_BEGIN_SPAN, Q.ACK_COMMIT_RING]
    expect_deque(seq1, b_cont, b_ack)
    assert queue(seq1, c_cont) == [Q.CONTINUE_BEGIN_SPAN]

    # The horizon prunes no producers: all states returned.
    _, states = seq1.checkpoint(20 * 100)
    assert by_producer(states) == by_producer(
        [
            ProducerState(JOURNAL, A, (10 << 4) - 1, a_cont.begin),
            ProducerState(JOURNAL, B, 20 << 4, -1),
            ProducerState(JOURNAL, C, (30 << 4) - 1, c_cont.begin),
        ]
    )
    assert len(partials(seq1)) == 3

    # A is pruned.
    _, states = seq1.checkpoint(19 * 100)
    assert by_producer(states) == by_producer(
        [ProducerState(JOURNAL, B, 20 << 4, -1), ProducerState(JOURNAL, C, (30 << 4) - 1, c_cont.begin)]
    )
    assert len(partials(seq1)) == 2

    # B is pruned.
    _, states = seq1.checkpoint(1)
    assert states == [ProducerState(JOURNAL, C, (30 << 4) - 1, c_cont.begin)]
    assert len(partials(seq1)) == 1


class _Wrap:
    """Replay iterator wrapping another one and altering what it returns."""

    def __init__(self, inner: ListReplay, alter) -> None:  # type: ignore[no-untyped-def]
        self.inner, self.alter = inner, alter

    def __iter__(self) -> _Wrap:
        return self

    def __next__(self):  # type: ignore[no-untyped-def]
        return self.alter(self.inner)


def _reader_error(inner: ListReplay):  # type: ignore[no-untyped-def]
    raise EOFError("unexpected EOF")


def _wrong_journal(inner: ListReplay):  # type: ignore[no-untyped-def]
    env = next(inner)
    env.journal = "wrong/journal"
    return env


def _begin_before_range(inner: ListReplay):  # type: ignore[no-untyped-def]
    env = next(inner)
    env.begin -= 1
    return env


def _end_after_range(inner: ListReplay):  # type: ignore[no-untyped-def]
    env = next(inner)
    env.end += 100
    return env


@pytest.mark.parametrize(
    ("alter", "expect"),
    [
        (lambda inner: next(inner), None),  # no error
        (_reader_error, "replay reader: unexpected EOF"),  # reader errors are passed through
        (_wrong_journal, "replay of wrong journal (wrong/journal; expected test/journal)"),
        (_begin_before_range, "replay has wrong Begin (101; expected >= 102)"),
        (_end_after_range, "replay has wrong End (302; expected <= 204)"),
    ],
    ids=["ok", "reader-error", "wrong-journal", "wrong-begin", "wrong-end"],
)
def test_replay_reader_errors(alter, expect) -> None:  # type: ignore[no-untyped-def]
    seq, gen = Sequencer(None, None, 0), Gen()
    A, B = new_producer_id(), new_producer_id()
    b1, a2, a3_ack = gen(B, 1, CONT), gen(A, 2, CONT), gen(A, 3, ACK)
    assert queue(seq, b1, a2, a3_ack) == [Q.CONTINUE_BEGIN_SPAN, Q.CONTINUE_BEGIN_SPAN, Q.ACK_COMMIT_REPLAY]
    expect_replay(seq, a2.begin, a3_ack.begin, a2)

    seq._replay_it = _Wrap(seq._replay_it, alter)
    if expect is None:
        assert seq.step() is a2
    else:
        with pytest.raises(ReplayError) as info:
            seq.step()
        assert str(info.value).startswith(expect)
        if alter is _reader_error:
            assert isinstance(info.value.__cause__, EOFError)
