"""The compiled Sequencer (``sequencer._native``) is the pure-Python reference, observably.

The rest of ``tests/test_sequencer`` runs once per implementation (see conftest.py); this module
compares the two directly: hypothesis plays the same relay-like logs (duplicates, partial ACKs,
rollbacks, OUTSIDE, unknown flags, nil UUIDs, two journals, tiny rings forcing replays and
evictions) through the reference message by message and through the native one in random batches
(both as tuple lists and as ``EntryBatch``), with checkpoints, pruning and journal drops at random
points, and requires identical outcomes, stepped objects and internal state at every point a
caller can observe. It also pins the native module's own surface: ``EntryBatch`` and the C-type
limits, which fail with the reference's error types.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from native_impl import native_module
from test_seq_batch import apply_event, cuts_st, drain, events_st, queue_until_commit, snapshot
from test_seq_properties import actions_st, build_log

from harvest_outbox import sequencer
from harvest_outbox.sequencer import CheckpointError, Flags, ProducerState, PySequencer, QueueOutcome, build_uuid
from harvest_outbox.sequencer.native import pure_python_forced

#: Run once (conftest.py): these tests name both implementations themselves.
IMPLEMENTATIONS = ["native"]

pytestmark = pytest.mark.skipif(pure_python_forced(), reason="HARVEST_PURE_PYTHON=1: no native Sequencer under test")


def native():  # type: ignore[no-untyped-def]
    return native_module("harvest_outbox.sequencer._native")


def test_the_package_exports_the_native_sequencer(sequencer_impl: str) -> None:
    assert sequencer.IMPLEMENTATION == "native"
    assert sequencer.Sequencer is native().Sequencer
    assert sequencer.EntryBatch is native().EntryBatch


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    actions=actions_st,
    ring_size=st.integers(0, 6),
    cuts=cuts_st,
    events=events_st,
    columnar=st.booleans(),
    many=st.integers(1, 4),
)
def test_native_equals_reference(actions, ring_size, cuts, events, columnar, many) -> None:
    nat_mod = native()
    log = build_log(actions)
    ref = PySequencer(ring_size=ring_size)
    nat = nat_mod.Sequencer(ring_size=ring_size)
    if columnar:
        entries = nat_mod.EntryBatch()
        for e in log:
            entries.append(e.journal, e.begin, e.end, e.uuid.int, e)
    else:
        entries = [(e.journal, e.begin, e.end, e.uuid.int, e) for e in log]
    events = dict(events)
    pos = cut = 0
    while pos < len(log):
        stop = min(len(log), pos + cuts[cut % len(cuts)])
        cut += 1
        want_stop, want_outcome = queue_until_commit(ref, log, pos, stop)
        if columnar:
            sub = nat_mod.EntryBatch()
            for i in range(stop):
                sub.append(*entries[i])
            got_stop, got_outcome = nat.queue_batch(sub, pos)
        else:
            got_stop, got_outcome = nat.queue_batch(entries[:stop], pos)
        assert (got_stop, got_outcome) == (want_stop, want_outcome)
        assert snapshot(nat) == snapshot(ref)
        if want_outcome is not None:
            want = drain(ref, want_outcome, log)
            if want_outcome == QueueOutcome.ACK_COMMIT_REPLAY:
                journal, begin, end = nat.replay_range()
                nat.start_replay(e for e in log if e.journal == journal and begin <= e.begin and e.end <= end)
            got = []
            while True:  # step_many in chunks of `many`, as ReadCommittedIter.poll_batch does
                chunk = nat.step_many(many)
                got += [id(x) for x in chunk]
                if len(chunk) < many:
                    break
            assert got == want
            assert snapshot(nat) == snapshot(ref)
        pos = want_stop
        apply_event(events.get(pos), nat, ref)
    assert nat.checkpoint(0) == ref.checkpoint(0)


def test_entry_batch_is_a_sequence_of_entries() -> None:
    eb = native().EntryBatch(1)  # grows past its initial capacity
    u = build_uuid(b"\x01\x02\x03\x04\x05\x06", 1 << 63 | 17, Flags.ACK_TXN)
    items = [object() for _ in range(40)]
    for i, item in enumerate(items):
        eb.append("t/3", i, i + 1, u.int if i % 2 else 0, item)
    assert len(eb) == 40
    assert eb[0] == ("t/3", 0, 1, 0, items[0])
    assert eb[-1] == ("t/3", 39, 40, u.int, items[39])
    assert [e[4] for e in (eb[i] for i in range(40))] == items
    with pytest.raises(IndexError):
        eb[40]


@pytest.mark.parametrize(
    ("state", "match"),
    [
        (ProducerState("t/0", b"\x01" * 6, 1 << 64, -1), "64-bit"),
        (ProducerState("t/0", b"\x01" * 6, 5, 1 << 63), "64-bit"),
        (ProducerState("t/0", b"\x01" * 6, -1, -1), "last_ack >= 0"),
        (ProducerState("t/0", b"\x01" * 5, 5, -1), "6 bytes"),
    ],
)
def test_corrupt_states_fail_as_in_the_reference(state: ProducerState, match: str) -> None:
    for cls in (native().Sequencer, PySequencer):
        with pytest.raises(CheckpointError, match=match):
            cls({}, [state])


def test_offsets_beyond_int64_are_an_overflow_not_a_wrap() -> None:
    seq = native().Sequencer()
    u = build_uuid(b"\x01" * 6, 160, Flags.CONTINUE_TXN)
    with pytest.raises(OverflowError):
        seq.queue_batch([("t/0", 1 << 63, (1 << 63) + 1, u.int, "x")])
    with pytest.raises(CheckpointError, match="64-bit"):
        native().Sequencer({"t/0": 1 << 63})


def test_entry_batch_from_columns_matches_appended_entries() -> None:
    import numpy as np

    eb_cls = native().EntryBatch
    us = [
        build_uuid(bytes([1, 0, 0, 0, 0, i]), 16 * (100 + i), Flags.CONTINUE_TXN if i % 3 else Flags.ACK_TXN)
        for i in range(6)
    ]
    offsets = np.array([10, 11, 13, 20, 21, 22], dtype=np.int64)
    his = np.array([u.int >> 64 for u in us], dtype=np.uint64)
    los = np.array([u.int & (2**64 - 1) for u in us], dtype=np.uint64)
    full = eb_cls.from_columns("t/2", offsets, his, los)
    assert [full[i] for i in range(6)] == [
        ("t/2", int(o), int(o) + 1, u.int, i) for i, (o, u) in enumerate(zip(offsets, us, strict=True))
    ]
    some = eb_cls.from_columns("t/2", offsets, his, los, np.array([1, 4], dtype=np.int64))
    assert [some[i] for i in range(2)] == [full[1], full[4]]
    with pytest.raises(ValueError, match="differ in length"):
        eb_cls.from_columns("t/2", offsets, his[:3], los)
    with pytest.raises(IndexError):
        eb_cls.from_columns("t/2", offsets, his, los, np.array([6], dtype=np.int64))
