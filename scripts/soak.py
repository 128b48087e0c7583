"""Soak: many randomized fault-injection runs of the whole pipeline (see harvest_local/faults.py).

    ./dev soak [--runs 30 | --minutes 60] [--brokers 3] [--rows 3000] [--seed 1] [--spark-every 5] [--no-standby]

Starts its own Postgres (a primary and a synchronous standby, whose runs add Postgres fail-overs; one
server with ``--no-standby``) and Kafka (one node, or with ``--brokers 3`` a replicated cluster whose runs
add node kills, bounces, frozen nodes, two-of-three outages and clients cut off a node), restarted by the
runs themselves; prints a
line per run and a summary table; exits 1 if any run found a violation. ``--minutes`` runs plans until the
time is up (instead of ``--runs``). Logs of each run: .work/soak/<seed>/.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harvest_outbox.harvest_local import LocalServices
from harvest_outbox.harvest_local.faults import FaultPlan, run_plan, summary
from harvest_outbox.harvest_local.workdir import work_dir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--minutes", type=float, default=0.0, help="run plans until this much time has passed")
    parser.add_argument("--brokers", type=int, default=1, choices=[1, 3], help="Kafka nodes (3: a replicated cluster)")
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--standby",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Postgres with a synchronous standby, and fail-overs in the runs (default on)",
    )
    parser.add_argument("--spark-every", type=int, default=5, help="verify with Spark every N runs (0: never)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    results = []
    spark = None
    deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
    with LocalServices(args.brokers, standby=args.standby) as services:
        for i in itertools.count():
            if (deadline is None and i >= args.runs) or (deadline is not None and time.monotonic() >= deadline):
                break
            seed = args.seed + i
            plan = FaultPlan.random(seed, rows=args.rows, brokers=args.brokers, standby=args.standby)
            use_spark = args.spark_every and i % args.spark_every == 0
            if use_spark and spark is None:
                from harvest_outbox.harvest_local.spark import local_spark_session

                spark = local_spark_session("harvest-soak")
            result = run_plan(services, plan, work_dir() / "soak" / str(seed), spark=spark if use_spark else None)
            results.append(result)
            print(summary([result]).splitlines()[-1], flush=True)
    print("\n" + summary(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
