"""Registry encoding benchmark (not a test): what Avro encoding at the relay (producer/serialization.py)
costs a backlog drain, and how often the schema id comes from the cache.

    .venv/bin/python -m bench.bench_registry [--rows 50000] [--runs 3] [--modes at_least_once,sequenced]

A real Apicurio Registry (harvest_local.registry) holds an Avro schema of the rows' record (an id, a
customer, an amount, a currency, a note: ~100 bytes of JSON per row). Per mode, the variants run
interleaved, round after round, each on a fresh outbox of ``--rows`` rows (1,000 keys, 8 partitions)
into one long-lived topic, timed from leadership to an empty outbox:

- ``off``: no ``serialization:`` (values published as stored); ``off_again``, the same measured
  again, so its ratio to ``off`` shows the run-to-run noise any other ratio must be read against;
- ``avro``: the topic encoded with the subject's latest schema (Confluent wire format).

Prints one JSON document: per mode and variant the median rows/s and relay CPU seconds per 100k rows
(process CPU), each variant's ratio to ``off`` (medians; the target is avro >= 0.7), and for ``avro``
the registry requests the relay made and the schema-id cache hit rate (1 - requests / rows encoded).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import uuid
from typing import Any

import psycopg
from psycopg import sql

from bench.drain import timed_drain, variant_medians
from harvest_outbox.harvest_local.kafka import create_topic
from harvest_outbox.harvest_local.registry import EmbeddedRegistry
from harvest_outbox.producer.config import HarvestConfig, Limits
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.schema import init_db
from harvest_outbox.producer.serialization_config import SerializationConfig
from harvest_outbox.producer.stasher import OutboxRecord, Stasher

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
    if variant == "avro":
        serialization = SerializationConfig.from_mapping(
            {"registry": {"url": registry}, "topics": [{"topic": topic, "serializer": "avro"}]}
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
    out: dict[str, Any] = timed_drain(relay, dsn, schema, rows)
    if encoder is not None:
        out["encoded"], out["registry_requests"] = encoder.encoded, requests[0]
    return out


VARIANTS = ("off", "off_again", "avro")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--modes", default="at_least_once,sequenced")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    services = None
    dsn, bootstrap = os.environ.get("HARVEST_PG_DSN"), os.environ.get("HARVEST_KAFKA_BOOTSTRAP")
    if not (dsn and bootstrap):
        from harvest_outbox.harvest_local import LocalServices

        services = LocalServices().start()
        dsn, bootstrap = services.endpoints.pg_dsn, services.endpoints.kafka_bootstrap
    registry = EmbeddedRegistry().start()
    report: dict[str, Any] = {
        "setup": {"rows": args.rows, "runs": args.runs, "keys": KEYS, "partitions": PARTITIONS, "cpus": os.cpu_count()},
        "modes": {},
    }
    try:
        topic = f"bench-registry-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, PARTITIONS)
        registry.register(f"{topic}-value", json.dumps(SCHEMA))
        modes = {"at_least_once": False, "sequenced": True}
        for name in args.modes.split(","):
            sequenced = modes[name]
            print(f"[bench registry] {name}: warm-up drain (untimed)", file=sys.stderr, flush=True)
            drain(dsn, bootstrap, registry.url, topic, args.rows, sequenced, "off")
            runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
            for n in range(args.runs):
                order = VARIANTS[n % len(VARIANTS) :] + VARIANTS[: n % len(VARIANTS)]
                for variant in order:
                    r = drain(dsn, bootstrap, registry.url, topic, args.rows, sequenced, variant)
                    print(f"[bench registry] {name} {variant}: {r}", file=sys.stderr, flush=True)
                    runs[variant].append(r)
            med = variant_medians(runs, "off")
            encoded = sum(r["encoded"] for r in runs["avro"])
            asked = sum(r["registry_requests"] for r in runs["avro"])
            med["avro"]["rows_encoded"] = encoded
            med["avro"]["registry_requests"] = asked
            med["avro"]["schema_id_cache_hit_rate"] = round(1 - asked / encoded, 5) if encoded else None
            report["modes"][name] = med
    finally:
        registry.destroy()
        if services is not None:
            services.stop()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
