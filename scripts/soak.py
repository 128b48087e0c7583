"""Soak: many randomized fault-injection runs of the whole pipeline (see harvest_local/faults.py).

    ./dev soak [--runs 30 | --minutes 60] [--brokers 3] [--rows 3000] [--seed 1] [--spark-every 5] [--pipeline-every 3]
               [--no-standby] [--out DIR]
    ./dev soak --report DIR     (write the report of an earlier soak folder again)

Starts its own Postgres (a primary and a synchronous standby, whose runs add Postgres fail-overs; one
server with ``--no-standby``) and Kafka (one node, or with ``--brokers 3`` a replicated cluster whose runs
add node kills, bounces, frozen nodes, two-of-three outages and clients cut off a node), restarted by the
runs themselves; prints a line per run and a summary table. ``--minutes`` runs plans until the time is up
(instead of ``--runs``).

Everything lands in the soak folder (``--out``, default .work/soak/<UTC start time>/): a folder per run
(its seed) with its logs and its history (harvest_local/history.py: each fault's start, end and target,
each reader's progress about once a second: the consumer's table, and every ``--pipeline-every`` runs
the Spark streaming pipeline's table, its driver killed in half of those), and at the end (also when a run
raises or on Ctrl-C) ``report.md`` and ``timeline.png`` (harvest_local/soak_report.py): the verdict, a table per run, faults
and per-reader lag over time. Exits 0 when the verdict is OK, 1 otherwise.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harvest_outbox.harvest_local import LocalServices, soak_report
from harvest_outbox.harvest_local.faults import FaultPlan, RunResult, run_plan, summary
from harvest_outbox.harvest_local.history import FILE_NAME, History
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
    parser.add_argument(
        "--pipeline-every",
        type=int,
        default=3,
        help="run the Spark streaming pipeline as a third reader every N runs, its driver killed in half of them "
        "(0: never)",
    )
    parser.add_argument("--out", type=Path, default=None, help="the soak folder (default .work/soak/<start time>)")
    parser.add_argument("--report", type=Path, metavar="DIR", help="only write the report of the soak folder DIR")
    args = parser.parse_args()
    if args.report is not None:
        return soak_report.main([str(args.report)])
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    folder = args.out or work_dir() / "soak" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    if any(folder.glob(f"*/{FILE_NAME}")):
        parser.error(f"--out {folder}: already holds a soak's histories; give a new folder")
    folder.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["./dev", "soak", *sys.argv[1:]])
    (folder / "soak.json").write_text(json.dumps({"command": command, "started": time.time()}, indent=2))
    print(f"soak folder: {folder}", flush=True)
    results: list[RunResult] = []
    error: BaseException | None = None
    try:
        _soak(args, folder, results)
    except (Exception, KeyboardInterrupt) as exc:  # the report is written first, then it propagates
        error = exc
    if results:
        print("\n" + summary(results))
    status = 1
    if any(folder.glob(f"*/{FILE_NAME}")):
        v, md, png = soak_report.write(folder)
        print(f"\n{v.line()}\nreport: {md}\ntimeline: {png}", flush=True)
        status = 0 if v.ok else 1
    if error is not None:
        raise error
    return status


def _soak(args: argparse.Namespace, folder: Path, results: list[RunResult]) -> None:
    spark = None
    deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
    with LocalServices(args.brokers, standby=args.standby) as services:
        for i in itertools.count():
            if (deadline is None and i >= args.runs) or (deadline is not None and time.monotonic() >= deadline):
                break
            seed = args.seed + i
            use_pipeline = bool(args.pipeline_every) and i % args.pipeline_every == args.pipeline_every - 1
            plan = FaultPlan.random(
                seed, rows=args.rows, brokers=args.brokers, standby=args.standby, pipeline=use_pipeline
            )
            use_spark = args.spark_every and i % args.spark_every == 0
            if use_spark and spark is None:
                from harvest_outbox.harvest_local.spark import local_spark_session

                spark = local_spark_session("harvest-soak")
            history = History(folder / str(seed) / FILE_NAME, seed)
            try:
                result = run_plan(
                    services, plan, folder / str(seed), spark=spark if use_spark else None, history=history
                )
            except Exception as exc:  # recorded, so the report names it; the soak stops (the services may be gone)
                history.run_ended(
                    ok=False,
                    committed=0,
                    rolled_back=0,
                    seconds=0.0,
                    verdicts=[],
                    injected={},
                    notes=[],
                    error=repr(exc),
                )
                raise
            results.append(result)
            print(summary([result]).splitlines()[-1], flush=True)


if __name__ == "__main__":
    sys.exit(main())
