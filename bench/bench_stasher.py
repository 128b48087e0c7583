"""Benchmark: the stasher's batch form (COPY) versus one INSERT per record, same transaction size.

Usage: python -m bench.bench_stasher [--rows 10000] [--repeat 5] [--warmup 1]. Prints JSON, with the speed-up's
spread (one ratio per repeat pair, the pair's order swapped each repeat; bench/spread.py). Not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import psycopg

from bench import targets
from bench.spread import DEFAULT_REPEATS, Recorder, alternate
from harvest_outbox.harvest_local import LocalServices
from harvest_outbox.producer import OutboxRecord, Stasher, init_db


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEATS, help="repeat pairs")
    parser.add_argument("--warmup", type=int, default=1, help="untimed pairs first")
    args = parser.parse_args()
    records = [OutboxRecord("orders", f"key-{i % 1000}", "v" * 100, (("source", "bench"),)) for i in range(args.rows)]
    recorder = Recorder(
        args.repeat, f"{args.warmup} untimed pair(s) of transactions first", targets.for_bench("stasher")
    )
    with LocalServices() as services:
        dsn = services.endpoints.pg_dsn
        init_db(dsn, "bench.outbox")
        stasher = Stasher("bench.outbox")
        with psycopg.connect(dsn) as conn:

            def one_each() -> float:
                t = time.perf_counter()
                with conn.transaction():
                    for r in records:
                        stasher.stash(conn, r)
                return args.rows / (time.perf_counter() - t)

            def many() -> float:
                t = time.perf_counter()
                with conn.transaction():
                    stasher.stash_many(conn, records)
                return args.rows / (time.perf_counter() - t)

            batch, single = alternate(many, one_each, args.repeat, args.warmup)
    recorder.figure("stash_many", batch, single, "stash_many (COPY) / one INSERT per record, rows/s")
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
                "spread": recorder.report(),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
