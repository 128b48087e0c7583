"""Checkpoint encoding: offsets and producer states <-> versioned msgpack bytes.

Layout (a msgpack map)::

    {"magic": "harvest.sequencer.checkpoint",
     "version": 1,
     "offsets": {journal: read_through_offset, ...},
     "producers": [[journal, producer_id(6 bytes), last_ack, begin], ...]}

Invariants (each backed by ``tests/test_sequencer/test_checkpoint.py``):

* ``decode_checkpoint(encode_checkpoint(o, s)) == (o, s)`` for valid inputs,
  with states in the given order.
* Encoding is deterministic: offsets are written sorted by journal.
* ``decode_checkpoint`` raises :class:`CheckpointError` naming the field and
  value for anything else: not msgpack, trailing bytes, a wrong magic, an
  unsupported version, a missing or mistyped field, a producer id that is not
  6 bytes, ``last_ack < 0`` or ``>= 2**64``, ``begin < -1``, negative offsets,
  or a (journal, producer) listed twice.

A checkpoint names its journals (``topic/partition``), so a reader can tell one
that is not its own (:func:`check_checkpoint_scope`, used by
``consumer.ReadCommittedIter`` and ``spark_reader``): a non-empty checkpoint
that covers none of the partitions the reader reads, or a partition its topic
does not have, is refused with :class:`CheckpointMismatchError` -- accepting it
would start every partition from ``auto.offset.reset`` (re-delivering or
skipping records) without a word. Its other journals are reported back so the
reader can say exactly what it ignores.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

import msgpack

from .errors import CheckpointError, CheckpointMismatchError
from .state import ProducerState

__all__ = ["CHECKPOINT_MAGIC", "CHECKPOINT_VERSION", "check_checkpoint_scope", "decode_checkpoint", "encode_checkpoint"]

CHECKPOINT_MAGIC = "harvest.sequencer.checkpoint"
CHECKPOINT_VERSION = 1
_CLOCK_LIMIT = 1 << 64


def _check_offsets(offsets: Mapping[Any, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for journal, offset in offsets.items():
        if not isinstance(journal, str) or not journal:
            raise CheckpointError(f"offsets: journal name must be a non-empty str, got {journal!r}")
        if type(offset) is not int or offset < 0:
            raise CheckpointError(f"offsets[{journal!r}] must be an int >= 0, got {offset!r}")
        out[journal] = offset
    return out


def _check_state(where: str, journal: Any, producer: Any, last_ack: Any, begin: Any) -> ProducerState:
    if not isinstance(journal, str) or not journal:
        raise CheckpointError(f"{where}.journal must be a non-empty str, got {journal!r}")
    if not isinstance(producer, (bytes, bytearray)) or len(producer) != 6:
        raise CheckpointError(f"{where}.producer must be 6 bytes, got {producer!r}")
    if type(last_ack) is not int or not 0 <= last_ack < _CLOCK_LIMIT:
        raise CheckpointError(f"{where}.last_ack must be an int in [0, 2**64), got {last_ack!r}")
    if type(begin) is not int or begin < -1:
        raise CheckpointError(f"{where}.begin must be an int >= -1, got {begin!r}")
    return ProducerState(journal, bytes(producer), last_ack, begin)


def _check_states(states: Iterable[Any], get: Any) -> list[ProducerState]:
    out: list[ProducerState] = []
    seen: set[tuple[str, bytes]] = set()
    for i, item in enumerate(states):
        st = _check_state(f"producers[{i}]", *get(i, item))
        key = (st.journal, st.producer)
        if key in seen:
            raise CheckpointError(
                f"producers[{i}]: producer {st.producer.hex()} of journal {st.journal!r} "
                "is listed twice; the checkpoint is corrupt"
            )
        seen.add(key)
        out.append(st)
    return out


def encode_checkpoint(offsets: Mapping[str, int], states: Iterable[ProducerState]) -> bytes:
    """Serialize a ``Sequencer.checkpoint()`` result. Validates like decoding."""

    def fields(i: int, st: Any) -> tuple[Any, Any, Any, Any]:
        if not isinstance(st, ProducerState):
            raise CheckpointError(f"producers[{i}] must be a ProducerState, got {st!r}")
        return st.journal, st.producer, st.last_ack, st.begin

    checked_offsets = _check_offsets(offsets)
    checked_states = _check_states(states, fields)
    doc = {
        "magic": CHECKPOINT_MAGIC,
        "version": CHECKPOINT_VERSION,
        "offsets": dict(sorted(checked_offsets.items())),
        "producers": [[s.journal, s.producer, s.last_ack, s.begin] for s in checked_states],
    }
    packed: bytes = msgpack.packb(doc, use_bin_type=True)
    return packed


def decode_checkpoint(data: bytes) -> tuple[dict[str, int], list[ProducerState]]:
    """Parse and validate bytes written by :func:`encode_checkpoint`."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CheckpointError(f"checkpoint must be bytes, got {type(data).__name__}")
    try:
        doc = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise CheckpointError(
            f"checkpoint is not valid msgpack ({type(exc).__name__}: {exc}); "
            "it is truncated or corrupt: restore from an older checkpoint"
        ) from exc
    if not isinstance(doc, dict):
        raise CheckpointError(f"checkpoint must be a msgpack map, got {type(doc).__name__}")
    magic = doc.get("magic")
    if magic != CHECKPOINT_MAGIC:
        raise CheckpointError(
            f"checkpoint magic is {magic!r}, expected {CHECKPOINT_MAGIC!r}; "
            "these bytes are not a harvest sequencer checkpoint"
        )
    version = doc.get("version")
    if version != CHECKPOINT_VERSION:
        raise CheckpointError(
            f"checkpoint version is {version!r}, this build reads version {CHECKPOINT_VERSION}; "
            "use the harvest release that wrote it"
        )
    offsets = doc.get("offsets")
    if not isinstance(offsets, dict):
        raise CheckpointError(f"checkpoint field 'offsets' must be a map, got {offsets!r}")
    producers = doc.get("producers")
    if not isinstance(producers, list):
        raise CheckpointError(f"checkpoint field 'producers' must be a list, got {producers!r}")

    def fields(i: int, item: Any) -> tuple[Any, Any, Any, Any]:
        if not isinstance(item, list) or len(item) != 4:
            raise CheckpointError(f"producers[{i}] must be [journal, producer, last_ack, begin], got {item!r}")
        return item[0], item[1], item[2], item[3]

    return _check_offsets(offsets), _check_states(producers, fields)


def _listed(journals: list[str], limit: int = 8) -> str:
    shown = ", ".join(journals[:limit])
    return shown + (f" and {len(journals) - limit} more" if len(journals) > limit else "")


def check_checkpoint_scope(
    offsets: Mapping[str, int],
    states: Iterable[ProducerState],
    reads: Mapping[str, Collection[int] | None],
    complete: bool,
) -> tuple[list[str], list[str]]:
    """Check that a decoded checkpoint belongs to a reader of ``reads`` (see the module doc).

    ``reads`` maps each topic the reader reads to the partitions it reads, or ``None`` when any
    partition of it may come (a consumer group assigns them); ``complete`` says the partition sets
    are all the topic's partitions (so a checkpoint journal outside them names a partition that does
    not exist). Returns ``(ignored, uncovered)``: the checkpoint's journals this reader does not read,
    and the partitions it reads that the checkpoint has no offset for (they start from the reader's
    default position). An empty checkpoint is anyone's. Raises :class:`CheckpointMismatchError`.
    """
    journals = sorted(set(offsets) | {st.journal for st in states})
    if not journals:
        return [], []
    ours: list[str] = []
    ignored: list[str] = []
    missing: list[str] = []
    for journal in journals:
        topic, _, part = journal.rpartition("/")
        if topic in reads and part.isdigit():
            parts = reads[topic]
            if parts is None or int(part) in parts:
                ours.append(journal)
                continue
            if complete:
                missing.append(journal)
                continue
        ignored.append(journal)
    read_desc = "; ".join(
        f"topic {t!r}" + ("" if p is None else f" partition(s) {', '.join(map(str, sorted(p)))}")
        for t, p in sorted(reads.items())
    )
    if missing:
        raise CheckpointMismatchError(
            f"the checkpoint covers {_listed(missing)}, which this reader's topic does not have (it reads "
            f"{read_desc}): it was taken on another topic of the same name, or the topic was re-created; "
            "pass a checkpoint of this topic, or none to start from the reader's default position"
        )
    if not ours:
        raise CheckpointMismatchError(
            f"the checkpoint covers {_listed(journals)}, none of which this reader reads (it reads {read_desc}): "
            "it was taken by a reader of other topics or partitions; pass that reader's own checkpoint, or none "
            "to start from the reader's default position"
        )
    uncovered = [
        f"{t}/{p}"
        for t, parts in sorted(reads.items())
        if parts is not None
        for p in sorted(parts)
        if f"{t}/{p}" not in offsets
    ]
    return ignored, uncovered
