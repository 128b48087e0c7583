"""sequencer/uuid_layout.py is the one definition of the Gazette v1 UUID layout (issue #32).

* the Cython mirror (``sequencer/_uuid_layout.pxd``) holds the same value for every constant;
* ``pack`` and the ``*_of_int`` readers are inverse, and equal ``identity``'s validated API;
* the ``*_halves`` readers equal the ``*_int`` ones on ints and on numpy uint64 arrays;
* the compiled reader's ``Record`` (which uses the .pxd's inline functions) reads the same clock,
  flags and producer as the Python layout from random 128-bit ints, valid or not.
"""

from __future__ import annotations

import random
import re
import uuid
from pathlib import Path

import numpy as np
from native_impl import native_module

from harvest_outbox.sequencer import build_uuid, clock_of, flags_of, new_producer_id, producer_of
from harvest_outbox.sequencer import uuid_layout as L

PXD = Path(L.__file__).with_name("_uuid_layout.pxd")
_ENUM_ITEM = re.compile(r"^\s+([A-Z][A-Z0-9_]*)\s*=\s*(\S+)\s*$", re.M)


def _pxd_constants() -> dict[str, int]:
    text = PXD.read_text(encoding="utf-8")
    block = text[text.index("cdef enum:") : text.index("cdef inline")]
    return {name: int(value, 0) for name, value in _ENUM_ITEM.findall(block)}


def test_the_cython_mirror_holds_the_python_constants() -> None:
    mirrored = _pxd_constants()
    assert len(mirrored) >= 15, mirrored
    different = {
        name: (value, getattr(L, name, None)) for name, value in mirrored.items() if getattr(L, name, None) != value
    }
    assert not different, f"_uuid_layout.pxd (left) differs from uuid_layout.py (right): {different}"


def _samples(n: int = 3000) -> list[tuple[int, int, int]]:
    rng = random.Random(32)
    edge = [(0, 0, 0), ((1 << 48) - 1, (1 << 64) - 1, 0x3FF), (1 << 40, 1 << 63, 2), (1, 15, 1)]
    return edge + [(rng.getrandbits(48), rng.getrandbits(64), rng.randrange(1024)) for _ in range(n)]


def test_pack_and_the_readers_are_inverse_and_equal_the_identity_api() -> None:
    for producer, clock, flags in _samples():
        x = L.pack(producer, clock, flags)
        assert (L.producer_of_int(x), L.clock_of_int(x), L.flags_of_int(x)) == (producer, clock, flags)
        u = build_uuid(producer.to_bytes(6, "big"), clock, flags)
        assert u.int == x
        assert (producer_of(u), clock_of(u), flags_of(u)) == (producer.to_bytes(6, "big"), clock, flags)
        assert u.version == 1 and u.variant == uuid.RFC_4122


def test_the_relay_rule_is_version_variant_multicast_and_flags() -> None:
    pid = int.from_bytes(new_producer_id(), "big")
    assert L.is_relay_int(L.pack(pid, 99, L.ACK_TXN))
    assert not L.is_relay_int(L.pack(pid, 99, L.MAX_RELAY_FLAGS + 1))  # reserved flags
    assert not L.is_relay_int(L.pack(pid & ~(1 << L.MULTICAST_SHIFT), 99, 0))  # a MAC address
    assert not L.is_relay_int(uuid.uuid4().int)
    assert not L.is_relay_int(0)


def test_the_halves_readers_equal_the_int_readers_on_ints_and_numpy_arrays() -> None:
    rng = random.Random(7)
    xs = [L.pack(p, c, f) for p, c, f in _samples(1000)] + [rng.getrandbits(128) for _ in range(1000)]
    his = np.array([x >> 64 for x in xs], np.uint64)
    los = np.array([x & L.MASK64 for x in xs], np.uint64)
    clocks, flags, relay = L.clock_of_halves(his, los), L.flags_of_lo(los), L.is_relay_halves(his, los)
    assert clocks.dtype == np.uint64 and flags.dtype == np.uint64 and relay.dtype == np.bool_
    for i, x in enumerate(xs):
        hi, lo = x >> 64, x & L.MASK64
        assert L.clock_of_halves(hi, lo) == L.clock_of_int(x) == int(clocks[i])
        assert L.flags_of_lo(lo) == L.flags_of_int(x) == int(flags[i])
        assert bool(L.is_relay_halves(hi, lo)) == L.is_relay_int(x) == bool(relay[i])


def test_the_compiled_record_reads_the_fields_as_the_python_layout() -> None:
    # a missing build fails (skipped only when HARVEST_PURE_PYTHON=1 asks for pure Python), as every
    # native test does
    _native_records = native_module("harvest_outbox.consumer._native")
    rng = random.Random(11)
    xs = [L.pack(p, c, f) for p, c, f in _samples(1000)] + [rng.getrandbits(128) | 1 for _ in range(1000)]
    for x in xs:
        r = _native_records.make_record(None, x)
        assert r.clock == L.clock_of_int(x)
        assert int(r.flags) == L.flags_of_int(x)
        assert r.producer == L.producer_of_int(x).to_bytes(6, "big")
        assert r.is_ack == (L.flags_of_int(x) == L.ACK_TXN)
