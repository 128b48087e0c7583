"""A leader view of the ``--uuid-sequencing`` relay: fence epoch, leader id, clock and producer ring
(docs/design.md §5, steps 1 and 5), and the UUIDs its records and ACKs carry.

Invariants:
- a view's clock starts at the fence row's ``last_clock`` (raised to each committed ACK clock by the
  fenced commit) or the wall clock, whichever is later, and only rises: clocks rise in publish order,
  across views and leaders, even when a leader's wall clock is behind or steps back;
- a view has ``producerRing`` (M) fresh ProducerIDs; transaction *k* uses ``ring[k mod M]`` and
  opens only once ACK *k-M* was enqueued (the mode's ``_open``), so M = 1 is stop-and-wait;
- ``last_ack`` holds, per (producer, topic, partition), the clock of the last ACK this view enqueued
  there: a rollback ACK at that clock is a clean ACK_ROLLBACK for readers.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable

from harvest_outbox.sequencer import Clock, Flags, new_producer_id
from harvest_outbox.sequencer import uuid_layout as layout

CONTINUE = int(Flags.CONTINUE_TXN)
ACK = int(Flags.ACK_TXN)

_UUID_HEAD = struct.Struct(">IHHH").pack
# The UUID's third and fourth 16-bit words, as sequencer.uuid_layout places them (the fourth word is
# the int's bits 48-63: variant, clock counter, flags): precomputed for the per-record path.
_TIME_HI_VERSION = layout.VERSION_1 << layout.HI_VERSION_SHIFT
_WORD4_COUNTER_SHIFT = layout.COUNTER_SHIFT - layout.FLAGS_SHIFT
_WORD4_CONTINUE = layout.VARIANT_RFC4122 << (layout.VARIANT_SHIFT - layout.FLAGS_SHIFT) | CONTINUE
_TIME_LOW_MASK, _TIME_MID_MASK, _TIME_HI_MASK, _COUNTER_MASK = (
    layout.TIME_LOW_MASK,
    layout.TIME_MID_MASK,
    layout.TIME_HI_MASK,
    layout.COUNTER_MASK,
)


def continue_uuid(producer: bytes, clock: int, _pack: Callable[..., bytes] = _UUID_HEAD) -> bytes:
    """``uuid_bytes(int.from_bytes(producer, "big"), clock, CONTINUE_TXN)`` for the per-record path:
    time_low, time_mid, time_hi|version, variant|counter|flags packed by one C call, then the
    6-byte ProducerID (a quarter less work than the 128-bit integer arithmetic). The clock's fields
    start at its bits 4 (time_low), 36 (time_mid) and 52 (time_hi); bits 0-3 are the counter
    (``sequencer.uuid_layout.pack``, which a test checks this equals)."""
    return (
        _pack(
            (clock >> 4) & _TIME_LOW_MASK,
            (clock >> 36) & _TIME_MID_MASK,
            ((clock >> 52) & _TIME_HI_MASK) | _TIME_HI_VERSION,
            ((clock & _COUNTER_MASK) << _WORD4_COUNTER_SHIFT) | _WORD4_CONTINUE,
        )
        + producer
    )


def uuid_bytes(producer: int, clock: int, flags: int) -> bytes:
    """``build_uuid(producer, clock, flags).bytes`` without validation (hot path; ``producer`` as int)."""
    return layout.pack(producer, clock, flags).to_bytes(16, "big")


class View:
    """One leader view: fence epoch, leader id, clock and producer ring."""

    __slots__ = ("clock", "epoch", "failed", "k", "last_ack", "leader_id", "max_ok", "ring")

    def __init__(self, leader_id: uuid.UUID, epoch: int, ring_size: int, now_ns: int, floor: int = 0) -> None:
        self.leader_id = leader_id
        self.epoch = epoch
        # Never below the largest ACK clock committed by any earlier view (the state row's
        # last_clock): a leader whose wall clock is behind (stepped back, or a standby with a slow
        # clock) still stamps clocks above everything readers have seen committed.
        self.clock = Clock(floor)
        self.clock.update(now_ns)
        self.ring = [new_producer_id() for _ in range(ring_size)]
        self.k = 0  # transactions opened
        # Largest clock of an acknowledged record of this view: a failed record with a smaller clock
        # waited while the broker acknowledged records sent after it (poison, not an outage).
        self.max_ok = 0
        self.failed = False  # set by the DB worker when a commit of this view failed
        self.last_ack: dict[tuple[bytes, str, int], int] = {}  # (producer, topic, partition) -> ACK clock
