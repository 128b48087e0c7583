"""Relay spans: one OpenTelemetry span per published record, parented on the trace context the
stasher stored with the row (:mod:`producer.observe.tracing`), so a trace reads app -> outbox -> relay ->
reader (docs/tracing.md).

Configuration: ``tracing: {spans: true, sampleRatio: 1.0}`` (:class:`TracingConfig`). Spans need the
OpenTelemetry *SDK* configured in the relay's process (a ``TracerProvider`` set globally before the
relay is built, e.g. by ``opentelemetry-instrument harvest run …``, or passed as
``Harvest(…, tracer_provider=…)``). :func:`relay_spans` decides once, when the relay is built: without
``opentelemetry-api``, without a configured provider (the API's no-op/proxy provider) or with
``spans: false`` it returns ``None``, and the modes then run exactly the code they ran before relay
spans existed: the same headers, the same delivery callbacks, no per-record check.

Decisions:

- **The span is the record's new parent.** A reader's span must be a child of the relay's, so the
  record carries the relay span's context in its ``traceparent`` header (``tracestate`` follows the
  span's: the stored header, byte for byte, unless the sampler changed it). The header is written when the record is produced, before Kafka
  names a partition and offset, so the span starts at ``produce()`` (start time = produce, parent =
  the stored ``traceparent``) and ends in the record's delivery report, which sets the partition,
  the offset and the dwell. A failed delivery (or a ``produce()`` that raised a Kafka error, or a
  record abandoned after a drain timed out) ends the span with an error status; a ``produce()``
  refused only because librdkafka's queue was full is retried at once with a fresh span (the
  refused attempt's is dropped unended, so never exported).
- **Which records get a span** (parent-based, then ratio, then the SDK's sampler): a record whose
  stored ``traceparent`` is valid and *sampled*; of those, ``sampleRatio``'s share, chosen by the row
  id (a multiplicative hash: the same row gets the same decision on every attempt and every relay);
  and of those, the ones the provider's own sampler records. A record without a trace context, of an
  unsampled trace, outside the ratio or dropped by the sampler gets no span and its headers go out
  exactly as stored, so its readers still join the stashing trace.
- **Retries are new spans.** A record re-sent after a failure (a new mark in at-least-once mode, a
  new view in ``--uuid-sequencing`` mode) gets a new span with the same parent; in sequenced mode a
  record delivered in a harvest transaction that was then rolled back keeps its (successful) span,
  although read-committed readers never see that copy: the copy that commits has its own span.
- **Headers are otherwise untouched.** Only the ``traceparent`` value (and ``tracestate`` when the
  span's differs) changes; the ``uuid`` header readers sequence on, the event id header and the
  row's other headers keep their values and order. The size preflight counts the stored header, and
  the rewritten one is never longer (a version-00 ``traceparent`` is always 55 characters).

Attributes follow OpenTelemetry's messaging semantic conventions: span kind PRODUCER, name
``send <topic>``, ``messaging.system=kafka``, ``messaging.operation.type=send``,
``messaging.operation.name=send``, ``messaging.destination.name``, at delivery
``messaging.destination.partition.id`` (and the older ``messaging.kafka.destination.partition``)
and ``messaging.kafka.offset``; plus ``harvest.outbox.id`` (the row id) and
``harvest.outbox.dwell_ms``: the row's commit -> this record's acknowledgement by Kafka, on the
clock the dwell histogram uses (:mod:`producer.observe._histograms`; in ``--uuid-sequencing`` mode the
histogram goes on until the transaction's ACK is delivered, the span's dwell stops at the record's).

Invariants (tests/test_producer/relay/test_relay_spans.py):
- :func:`relay_spans` is ``None`` unless spans are on and a real TracerProvider is configured;
- a record that gets no span goes out with its stored headers, value for value;
- every span that starts for a produced record is ended exactly once, by its delivery report or by
  the failure that means no report will come; the only spans never ended (so never exported) are
  those of a ``produce()`` refused as queue-full (retried at once with a new span) and, in
  ``--uuid-sequencing`` mode, of records still in flight when a wind-down gives up on the producer
  and drops it (their rows are re-sent, with new spans, by the next view);
- the record's ``traceparent`` is the span's context; the span's parent is the stored context.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from harvest_outbox.producer.errors import ConfigError, shown

log = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: Attribute names (OpenTelemetry messaging semantic conventions, and harvest's own).
PARTITION_ID = "messaging.destination.partition.id"
KAFKA_PARTITION = "messaging.kafka.destination.partition"
OFFSET = "messaging.kafka.offset"
DWELL_MS = "harvest.outbox.dwell_ms"
ROW_ID = "harvest.outbox.id"
#: The instrumentation scope of relay spans.
SCOPE = "harvest_outbox.relay"

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: consecutive row ids spread evenly over 64 bits


@dataclass(frozen=True)
class TracingConfig:
    """YAML ``tracing:``. ``spans`` (default true): record relay spans when an OpenTelemetry SDK
    TracerProvider is configured (without one nothing happens either way); ``sampleRatio`` (default
    1.0): the share of records of sampled traces that get a span, 0 < ratio <= 1."""

    #: Record a span per published record of a sampled trace, when an OpenTelemetry SDK TracerProvider
    #: is configured in the relay's process (without one, nothing is recorded and nothing changes).
    spans: bool = True
    #: The share of those records that get a span, above 0 and at most 1; chosen by row id, so a row
    #: gets the same decision on every attempt. The provider's sampler applies after it.
    sample_ratio: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.spans, bool):
            raise ConfigError(f"tracing.spans: {shown(self.spans)} must be true or false")
        ratio = self.sample_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise ConfigError(
                f"tracing.sampleRatio: {shown(ratio)} must be a number above 0 and at most 1, e.g. 0.1 "
                f"for a span on one record in ten (write spans: false for none)"
            )

    @classmethod
    def from_mapping(cls, data: Any, path: str = "tracing") -> TracingConfig:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"{path}: expected a mapping such as {{spans: true, sampleRatio: 0.1}}, got {shown(data)}"
            )
        keys = {"spans": "spans", "sampleRatio": "sample_ratio"}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in keys:
                name = key if isinstance(key, str) and key.isprintable() and len(key) <= 64 else shown(key)
                raise ConfigError(f"{path}.{name}: unknown key; valid keys are: {', '.join(sorted(keys))}")
            if value is not None:
                kwargs[keys[key]] = value
        try:
            return cls(**kwargs)
        except ConfigError as exc:  # named from the YAML's root, e.g. harvest.tracing.sampleRatio
            raise ConfigError(f"{path}{str(exc).removeprefix('tracing')}") from None


class RecordSpan:
    """The span of one produced record, until its delivery report ends it."""

    __slots__ = ("created", "span")

    def __init__(self, span: Any, created: float) -> None:
        self.span = span
        self.created = created


class RelaySpans:
    """Starts and ends relay spans (see module doc). Used by the relay thread only."""

    def __init__(self, tracer: Any, sample_ratio: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        from opentelemetry.trace.status import Status, StatusCode

        self._tracer = tracer
        self._extract = TraceContextTextMapPropagator().extract
        self._span_of = trace.get_current_span
        self._producer = trace.SpanKind.PRODUCER
        self._error: Callable[[str], Any] = lambda text: Status(StatusCode.ERROR, text)
        #: Row ids whose hash is below this get a span; None: every row.
        self._threshold = None if sample_ratio >= 1 else int(sample_ratio * (1 << 64))
        self._clock = clock
        self._base = {
            "messaging.system": "kafka",
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
        }

    def sampled(self, row_id: int) -> bool:
        """Is ``row_id`` in ``sampleRatio``'s share?"""
        return self._threshold is None or (row_id * _GOLDEN) & _MASK64 < self._threshold

    def start(self, row_id: int, topic: str, created: float, headers: list[tuple[str, Any]]) -> RecordSpan | None:
        """A record is about to be produced with ``headers``: start its span (child of the stored
        ``traceparent``) and point the headers at it, in place. None (headers untouched) when the
        record gets no span."""
        if self._threshold is not None and (row_id * _GOLDEN) & _MASK64 >= self._threshold:
            return None
        at = state_at = -1
        for i, (name, _value) in enumerate(headers):
            if name == TRACEPARENT:
                if at < 0:
                    at = i
            elif name == TRACESTATE and state_at < 0:
                state_at = i
        if at < 0:
            return None
        stored = headers[at][1]
        if not isinstance(stored, str):
            return None
        carrier = {TRACEPARENT: stored}
        stored_state = headers[state_at][1] if state_at >= 0 else None
        if isinstance(stored_state, str):
            carrier[TRACESTATE] = stored_state
        parent_context = self._extract(carrier)
        parent = self._span_of(parent_context).get_span_context()
        if not parent.is_valid or not parent.trace_flags.sampled:
            return None  # parent-based: an unsampled trace stays so; readers join it as stored
        attributes = {**self._base, "messaging.destination.name": topic, ROW_ID: row_id}
        span = self._tracer.start_span(f"send {topic}", parent_context, self._producer, attributes)
        if not span.is_recording():
            return None  # the provider's sampler dropped it: the stored context stays the parent
        ctx = span.get_span_context()
        headers[at] = (TRACEPARENT, f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}")
        if ctx.trace_state != parent.trace_state:  # the sampler changed it: the span's goes on
            state = ctx.trace_state.to_header()
            if state_at >= 0:
                if state:
                    headers[state_at] = (TRACESTATE, state)
                else:
                    del headers[state_at]
            elif state:
                headers.append((TRACESTATE, state))
        return RecordSpan(span, created)

    def end(self, record: RecordSpan, err: Any, msg: Any) -> None:
        """The record's delivery report (confluent-kafka's ``err``, ``msg``): end its span."""
        span = record.span
        partition = msg.partition() if msg is not None else None
        attributes: dict[str, Any] = {}
        if partition is not None and partition >= 0:
            attributes[PARTITION_ID] = str(partition)
            attributes[KAFKA_PARTITION] = partition
        if err is None:
            attributes[OFFSET] = msg.offset()
            attributes[DWELL_MS] = (self._clock() - record.created) * 1000.0
            span.set_attributes(attributes)
        else:
            attributes["error.type"] = err.name()
            span.set_attributes(attributes)
            span.set_status(self._error(err.str()))
        span.end()

    def fail(self, record: RecordSpan, error_type: str, description: str) -> None:
        """No delivery report will come (``produce()`` raised, or the record was abandoned): end the
        span as failed."""
        span = record.span
        span.set_attribute("error.type", error_type)
        span.set_status(self._error(description))
        span.end()


def relay_spans(config: TracingConfig, tracer_provider: Any = None) -> RelaySpans | None:
    """The relay's spans, or None (decided once, when the relay is built; see module doc)."""
    if not config.spans:
        return None
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        log.debug("relay spans: no OpenTelemetry TracerProvider is configured, so none are recorded")
        return None
    import harvest_outbox

    # Not installed as a distribution (a source checkout): the scope has no version.
    scope_version = None if harvest_outbox.__version__ == harvest_outbox.UNKNOWN_VERSION else harvest_outbox.__version__
    log.info(
        "relay spans on: a span per published record of a sampled trace%s",
        "" if config.sample_ratio >= 1 else f" (sampleRatio {config.sample_ratio:g})",
    )
    return RelaySpans(provider.get_tracer(SCOPE, scope_version), config.sample_ratio)
