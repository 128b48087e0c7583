"""Benchmark: the stasher's batch form (COPY) versus one INSERT per record, same transaction size.

Usage: python -m bench.bench_stasher [--rows 10000] [--repeat 3]. Prints JSON. Not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import psycopg

from harvest_outbox.harvest_local import LocalServices
from harvest_outbox.producer import OutboxRecord, Stasher, init_db


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    records = [OutboxRecord("orders", f"key-{i % 1000}", "v" * 100, (("source", "bench"),)) for i in range(args.rows)]
    single, batch = [], []
    with LocalServices() as services:
        dsn = services.endpoints.pg_dsn
        init_db(dsn, "bench.outbox")
        stasher = Stasher("bench.outbox")
        with psycopg.connect(dsn) as conn:
            for _ in range(args.repeat):
                t = time.perf_counter()
                with conn.transaction():
                    for r in records:
                        stasher.stash(conn, r)
                single.append(args.rows / (time.perf_counter() - t))
                t = time.perf_counter()
                with conn.transaction():
                    stasher.stash_many(conn, records)
                batch.append(args.rows / (time.perf_counter() - t))
    print(
        json.dumps(
            {
                "benchmark": "stasher stash_many (COPY) vs one INSERT per record",
                "rows_per_transaction": args.rows,
                "single_insert_rows_per_s": [round(x) for x in single],
                "stash_many_rows_per_s": [round(x) for x in batch],
                "single_median_rows_per_s": round(statistics.median(single)),
                "stash_many_median_rows_per_s": round(statistics.median(batch)),
                "speedup_median": round(statistics.median(batch) / statistics.median(single), 1),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
