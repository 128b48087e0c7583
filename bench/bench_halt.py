"""deadLetterPolicy benchmark (not a test): what ``haltKey`` costs a backlog drain (producer/relay/key_halt.py).

    .venv/bin/python -m bench.bench_halt [--rows 50000] [--runs 5] [--dead 1000]

Under ``haltKey`` every mark probes the dead-letter table for each row it claims (``NOT EXISTS`` on
the ``(kafka_topic, kafka_key)`` index). Per mode (at-least-once, ``--uuid-sequencing``) the variants
run interleaved, round after round (the order rotated), each on a fresh outbox of ``--rows`` rows
(100-byte values, 1,000 keys, 8 partitions) into one long-lived topic, timed from leadership to an
empty outbox:

- ``skip``: the default policy; ``skip_again``, the same, measured as a second variant so its
  ratio to ``skip`` shows the run-to-run noise any other ratio must be read against;
- ``halt_empty``: ``haltKey`` with an empty dead-letter table (the usual state);
- ``halt_dead``: ``haltKey`` with ``--dead`` dead letters of other keys parked (the probe hits the
  index and finds nothing: every row still flows).

Before the drains, the mark statement alone (``marks``): on one outbox of ``--rows`` rows, a
5,000-row mark as ``skip``, ``haltKey`` with an empty dead-letter table and ``haltKey`` with
``--dead`` parked dead letters builds it, timed in turns ``--mark-runs`` times each (every row
un-marked again between marks, untimed): the database's own cost of the probe, which a drain's
rate on a shared machine blurs.

Prints one JSON document: per mode and variant the median rows/s, the relay's CPU seconds per 100k
rows (process CPU), and each variant's ratio to ``skip`` (medians). An untimed drain of each mode
warms the broker first.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql

from bench import targets
from bench.drain import timed_drain, variant_medians
from bench.services import endpoints
from bench.spread import DEFAULT_REPEATS, Recorder
from harvest_outbox.harvest_local.kafka import create_topic
from harvest_outbox.producer.config import HarvestConfig, Limits
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

KEYS, PARTITIONS = 1000, 8
VARIANTS = ("skip", "skip_again", "halt_empty", "halt_dead")


def drain(dsn: str, bootstrap: str, topic: str, rows: int, dead: int, sequenced: bool, variant: str) -> dict[str, Any]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    table = f"{schema}.outbox"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
    names = init_db(dsn, table)
    pad = "x" * 100
    records = [OutboxRecord(topic, f"key-{i % KEYS}", f"{i:010d}{pad}"[:100]) for i in range(rows)]
    with psycopg.connect(dsn) as conn:
        Stasher(table).stash_many(conn, records)
        if variant == "halt_dead":  # parked dead letters of keys the backlog does not have
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (id, kafka_topic, kafka_key, kafka_value, error, attempts) "
                    "SELECT 1000000000 + g, %s, 'dead-' || g, 'v', 'bench', 1 FROM generate_series(1, %s) AS g"
                ).format(names.dead_letters),
                (topic, dead),
            )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(names.outbox))
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(names.dead_letters))
    cfg = HarvestConfig(
        data_source=dsn,
        outbox_table=table,
        base_kafka_config={"bootstrap.servers": bootstrap},
        leader_group_id=f"bench-{uuid.uuid4().hex[:8]}",
        limits=Limits(heartbeat_timeout=5.0),
        uuid_sequencing=sequenced,
        dead_letter_policy="haltKey" if variant.startswith("halt") else "skip",
    )
    return timed_drain(Harvest(cfg), dsn, schema, rows)


def marks(dsn: str, topic: str, rows: int, dead: int, runs: int) -> dict[str, Any]:
    """Median milliseconds of one 5,000-row mark per variant, and the ratio to ``skip``."""
    from harvest_outbox.producer.layouts.mark.database import MarkDatabase

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    table = f"{schema}.outbox"
    names = init_db(dsn, table)
    pad = "x" * 100
    with psycopg.connect(dsn) as conn:
        Stasher(table).stash_many(conn, [OutboxRecord(topic, f"key-{i % KEYS}", pad) for i in range(rows)])
    dbs = {
        "skip": MarkDatabase(dsn, names),
        "halt_empty": MarkDatabase(dsn, names, halt_keys=True),
        "halt_dead": MarkDatabase(dsn, names, halt_keys=True),
    }
    park = sql.SQL(
        "INSERT INTO {} (id, kafka_topic, kafka_key, kafka_value, error, attempts) "
        "SELECT 1000000000 + g, %s, 'dead-' || g, 'v', 'bench', 1 FROM generate_series(1, %s) AS g"
    ).format(names.dead_letters)
    unmark = sql.SQL("UPDATE {} SET leader_id = NULL").format(names.outbox)
    times: dict[str, list[float]] = {v: [] for v in dbs}
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(names.outbox))
            for n in range(runs):
                for variant, db in dbs.items():
                    conn.execute(sql.SQL("TRUNCATE {}").format(names.dead_letters))
                    if variant == "halt_dead":
                        conn.execute(park, (topic, dead))
                    # statistics as autovacuum keeps them: the plan (hashed subplan or index probe) follows them
                    conn.execute(sql.SQL("ANALYZE {}").format(names.dead_letters))
                    conn.execute(unmark)
                    t0 = time.perf_counter()
                    got = db.mark(uuid.uuid4(), 5000)
                    if n:  # the first round warms each connection's plan and caches
                        times[variant].append((time.perf_counter() - t0) * 1000)
                    assert len(got) == 5000
    finally:
        for db in dbs.values():
            db.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    med = {v: statistics.median(t) for v, t in times.items()}
    return {
        v: {"ms_per_5000_row_mark": round(m, 2), "ratio_to_skip": round(m / med["skip"], 3)} for v, m in med.items()
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=DEFAULT_REPEATS)
    ap.add_argument("--dead", type=int, default=1000, help="dead letters parked in the halt_dead variant")
    ap.add_argument("--mark-runs", type=int, default=30, help="timed marks per variant (0: skip the phase)")
    ap.add_argument("--no-drains", action="store_true", help="only the mark statement")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    services, dsn, bootstrap = endpoints()
    recorder = Recorder(
        args.runs,
        "one untimed drain per mode; the variants interleaved, their order rotated each round",
        targets.for_bench("halt"),
    )
    report: dict[str, Any] = {
        "setup": {"rows": args.rows, "runs": args.runs, "dead": args.dead, "keys": KEYS, "partitions": PARTITIONS},
        "modes": {},
    }
    try:
        topic = f"bench-halt-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, PARTITIONS)
        if args.mark_runs:
            report["marks"] = marks(dsn, topic, args.rows, args.dead, args.mark_runs + 1)
            print(f"[bench halt] marks: {report['marks']}", file=sys.stderr, flush=True)
        for name, sequenced in () if args.no_drains else (("at_least_once", False), ("sequenced", True)):
            print(f"[bench halt] {name}: warm-up drain (untimed)", file=sys.stderr, flush=True)
            drain(dsn, bootstrap, topic, args.rows, args.dead, sequenced, "skip")
            runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
            for n in range(args.runs):
                order = VARIANTS[n % len(VARIANTS) :] + VARIANTS[: n % len(VARIANTS)]
                for variant in order:
                    r = drain(dsn, bootstrap, topic, args.rows, args.dead, sequenced, variant)
                    print(f"[bench halt] {name} {variant}: {r}", file=sys.stderr, flush=True)
                    runs[variant].append(r)
            report["modes"][name] = variant_medians(runs, "skip", recorder=recorder, prefix=f"{name}/")
    finally:
        if services is not None:
            services.stop()
    report["spread"] = recorder.report()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
