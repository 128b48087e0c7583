"""Message identity: UUID layout vectors, round trips, stdlib view, Clock
(port of Gazette's ``message/uuid_test.go`` plus byte-for-byte vectors)."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harvest_outbox.sequencer import (
    NIL_UUID,
    TICK,
    Clock,
    Flags,
    build_uuid,
    clock_of,
    flags_of,
    new_producer_id,
    parse_uuid,
    producer_of,
)
from harvest_outbox.sequencer.clock import G1582_NS100

# (producer hex, clock, flags, UUID hex). Produced by running Gazette's own
# message/uuid.go (gazette/core at e54beb5c6e6452a94fe0c0bbe21a1695fa9fddd6)
# BuildUUID for these inputs; the second row is TestUUIDBuilding's fixture:
# NewClock(time.Unix(1567304621, 981273734)) plus two Ticks, flags 682.
GAZETTE_VECTORS = [
    ("010203040506", 160, 0, "0000000a000010008000010203040506"),
    ("010203040506", 2205855587517004112, 682, "83fc2f95cc5f11e982aa010203040506"),
    ("ffffffffffff", 2**64 - 1, 0x3FF, "ffffffffffff1fffbfffffffffffffff"),
    ("010000000000", 15, 1, "0000000000001000bc01010000000000"),
    ("a1b2c3d4e5f6", 0xABCDEF0123456789, 2, "12345678def01abca402a1b2c3d4e5f6"),
    ("0b0c0d0e0f10", 2227086848019753072, 1, "04c29687833b11ee80010b0c0d0e0f10"),
    ("000000000000", 0, 0, "00000000000010008000000000000000"),
]


def test_issue_vector() -> None:
    u = build_uuid(bytes([1, 2, 3, 4, 5, 6]), 160, Flags.OUTSIDE_TXN)
    assert u == uuid.UUID("0000000a-0000-1000-8000-010203040506")


@pytest.mark.parametrize(("producer", "clock", "flags", "expect"), GAZETTE_VECTORS)
def test_gazette_vectors(producer: str, clock: int, flags: int, expect: str) -> None:
    u = build_uuid(bytes.fromhex(producer), clock, flags)
    assert u.bytes == bytes.fromhex(expect)
    # And back: a UUID built by Gazette parses to the same fields.
    g = parse_uuid(bytes.fromhex(expect))
    assert (producer_of(g), clock_of(g), flags_of(g)) == (bytes.fromhex(producer), clock, flags)


def test_gazette_uuid_building() -> None:
    # Port of TestUUIDBuilding.
    producer = new_producer_id()
    clock = Clock()
    clock.update(1567304621 * 10**9 + 981273734)
    clock.tick()
    clock.tick()
    u = build_uuid(producer, clock.value, 682)  # 0b1010101010
    assert clock_of(u) == clock.value
    assert producer_of(u) == producer
    assert flags_of(u) == 682
    # Compatibility with the stdlib uuid module.
    assert u.version == 1
    assert u.variant == uuid.RFC_4122
    assert u.node == int.from_bytes(producer, "big")
    assert u.time == clock.value >> 4
    # Its time point: nanos rounded to 100 ns plus 2 µs from the two ticks.
    assert (u.time - G1582_NS100) * 100 == 1567304621 * 10**9 + 981275700


@given(
    producer=st.binary(min_size=6, max_size=6),
    clock=st.integers(0, 2**64 - 1),
    flags=st.integers(0, 0x3FF),
)
def test_round_trip_and_stdlib_view(producer: bytes, clock: int, flags: int) -> None:
    u = build_uuid(producer, clock, flags)
    assert (producer_of(u), clock_of(u), flags_of(u)) == (producer, clock, flags)
    assert u.version == 1
    assert u.variant == uuid.RFC_4122
    assert u.time == clock >> 4
    assert u.node == int.from_bytes(producer, "big")
    assert u.clock_seq & 0x3FF == flags
    assert parse_uuid(u.bytes) == u


def test_producer_uniqueness() -> None:
    # Port of TestUUIDProducerUniqueness, plus the multicast bit.
    ids = {new_producer_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(len(p) == 6 and p[0] & 1 for p in ids)


def test_flags_values() -> None:
    assert [int(f) for f in (Flags.OUTSIDE_TXN, Flags.CONTINUE_TXN, Flags.ACK_TXN)] == [0, 1, 2]


def test_nil_uuid_parses() -> None:
    assert parse_uuid(bytes(16)) is NIL_UUID
    assert clock_of(NIL_UUID) == 0


def test_clock_cases() -> None:
    # Port of TestUUIDClock.
    clock = Clock()
    # Each tick adds 1 µs (160 units) and returns the new value.
    assert clock.tick() == 160
    assert clock.tick() == 320
    assert TICK == 160

    clock.update(12 * 10**9 + 300)
    # Precise to 100 ns.
    assert clock == Clock.from_unix_ns(12 * 10**9 + 399)
    assert clock.as_unix_ns() == 12 * 10**9 + 300
    assert clock < Clock.from_unix_ns(12 * 10**9 + 400)
    assert clock > Clock.from_unix_ns(12 * 10**9 + 299)
    assert clock.value == 1955086849920000048  # as Gazette computes it

    # After a tick the clock is 1 µs later.
    clock.tick()
    assert clock.as_unix_ns() == 12 * 10**9 + 1300
    assert clock > Clock.from_unix_ns(12 * 10**9 + 1299)
    assert clock < Clock.from_unix_ns(12 * 10**9 + 1400)

    # update never decreases the clock.
    clock.update(11 * 10**9 + 100)
    assert clock.as_unix_ns() == 12 * 10**9 + 1300

    # Sequence bits reset when the timestamp moves forward.
    clock.update(12 * 10**9 + 5000)
    assert clock == Clock.from_unix_ns(12 * 10**9 + 5000)
    assert clock.as_unix_ns() == 12 * 10**9 + 5000
    assert clock.value == 1955086849920000800


def test_clock_counter_survives_ticks_and_is_reset_by_update() -> None:
    clock = Clock(Clock.from_unix_ns(10**9).value | 0x7)
    clock.tick()
    assert clock.value & 0xF == 0x7  # a tick moves the timestamp, not the counter
    clock.update(2 * 10**9)
    assert clock.value & 0xF == 0


@given(st.lists(st.one_of(st.just(None), st.integers(0, 2**62)), max_size=50))
def test_clock_is_monotonic(ops: list[int | None]) -> None:
    clock = Clock()
    for op in ops:
        before = clock.value
        if op is None:
            assert clock.tick() == before + TICK
        else:
            clock.update(op)
            assert clock.value >= before
