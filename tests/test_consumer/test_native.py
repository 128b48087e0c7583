"""consumer/_native.pyx is the pure-Python reader path, observably (no services needed).

The compiled ``convert`` must turn confluent-kafka messages into exactly the entries
``ReadUncommittedIter._convert_entries_py`` (the reference) makes, and leave exactly the same
records to the UUID policy: a parametrized table of header shapes (valid CONTINUE/ACK UUIDs, nil,
wrong version or variant, wrong length, non-bytes values, missing or repeated headers) and Kafka
errors, under every policy, compares the two paths record by record.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest

import harvest_outbox.consumer.uncommitted as unc
from harvest_outbox.consumer.errors import MissingUUIDError
from harvest_outbox.consumer.uuid_header import RateLimitedLog, UUIDPolicy
from harvest_outbox.sequencer import Flags, build_uuid, new_producer_id
from harvest_outbox.sequencer.native import pure_python_forced

pytestmark = pytest.mark.skipif(pure_python_forced(), reason="HARVEST_PURE_PYTHON=1: no native converter under test")

PID = new_producer_id()
V1 = build_uuid(PID, 16 * 5000 + 3, Flags.CONTINUE_TXN).bytes
ACK = build_uuid(PID, 16 * 5001, Flags.ACK_TXN).bytes
WRONG_VERSION = bytes([V1[0], V1[1], V1[2], V1[3], V1[4], V1[5], (V1[6] & 0x0F) | 0x40, *V1[7:]])
WRONG_VARIANT = bytes([*V1[:8], (V1[8] & 0x3F) | 0xC0, *V1[9:]])
# What an application's uuid.uuid1() looks like: a MAC address as node (multicast bit clear).
MAC_UUID1 = uuid.uuid1(node=0x0242AC110002, clock_seq=2).bytes
UNICAST_PRODUCER = build_uuid(bytes([PID[0] & 0xFE, *PID[1:]]), 16 * 5002, Flags.ACK_TXN).bytes
RESERVED_FLAGS = build_uuid(PID, 16 * 5003, 3).bytes
ALL_FLAGS = build_uuid(PID, 16 * 5004, 0x3FF).bytes


class FakeError:
    def code(self) -> int:
        return -191  # _PARTITION_EOF: logged, not raised

    def fatal(self) -> bool:
        return False

    def retriable(self) -> bool:
        return True

    def str(self) -> str:
        return "fake partition EOF"


class Msg:
    def __init__(self, offset: int, headers: Any, partition: int = 0, topic: str = "t", error: Any = None) -> None:
        self._o, self._h, self._p, self._t, self._e = offset, headers, partition, topic, error

    def error(self) -> Any:
        return self._e

    def headers(self) -> Any:
        return self._h

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o


HEADER_CASES = {
    "continue": [("uuid", V1)],
    "ack": [("uuid", ACK)],
    "uuid-second": [("trace", b"abc"), ("uuid", V1)],
    "first-uuid-wins": [("uuid", b"short"), ("uuid", V1)],
    "nil": [("uuid", bytes(16))],
    "wrong-version": [("uuid", WRONG_VERSION)],
    "wrong-variant": [("uuid", WRONG_VARIANT)],
    "mac-uuid1": [("uuid", MAC_UUID1)],
    "unicast-producer": [("uuid", UNICAST_PRODUCER)],
    "reserved-flags": [("uuid", RESERVED_FLAGS)],
    "all-flags": [("uuid", ALL_FLAGS)],
    "15-bytes": [("uuid", V1[:15])],
    "17-bytes": [("uuid", V1 + b"\x00")],
    "no-value": [("uuid", None)],
    "str-value": [("uuid", "not bytes")],
    "bytearray-value": [("uuid", bytearray(V1))],
    "other-headers-only": [("trace", V1)],
    "empty-list": [],
    "no-headers": None,
}


def bare_reader(policy: UUIDPolicy) -> unc.ReadUncommittedIter:
    """A reader with only the state the converters use (no Kafka client)."""
    r = object.__new__(unc.ReadUncommittedIter)
    r._journals = {}
    r._policy = policy
    r._pending_error = None
    r._pending_raw = []
    r._warn = RateLimitedLog(logging.getLogger("test"), interval=0.0)
    return r


def log_of(case_names: list[str]) -> list[Msg]:
    out = []
    for i, name in enumerate(case_names):
        if name == "error":
            out.append(Msg(i, None, error=FakeError()))
        else:
            out.append(Msg(i, HEADER_CASES[name], partition=i % 2))
    return out


def as_rows(entries: Any) -> list[tuple]:
    return [(j, b, e, x, item.kafka_message, item._x) for j, b, e, x, item in (entries[i] for i in range(len(entries)))]


@pytest.mark.parametrize("policy", list(UUIDPolicy))
@pytest.mark.parametrize("case", [*HEADER_CASES, "error"])
def test_native_convert_equals_reference(policy: UUIDPolicy, case: str) -> None:
    assert unc._native_convert is not None, "consumer._native is not built: run ./dev setup"
    names = ["continue", case, "ack", case, "continue"]
    raw = log_of(names)
    results = []
    for path in ("native", "py"):
        r = bare_reader(policy)
        conv = r._convert_entries if path == "native" else r._convert_entries_py
        out = conv(raw)
        results.append((as_rows(out), type(r._pending_error), [m._o for m in r._pending_raw]))
    assert results[0] == results[1]
    if policy is UUIDPolicy.RAISE and case not in ("continue", "ack", "uuid-second", "error"):
        assert results[0][1] is MissingUUIDError


def test_native_convert_yields_an_entry_batch_of_native_records() -> None:
    import harvest_outbox.consumer._native as nat

    r = bare_reader(UUIDPolicy.DELIVER)
    out = r._convert_entries(log_of(["continue", "ack"]))
    assert type(out).__name__ == "EntryBatch" and len(out) == 2
    j, b, e, x, rec = out[1]
    assert (j, b, e, x) == ("t/1", 1, 2, int.from_bytes(ACK, "big"))
    assert type(rec) is nat.Record and rec.is_ack and rec.clock == 16 * 5001 and rec.producer == PID
