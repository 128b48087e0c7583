"""Gazette-compatible message identity: producer ids, flags and v1 UUIDs.

Byte layout of a message UUID (RFC 4122 version 1, big-endian; bit by bit, with the constants
and pack/unpack functions every path uses, in :mod:`.uuid_layout`):

* bytes 0-7: the 60-bit timestamp ``clock >> 4`` as time_low (32 bits),
  time_mid (16 bits) and time_hi (12 bits) with the version nibble ``1``;
* bytes 8-9: the variant bits ``10``, the 4-bit counter ``clock & 0xF``, then
  10 bits of flags;
* bytes 10-15: the 6-byte producer id (the v1 "node"), multicast bit set.

Invariants (each is exercised by ``tests/test_sequencer/test_identity.py``):

* ``build_uuid`` then ``producer_of`` / ``clock_of`` / ``flags_of`` returns the
  inputs unchanged for every producer, every 64-bit clock and flags < 1024.
* The result equals Gazette's ``BuildUUID`` byte for byte; the stdlib sees
  version 1, the RFC 4122 variant, ``.time == clock >> 4`` and
  ``.node == producer``.
* ``new_producer_id()`` is 6 random bytes with ``b[0] & 1 == 1``.
* ``parse_uuid`` accepts exactly 16 bytes that are either the nil UUID or a
  version-1 RFC 4122 UUID, and raises :class:`UUIDError` otherwise.

The accessors only extract bits, as Gazette's do; validation of untrusted
bytes (a Kafka header) is ``parse_uuid``'s job.
"""

from __future__ import annotations

import os
import uuid
from enum import IntEnum

from . import uuid_layout as _layout
from .errors import UUIDError
from .uuid_layout import FLAGS_MASK

__all__ = [
    "FLAGS_MASK",
    "NIL_UUID",
    "Flags",
    "build_uuid",
    "clock_of",
    "flags_of",
    "new_producer_id",
    "parse_uuid",
    "producer_of",
]


#: The all-zero UUID. Gazette treats a zero clock as "not sequenced": such a
#: message commits at once and its producer is not tracked.
NIL_UUID = uuid.UUID(int=0)


class Flags(IntEnum):
    """Transaction semantics of a message, compared by exact value."""

    #: Not part of a transaction: commits as soon as it is read.
    OUTSIDE_TXN = _layout.OUTSIDE_TXN
    #: Opens or continues a transaction; commits only with a later ACK_TXN.
    CONTINUE_TXN = _layout.CONTINUE_TXN
    #: Commits the producer's CONTINUE_TXN messages having clock <= its own,
    #: and rolls back the rest.
    ACK_TXN = _layout.ACK_TXN


def new_producer_id() -> bytes:
    """A random 6-byte producer id with the multicast bit set.

    The multicast bit marks the v1 "node" as not being a real MAC address
    (RFC 4122 section 4.5). 47 random bits make collisions very unlikely for
    ids that live as long as a process.
    """
    b = bytearray(os.urandom(6))
    b[0] |= 0x01  # bit 40 of the UUID int: uuid_layout.MULTICAST_SHIFT
    return bytes(b)


def build_uuid(producer: bytes, clock: int, flags: int) -> uuid.UUID:
    """The v1 UUID of a message from ``producer`` at ``clock`` with ``flags``."""
    if not isinstance(producer, (bytes, bytearray, memoryview)) or len(producer) != 6:
        raise UUIDError(f"producer must be 6 bytes, got {producer!r}; use new_producer_id()")
    if not isinstance(clock, int) or not 0 <= clock < _layout.CLOCK_LIMIT:
        raise UUIDError(f"clock must be an int in [0, 2**64), got {clock!r}; use Clock.tick()")
    if not isinstance(flags, int) or not 0 <= flags <= FLAGS_MASK:
        raise UUIDError(f"flags must be an int in [0, {FLAGS_MASK:#x}] (10 bits), got {flags!r}; use a Flags value")
    return uuid.UUID(int=_layout.pack(int.from_bytes(producer, "big"), clock, flags))


def producer_of(u: uuid.UUID) -> bytes:
    """The 6-byte producer id (v1 node) of a message UUID."""
    return _layout.producer_of_int(u.int).to_bytes(6, "big")


def clock_of(u: uuid.UUID) -> int:
    """The clock (60-bit timestamp and 4-bit counter) of a message UUID."""
    return _layout.clock_of_int(u.int)


def flags_of(u: uuid.UUID) -> int:
    """The 10 flag bits of a message UUID (may be a value Flags does not name)."""
    return _layout.flags_of_int(u.int)


def parse_uuid(raw: bytes | bytearray | memoryview) -> uuid.UUID:
    """Validate untrusted UUID bytes (e.g. a record header) and return the UUID.

    Accepts the 16-byte nil UUID (an unsequenced message) or a version-1
    RFC 4122 UUID. Raises :class:`UUIDError` naming the bad field otherwise.
    """
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise UUIDError(f"uuid header must be bytes, got {type(raw).__name__}; pass the raw 16-byte header value")
    if len(raw) != 16:
        raise UUIDError(
            f"uuid header must be exactly 16 bytes, got {len(raw)}; "
            "the header must hold the raw UUID bytes, not its text form"
        )
    u = uuid.UUID(bytes=bytes(raw))
    if u.int == 0:
        return NIL_UUID
    if u.variant != uuid.RFC_4122:
        raise UUIDError(
            f"uuid {u} has variant {u.variant!r}, expected RFC 4122 (byte 8 = 0b10xxxxxx); "
            "only UUIDs built by build_uuid() or Gazette can be sequenced"
        )
    if u.version != 1:
        raise UUIDError(
            f"uuid {u} has version {u.version}, expected 1; "
            "only UUIDs built by build_uuid() or Gazette can be sequenced"
        )
    return u
