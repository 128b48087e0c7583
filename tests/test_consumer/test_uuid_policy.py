"""Records without a usable ``uuid`` header: deliver (default, at-least-once,
warned, rate-limited), drop, or raise; none of them crash the reader."""

from __future__ import annotations

import logging
import uuid

import pytest
from cons_testlib import Rec, drain, kafka_config, produce

from harvest_outbox.consumer import MissingUUIDError, ReadCommittedIter, UUIDPolicy
from harvest_outbox.consumer.uuid_header import RateLimitedLog, describe_problem, parse_header_value
from harvest_outbox.sequencer import Flags, build_uuid, new_producer_id, parse_uuid

pytestmark = pytest.mark.integration

BAD_HEADERS = {
    "missing": None,
    "short": b"\x01\x02\x03",
    "text-form": str(uuid.uuid1()).encode(),
    "version4": uuid.uuid4().bytes,
    "nil": bytes(16),
    "ncs-variant": bytes.fromhex("000000a0000010000000010203040506"),
}
# Well-formed version-1 UUIDs no relay writes (sequencer.parse_uuid accepts them): an application's
# uuid.uuid1() (a MAC address as node: multicast bit clear), here with the clock sequences that make
# them look like an ACK (flags 2: would vanish as an ACK) and a CONTINUE (flags 1: would wait forever
# for an ACK); and a multicast ProducerID with reserved flags.
FOREIGN_HEADERS = {
    "uuid1-mac-ack-flags": uuid.uuid1(node=0x0242AC110002, clock_seq=2).bytes,
    "uuid1-mac-continue-flags": uuid.uuid1(node=0x0242AC110003, clock_seq=1).bytes,
    "reserved-flags": build_uuid(bytes.fromhex("0102030405ff"), 160, 3).bytes,
}
BAD_HEADERS.update(FOREIGN_HEADERS)


@pytest.mark.parametrize("bad", sorted(BAD_HEADERS))
def test_parse_matches_sequencer_parse_uuid(bad: str) -> None:
    raw = BAD_HEADERS[bad]
    assert parse_header_value(raw) is None
    if bad in FOREIGN_HEADERS:
        assert parse_uuid(raw).bytes == raw  # well formed: refused only because no relay writes it
        assert "not read as a message identity" in describe_problem([("uuid", raw)])
    elif raw is not None and len(raw) == 16 and raw != bytes(16):
        with pytest.raises(ValueError):
            parse_uuid(raw)
    good = build_uuid(new_producer_id(), 12345 << 4, Flags.CONTINUE_TXN)
    assert parse_header_value(good.bytes) == good == parse_uuid(good.bytes)
    assert parse_header_value(bytearray(good.bytes)) is None or True  # never raises on any type
    assert parse_header_value(None) is None and parse_header_value("x" * 16) is None


@pytest.mark.parametrize("policy", ["deliver", "drop", "raise"])
def test_unsequenced_records_policy(kafka_bootstrap: str, topic_factory, policy: str, caplog) -> None:
    topic = topic_factory()
    p = new_producer_id()
    recs = [Rec(0, build_uuid(p, 160, Flags.OUTSIDE_TXN), b"ok-0")]
    for name in sorted(BAD_HEADERS):
        recs.append(Rec(0, BAD_HEADERS[name], name.encode()))
    recs += [
        Rec(0, build_uuid(p, 320, Flags.CONTINUE_TXN), b"ok-1"),
        Rec(0, None, b"plain-inside-span"),  # an unsequenced record does not disturb the open span
        Rec(0, build_uuid(p, 480, Flags.ACK_TXN), b"ack"),
    ]
    produce(kafka_bootstrap, topic, recs)
    bad_values = [n.encode() for n in sorted(BAD_HEADERS)]
    caplog.set_level(logging.WARNING, logger="harvest_outbox.consumer")
    with ReadCommittedIter(kafka_config(kafka_bootstrap), topics=[topic], uuid_policy=policy) as it:
        if policy == "raise":
            got, errors = [], []
            while True:
                try:
                    r = it.poll(1.0)
                except MissingUUIDError as exc:
                    errors.append(str(exc))
                    continue
                if r is None:
                    break
                got.append(r.value)
            assert got == [b"ok-0", b"ok-1"]
            assert len(errors) == len(BAD_HEADERS) + 1
            assert any("no 'uuid' header" in e for e in errors)
            assert any("exactly 16 bytes" in e for e in errors)
            assert any("multicast bit clear" in e for e in errors) and any("reserved flags 0x3" in e for e in errors)
            return
        got_recs = drain(it, idle=1.0)
    got = [r.value for r in got_recs]
    if policy == "deliver":
        assert got == [b"ok-0", *bad_values, b"plain-inside-span", b"ok-1"]
        for r in got_recs[1:-2]:
            assert r.uuid is None and r.producer is None and r.clock == 0 and r.flags == Flags.OUTSIDE_TXN
    else:
        assert got == [b"ok-0", b"ok-1"]
    warnings = [
        r for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("harvest_outbox.consumer")
    ]
    # Rate-limited: one warning per partition per interval, not one per record.
    assert 1 <= len(warnings) <= 2
    assert "uuid" in warnings[0].getMessage()


def test_rate_limited_log_counts_suppressed(caplog) -> None:
    log = logging.getLogger("harvest_outbox.consumer.test")
    rl = RateLimitedLog(log, interval=0.0)
    caplog.set_level(logging.WARNING, logger="harvest_outbox.consumer.test")
    rl.warning("k", "hello %s", "a")
    rl.warning("k", "hello %s", "b")
    assert [r.getMessage() for r in caplog.records] == ["hello a", "hello b"]
    rl2 = RateLimitedLog(log, interval=3600)
    caplog.clear()
    for i in range(100):
        rl2.warning("k", "x %d", i)
    assert [r.getMessage() for r in caplog.records] == ["x 0"]
    assert UUIDPolicy("drop") is UUIDPolicy.DROP
