"""TopicGuard (producer/ops/preflight.py): verdicts per topic, cached, never refusing on a failed lookup.
Pure logic with a fake admin client, then the real broker."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fake_admin import FakeAdmin

from harvest_outbox.producer.ops.preflight import RECORD_OVERHEAD, TopicGuard, header_bytes, too_large


def _guard(admin: FakeAdmin, **kw: object) -> TopicGuard:
    return TopicGuard({}, kw.pop("producer", {}), admin_factory=lambda conf: admin, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("topic", "needle"),
    [
        ("no-such", "topic 'no-such' does not exist"),
        ("__consumer_offsets", "internal topics"),
        ("bad topic!", "not a legal Kafka topic name"),
        ("x" * 250, "not a legal Kafka topic name"),
        ("..", "not a legal Kafka topic name"),
    ],
)
def test_refused_topics_name_topic_reason_and_fix(topic: str, needle: str) -> None:
    verdict = _guard(FakeAdmin()).verdict(topic)
    assert isinstance(verdict, str) and needle in verdict and ("requeue" in verdict)


def test_budget_is_the_smaller_limit_less_framing_and_own_headers() -> None:
    admin = FakeAdmin({"small": 5_000, "big": 10_000_000})
    g = _guard(admin, producer={"message.max.bytes": 2_000_000}, extra_overhead=30)
    assert g.verdict("small") == 5_000 - RECORD_OVERHEAD - 30
    assert g.verdict("big") == 2_000_000 - RECORD_OVERHEAD - 30


def test_verdicts_are_cached_and_expire() -> None:
    admin = FakeAdmin({"t": 1000})
    g = _guard(admin, ttl=60.0, missing_ttl=2.0)
    for _ in range(3):
        g.verdict("t")
        g.verdict("later")
    assert admin.lookups == ["t", "later"]
    g.expire(float("inf") - 1 if False else 1e18)  # everything due
    assert g.verdicts == {}
    admin.topics["later"] = 1000  # the topic was created meanwhile
    assert g.verdict("later") == 1000 - RECORD_OVERHEAD


def test_missing_topics_expire_sooner_than_good_ones() -> None:
    import time

    g = _guard(FakeAdmin({"t": 1000}), ttl=60.0, missing_ttl=2.0)
    g.verdict("t")
    g.verdict("gone")
    g.expire(time.monotonic() + 3)
    assert set(g.verdicts) == {"t"}


def test_a_failed_lookup_never_refuses() -> None:
    g = _guard(FakeAdmin(fail=True))
    verdict = g.verdict("anything")
    assert isinstance(verdict, int) and verdict > 100_000


def test_compression_skips_the_size_check() -> None:
    g = _guard(FakeAdmin({"t": 1000}), producer={"compression.type": "lz4"})
    verdict = g.verdict("t")
    assert isinstance(verdict, int) and too_large(verdict, b"k", b"x" * 100_000, [], []) is None


def test_too_large_counts_key_value_and_headers() -> None:
    assert too_large(10, b"k" * 5, b"v" * 5, [], []) is None
    assert "record of 11 bytes" in (too_large(10, b"k" * 5, b"v" * 6, [], []) or "")
    assert header_bytes(["ab"], [b"xyz"]) == 2 + 3 + 10
    # text counts as the UTF-8 it is sent as (a value of 3 characters, 9 bytes), keys and values alike
    assert header_bytes(["é"], ["€€€"]) == 2 + 9 + 10
    assert header_bytes(["k", "n"], ["v", None]) == (1 + 1 + 10) + (1 + 0 + 10)
    assert too_large(30, b"k", b"v", ["ab"], [b"xyz"]) is None
    assert too_large(16, b"k", b"v", ["ab"], [b"xyz"]) is not None


@pytest.mark.integration
def test_real_broker_verdicts(kafka_bootstrap: str, topic_factory: Callable[..., str]) -> None:
    small = topic_factory(config={"max.message.bytes": "20000"})
    plain = topic_factory()
    g = TopicGuard({"bootstrap.servers": kafka_bootstrap}, {})
    assert g.verdict(small) == 20_000 - RECORD_OVERHEAD
    assert g.verdict(plain) == 1_000_000 - RECORD_OVERHEAD  # the producer's message.max.bytes is smaller
    assert "does not exist" in str(g.verdict(plain + "-missing"))
    assert "internal" in str(g.verdict("__consumer_offsets"))


def test_check_sizes_turns_the_size_check_on_for_one_compressed_topic() -> None:
    g = _guard(FakeAdmin({"t": 1000, "u": 1000}), producer={"compression.type": "lz4"})
    assert g.verdict("t") > 10**9 and g.verdict("u") > 10**9  # compressed: not checked up front
    g.check_sizes("t")  # the broker refused a batch of t as too large
    assert g.verdict("t") == 1000 - RECORD_OVERHEAD and g.verdict("u") > 10**9


def test_fatal_errors_from_poll_are_handed_over_not_raised() -> None:
    from confluent_kafka import KafkaError, KafkaException

    from harvest_outbox.producer.kafka import FatalErrorGuard

    class Raising:
        def __init__(self, err: KafkaError) -> None:
            self.err = err

        def produce(self, *a: object, **k: object) -> None: ...

        def purge(self, *a: object, **k: object) -> None: ...

        def poll(self, timeout: float = 0) -> int:
            raise KafkaException(self.err)

        def flush(self, timeout: float = 0) -> int:
            raise KafkaException(self.err)

        def __len__(self) -> int:
            return 3

    seen: list[KafkaError] = []
    fatal = KafkaError(KafkaError._GAPLESS_GUARANTEE, "gap", fatal=True)
    guarded = FatalErrorGuard(Raising(fatal), seen.append)  # type: ignore[arg-type]
    assert guarded.poll(0) == 0 and guarded.flush(0) == 3 and seen == [fatal, fatal]
    other = FatalErrorGuard(Raising(KafkaError(KafkaError._TRANSPORT, "down")), seen.append)  # type: ignore[arg-type]
    with pytest.raises(KafkaException):
        other.poll(0)  # anything not fatal is not ours to swallow


def test_a_topic_the_principal_may_not_write_is_refused_only_if_it_writes_other_topics() -> None:
    """A missing ACL for one topic refuses that topic's rows (dead letters, naming the ACL); missing for every
    topic it stops the relay (KafkaSecurityError): a wholesale authorization failure dead-letters nothing. The
    relay's own topics (NELI's leader topic) do not count as "other topics"."""
    from harvest_outbox.producer.errors import KafkaSecurityError

    settings = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "relay"}
    topics = {"t": 1_000_000, "ok-1": 1_000_000, "ok-2": 1_000_000}
    admin = FakeAdmin(topics, denied=("t",))
    guard = TopicGuard(settings, {}, admin_factory=lambda conf: admin)
    verdict = guard.verdict("t")
    assert isinstance(verdict, str)
    assert "User:relay lacks WRITE on TOPIC 't'" in verdict and "--operation Write --topic t" in verdict
    assert "requeue" in verdict
    nothing = FakeAdmin(topics, denied=("t",), writable=False)
    with pytest.raises(KafkaSecurityError, match=r"lacks WRITE on TOPIC 't'.*no row is dead-lettered"):
        TopicGuard(settings, {}, admin_factory=lambda conf: nothing).verdict("t")
    own = FakeAdmin({"t": 1, "leader.neli": 1}, denied=("t",))
    with pytest.raises(KafkaSecurityError):
        TopicGuard(settings, {}, admin_factory=lambda conf: own, own_topics=frozenset({"leader.neli"})).verdict("t")
    guard.forget()
    assert guard.verdicts == {}
