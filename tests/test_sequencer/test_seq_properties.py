"""Property tests: the Sequencer against an independent reference model.

Hypothesis draws a script of producer actions (CONTINUE, ACK, partial ACK,
re-sent ACK rollbacks, OUTSIDE, unknown flags, nil UUIDs, duplicates) for a
few producers over two journals, and a list of crash points. The test plays
the reader: it feeds the log to a Sequencer with a tiny ring, serves every
replay from the full log, and at each crash point checkpoints (through
encode/decode), discards the Sequencer and restores a new one that resumes
reading at the checkpoint's offsets.

Checked: the processed messages of every journal equal the reference model's
committed messages, in order; no message is processed twice (a restored
reader never re-delivers what was processed before its checkpoint); and
within a sequence clocks strictly increase up to the committing clock.

The generated producers behave like real ones: fresh clocks only increase,
and duplicates are re-sends of committed or still-open messages. (Gazette's
ring and replay paths can disagree for adversarial logs that re-send
rolled-back messages; real producers never do.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harvest_outbox.sequencer import (
    NIL_UUID,
    Envelope,
    Flags,
    QueueOutcome,
    Sequencer,
    build_uuid,
    clock_of,
    decode_checkpoint,
    encode_checkpoint,
    flags_of,
    producer_of,
)

JOURNALS = ("t/0", "t/1")
PRODUCERS = tuple(bytes([2 * i + 1, 0, 0, 0, 0, i]) for i in range(3))
KINDS = ["cont"] * 6 + ["ack"] * 3 + ["partial"] * 2 + ["rollback", "outside", "badflags", "nil"] + ["dup"] * 3


# -- log generation ---------------------------------------------------------


@dataclass
class _Stream:
    """Writer-side view of one producer in one journal."""

    last_ack: int | None = None
    open: list[Envelope] = field(default_factory=list)
    resendable: list[Envelope] = field(default_factory=list)


def build_log(actions: list[tuple[int, int, str, int]]) -> list[Envelope]:
    log: list[Envelope] = []
    ends = dict.fromkeys(JOURNALS, 0)
    clocks = [1000] * len(PRODUCERS)  # steps of 2 leave odd clocks for partial ACKs
    streams: dict[tuple[int, int], _Stream] = {}

    def write(j: int, u: object, payload: object) -> Envelope:
        journal = JOURNALS[j]
        begin = ends[journal] + 2
        env = Envelope(journal, begin, begin + 10, u, payload)  # type: ignore[arg-type]
        ends[journal] = env.end
        log.append(env)
        return env

    def fresh(p: int) -> int:
        clocks[p] += 2
        return clocks[p]

    for serial, (p, j, kind, pick) in enumerate(actions, 1):
        s = streams.setdefault((p, j), _Stream())
        if kind == "rollback" and s.last_ack is None:
            kind = "cont"
        if kind == "partial" and len(s.open) < 2:
            kind = "ack"
        if kind == "dup" and not s.resendable:
            kind = "cont"

        if kind == "cont":
            env = write(j, build_uuid(PRODUCERS[p], fresh(p), Flags.CONTINUE_TXN), serial)
            s.open.append(env)
            s.resendable.append(env)
        elif kind == "ack":
            s.last_ack = fresh(p)
            write(j, build_uuid(PRODUCERS[p], s.last_ack, Flags.ACK_TXN), serial)
            s.open = []
        elif kind == "partial":
            keep = 1 + pick % (len(s.open) - 1)
            s.last_ack = clock_of(s.open[keep - 1].uuid) + 1
            write(j, build_uuid(PRODUCERS[p], s.last_ack, Flags.ACK_TXN), serial)
            dropped = {id(e) for e in s.open[keep:]}
            s.resendable = [e for e in s.resendable if id(e) not in dropped]
            s.open = []
        elif kind == "rollback":  # a re-sent ACK intent
            assert s.last_ack is not None
            write(j, build_uuid(PRODUCERS[p], s.last_ack, Flags.ACK_TXN), serial)
            dropped = {id(e) for e in s.open}
            s.resendable = [e for e in s.resendable if id(e) not in dropped]
            s.open = []
        elif kind in ("outside", "badflags"):
            s.last_ack = fresh(p)
            flags = Flags.OUTSIDE_TXN if kind == "outside" else (0x100, 0x3, 0x3FF)[pick % 3]
            env = write(j, build_uuid(PRODUCERS[p], s.last_ack, flags), serial)
            dropped = {id(e) for e in s.open}  # the open span is clobbered
            s.resendable = [e for e in s.resendable if id(e) not in dropped] + [env]
            s.open = []
        elif kind == "nil":
            write(j, NIL_UUID, serial)
        else:  # dup
            orig = s.resendable[pick % len(s.resendable)]
            write(j, orig.uuid, orig.message)
    return log


# -- reference model --------------------------------------------------------


def reference(log: list[Envelope]) -> dict[str, list[Envelope]]:
    """Committed messages per journal, straight from the sequencing rules."""
    out: dict[str, list[Envelope]] = {j: [] for j in JOURNALS}
    state: dict[tuple[str, bytes], tuple[int, int, list[Envelope]]] = {}
    for env in log:
        clock, flags = clock_of(env.uuid), flags_of(env.uuid)
        if clock == 0:
            out[env.journal].append(env)
            continue
        key = (env.journal, producer_of(env.uuid))
        last, top, span = state.get(key, (clock - 1, clock - 1, []))
        if flags == Flags.CONTINUE_TXN:
            if clock > top and clock > last:
                state[key] = (last, clock, [*span, env])
        elif flags == Flags.ACK_TXN:
            if clock > last:
                out[env.journal] += [e for e in span if clock_of(e.uuid) <= clock] + [env]
            state[key] = (clock, clock, [])
        elif clock > last:  # OUTSIDE_TXN, or unknown flags treated as such
            out[env.journal].append(env)
            state[key] = (clock, clock, [])
    return out


# -- the reader under test --------------------------------------------------


def read(log: list[Envelope], ring_size: int, crashes: list[tuple[int, int]]) -> dict[str, list[Envelope]]:
    processed: dict[str, list[Envelope]] = {j: [] for j in JOURNALS}
    crashes = sorted(crashes)
    seq = Sequencer(ring_size=ring_size)
    restarts = 0

    while True:
        resume = dict(seq.offsets)
        crashed = False
        for i, env in enumerate(log):
            if env.begin < resume.get(env.journal, 0):
                continue  # read through before the checkpoint
            outcome = seq.queue_uncommitted(env)
            if outcome == QueueOutcome.ACK_COMMIT_REPLAY:
                journal, begin, end = seq.replay_range()
                seq.start_replay(e for e in log if e.journal == journal and begin <= e.begin and e.end <= end)
            crash_after = None
            if crashes and crashes[0][0] <= i:
                crash_after = crashes.pop(0)[1]
            returned: Envelope | None = None
            steps = 0
            while True:
                if crash_after is not None and steps == crash_after:
                    crashed = True
                    break
                got = seq.step()
                steps += 1
                if returned is not None:  # calling step() marks it processed
                    processed[returned.journal].append(returned)
                if got is None:
                    break
                # Clocks strictly increase within a sequence, up to the committing clock.
                clock = clock_of(got.uuid)
                if clock_of(env.uuid) != 0:
                    assert clock <= clock_of(env.uuid)
                    assert returned is None or clock > clock_of(returned.uuid)
                returned = got
            if crashed:
                break
        if not crashed:
            return processed
        restarts += 1
        assert restarts < 100
        offsets, states = seq.checkpoint()
        seq = Sequencer(*decode_checkpoint(encode_checkpoint(offsets, states)), ring_size=ring_size)


actions_st = st.lists(
    st.tuples(
        st.integers(0, len(PRODUCERS) - 1),
        st.sampled_from((0, 0, 0, 1)),
        st.sampled_from(KINDS),
        st.integers(0, 1000),
    ),
    min_size=4,
    max_size=60,
)
crashes_st = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 6)), max_size=4)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=actions_st, ring_size=st.integers(0, 5), crashes=crashes_st)
def test_matches_reference_across_crashes(
    actions: list[tuple[int, int, str, int]], ring_size: int, crashes: list[tuple[int, int]]
) -> None:
    log = build_log(actions)
    want = reference(log)
    got = read(log, ring_size, crashes)
    for journal in JOURNALS:
        assert [id(e) for e in got[journal]] == [id(e) for e in want[journal]], journal
        # At most once: no sequenced message is processed twice.
        seen = [e.uuid for e in got[journal] if e.uuid != NIL_UUID]
        assert len(seen) == len(set(seen))


@settings(max_examples=150, deadline=None)
@given(actions=actions_st, ring_size=st.integers(0, 8))
def test_ring_size_does_not_change_output(actions: list[tuple[int, int, str, int]], ring_size: int) -> None:
    # With a ring large enough nothing is replayed; with a tiny one most
    # commits replay. Both must deliver the same messages.
    log = build_log(actions)
    assert read(log, ring_size, []) == read(log, 4096, [])


@settings(max_examples=150, deadline=None)
@given(actions=actions_st, ring_size=st.integers(0, 8))
def test_offsets_and_pending(actions: list[tuple[int, int, str, int]], ring_size: int) -> None:
    # Ignored/span outcomes advance offsets at once; committing outcomes only
    # when step() returns None. has_pending() holds iff a span opened since the
    # last checkpoint is still open.
    log = build_log(actions)
    seq = Sequencer(ring_size=ring_size)
    opened: set[tuple[str, bytes]] = set()
    for n, env in enumerate(log):
        before = dict(seq.offsets)
        outcome = seq.queue_uncommitted(env)
        key = (env.journal, producer_of(env.uuid))
        if outcome.commits:
            assert dict(seq.offsets) == before
            if outcome == QueueOutcome.ACK_COMMIT_REPLAY:
                j, b, e = seq.replay_range()
                seq.start_replay(x for x in log if x.journal == j and b <= x.begin and x.end <= e)
            while seq.step() is not None:
                assert dict(seq.offsets) == before
            opened.discard(key)
        else:
            assert seq.offsets[env.journal] == env.end
            if outcome == QueueOutcome.CONTINUE_BEGIN_SPAN:
                opened.add(key)
            elif outcome == QueueOutcome.ACK_ROLLBACK:
                opened.discard(key)
        assert seq.offsets[env.journal] == env.end
        assert seq.has_pending() == bool(opened)
        if n % 7 == 6:
            seq.checkpoint()
            opened.clear()
            assert not seq.has_pending()
