"""``Sequencer.queue_batch`` is ``queue_uncommitted`` on each entry, and
``Sequencer.drop_journals`` is pure state removal.

Hypothesis draws the same relay-like logs as ``test_seq_properties`` (CONTINUE,
ACK, partial ACKs, re-sent-ACK rollbacks, OUTSIDE, unknown flags, nil UUIDs,
duplicates over two journals), cuts them into random batches, and plays them
through two Sequencers: one message by message, one batch by batch, with tiny
rings (forcing replays and evictions), checkpoints (with pruning) and journal
drops at random points. After every message of the reference, the batched one
must stop at exactly the committing messages with the same outcome, step()
must return the very same objects, and the whole internal state (partials,
ring, offsets, pending) must be identical at every point the batch caller can
observe.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from seq_testlib import Gen
from test_seq_properties import JOURNALS, actions_st, build_log

from harvest_outbox.sequencer import Flags, QueueOutcome, Sequencer, build_uuid
from harvest_outbox.sequencer.errors import SequencerStateError


def snapshot(seq: Sequencer) -> tuple:
    parts = {
        (j, pid): (p.min_clock, p.max_clock, p.begin, p.ring_start, p.ring_stop)
        for j, jp in seq._partials.items()
        for pid, p in jp.items()
    }
    pending = sorted((p.journal, p.producer) for p in seq._pending)
    return (
        parts,
        pending,
        dict(seq.offsets),
        [id(x) for x in seq._ring],
        list(seq._rbegin),
        list(seq._rclock),
        list(seq._next),
        seq._head,
        seq.has_pending(),
    )


def drain(seq: Sequencer, outcome: QueueOutcome, log: list) -> list[int]:
    if outcome == QueueOutcome.ACK_COMMIT_REPLAY:
        journal, begin, end = seq.replay_range()
        seq.start_replay(e for e in log if e.journal == journal and begin <= e.begin and e.end <= end)
    out = []
    while (got := seq.step()) is not None:
        out.append(id(got))
    return out


def queue_until_commit(ref: Sequencer, log: list, pos: int, stop: int) -> tuple[int, QueueOutcome | None]:
    """The reference, message by message, up to ``stop`` or the first commit: queue_batch's answer."""
    for i in range(pos, stop):
        outcome = ref.queue_uncommitted(log[i])
        if outcome.commits:
            return i + 1, outcome
    return stop, None


def apply_event(ev: str | None, got: Sequencer, ref: Sequencer) -> None:
    """Apply a between-batches event to both Sequencers; their state must stay identical."""
    if ev == "cp" or ev == "prune":
        h = 0 if ev == "cp" else 3 * 16
        assert got.checkpoint(h) == ref.checkpoint(h)
    elif ev in ("drop0", "drop1"):
        got.drop_journals([JOURNALS[int(ev[-1])]])
        ref.drop_journals([JOURNALS[int(ev[-1])]])
    assert snapshot(got) == snapshot(ref)


cuts_st = st.lists(st.integers(1, 12), min_size=1, max_size=30)
events_st = st.lists(st.tuples(st.integers(0, 80), st.sampled_from(["cp", "prune", "drop0", "drop1"])), max_size=5)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=actions_st, ring_size=st.integers(0, 6), cuts=cuts_st, events=events_st)
def test_queue_batch_equals_queue_uncommitted(actions, ring_size, cuts, events) -> None:
    log = build_log(actions)
    ref = Sequencer(ring_size=ring_size)
    bat = Sequencer(ring_size=ring_size)
    entries = [(e.journal, e.begin, e.end, e.uuid.int, e) for e in log]
    events = dict(events)  # batch boundary index -> event, applied to both between batches
    pos = 0
    cut = 0
    while pos < len(entries):
        stop = min(len(entries), pos + cuts[cut % len(cuts)])
        cut += 1
        want_stop, want_outcome = queue_until_commit(ref, log, pos, stop)
        got_stop, got_outcome = bat.queue_batch(entries[:stop], pos)
        assert (got_stop, got_outcome) == (want_stop, want_outcome)
        assert snapshot(bat) == snapshot(ref)
        if want_outcome is not None:
            assert drain(bat, got_outcome, log) == drain(ref, want_outcome, log)
            assert snapshot(bat) == snapshot(ref)
        pos = want_stop
        apply_event(events.get(pos), bat, ref)


def test_queue_batch_requires_drained_sequence() -> None:
    gen = Gen()
    p = b"\x01\x00\x00\x00\x00\x01"
    seq = Sequencer()
    env = gen(p, 160, Flags.OUTSIDE_TXN)
    assert seq.queue_batch([(env.journal, env.begin, env.end, env.uuid.int, "item")]) == (
        1,
        QueueOutcome.OUTSIDE_COMMIT,
    )
    try:
        seq.queue_batch([])
    except SequencerStateError:
        pass
    else:  # pragma: no cover
        raise AssertionError("queue_batch with a sequence to dequeue must raise")
    assert seq.step() == "item" and seq.step() is None
    assert seq.queue_batch([]) == (0, None)


def test_drop_journals_is_state_removal() -> None:
    a, b = Gen("t/0"), Gen("t/1")
    p = b"\x01\x00\x00\x00\x00\x01"
    seq = Sequencer(ring_size=8)
    a1 = a(p, 160, Flags.CONTINUE_TXN)
    b1, b2 = b(p, 160, Flags.CONTINUE_TXN), b(p, 320, Flags.ACK_TXN)
    for env in (a1, b1, b2):
        seq.queue_uncommitted(env)
    assert [seq.step(), seq.step(), seq.step()] == [b1, b2, None]
    assert seq.has_pending()  # a's span is open
    seq.queue_uncommitted(a(p, 320, Flags.CONTINUE_TXN))
    seq.drop_journals(["t/0", "t/unknown"])
    offsets, states = seq.checkpoint(0)
    assert offsets == {"t/1": b2.end} and [s.journal for s in states] == ["t/1"]
    assert not seq.has_pending()
    # t/0 now behaves as a journal never seen: its ACK commits nothing of the
    # dropped span (which stays unreachable in the ring until evicted).
    ack = a(p, 480, Flags.ACK_TXN)
    assert seq.queue_uncommitted(ack) == QueueOutcome.ACK_EMPTY
    assert [seq.step(), seq.step()] == [ack, None]
    # Wrapping the ring over the dropped entries leaves live state alone.
    for c in range(5):
        env = b(p, 480 + 160 * c, Flags.CONTINUE_TXN)
        assert seq.queue_uncommitted(env) in (QueueOutcome.CONTINUE_BEGIN_SPAN, QueueOutcome.CONTINUE_EXTEND_SPAN)
    ack = b(p, 480 + 160 * 5, Flags.ACK_TXN)
    assert seq.queue_uncommitted(ack) == QueueOutcome.ACK_COMMIT_RING
    assert sum(1 for _ in iter(seq.step, None)) == 6


def test_drop_journals_between_sequences_only() -> None:
    gen = Gen()
    seq = Sequencer()
    seq.queue_uncommitted(gen(b"\x01\x00\x00\x00\x00\x01", 160, Flags.OUTSIDE_TXN))
    try:
        seq.drop_journals([gen.journal])
    except SequencerStateError:
        pass
    else:  # pragma: no cover
        raise AssertionError("drop_journals mid-sequence must raise")


def test_queue_batch_nil_and_unknown_journal() -> None:
    # Unsequenced (nil) entries and journals first seen inside a batch.
    seq = Sequencer(ring_size=4)
    p = b"\x01\x00\x00\x00\x00\x01"
    entries = [
        ("x/0", 0, 1, build_uuid(p, 160, Flags.CONTINUE_TXN).int, "c1"),
        ("x/1", 0, 1, 0, "nil"),
        ("x/0", 1, 2, build_uuid(p, 320, Flags.CONTINUE_TXN).int, "c2"),
        ("x/0", 2, 3, build_uuid(p, 480, Flags.ACK_TXN).int, "ack"),
    ]
    assert seq.queue_batch(entries) == (2, QueueOutcome.OUTSIDE_COMMIT)
    assert [seq.step(), seq.step()] == ["nil", None]
    assert seq.queue_batch(entries, 2) == (4, QueueOutcome.ACK_COMMIT_RING)
    assert list(iter(seq.step, None)) == ["c1", "c2", "ack"]
