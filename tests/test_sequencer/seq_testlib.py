"""Shared helpers for the sequencer tests: a port of the helpers of Gazette's
``message/sequencer_test.go`` (message generator, queue, expectDeque,
expectReplay) plus white-box access to the Sequencer's partial sequences."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from harvest_outbox.sequencer import Envelope, QueueOutcome, Sequencer, build_uuid, clock_of, producer_of

JOURNAL = "test/journal"


class Gen:
    """Envelopes at increasing offsets: [o, o+100), with 2 bytes of dead space
    between envelopes, because the Sequencer must not assume contiguity."""

    def __init__(self, journal: str = JOURNAL) -> None:
        self.journal = journal
        self.offset = 0

    def __call__(self, producer: bytes, clock: int, flags: int) -> Envelope:
        env = Envelope(self.journal, self.offset, self.offset + 100, build_uuid(producer, clock, flags), str(clock))
        self.offset += 102
        return env


def queue(seq: Sequencer, *envs: Envelope) -> list[QueueOutcome]:
    return [seq.queue_uncommitted(e) for e in envs]


def partial(seq: Sequencer, producer: bytes, journal: str = JOURNAL) -> Any:
    return seq._partials[journal][int.from_bytes(producer, "big")]


def partials(seq: Sequencer, journal: str = JOURNAL) -> dict[bytes, tuple[int, int, int, int, int]]:
    """{producer: (begin, ring_start, ring_stop, min_clock, max_clock)}, the
    fields Gazette's tests compare."""
    return {
        pid.to_bytes(6, "big"): (p.begin, p.ring_start, p.ring_stop, p.min_clock, p.max_clock)
        for pid, p in seq._partials.get(journal, {}).items()
    }


def expect_deque(seq: Sequencer, *expect: Envelope) -> None:
    for i, want in enumerate(expect):
        got = seq.step()
        assert got is want, f"step {i}: got {got}, want {want}"
        assert seq._emit.begin == want.begin
        if i > 0:
            assert seq._emit.min_clock == clock_of(expect[i - 1].uuid)
    assert seq.step() is None
    assert seq._dequeued is None
    assert seq._emit is None

    last = expect[-1]
    clock = clock_of(last.uuid)
    if clock != 0:
        # The producer's partial sequence is reset, ready for its next sequence.
        assert partials(seq, last.journal)[producer_of(last.uuid)] == (-1, -1, -1, clock, clock)
    # Read-through of the committing message is now tracked in offsets.
    assert seq.offsets[last.journal] == last.end


class ListReplay:
    """A replay iterator over given envelopes that fails if read past its end."""

    def __init__(self, envs: Iterable[Envelope]) -> None:
        self.envs: list[Envelope] | None = list(envs)

    def __iter__(self) -> Iterator[Envelope]:
        return self

    def __next__(self) -> Envelope:
        if self.envs is None:
            raise AssertionError("unexpected extra replay call")
        if not self.envs:
            self.envs = None
            raise StopIteration
        return self.envs.pop(0)


def expect_replay(seq: Sequencer, begin: int, end: int, *envs: Envelope) -> None:
    assert seq.replay_range() == (envs[0].journal, begin, end)
    seq.start_replay(ListReplay(envs))
