"""Error paths: malformed UUIDs, bad build_uuid inputs, API misuse, bad
restored states. Every error is a SequencerError with a message naming the
field and value."""

from __future__ import annotations

import uuid

import pytest
from seq_testlib import Gen

from harvest_outbox.sequencer import (
    CheckpointError,
    Envelope,
    Flags,
    ProducerState,
    Publisher,
    QueueOutcome,
    Sequencer,
    SequencerError,
    SequencerStateError,
    UUIDError,
    build_uuid,
    new_producer_id,
    parse_uuid,
)

P = bytes([1, 2, 3, 4, 5, 6])
V1 = build_uuid(P, 160, 1).bytes


def _with_byte(raw: bytes, i: int, value: int) -> bytes:
    b = bytearray(raw)
    b[i] = value
    return bytes(b)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (V1[:15], "exactly 16 bytes, got 15"),
        (V1 + b"\0", "exactly 16 bytes, got 17"),
        (b"", "exactly 16 bytes, got 0"),
        (str(uuid.UUID(bytes=V1)).encode(), "exactly 16 bytes, got 36"),
        # A fixed version-4 UUID, not uuid4(): parallel workers must collect the same test ids.
        (uuid.UUID("3f2a8c1e-5b7d-4e90-9a1b-2c3d4e5f6071").bytes, "version 4, expected 1"),
        (_with_byte(V1, 6, 0x00), "version 0, expected 1"),
        (_with_byte(V1, 8, 0x00), "variant .*reserved for NCS"),
        (_with_byte(V1, 8, 0xC0), "variant .*Microsoft"),
        (_with_byte(V1, 8, 0xE0), "variant .*future"),
        ("0000000a-0000-1000-8000-010203040506", "must be bytes, got str"),
        (None, "must be bytes, got NoneType"),
    ],
)
def test_parse_uuid_rejects(raw: bytes, match: str) -> None:
    with pytest.raises(UUIDError, match=match):
        parse_uuid(raw)


@pytest.mark.parametrize(
    ("producer", "clock", "flags", "match"),
    [
        (P, 160, 0x400, r"flags must be .*\[0, 0x3ff\].*got 1024"),
        (P, 160, 0xFFFF, "got 65535"),
        (P, 160, -1, "got -1"),
        (P, 160, 1.0, "got 1.0"),
        (P, -1, 0, r"clock must be .*got -1"),
        (P, 2**64, 0, r"clock must be .*got 18446744073709551616"),
        (P[:5], 160, 0, "producer must be 6 bytes"),
        (P + b"\0", 160, 0, "producer must be 6 bytes"),
        ("abcdef", 160, 0, "producer must be 6 bytes"),
    ],
)
def test_build_uuid_rejects(producer: bytes, clock: int, flags: int, match: str) -> None:
    with pytest.raises(UUIDError, match=match):
        build_uuid(producer, clock, flags)


def test_error_hierarchy() -> None:
    assert issubclass(UUIDError, SequencerError) and issubclass(UUIDError, ValueError)
    assert issubclass(CheckpointError, SequencerError) and issubclass(CheckpointError, ValueError)
    assert issubclass(SequencerStateError, SequencerError) and issubclass(SequencerStateError, RuntimeError)


def _committed_seq() -> Sequencer:
    seq, gen = Sequencer(), Gen()
    assert seq.queue_uncommitted(gen(P, 160, Flags.OUTSIDE_TXN)) == QueueOutcome.OUTSIDE_COMMIT
    return seq


def _replay_seq() -> Sequencer:
    seq, gen = Sequencer(ring_size=1), Gen()
    seq.queue_uncommitted(gen(P, 160, Flags.CONTINUE_TXN))
    assert seq.queue_uncommitted(gen(P, 320, Flags.ACK_TXN)) == QueueOutcome.ACK_COMMIT_REPLAY
    return seq


@pytest.mark.parametrize(
    ("make", "call", "match"),
    [
        (_committed_seq, lambda s: s.queue_uncommitted(Gen()(P, 480, 0)), "committed messages remain to dequeue"),
        (_replay_seq, lambda s: s.step(), "must be replayed: call replay_range"),
        (Sequencer, lambda s: s.replay_range(), "no committed sequence"),
        (Sequencer, lambda s: s.start_replay([]), "no committed sequence"),
    ],
    ids=["queue-while-dequeuing", "step-without-replay", "replay-range-idle", "start-replay-idle"],
)
def test_api_misuse(make, call, match) -> None:  # type: ignore[no-untyped-def]
    seq = make()
    with pytest.raises(SequencerStateError, match=match):
        call(seq)


def test_step_when_idle_returns_none() -> None:
    assert Sequencer().step() is None


@pytest.mark.parametrize(
    ("states", "match"),
    [
        ([("j", P, 0, -1)], "must hold ProducerState"),
        ([ProducerState("j", P[:4], 0, -1)], "producer must be 6 bytes"),
        ([ProducerState("j", P, -5, -1)], "last_ack=-5"),
        ([ProducerState("j", P, 0, -2)], "begin=-2"),
    ],
)
def test_sequencer_rejects_bad_states(states, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CheckpointError, match=match):
        Sequencer(states=states)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"producer_id": b"\1\2\3"}, UUIDError, "producer_id must be 6 bytes"),
        ({"producer_id": "abcdef"}, UUIDError, "producer_id must be 6 bytes"),
    ],
)
def test_publisher_rejects(kwargs, exc, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(exc, match=match):
        Publisher(**kwargs)


@pytest.mark.parametrize("journal", ["", None, 3])
def test_publisher_rejects_bad_journal(journal) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="journal must be a non-empty str"):
        Publisher().publish_uncommitted(journal)


def test_unknown_flags_logged_once_per_producer(caplog: pytest.LogCaptureFixture) -> None:
    seq, gen = Sequencer(), Gen()
    other = new_producer_id()
    with caplog.at_level("WARNING", logger="harvest_outbox.sequencer.sequencer"):
        for clock in (160, 320, 480):
            assert seq.queue_uncommitted(gen(P, clock, 0x3FF)) == QueueOutcome.OUTSIDE_COMMIT
            while seq.step() is not None:
                pass
        seq.queue_uncommitted(gen(other, 160, 0x10))
    flagged = [r for r in caplog.records if "unexpected UUID flags" in r.getMessage()]
    assert len(flagged) == 2  # once for P, once for other
    assert "flags=0x3ff" in flagged[0].getMessage()


def test_ack_below_last_ack_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    seq, gen = Sequencer(), Gen()
    seq.queue_uncommitted(gen(P, 320, Flags.ACK_TXN))
    while seq.step() is not None:
        pass
    with caplog.at_level("WARNING", logger="harvest_outbox.sequencer.sequencer"):
        assert seq.queue_uncommitted(gen(P, 160, Flags.ACK_TXN)) == QueueOutcome.ACK_ROLLBACK
    assert any("loss of exactly-once" in r.getMessage() for r in caplog.records)


def test_envelope_is_not_mutated() -> None:
    seq, gen = Sequencer(ring_size=2), Gen()
    envs = [gen(P, 160, 1), gen(P, 320, 1), gen(P, 480, 2)]
    before = [Envelope(e.journal, e.begin, e.end, e.uuid, e.message) for e in envs]
    for e in envs:
        seq.queue_uncommitted(e)
    seq.start_replay(envs[:1])
    out = []
    while (e := seq.step()) is not None:
        out.append(e)
    assert out == before and envs == before
