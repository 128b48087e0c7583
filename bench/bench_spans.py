"""Relay spans benchmark (not a test): what relay spans (producer/relay/spans.py) cost a backlog drain.

    .venv/bin/python -m bench.bench_spans [--rows 50000] [--runs 5]

Every row carries a sampled W3C ``traceparent`` (as rows stashed under a sampled span do), so the
variants differ only in the relay's spans. Per mode (at-least-once, ``--uuid-sequencing``), the
variants run interleaved, round after round, each on a fresh outbox of ``--rows`` rows (100-byte
values, 1,000 keys, 8 partitions) into one long-lived topic, timed from leadership to an empty outbox:

- ``off``: no TracerProvider configured (the default of every relay whose process sets none): the
  modes run their untraced code; ``off_again``, the same, measured as a second variant so its
  ratio to ``off`` shows the run-to-run noise any other ratio must be read against;
- ``on_1``: an SDK TracerProvider (a BatchSpanProcessor to an exporter that counts and drops, so the
  figure is the relay's cost, not an exporter's) and ``sampleRatio: 1.0``: a span per record;
- ``on_0.01``: the same provider, ``sampleRatio: 0.01``.

Prints one JSON document: per mode and variant the median rows/s and relay CPU seconds per 100k rows
(process CPU), the spans exported, and each variant's ratio to ``off`` (medians). An untimed drain
of each mode warms the broker first.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from psycopg import sql

from bench import targets
from bench.drain import timed_drain, variant_medians
from bench.services import endpoints
from bench.spread import DEFAULT_REPEATS, Recorder
from harvest_outbox.harvest_local.kafka import create_topic
from harvest_outbox.producer.config import HarvestConfig, Limits
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.relay.spans import TracingConfig
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

KEYS, PARTITIONS = 1000, 8


class CountingExporter(SpanExporter):
    """Counts the spans it is handed and drops them."""

    def __init__(self) -> None:
        self.count = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.count += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def fill(dsn: str, table: str, topic: str, rows: int) -> None:
    """``rows`` rows, each with a sampled traceparent of its own (one trace per 100 rows)."""
    pad = "x" * 100
    records = [
        OutboxRecord(
            topic,
            f"key-{i % KEYS}",
            f"{i:010d}{pad}"[:100],
            [("traceparent", f"00-{i // 100 + 1:032x}-{i + 1:016x}-01")],
        )
        for i in range(rows)
    ]
    with psycopg.connect(dsn) as conn:
        Stasher(table, trace_context=False).stash_many(conn, records)


def drain(dsn: str, bootstrap: str, topic: str, rows: int, sequenced: bool, variant: str) -> dict[str, Any]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    table = f"{schema}.outbox"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
    init_db(dsn, table)
    fill(dsn, table, topic, rows)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(schema, "outbox")))
    provider, exporter = None, CountingExporter()
    tracing = TracingConfig()
    if variant.startswith("on_"):
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=65536))
        tracing = TracingConfig(sample_ratio=float(variant[3:]))
    cfg = HarvestConfig(
        data_source=dsn,
        outbox_table=table,
        base_kafka_config={"bootstrap.servers": bootstrap},
        leader_group_id=f"bench-{uuid.uuid4().hex[:8]}",
        limits=Limits(heartbeat_timeout=5.0),
        uuid_sequencing=sequenced,
        tracing=tracing,
    )
    # shutdown() flushes the batch processor: every span is counted
    relay = Harvest(cfg, tracer_provider=provider)
    out: dict[str, Any] = timed_drain(relay, dsn, schema, rows, provider.shutdown if provider is not None else None)
    out["spans"] = exporter.count
    return out


VARIANTS = ("off", "off_again", "on_1", "on_0.01")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=DEFAULT_REPEATS)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    services, dsn, bootstrap = endpoints()
    recorder = Recorder(
        args.runs,
        "one untimed drain per mode; the variants interleaved, their order rotated each round",
        targets.for_bench("spans"),
    )
    report: dict[str, Any] = {
        "setup": {"rows": args.rows, "runs": args.runs, "keys": KEYS, "partitions": PARTITIONS, "cpus": os.cpu_count()},
        "modes": {},
    }
    try:
        topic = f"bench-spans-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, PARTITIONS)
        for name, sequenced in (("at_least_once", False), ("sequenced", True)):
            print(f"[bench spans] {name}: warm-up drain (untimed)", file=sys.stderr, flush=True)
            drain(dsn, bootstrap, topic, args.rows, sequenced, "off")
            runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
            for n in range(args.runs):
                # rotate the order each round, so no variant always runs first (or after the same one)
                order = VARIANTS[n % len(VARIANTS) :] + VARIANTS[: n % len(VARIANTS)]
                for variant in order:
                    r = drain(dsn, bootstrap, topic, args.rows, sequenced, variant)
                    print(f"[bench spans] {name} {variant}: {r}", file=sys.stderr, flush=True)
                    runs[variant].append(r)
            report["modes"][name] = variant_medians(runs, "off", keep=("spans",), recorder=recorder, prefix=f"{name}/")
    finally:
        if services is not None:
            services.stop()
    report["spread"] = recorder.report()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
