"""Relay spans (producer.relay.spans), pure logic on the OpenTelemetry SDK's in-memory exporter and
fake Kafka clients (no DB, no broker; the real services: test_relay_spans_e2e.py):
- no configured TracerProvider, ``spans: false`` or no opentelemetry: no RelaySpans, and the modes
  keep their untraced callbacks;
- a record of a sampled trace gets a PRODUCER span parented on its stored traceparent, and its
  traceparent names that span; other headers keep their values and order;
- no span (headers untouched) without a trace context, for an unsampled trace, outside the ratio,
  or when the provider's sampler drops it;
- delivery ends the span with partition, offset and dwell; a failed delivery, a refused produce()
  and an abandoned record end it with an error status; a queue-full retry exports one span."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import yaml
from confluent_kafka import KafkaError, KafkaException
from fake_admin import FakeAdmin
from fake_producer import FakeProducer
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import NoOpTracerProvider, SpanKind, StatusCode
from test_optional_deps import _run

from harvest_outbox.producer.config import HarvestConfig, Limits
from harvest_outbox.producer.election.neli import StaticElection
from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.ops.preflight import TopicGuard
from harvest_outbox.producer.relay.at_least_once.mode import AtLeastOnceMode
from harvest_outbox.producer.relay.sequenced._txn import Slot, TracedSlot
from harvest_outbox.producer.relay.spans import (
    DWELL_MS,
    KAFKA_PARTITION,
    OFFSET,
    PARTITION_ID,
    ROW_ID,
    RelaySpans,
    TracingConfig,
    relay_spans,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
SAMPLED = f"00-{TRACE}-{PARENT}-01"


def sdk() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


class Msg:
    """A delivery report's message: key, topic, partition, offset, latency."""

    def __init__(self, key: bytes, partition: int = 3, offset: int = 41, topic: str = "orders") -> None:
        self._key, self._partition, self._offset, self._topic = key, partition, offset, topic

    def key(self) -> bytes:
        return self._key

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def latency(self) -> float:
        return 0.01


def row(i: int, key: str, headers: list[tuple[str, str]] | None, created: float = 0.0) -> tuple:
    hkeys = tuple(h[0] for h in headers) if headers else None
    hvals = tuple(h[1] for h in headers) if headers else None
    return (i, "orders", key.encode(), b"v", hkeys, hvals, None, None, None, None, created)


def header(headers: Any, name: str) -> Any:
    return next((v for k, v in headers or () if k == name), None)


def span_id_of(traceparent: str) -> int:
    return int(traceparent.split("-")[2], 16)


# ---------------------------------------------------------------------------------- when spans exist
def test_no_spans_without_a_configured_provider_or_when_off() -> None:
    provider, _ = sdk()
    assert relay_spans(TracingConfig(), NoOpTracerProvider()) is None
    assert relay_spans(TracingConfig()) is None  # this process sets no global provider: the API's proxy
    assert relay_spans(TracingConfig(spans=False), provider) is None
    assert isinstance(relay_spans(TracingConfig(), provider), RelaySpans)


def test_without_opentelemetry_the_relay_builds_no_spans() -> None:
    out = _run(
        {"opentelemetry"},
        """
        from harvest_outbox.producer.config import HarvestConfig
        from harvest_outbox.producer.relay.spans import relay_spans
        print(relay_spans(HarvestConfig().tracing), "opentelemetry" in sys.modules)
    """,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None False"


def test_a_global_provider_set_before_the_relay_is_built_is_used() -> None:
    # What opentelemetry-instrument (or an application) does: set the global provider first. A fresh
    # interpreter: the global provider can be set once per process.
    out = _run(
        set(),
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from harvest_outbox.producer.config import HarvestConfig
        from harvest_outbox.producer.relay.spans import relay_spans
        before = relay_spans(HarvestConfig().tracing)
        trace.set_tracer_provider(TracerProvider())
        print(before, type(relay_spans(HarvestConfig().tracing)).__name__)
    """,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None RelaySpans"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("tracing: {spans: 2}", "harvest.tracing.spans: 2 must be true or false"),
        ("tracing: {sampleRatio: 0}", "harvest.tracing.sampleRatio: 0 must be a number above 0 and at most 1"),
        ("tracing: {sampleRatio: 1.5}", "harvest.tracing.sampleRatio: 1.5 must be a number above 0"),
        ("tracing: {sampleRatio: 'x'}", "harvest.tracing.sampleRatio: 'x' must be a number"),
        ("tracing: {sample: 0.1}", "harvest.tracing.sample: unknown key; valid keys are: sampleRatio, spans"),
        ("tracing: on", "harvest.tracing: expected a mapping such as {spans: true, sampleRatio: 0.1}"),
    ],
)
def test_config_errors_name_the_key_and_the_fix(text: str, error: str) -> None:
    with pytest.raises(ConfigError) as exc:
        HarvestConfig.from_mapping(yaml.safe_load(text))
    assert str(exc.value).startswith(error)


def test_config_reads_on_off_and_a_ratio() -> None:
    assert HarvestConfig().tracing == TracingConfig(spans=True, sample_ratio=1.0)
    got = HarvestConfig.from_mapping(yaml.safe_load("tracing: {spans: off, sampleRatio: 0.25}")).tracing
    assert got == TracingConfig(spans=False, sample_ratio=0.25)


# ---------------------------------------------------------------------------------- RelaySpans
def test_a_span_is_the_child_of_the_stored_context_and_the_records_new_parent() -> None:
    provider, exporter = sdk()
    spans = relay_spans(TracingConfig(), provider)
    assert spans is not None
    headers = [("uuid", b"u"), ("a", "1"), ("traceparent", SAMPLED), ("tracestate", "vendor=v1"), ("b", None)]
    record = spans.start(7, "orders", 0.0, headers)
    assert record is not None
    ctx = record.span.get_span_context()
    assert headers == [
        ("uuid", b"u"),
        ("a", "1"),
        ("traceparent", f"00-{TRACE}-{ctx.span_id:016x}-01"),
        ("tracestate", "vendor=v1"),
        ("b", None),
    ]
    spans.end(record, None, Msg(b"k", partition=2, offset=99))
    (span,) = exporter.get_finished_spans()
    assert span.name == "send orders" and span.kind is SpanKind.PRODUCER
    assert span.parent is not None and span.parent.span_id == int(PARENT, 16) and span.parent.is_remote
    assert format(span.context.trace_id, "032x") == TRACE
    attrs = dict(span.attributes or {})
    assert attrs["messaging.system"] == "kafka" and attrs["messaging.operation.type"] == "send"
    assert attrs["messaging.destination.name"] == "orders" and attrs[ROW_ID] == 7
    assert (attrs[PARTITION_ID], attrs[KAFKA_PARTITION], attrs[OFFSET]) == ("2", 2, 99)
    assert attrs[DWELL_MS] > 0  # created at monotonic 0.0: the whole uptime of this clock
    assert span.status.status_code is StatusCode.UNSET


def test_the_stored_tracestate_goes_on_byte_for_byte() -> None:
    provider, _ = sdk()
    spans = relay_spans(TracingConfig(), provider)
    assert spans is not None
    headers = [("tracestate", "vendor=v1 , other=x"), ("traceparent", SAMPLED)]  # valid, not canonical
    record = spans.start(1, "orders", 0.0, headers)
    assert record is not None and dict(record.span.get_span_context().trace_state) == {"vendor": "v1", "other": "x"}
    assert headers[0] == ("tracestate", "vendor=v1 , other=x") and headers[1][1] != SAMPLED


@pytest.mark.parametrize(
    "headers",
    [
        None,
        [("a", "1")],
        [("traceparent", f"00-{TRACE}-{PARENT}-00")],  # unsampled trace (parent-based)
        [("traceparent", "garbage")],
        [("traceparent", f"00-{'0' * 32}-{PARENT}-01")],  # invalid trace id
        [("traceparent", None)],
    ],
    ids=["no headers", "no traceparent", "unsampled", "garbage", "invalid", "null value"],
)
def test_no_span_and_headers_untouched(headers: list[tuple[str, Any]] | None) -> None:
    provider, exporter = sdk()
    spans = relay_spans(TracingConfig(), provider)
    assert spans is not None
    stored = list(headers or [])
    given = list(stored)
    assert spans.start(1, "orders", 0.0, given) is None
    assert given == stored and exporter.get_finished_spans() == ()


def test_the_providers_sampler_dropping_a_span_leaves_the_stored_context() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = relay_spans(TracingConfig(), provider)
    assert spans is not None
    headers = [("traceparent", SAMPLED)]
    assert spans.start(1, "orders", 0.0, headers) is None
    assert headers == [("traceparent", SAMPLED)]


def test_sample_ratio_is_a_share_of_row_ids_decided_the_same_every_time() -> None:
    provider, _ = sdk()
    for ratio in (0.01, 0.1, 0.5):
        spans = relay_spans(TracingConfig(sample_ratio=ratio), provider)
        assert spans is not None
        chosen = [i for i in range(1, 100_001) if spans.sampled(i)]
        assert abs(len(chosen) / 100_000 - ratio) < ratio * 0.05, (ratio, len(chosen))
        assert chosen == [i for i in range(1, 100_001) if spans.sampled(i)]
        # start() applies it: a row outside the share gets no span
        outside = next(i for i in range(1, 1000) if not spans.sampled(i))
        headers = [("traceparent", SAMPLED)]
        assert spans.start(outside, "orders", 0.0, headers) is None and headers == [("traceparent", SAMPLED)]
        assert spans.start(chosen[0], "orders", 0.0, headers) is not None and headers[0][1] != SAMPLED


def test_a_failed_delivery_ends_the_span_with_an_error() -> None:
    provider, exporter = sdk()
    spans = relay_spans(TracingConfig(), provider)
    assert spans is not None
    record = spans.start(1, "orders", 0.0, [("traceparent", SAMPLED)])
    assert record is not None
    spans.end(record, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"), Msg(b"k", partition=-1))
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR and span.status.description == "too large"
    attrs = dict(span.attributes or {})
    assert attrs["error.type"] == "MSG_SIZE_TOO_LARGE"
    assert OFFSET not in attrs and PARTITION_ID not in attrs


# ---------------------------------------------------------------------------------- at-least-once mode
class RefusingProducer(FakeProducer):
    """produce() raises the queued errors first (BufferError, KafkaException), then records."""

    def __init__(self, on_delivery: Any) -> None:
        super().__init__(on_delivery)
        self.raise_next: list[BaseException] = []

    def produce(self, *args: Any, **kw: Any) -> None:
        if self.raise_next:
            raise self.raise_next.pop(0)
        super().produce(*args, **kw)


def leader(provider: Any) -> tuple[AtLeastOnceMode, RefusingProducer]:
    box: dict[str, Any] = {}

    def factory(conf: dict, cb: Any) -> Any:
        box["p"] = RefusingProducer(cb)
        return box["p"]

    cfg = HarvestConfig(limits=Limits())
    guard = TopicGuard({}, cfg.producer_config(), admin_factory=lambda conf: FakeAdmin({"orders": 1_048_588}))
    h = Harvest(cfg, producer_factory=factory, election=StaticElection(), topic_guard=guard, tracer_provider=provider)
    h.core.leader_id = uuid.uuid4()
    h.mode.ensure_producer()
    assert isinstance(h.mode, AtLeastOnceMode)
    return h.mode, box["p"]


def test_at_least_once_without_a_provider_runs_the_untraced_code() -> None:
    mode, producer = leader(None)
    assert mode.core.spans is None and producer.on_delivery == mode._on_delivery
    stored = [("a", "1"), ("traceparent", SAMPLED)]
    mode._send(row(1, "k", stored))
    assert producer.sent[0][3] == stored


def test_at_least_once_spans_from_produce_to_report() -> None:
    provider, exporter = sdk()
    mode, producer = leader(provider)
    assert producer.on_delivery == mode._on_delivery_traced
    mode._send(row(1, "k1", [("a", "1"), ("traceparent", SAMPLED)]))
    mode._send(row(2, "k2", [("a", "2")]))  # no trace context: no span, headers as stored
    mode._send(row(3, "k3", None))
    sent = {s[2]: s[3] for s in producer.sent}
    assert sent[b"k2"] == [("a", "2")] and sent[b"k3"] is None
    assert header(sent[b"k1"], "a") == "1" and header(sent[b"k1"], "traceparent") != SAMPLED
    assert exporter.get_finished_spans() == ()  # ended by the report, not before
    for key in (b"k1", b"k2", b"k3"):
        producer.on_delivery(None, Msg(key, partition=1, offset=5))
    (span,) = exporter.get_finished_spans()
    assert span.context.span_id == span_id_of(header(sent[b"k1"], "traceparent"))
    assert span.parent is not None and span.parent.span_id == int(PARENT, 16)
    assert dict(span.attributes or {})[OFFSET] == 5 and mode._traced == {}
    assert mode._purge_buf == [1, 2, 3]  # the reports did their usual work too


def test_at_least_once_failures_end_spans_with_errors() -> None:
    provider, exporter = sdk()
    mode, producer = leader(provider)
    tp = [("traceparent", SAMPLED)]
    # a failed delivery
    mode._send(row(1, "k1", tp))
    producer.on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT, "timed out"), Msg(b"k1"))
    # produce() refused with a Kafka error: no report will come
    producer.raise_next = [KafkaException(KafkaError(KafkaError._UNKNOWN_TOPIC, "unknown topic"))]
    mode._send(row(2, "k2", tp))
    # a queue-full produce() retried: one span, ended by the report of the retried record
    producer.raise_next = [BufferError()]
    mode._send(row(3, "k3", tp))
    producer.on_delivery(None, Msg(b"k3"))
    # abandoned after a drain that timed out
    mode._send(row(4, "k4", tp))
    mode._drain(0.0)
    spans = sorted(exporter.get_finished_spans(), key=lambda s: dict(s.attributes or {})[ROW_ID])
    by_id: dict[int, ReadableSpan] = {dict(s.attributes or {})[ROW_ID]: s for s in spans}  # type: ignore[misc]
    assert sorted(by_id) == [1, 2, 3, 4] and len(spans) == 4
    assert [by_id[i].status.status_code for i in (1, 2, 3, 4)] == [
        StatusCode.ERROR,
        StatusCode.ERROR,
        StatusCode.UNSET,
        StatusCode.ERROR,
    ]
    assert [dict(by_id[i].attributes or {}).get("error.type") for i in (1, 2, 4)] == [
        "_MSG_TIMED_OUT",
        "_UNKNOWN_TOPIC",
        "abandoned",
    ]
    (k3,) = [s for s in producer.sent if s[2] == b"k3"]
    assert by_id[3].context.span_id == span_id_of(header(k3[3], "traceparent"))
    assert mode._traced == {}


# ---------------------------------------------------------------------------------- sequenced mode's slot
def test_a_traced_slot_ends_its_span_then_reports_to_its_transaction() -> None:
    provider, exporter = sdk()
    spans = relay_spans(TracingConfig(), provider)
    assert spans is not None
    seen: list[tuple[int, Any]] = []

    class Txn:
        def on_delivery(self, clock: int, err: Any, msg: Any) -> None:
            seen.append((clock, err))

    pool: list[Slot] = []
    slot = TracedSlot(pool, spans)
    slot.txn, slot.clock = Txn(), 11  # type: ignore[assignment]
    slot.span = spans.start(1, "orders", 0.0, [("traceparent", SAMPLED)])
    slot(None, Msg(b"k", partition=0, offset=3))
    assert seen == [(11, None)] and pool == [slot] and slot.span is None
    (span,) = exporter.get_finished_spans()
    assert dict(span.attributes or {})[OFFSET] == 3
    slot.txn, slot.clock = Txn(), 12  # type: ignore[assignment]
    slot(None, Msg(b"k"))  # a record without a span: reported, nothing exported
    assert seen[-1] == (12, None) and len(exporter.get_finished_spans()) == 1
