"""Checkpoint encoding: round trips, determinism, and a table of corrupt inputs."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harvest_outbox.sequencer import (
    CHECKPOINT_VERSION,
    CheckpointError,
    ProducerState,
    Sequencer,
    decode_checkpoint,
    encode_checkpoint,
)
from harvest_outbox.sequencer.checkpoint import CHECKPOINT_MAGIC

P = bytes([1, 2, 3, 4, 5, 6])

journals = st.text(min_size=1, max_size=12)
states_st = st.lists(
    st.builds(
        ProducerState,
        journal=journals,
        producer=st.binary(min_size=6, max_size=6),
        last_ack=st.integers(0, 2**64 - 1),
        begin=st.integers(-1, 2**63 - 1),
    ),
    max_size=8,
    unique_by=lambda s: (s.journal, s.producer),
)


@given(offsets=st.dictionaries(journals, st.integers(0, 2**63 - 1), max_size=6), states=states_st)
def test_round_trip(offsets: dict[str, int], states: list[ProducerState]) -> None:
    data = encode_checkpoint(offsets, states)
    assert decode_checkpoint(data) == (offsets, states)
    # Deterministic regardless of dict order.
    assert encode_checkpoint(dict(reversed(list(offsets.items()))), states) == data


def test_sequencer_checkpoint_round_trip() -> None:
    seq = Sequencer({"t/0": 7}, [ProducerState("t/0", P, 160, 3)])
    offsets, states = seq.checkpoint()
    restored = Sequencer(*decode_checkpoint(encode_checkpoint(offsets, states)))
    assert restored.checkpoint() == (offsets, states) == ({"t/0": 7}, [ProducerState("t/0", P, 160, 3)])


def _doc(**changes: object) -> bytes:
    doc: dict[str, object] = {
        "magic": CHECKPOINT_MAGIC,
        "version": CHECKPOINT_VERSION,
        "offsets": {"t/0": 10},
        "producers": [["t/0", P, 160, -1]],
    }
    for k, v in changes.items():
        if v is _DROP:
            del doc[k]
        else:
            doc[k] = v
    return msgpack.packb(doc, use_bin_type=True)


_DROP = object()
GOOD = _doc()


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "not valid msgpack"),
        (GOOD[:-3], "not valid msgpack"),
        (GOOD + b"\x00", "not valid msgpack"),
        (b"\xc1", "not valid msgpack"),
        (msgpack.packb([1, 2]), "must be a msgpack map, got list"),
        (_doc(magic="something.else"), "magic is 'something.else'"),
        (_doc(magic=_DROP), "magic is None"),
        (_doc(version=2), "version is 2, this build reads version 1"),
        (_doc(version=_DROP), "version is None"),
        (_doc(offsets=[1]), "'offsets' must be a map"),
        (_doc(producers={"a": 1}), "'producers' must be a list"),
        (_doc(offsets={"t/0": -1}), r"offsets\['t/0'\] must be an int >= 0, got -1"),
        (_doc(offsets={"t/0": "10"}), r"offsets\['t/0'\] must be an int >= 0, got '10'"),
        (_doc(offsets={"t/0": 1.5}), r"got 1.5"),
        (_doc(offsets={7: 1}), "journal name must be a non-empty str, got 7"),
        (_doc(offsets={"": 1}), "journal name must be a non-empty str"),
        (_doc(producers=[["t/0", P, 160]]), r"producers\[0\] must be \[journal, producer, last_ack, begin\]"),
        (_doc(producers=["x"]), r"producers\[0\] must be"),
        (_doc(producers=[[1, P, 160, -1]]), r"producers\[0\].journal must be a non-empty str, got 1"),
        (_doc(producers=[["t/0", P[:5], 160, -1]]), r"producers\[0\].producer must be 6 bytes"),
        (_doc(producers=[["t/0", "abcdef", 160, -1]]), r"producers\[0\].producer must be 6 bytes"),
        (_doc(producers=[["t/0", P, -1, -1]]), r"producers\[0\].last_ack must be .*got -1"),
        (_doc(producers=[["t/0", P, True, -1]]), r"producers\[0\].last_ack must be .*got True"),
        (_doc(producers=[["t/0", P, 160, -2]]), r"producers\[0\].begin must be an int >= -1, got -2"),
        (_doc(producers=[["t/0", P, 160, -1], ["t/0", P, 320, 5]]), r"producers\[1\]: producer 010203040506 .* twice"),
        ("not bytes", "checkpoint must be bytes, got str"),
    ],
)
def test_decode_rejects(data: bytes, match: str) -> None:
    with pytest.raises(CheckpointError, match=match):
        decode_checkpoint(data)


def test_decode_chains_msgpack_error() -> None:
    with pytest.raises(CheckpointError) as info:
        decode_checkpoint(GOOD[:-3])
    assert info.value.__cause__ is not None


@pytest.mark.parametrize(
    ("offsets", "states", "match"),
    [
        ({"t/0": -3}, [], r"offsets\['t/0'\] must be an int >= 0"),
        ({}, [("t/0", P, 0, -1)], r"producers\[0\] must be a ProducerState"),
        ({}, [ProducerState("t/0", P, 0, -7)], r"producers\[0\].begin must be an int >= -1"),
    ],
)
def test_encode_rejects(offsets, states, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CheckpointError, match=match):
        encode_checkpoint(offsets, states)
