"""``Sequencer.step_many(n)`` is ``step()`` called until n messages or ``None``.

Hypothesis draws the relay-like logs of ``test_seq_properties`` (CONTINUE,
ACK, partial ACKs, rollbacks, OUTSIDE, unknown flags, nil UUIDs, duplicates
over two journals) and plays them through two Sequencers with tiny rings
(forcing replays, including replays that end and continue from the ring):
the reference drains each sequence with ``step()``, the other with
``step_many`` in random chunk sizes (0 included). Each chunk must return the
very same objects as the same number of ``step()`` calls, and the whole
internal state (partials, ring, offsets, pending, the dequeued message) must be
identical after every chunk, i.e. at every point a caller can observe; random
checkpoints (with pruning) are taken between chunks on both.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from seq_testlib import Gen
from test_seq_batch import snapshot
from test_seq_properties import actions_st, build_log

from harvest_outbox.sequencer import Flags, QueueOutcome, Sequencer


def full_snapshot(seq: Sequencer) -> tuple:
    emit = seq._emit
    return (
        snapshot(seq),
        id(seq._dequeued),
        seq._dequeued_clock,
        None if emit is None else (emit.journal, emit.producer),
        seq._replay_it is None,
    )


chunks_st = st.lists(st.integers(0, 7), min_size=1, max_size=20)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=actions_st, ring_size=st.integers(0, 6), chunks=chunks_st, cps=st.sets(st.integers(0, 200), max_size=6))
def test_step_many_equals_step(actions, ring_size, chunks, cps) -> None:
    log = build_log(actions)
    ref = Sequencer(ring_size=ring_size)
    many = Sequencer(ring_size=ring_size)
    c = 0
    for env in log:
        outcome = ref.queue_uncommitted(env)
        assert many.queue_uncommitted(env) == outcome
        if not outcome.commits:
            continue
        if outcome == QueueOutcome.ACK_COMMIT_REPLAY:
            journal, begin, end = ref.replay_range()
            assert many.replay_range() == (journal, begin, end)
            replay = [e for e in log if e.journal == journal and begin <= e.begin and e.end <= end]
            ref.start_replay(iter(replay))
            many.start_replay(iter(replay))
        done = False
        while not done:
            n = chunks[c % len(chunks)]
            c += 1
            want = []
            for _ in range(n):
                got = ref.step()
                if got is None:
                    done = True
                    break
                want.append(got)
            got_many = many.step_many(n)
            assert [id(x) for x in got_many] == [id(x) for x in want]
            assert full_snapshot(many) == full_snapshot(ref)
            if c in cps:
                assert many.checkpoint(3 * 16) == ref.checkpoint(3 * 16)
                assert full_snapshot(many) == full_snapshot(ref)
            if n == 0 and c % 3 == 0:
                # Finish with single steps sometimes: mixing both is allowed.
                while (got := ref.step()) is not None:
                    assert many.step() is got
                assert many.step() is None
                done = True
        assert full_snapshot(many) == full_snapshot(ref)


def test_step_many_basics() -> None:
    gen = Gen()
    p = b"\x01\x00\x00\x00\x00\x01"
    seq = Sequencer(ring_size=16)
    assert seq.step_many(5) == []  # nothing to dequeue
    envs = [gen(p, 160 * (i + 1), Flags.CONTINUE_TXN) for i in range(4)]
    for env in envs:
        seq.queue_uncommitted(env)
    ack = gen(p, 160 * 5, Flags.ACK_TXN)
    assert seq.queue_uncommitted(ack) == QueueOutcome.ACK_COMMIT_RING
    assert seq.step_many(0) == []
    assert seq.step_many(2) == envs[:2]
    # envs[1] is dequeued, not processed: a checkpoint now resumes at it.
    offsets, states = seq.checkpoint(0)
    assert offsets[gen.journal] == envs[-1].end and states[0].begin == envs[1].begin and states[0].last_ack == 160
    assert seq.step_many(10) == [*envs[2:], ack]  # shorter: the sequence is done
    offsets, states = seq.checkpoint(0)
    assert offsets[gen.journal] == ack.end and states[0].begin == -1 and states[0].last_ack == 800
    assert seq.step() is None and seq.step_many(3) == []
