"""The Gazette v1 message UUID, bit by bit: the one definition of its layout (docs/design.md §2).

A message UUID is an RFC 4122 version-1 UUID; as its 128-bit int (big-endian, bit 127 first):

====================  ======  ==============================================================
bits                  width   field
====================  ======  ==============================================================
96-127                32      time_low: clock bits 4-35
80-95                 16      time_mid: clock bits 36-51
76-79                 4       version: 1
64-75                 12      time_hi: clock bits 52-63
62-63                 2       variant: 0b10 (RFC 4122)
58-61                 4       counter: clock bits 0-3
48-57                 10      flags (``OUTSIDE_TXN`` 0, ``CONTINUE_TXN`` 1, ``ACK_TXN`` 2)
0-47                  48      ProducerID (the v1 "node"); bit 40 is its multicast bit
====================  ======  ==============================================================

The clock is Gazette's: a 60-bit timestamp (100 ns ticks since 1582) shifted left 4, plus a
4-bit counter. The compiled paths work on the int's two 64-bit halves, ``hi = x >> 64`` and
``lo = x & MASK64``: every field but the time fields lies in ``lo``, at the same bit positions.

Every path that packs or reads these bits uses this module: :mod:`.identity` (the validated
API), the pure-Python Sequencer and readers, the Spark reader's numpy columns (the ``*_halves``
functions take uint64 arrays as well as ints), and the Cython modules through
``_uuid_layout.pxd``, which mirrors these constants (``tests/test_sequencer/test_uuid_layout.py``
checks each equal, and that every implementation reads the same fields from random UUIDs).
Hot loops (the Sequencer's ``queue_batch``) spell the shifts with these names rather than call a
function per message.

Invariants (``test_uuid_layout.py``): ``pack`` then ``clock_of_int`` / ``flags_of_int`` /
``producer_of_int`` returns the inputs for every 64-bit clock, flags < 1024 and 48-bit producer;
the ``*_halves`` functions equal the ``*_int`` ones on ``(x >> 64, x & MASK64)``. Nothing here
validates: :func:`.identity.build_uuid` and :func:`.identity.parse_uuid` do.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ACK_TXN",
    "CLOCK_LIMIT",
    "CONTINUE_TXN",
    "COUNTER_MASK",
    "COUNTER_SHIFT",
    "FLAGS_MASK",
    "FLAGS_SHIFT",
    "HI_VERSION_SHIFT",
    "MASK64",
    "MAX_RELAY_FLAGS",
    "MULTICAST_SHIFT",
    "OUTSIDE_TXN",
    "PRODUCER_BITS",
    "PRODUCER_MASK",
    "RELAY_UUID_BITS",
    "RELAY_UUID_MASK",
    "TIME_HI_MASK",
    "TIME_HI_SHIFT",
    "TIME_LOW_MASK",
    "TIME_LOW_SHIFT",
    "TIME_MID_MASK",
    "TIME_MID_SHIFT",
    "VARIANT_RFC4122",
    "VARIANT_SHIFT",
    "VERSION_1",
    "VERSION_SHIFT",
    "clock_of_halves",
    "clock_of_int",
    "flags_of_int",
    "flags_of_lo",
    "is_relay_halves",
    "is_relay_int",
    "pack",
    "producer_of_int",
]

# -- flags (bits 48-57) --------------------------------------------------------------------
#: Not part of a transaction: commits as soon as it is read.
OUTSIDE_TXN = 0
#: Opens or continues a transaction; commits only with a later ACK_TXN.
CONTINUE_TXN = 1
#: Commits the producer's CONTINUE_TXN messages with clock <= its own, rolls back the rest.
ACK_TXN = 2
#: Flags above this are reserved: no relay (nor Gazette) writes them.
MAX_RELAY_FLAGS = ACK_TXN
FLAGS_SHIFT = 48
FLAGS_MASK = 0x3FF

# -- the ProducerID (bits 0-47) -------------------------------------------------------------
PRODUCER_BITS = 48
PRODUCER_MASK = (1 << PRODUCER_BITS) - 1
#: The ProducerID's multicast bit (its first byte's low bit): set in every relay's ProducerID.
MULTICAST_SHIFT = 40

# -- the clock's fields: (int bit position, mask); the clock bit each starts at is in clock_of_int
TIME_LOW_SHIFT, TIME_LOW_MASK = 96, 0xFFFFFFFF  # clock bits 4-35
TIME_MID_SHIFT, TIME_MID_MASK = 80, 0xFFFF  # clock bits 36-51
TIME_HI_SHIFT, TIME_HI_MASK = 64, 0x0FFF  # clock bits 52-63
COUNTER_SHIFT, COUNTER_MASK = 58, 0xF  # clock bits 0-3
#: Clocks are unsigned 64-bit.
CLOCK_LIMIT = 1 << 64

# -- version and variant ---------------------------------------------------------------------
VERSION_SHIFT, VERSION_1 = 76, 1
#: The version nibble's position in the high half (``hi = x >> 64``).
HI_VERSION_SHIFT = VERSION_SHIFT - 64
VARIANT_SHIFT, VARIANT_RFC4122 = 62, 0b10

#: The low/high 64-bit half of the int.
MASK64 = (1 << 64) - 1

#: The bits a relay's UUID fixes: version 1, the RFC 4122 variant, the multicast ProducerID;
#: ``x & RELAY_UUID_MASK == RELAY_UUID_BITS`` (and flags <= MAX_RELAY_FLAGS: :func:`is_relay_int`).
RELAY_UUID_MASK = (0xF << VERSION_SHIFT) | (0x3 << VARIANT_SHIFT) | (1 << MULTICAST_SHIFT)
RELAY_UUID_BITS = (VERSION_1 << VERSION_SHIFT) | (VARIANT_RFC4122 << VARIANT_SHIFT) | (1 << MULTICAST_SHIFT)


def pack(producer: int, clock: int, flags: int) -> int:
    """The 128-bit int of the UUID of ``producer`` (48-bit int) at ``clock`` with ``flags``;
    unchecked (out-of-range inputs spill into other fields: :func:`.identity.build_uuid` checks)."""
    return (
        ((clock >> 4) & TIME_LOW_MASK) << TIME_LOW_SHIFT
        | ((clock >> 36) & TIME_MID_MASK) << TIME_MID_SHIFT
        | ((clock >> 52) & TIME_HI_MASK | VERSION_1 << HI_VERSION_SHIFT) << TIME_HI_SHIFT
        | VARIANT_RFC4122 << VARIANT_SHIFT
        | (clock & COUNTER_MASK) << COUNTER_SHIFT
        | flags << FLAGS_SHIFT
        | producer
    )


def clock_of_int(x: int) -> int:
    """The clock of the UUID int ``x`` (the version nibble is not part of it)."""
    return (
        (x >> TIME_LOW_SHIFT) << 4
        | ((x >> TIME_MID_SHIFT) & TIME_MID_MASK) << 36
        | ((x >> TIME_HI_SHIFT) & TIME_HI_MASK) << 52
        | (x >> COUNTER_SHIFT) & COUNTER_MASK
    )


def flags_of_int(x: int) -> int:
    """The 10 flag bits of the UUID int ``x``."""
    return (x >> FLAGS_SHIFT) & FLAGS_MASK


def producer_of_int(x: int) -> int:
    """The ProducerID of the UUID int ``x``, as a 48-bit int."""
    return x & PRODUCER_MASK


def is_relay_int(x: int) -> bool:
    """True if ``x`` is a UUID a harvest relay (or Gazette) can have written: version 1, RFC 4122
    variant, multicast ProducerID, flags 0-2 (``consumer.uuid_header`` says why each)."""
    return x & RELAY_UUID_MASK == RELAY_UUID_BITS and (x >> FLAGS_SHIFT) & FLAGS_MASK <= MAX_RELAY_FLAGS


# The halves: ``hi``/``lo`` are ints or numpy uint64 arrays (element-wise; shifts by Python ints
# keep the uint64 dtype). Every field but the clock's time fields lies in ``lo``.


def clock_of_halves(hi: Any, lo: Any) -> Any:
    """:func:`clock_of_int` of ``hi << 64 | lo``."""
    return (
        ((hi >> (TIME_LOW_SHIFT - 64)) << 4)
        | (((hi >> (TIME_MID_SHIFT - 64)) & TIME_MID_MASK) << 36)
        | ((hi & TIME_HI_MASK) << 52)
        | ((lo >> COUNTER_SHIFT) & COUNTER_MASK)
    )


def flags_of_lo(lo: Any) -> Any:
    """:func:`flags_of_int` of ``hi << 64 | lo`` (the flags lie in ``lo``)."""
    return (lo >> FLAGS_SHIFT) & FLAGS_MASK


def is_relay_halves(hi: Any, lo: Any) -> Any:
    """:func:`is_relay_int` of ``hi << 64 | lo`` (for arrays: a boolean array)."""
    return (
        (((hi >> HI_VERSION_SHIFT) & 0xF) == VERSION_1)
        & ((lo >> VARIANT_SHIFT) == VARIANT_RFC4122)
        & (((lo >> MULTICAST_SHIFT) & 1) == 1)
        & (((lo >> FLAGS_SHIFT) & FLAGS_MASK) <= MAX_RELAY_FLAGS)
    )
