"""W3C trace context from the stashing span to the reader: stash under an OpenTelemetry SDK span ->
real exactly-once relay -> Kafka -> ReadCommittedIter, which shows the same trace id."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from relaylib import relay_config, wait_drained
from sequenced_log import read_committed_to_end

from harvest_outbox.consumer.record import PyRecord
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.async_stasher import AsyncStasher
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

pytestmark = pytest.mark.integration


def _hex_trace_id(span: trace.Span) -> str:
    return format(span.get_span_context().trace_id, "032x")


def test_trace_id_spans_app_outbox_kafka_reader(
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic, table = topic_factory(partitions=2), f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    tracer = TracerProvider().get_tracer("harvest-test")  # an SDK tracer: real, recording spans
    st, off = Stasher(table), Stasher(table, trace_context=False)
    # A remote parent carrying vendor tracestate: the child span inherits it, the stasher records it.
    parent = SpanContext(
        trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
        span_id=0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "v1")]),
    )
    expected: dict[str, str | None] = {}
    with psycopg.connect(pg_dsn) as conn:
        with tracer.start_as_current_span("place-order") as span, conn.transaction():
            st.stash(conn, OutboxRecord(topic, "one", "a"))
            st.stash_many(conn, [OutboxRecord(topic, "many-1", "b"), OutboxRecord(topic, "many-2", "c")])
            off.stash(conn, OutboxRecord(topic, "opted-out", "d"))
            explicit = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
            st.stash(conn, OutboxRecord(topic, "explicit", "e", [("traceparent", explicit)]))
        for k in ("one", "many-1", "many-2"):
            expected[k] = _hex_trace_id(span)
        expected["opted-out"] = None
        expected["explicit"] = "0af7651916cd43dd8448eb211c80319c"

        async def in_async_app() -> str:
            with tracer.start_as_current_span("async-handler") as aspan:
                async with await psycopg.AsyncConnection.connect(pg_dsn) as aconn:
                    await AsyncStasher(table).stash(aconn, OutboxRecord(topic, "async", "f"))
                    await aconn.commit()
                return _hex_trace_id(aspan)

        expected["async"] = asyncio.run(in_async_app())
        ctx = trace.set_span_in_context(NonRecordingSpan(parent))
        with tracer.start_as_current_span("with-state", context=ctx), conn.transaction():
            st.stash(conn, OutboxRecord(topic, "with-state", "g"))
        expected["with-state"] = "4bf92f3577b34da6a3ce929d0e0e4736"
        with conn.transaction():  # no active span: no header
            st.stash(conn, OutboxRecord(topic, "no-span", "h"))
        expected["no-span"] = None

    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(
        uuid_sequencing=True, leader_election="postgres"
    )
    with Harvest(cfg):
        wait_drained(pg_dsn, table)
    got = {}
    for r in read_committed_to_end({"bootstrap.servers": kafka_bootstrap}, [topic]):
        got[r.key.decode()] = r
    assert set(got) == set(expected)
    for key, trace_id in expected.items():
        r = got[key]
        py = PyRecord(r.kafka_message, r.uuid)  # the pure-Python twin reads the same headers
        assert (r.traceparent, r.tracestate) == (py.traceparent, py.tracestate), key
        if trace_id is None:
            assert r.traceparent is None and all(h[0] != "traceparent" for h in r.headers or []), key
            continue
        assert r.traceparent is not None and r.traceparent.split("-")[1] == trace_id, (key, r.traceparent)
        # A reader continues the trace with OpenTelemetry's own propagator.
        extracted = trace.get_current_span(TraceContextTextMapPropagator().extract({"traceparent": r.traceparent}))
        assert format(extracted.get_span_context().trace_id, "032x") == trace_id
    assert got["with-state"].tracestate == "vendor=v1"
    assert got["one"].tracestate is None
    assert [h[0] for h in got["explicit"].headers if h[0] == "traceparent"] == ["traceparent"]  # not doubled
