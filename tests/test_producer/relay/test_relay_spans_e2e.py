"""Relay spans on the real services, both delivery modes: stash under an OpenTelemetry SDK span ->
relay with spans on -> Kafka -> reader (``ReadCommittedIter`` with ``--uuid-sequencing``, a plain
read otherwise). The relay's span is the stashing span's child, the record's ``traceparent`` names
the relay's span (so a reader's span is its child), the span's partition and offset are the
record's; records without a sampled trace context, and every record with spans off, go out with
exactly the headers stored in the outbox."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from relaylib import relay_config, wait_drained
from seqcheck import read_intents, wait_for
from sequenced_log import read_committed_to_end

from harvest_outbox.harvest_local.kafka import read_to_end
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.kafka import FaultInjector
from harvest_outbox.producer.relay.spans import DWELL_MS, KAFKA_PARTITION, OFFSET, TracingConfig
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

pytestmark = pytest.mark.integration

UNSAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
TRACED = ("one", "two", "three")


def _sdk() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _stash(pg_dsn: str, table: str, topic: str) -> tuple[trace.SpanContext, dict[str, list[tuple[str, str]]]]:
    """Stash three records under one SDK span and two without a sampled trace context; returns the
    stashing span's context and every row's stored headers by key."""
    tracer = _sdk()[0].get_tracer("app")
    st, off = Stasher(table), Stasher(table, trace_context=False)
    with psycopg.connect(pg_dsn) as conn:
        with tracer.start_as_current_span("place-order") as span, conn.transaction():
            st.stash(conn, OutboxRecord(topic, "one", "a", [("app", "1")]))
            st.stash_many(conn, [OutboxRecord(topic, "two", "b"), OutboxRecord(topic, "three", "c", [("z", "")])])
            off.stash(conn, OutboxRecord(topic, "plain", "d", [("app", "2")]))
            off.stash(conn, OutboxRecord(topic, "unsampled", "e", [("traceparent", UNSAMPLED), ("app", "3")]))
        rows = conn.execute(
            f"SELECT kafka_key, kafka_header_keys, kafka_header_values FROM {table} ORDER BY id"
        ).fetchall()
    stored = {key: list(zip(hkeys or [], hvals or [], strict=True)) for key, hkeys, hvals in rows}
    return span.get_span_context(), stored


def _read(bootstrap: str, topic: str, sequenced: bool) -> dict[str, tuple[int, int, list[tuple[str, Any]]]]:
    """key -> (partition, offset, headers) of what a reader sees (the ``uuid`` header left out)."""
    got: dict[str, tuple[int, int, list[tuple[str, Any]]]] = {}
    if sequenced:
        for r in read_committed_to_end({"bootstrap.servers": bootstrap}, [topic]):
            msg = r.kafka_message
            headers = list(r.headers or [])
            assert headers[0][0] == "uuid"
            got[r.key.decode()] = (msg.partition(), msg.offset(), headers[1:])
    else:
        for rec in read_to_end(bootstrap, [topic]):
            assert rec.key is not None
            got[rec.key.decode()] = (rec.partition, rec.offset, list(rec.headers))
    return got


def _as_bytes(headers: list[tuple[str, str]]) -> list[tuple[str, bytes]]:
    return [(k, v.encode()) for k, v in headers]


@pytest.mark.parametrize("sequenced", [False, True], ids=["at-least-once", "uuid-sequencing"])
def test_the_relay_span_sits_between_the_stash_and_the_reader(
    sequenced: bool,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic, table = topic_factory(partitions=2), f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    stash_ctx, stored = _stash(pg_dsn, table, topic)
    provider, exporter = _sdk()
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(
        uuid_sequencing=sequenced, leader_election="postgres"
    )
    with Harvest(cfg, tracer_provider=provider):
        wait_drained(pg_dsn, table)
    got = _read(kafka_bootstrap, topic, sequenced)
    assert set(got) == set(stored)

    spans: dict[int, ReadableSpan] = {s.context.span_id: s for s in exporter.get_finished_spans()}
    assert len(spans) == len(TRACED), [s.name for s in spans.values()]
    reader = _sdk()[0].get_tracer("reader")
    for key in TRACED:
        partition, offset, headers = got[key]
        traceparent = dict(headers)["traceparent"].decode()
        version, trace_id, span_id, flags = traceparent.split("-")
        stored_flags = dict(stored[key])["traceparent"].split("-")[3]  # sampled (01; 03 with W3C level 2's random bit)
        assert (version, int(trace_id, 16), flags) == ("00", stash_ctx.trace_id, stored_flags)
        span = spans[int(span_id, 16)]  # the record's parent is the relay's span ...
        assert span.parent is not None and span.parent.span_id == stash_ctx.span_id  # ... the stash's child
        assert span.context.trace_id == stash_ctx.trace_id
        assert span.kind is SpanKind.PRODUCER and span.name == f"send {topic}"
        assert span.status.status_code is StatusCode.UNSET
        attrs = dict(span.attributes or {})
        assert (attrs[KAFKA_PARTITION], attrs[OFFSET]) == (partition, offset)
        assert 0 <= attrs[DWELL_MS] < 60_000  # type: ignore[operator]
        # only the traceparent changed: the other headers keep their values and order
        expected = [(k, v.encode() if k != "traceparent" else traceparent.encode()) for k, v in stored[key]]
        assert headers == expected
        # a reader continuing the trace from the record (OpenTelemetry's own propagator) is the relay span's child
        carrier = {"traceparent": traceparent}
        with reader.start_as_current_span("process", context=TraceContextTextMapPropagator().extract(carrier)) as r:
            assert r.parent is not None and r.parent.span_id == span.context.span_id  # type: ignore[attr-defined]
    for key in ("plain", "unsampled"):  # no sampled trace context: exactly as stored
        assert got[key][2] == _as_bytes(stored[key]), key


@pytest.mark.parametrize("sequenced", [False, True], ids=["at-least-once", "uuid-sequencing"])
def test_spans_off_records_carry_the_stored_headers(
    sequenced: bool,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic, table = topic_factory(partitions=2), f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    _ctx, stored = _stash(pg_dsn, table, topic)
    provider, exporter = _sdk()
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(
        uuid_sequencing=sequenced, leader_election="postgres", tracing=TracingConfig(spans=False)
    )
    with Harvest(cfg, tracer_provider=provider):
        wait_drained(pg_dsn, table)
    got = _read(kafka_bootstrap, topic, sequenced)
    assert {key: headers for key, (_p, _o, headers) in got.items()} == {k: _as_bytes(v) for k, v in stored.items()}
    assert exporter.get_finished_spans() == ()


@pytest.mark.parametrize("sequenced", [False, True], ids=["at-least-once", "uuid-sequencing"])
def test_failed_deliveries_end_in_error_and_each_resend_gets_its_own_span(
    sequenced: bool,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic, table = topic_factory(partitions=2), f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    tracer = _sdk()[0].get_tracer("app")
    with psycopg.connect(pg_dsn) as conn, tracer.start_as_current_span("batch") as stash_span, conn.transaction():
        Stasher(table).stash_many(conn, [OutboxRecord(topic, f"k{i}", f"v{i}") for i in range(40)])
    stash_ctx = stash_span.get_span_context()
    provider, exporter = _sdk()
    # injected failures: produce() raising (the record never left), and delivery reports turned into
    # errors (the record is in the log: a duplicate at-least-once, a rolled-back copy when sequenced)
    faults = FaultInjector(produce_failure_rate=0.05, delivery_failure_rate=0.1, seed=7)
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g"), max_delivery_attempts=50).replace(
        uuid_sequencing=sequenced, leader_election="postgres"
    )
    with Harvest(cfg, producer_factory=faults, tracer_provider=provider):
        wait_drained(pg_dsn, table, timeout=120)
        if sequenced:  # drained is committed, not yet ACKed (an injected failure may hit the ACK too)
            wait_for(lambda: not read_intents(pg_dsn, table), 60, "ACK intents confirmed")
    assert faults.counters["produce"] and faults.counters["delivery"], faults.counters
    finished = exporter.get_finished_spans()
    failed = [s for s in finished if s.status.status_code is StatusCode.ERROR]
    ok = {s.context.span_id: s for s in finished if s.status.status_code is StatusCode.UNSET}
    if sequenced:  # (the injector fails ACK_TXN records too: they have no span)
        assert 0 < len(failed) <= faults.counters["produce"] + faults.counters["delivery"]
    else:  # every injected failure was a traced record's
        assert len(failed) == faults.counters["produce"] + faults.counters["delivery"]
    assert {dict(s.attributes or {})["error.type"] for s in failed} <= {"_MSG_TIMED_OUT", "_TRANSPORT", "_PURGE_QUEUE"}
    assert all(s.parent is not None and s.parent.span_id == stash_ctx.span_id for s in finished)
    attempts = Counter(dict(s.attributes or {})["harvest.outbox.id"] for s in finished)
    assert len(attempts) == 40 and attempts.total() > 40  # re-sent rows: a span per attempt
    got = _read(kafka_bootstrap, topic, sequenced)  # sequenced: the committed copy of each key
    assert len(got) == 40
    if not sequenced:  # each failed report's copy is in the log too; a key's last copy is the delivered one
        assert len(read_to_end(kafka_bootstrap, [topic])) >= 40 + faults.counters["delivery"]
    for key, (partition, offset, headers) in got.items():
        span_id = int(dict(headers)["traceparent"].decode().split("-")[2], 16)
        span = ok.get(span_id)
        assert span is not None, f"{key}: its traceparent names no successful relay span"
        attrs = dict(span.attributes or {})
        assert (attrs[KAFKA_PARTITION], attrs[OFFSET]) == (partition, offset), key
