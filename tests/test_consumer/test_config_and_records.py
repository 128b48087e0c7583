"""Config validation, secret redaction, errors and Record semantics (no services needed)."""

from __future__ import annotations

import logging
import pickle

import pytest

from harvest_outbox.consumer import ConfigError, ConsumerError, ReadCommittedIter, ReadUncommittedIter
from harvest_outbox.consumer.config import REDACTED, ReaderConfig, redact
from harvest_outbox.sequencer import Flags, build_uuid, new_producer_id

BOOT = {"bootstrap.servers": "127.0.0.1:1"}


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"enable.auto.commit": True}, "'enable.auto.commit' must be false"),
        ({"enable.auto.commit": "true"}, "'enable.auto.commit' must be false"),
        ({"enable.auto.offset.store": True}, "'enable.auto.offset.store' must be false"),
        ({"isolation.level": "read_committed"}, "'isolation.level' must be 'read_uncommitted'"),
        ({"auto.offset.reset": "sometimes"}, "'auto.offset.reset' must be one of"),
        ({"enable.auto.commit": "maybe"}, "'enable.auto.commit' must be true or false"),
    ],
)
def test_config_errors_name_the_key(extra, match) -> None:
    with pytest.raises(ConfigError, match=match):
        ReaderConfig({**BOOT, **extra})


def test_bootstrap_required_and_forced_settings() -> None:
    with pytest.raises(ConfigError, match=r"bootstrap\.servers"):
        ReaderConfig({"group.id": "g"})
    rc = ReaderConfig({**BOOT, "auto.offset.reset": "latest", "enable.auto.commit": False})
    main = rc.main_config()
    assert main["enable.auto.commit"] is False and main["isolation.level"] == "read_uncommitted"
    assert main["auto.offset.reset"] == "error" and rc.start == "latest"
    assert main["group.id"].startswith("harvest-assign-")  # never joined: assign() only
    replay = rc.replay_config()
    assert replay["group.id"].startswith("harvest-replay-") and replay["fetch.wait.max.ms"] == 10


def test_unknown_property_is_config_error_without_secrets(caplog) -> None:
    caplog.set_level(logging.DEBUG)
    cfg = {**BOOT, "sasl.password": "hunter2", "ssl.key.password": "s3cret", "no.such.property": 1}
    with pytest.raises(ConfigError, match=r"no\.such\.property") as info:
        ReadCommittedIter(cfg, topics=["t"])
    text = str(info.value) + repr(info.value.__cause__) + caplog.text
    assert "hunter2" not in text and "s3cret" not in text
    assert REDACTED in str(info.value)
    assert isinstance(info.value, ConsumerError) and isinstance(info.value, ValueError)
    assert info.value.__cause__ is not None
    assert "hunter2" not in repr(ReaderConfig(cfg))
    assert redact({"sasl.oauthbearer.client.secret": "x", "a": 1}) == {
        "sasl.oauthbearer.client.secret": REDACTED,
        "a": 1,
    }


def test_argument_errors() -> None:
    with pytest.raises(ConfigError, match="topics="):
        ReadUncommittedIter(BOOT)
    with pytest.raises(ConfigError, match="not both"):
        ReadUncommittedIter(BOOT, topics=["t"], partitions=[("t", 0)])
    with pytest.raises(ConfigError, match=r"remove 'group\.id'"):
        ReadUncommittedIter({**BOOT, "group.id": "g"}, partitions=[("t", 0)])
    with pytest.raises(ConfigError, match="uuid_policy"):
        ReadUncommittedIter(BOOT, topics=["t"], uuid_policy="ignore")
    with pytest.raises(ConfigError, match="ring_size"):
        ReadCommittedIter(BOOT, topics=["t"], ring_size=0)


_READERS = {"committed": ReadCommittedIter, "uncommitted": ReadUncommittedIter}


@pytest.mark.parametrize("reader", sorted(_READERS))
@pytest.mark.parametrize(
    ("config", "kwargs", "match"),
    [
        (
            BOOT,
            {"idle_timeout": "x"},
            r"idle_timeout must be None \(wait forever\) or a number of seconds >= 0, e\.g\. 5 "
            r"or 0\.5; got 'x'",
        ),
        (BOOT, {"idle_timeout": -1}, r"idle_timeout must be None .*; got -1"),
        (BOOT, {"idle_timeout": float("nan")}, r"idle_timeout must be None .*; got nan"),
        (BOOT, {"idle_timeout": float("inf")}, r"idle_timeout must be None \(wait forever\).*; got inf"),
        (BOOT, {"idle_timeout": True}, r"idle_timeout must be None .*; got True"),
        (
            BOOT,
            {"batch_size": 10**9},
            r"batch_size must be an int 1-1,000,000 \(records per consume\(\) call; "
            r"confluent-kafka takes at most 1,000,000\), got 1000000000",
        ),
        (BOOT, {"batch_size": 0}, r"batch_size must be an int 1-1,000,000 .*got 0"),
        (BOOT, {"batch_size": "256"}, r"batch_size must be an int .*got '256'"),
        (["bootstrap.servers", "k:9092"], {}, r"kafka_config must be a dict of librdkafka properties, got list"),
        ("bootstrap.servers=k:9092", {}, r"kafka_config must be a dict of librdkafka properties, got str"),
        (None, {}, r"kafka_config must be a dict of librdkafka properties, got NoneType"),
        (
            {"bootstrap.servers": 12345},
            {},
            r"kafka config 'bootstrap.servers' must be a string of host:port pairs, "
            r"e\.g\. 'broker1:9092,broker2:9092'; got 12345 \(int\): quote it",
        ),
        ({"metadata.broker.list": 9092}, {}, r"'metadata.broker.list' must be a string .*got 9092 \(int\)"),
        ({"bootstrap.servers": ""}, {}, r"kafka config 'bootstrap.servers' is required"),
        ({"bootstrap.servers": "  "}, {}, r"kafka config 'bootstrap.servers' is required"),
    ],
    ids=[
        "idle-x",
        "idle-negative",
        "idle-nan",
        "idle-inf",
        "idle-bool",
        "batch-huge",
        "batch-zero",
        "batch-str",
        "config-list",
        "config-str",
        "config-none",
        "bootstrap-int",
        "broker-list-int",
        "bootstrap-empty",
        "bootstrap-blank",
    ],
)
def test_reader_arguments_are_checked_with_the_fix(reader: str, config, kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _READERS[reader](config, topics=["t"], **kwargs)


def test_reader_argument_checks_accept_their_bounds() -> None:
    from harvest_outbox.consumer.config import MAX_BATCH_SIZE, check_batch_size, check_idle_timeout

    assert [check_idle_timeout(v) for v in (None, 0, 2, 0.5)] == [None, 0.0, 2.0, 0.5]
    assert check_batch_size(1) == 1 and check_batch_size(MAX_BATCH_SIZE) == MAX_BATCH_SIZE
    assert ReaderConfig({"metadata.broker.list": "k:9092"}).base["metadata.broker.list"] == "k:9092"


class FakeMessage:
    def __init__(self, offset: int = 7) -> None:
        self._offset = offset

    def topic(self) -> str:
        return "orders"

    def partition(self) -> int:
        return 3

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v"

    def headers(self) -> list:
        return [("uuid", b"x")]

    def timestamp(self) -> tuple[int, int]:
        return (1, 1234)


def _record_classes() -> list:
    import harvest_outbox.consumer.record as rec

    return [rec.PyRecord] + ([] if rec._native is None else [rec._native.Record])


@pytest.mark.parametrize("Record", _record_classes(), ids=lambda c: c.__module__)
def test_record_is_read_only_and_exposes_identity(Record: type) -> None:
    pid = new_producer_id()
    u = build_uuid(pid, 16 * 1000, Flags.ACK_TXN)
    r = Record(FakeMessage(), u)
    assert (r.topic, r.partition, r.offset, r.key, r.value, r.timestamp, r.journal) == (
        "orders",
        3,
        7,
        b"k",
        b"v",
        1234,
        "orders/3",
    )
    assert (r.uuid, r.producer, r.clock, r.flags, r.is_ack) == (u, pid, 16000, Flags.ACK_TXN, True)
    with pytest.raises(AttributeError):
        r.value = b"x"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del r.key  # type: ignore[misc]
    assert r == Record(FakeMessage(), None) and hash(r) == hash(Record(FakeMessage(), None))
    assert r != Record(FakeMessage(8), u)
    plain = Record(FakeMessage(), None)
    assert (plain.uuid, plain.producer, plain.clock, plain.flags, plain.is_ack) == (
        None,
        None,
        0,
        Flags.OUTSIDE_TXN,
        False,
    )
    assert "orders/3@7" in repr(r) and "unsequenced" in repr(plain)
    assert r._x == u.int and plain._x == 0
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(r)


class HeaderMessage(FakeMessage):
    def __init__(self, headers: list | None) -> None:
        super().__init__()
        self._headers = headers

    def headers(self) -> list | None:
        return self._headers


_TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize("Record", _record_classes(), ids=lambda c: c.__module__)
@pytest.mark.parametrize(
    ("headers", "parent", "state"),
    [
        (None, None, None),
        ([("uuid", b"x")], None, None),
        ([("uuid", b"x"), ("traceparent", _TP.encode()), ("tracestate", b"a=1,b=2")], _TP, "a=1,b=2"),
        ([("traceparent", _TP.encode()), ("traceparent", b"00-second")], _TP, None),  # the first one wins
        ([("traceparent", None), ("tracestate", b"\xff\xfe")], None, None),  # null / not UTF-8: no context
        ([("Traceparent", _TP.encode())], None, None),  # header names are exact (lower case, W3C)
    ],
)
def test_record_exposes_w3c_trace_context(
    Record: type, headers: list | None, parent: str | None, state: str | None
) -> None:
    r = Record(HeaderMessage(headers), None)
    assert (r.traceparent, r.tracestate) == (parent, state)
