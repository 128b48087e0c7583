"""Registry encoding benchmark (not a test): what Avro encoding at the relay (producer/encode/serialization.py)
costs a backlog drain, and how often the schema id comes from the cache.

    .venv/bin/python -m bench.bench_registry [--rows 50000] [--runs 5] [--modes at_least_once,sequenced]
        [--variants off,off_again,avro,json_schema,protobuf]

A real Apicurio Registry (harvest_local.registry) holds an Avro schema of the rows' record (an id, a
customer, an amount, a currency, a note: ~100 bytes of JSON per row). Per mode, the variants run
interleaved, round after round, each on a fresh outbox of ``--rows`` rows (1,000 keys, 8 partitions)
into one long-lived topic, timed from leadership to an empty outbox:

- ``off``: no ``serialization:`` (values published as stored); ``off_again``, the same measured
  again, so its ratio to ``off`` shows the run-to-run noise any other ratio must be read against;
- ``avro``: the topic encoded with the subject's latest schema (Confluent wire format);
- ``avro_worker``: the same with ``encodeWorker: true`` (values encoded in a child process; its CPU is
  reported apart, as ``worker_cpu_s_per_100k``);
- ``json_schema``, ``protobuf``: the same record as JSON Schema / Protobuf (each on its own topic,
  whose subject holds that format's schema).

Prints one JSON document: per mode and variant the median rows/s and relay CPU seconds per 100k rows
(process CPU), each variant's ratio to ``off`` (medians; the target is avro >= 0.7), and for the
encoded variants the registry requests the relay made and the schema-id cache hit rate
(1 - requests / rows encoded).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import statistics
import sys
import uuid
from typing import Any

import psycopg
from psycopg import sql

from bench import targets
from bench.drain import timed_drain, variant_medians
from bench.services import endpoints
from bench.spread import DEFAULT_REPEATS, Recorder
from harvest_outbox.harvest_local.kafka import create_topic
from harvest_outbox.harvest_local.registry import EmbeddedRegistry
from harvest_outbox.producer.config import HarvestConfig, Limits
from harvest_outbox.producer.config.serialization import SerializationConfig
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

KEYS, PARTITIONS = 1000, 8
SCHEMA = {
    "type": "record",
    "name": "Payment",
    "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "currency", "type": "string"},
        {"name": "note", "type": "string"},
    ],
}
JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "customer": {"type": "string"},
        "amount": {"type": "number"},
        "currency": {"type": "string"},
        "note": {"type": "string"},
    },
    "required": ["id", "customer", "amount", "currency", "note"],
}
PROTO = """syntax = "proto3";
package bench;
message Payment {
  int64 id = 1;
  string customer = 2;
  double amount = 3;
  string currency = 4;
  string note = 5;
}
"""
#: variant -> (serializer, registry schema type, schema text); the others publish as stored
ENCODED = {
    "avro": ("avro", "AVRO", json.dumps(SCHEMA)),
    "avro_worker": ("avro", "AVRO", json.dumps(SCHEMA)),
    "json_schema": ("jsonSchema", "JSON", json.dumps(JSON_SCHEMA)),
    "protobuf": ("protobuf", "PROTOBUF", PROTO),
}


def fill(dsn: str, table: str, topic: str, rows: int) -> None:
    records = [
        OutboxRecord(
            topic,
            f"key-{i % KEYS}",
            json.dumps(
                {"id": i, "customer": f"c-{i % 977:05d}", "amount": i * 0.25, "currency": "EUR", "note": "x" * 24}
            ),
        )
        for i in range(rows)
    ]
    with psycopg.connect(dsn) as conn:
        Stasher(table, trace_context=False).stash_many(conn, records)


def drain(
    dsn: str, bootstrap: str, registry: str, topic: str, rows: int, sequenced: bool, variant: str
) -> dict[str, Any]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    table = f"{schema}.outbox"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
    init_db(dsn, table)
    fill(dsn, table, topic, rows)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(schema, "outbox")))
    serialization = SerializationConfig()
    if variant in ENCODED:
        serialization = SerializationConfig.from_mapping(
            {
                "registry": {"url": registry},
                "topics": [{"topic": topic, "serializer": ENCODED[variant][0]}],
                "encodeWorker": variant == "avro_worker",
            }
        )
    cfg = HarvestConfig(
        data_source=dsn,
        outbox_table=table,
        base_kafka_config={"bootstrap.servers": bootstrap},
        leader_group_id=f"bench-{uuid.uuid4().hex[:8]}",
        limits=Limits(heartbeat_timeout=5.0),
        uuid_sequencing=sequenced,
        serialization=serialization,
    )
    relay = Harvest(cfg)
    requests = [0]
    encoder = relay.core.encoder
    if encoder is not None:  # count the registry client's HTTP requests (its cache misses)
        rest = encoder.client._rest_client
        send = rest.send_request

        def counted(*a: Any, **kw: Any) -> Any:
            requests[0] += 1
            return send(*a, **kw)

        rest.send_request = counted
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    # the encode worker's CPU counts once it is reaped (close joins it)
    out: dict[str, Any] = timed_drain(relay, dsn, schema, rows, encoder.close if encoder is not None else None)
    if encoder is not None:
        out["encoded"], out["registry_requests"] = encoder.encoded, requests[0]
    if variant == "avro_worker":
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
        out["worker_cpu_s_per_100k"] = round(cpu / rows * 100_000, 3)
    return out


VARIANTS = ("off", "off_again", "avro", "avro_worker", "json_schema", "protobuf")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=DEFAULT_REPEATS)
    ap.add_argument("--modes", default="at_least_once,sequenced")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="off is always measured (the baseline)")
    args = ap.parse_args()
    variants = ("off", *(v for v in args.variants.split(",") if v and v != "off"))
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        ap.error(f"--variants: unknown {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    services, dsn, bootstrap = endpoints()
    registry = EmbeddedRegistry().start()
    recorder = Recorder(
        args.runs,
        "one untimed drain per mode; the variants interleaved, their order rotated each round",
        targets.for_bench("registry"),
    )
    report: dict[str, Any] = {
        "setup": {
            "rows": args.rows,
            "runs": args.runs,
            "variants": variants,
            "keys": KEYS,
            "partitions": PARTITIONS,
            "cpus": os.cpu_count(),
        },
        "modes": {},
    }
    try:
        run_id = uuid.uuid4().hex[:8]
        topics = {v: f"bench-registry-{run_id}-{v if v in ENCODED else 'off'}" for v in variants}
        for topic in set(topics.values()):
            create_topic(bootstrap, topic, PARTITIONS)
        for v in ENCODED.keys() & set(variants):
            registry.register(f"{topics[v]}-value", ENCODED[v][2], ENCODED[v][1])
        modes = {"at_least_once": False, "sequenced": True}
        for name in args.modes.split(","):
            sequenced = modes[name]
            print(f"[bench registry] {name}: warm-up drain (untimed)", file=sys.stderr, flush=True)
            drain(dsn, bootstrap, registry.url, topics["off"], args.rows, sequenced, "off")
            runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
            for n in range(args.runs):
                order = variants[n % len(variants) :] + variants[: n % len(variants)]
                for variant in order:
                    r = drain(dsn, bootstrap, registry.url, topics[variant], args.rows, sequenced, variant)
                    print(f"[bench registry] {name} {variant}: {r}", file=sys.stderr, flush=True)
                    runs[variant].append(r)
            med = variant_medians(runs, "off", recorder=recorder, prefix=f"{name}/")
            if "avro_worker" in runs:
                worker = statistics.median(r["worker_cpu_s_per_100k"] for r in runs["avro_worker"])
                med["avro_worker"]["worker_cpu_s_per_100k"] = round(worker, 2)
            for v in ENCODED.keys() & set(variants):
                encoded = sum(r["encoded"] for r in runs[v])
                asked = sum(r["registry_requests"] for r in runs[v])
                med[v]["rows_encoded"] = encoded
                med[v]["registry_requests"] = asked
                med[v]["schema_id_cache_hit_rate"] = round(1 - asked / encoded, 5) if encoded else None
            report["modes"][name] = med
    finally:
        registry.destroy()
        if services is not None:
            services.stop()
    report["spread"] = recorder.report()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
