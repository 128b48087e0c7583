"""The main job, end to end on embedded Postgres, Kafka and Spark (README command 1).

1. Application writers run concurrent transactions: bump a per-key version in ``accounts`` and
   stash an outbox message for it, in one transaction; some roll back, some are held open.
2. Two ``harvest --uuid-sequencing`` relays (real processes): one leads, one stands by. Mid-way the
   leader is killed with SIGKILL and the standby takes over.
3. A ``ReadCommittedIter`` consumer process applies the committed messages to a Postgres table,
   its checkpoint saved in the same transaction (exactly-once effects).
4. A Spark ``readCommitted`` batch over the topic.
5. A verdict per reader (lost, duplicates, per-key order violations, phantoms from rolled-back
   transactions), throughput, latency and a PNG plot of throughput over time.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from harvest_local.applier import applied_rows, create_tables
from harvest_local.kafka import create_topic
from harvest_local.launcher import LocalServices
from harvest_local.relays import RelayProcess, current_leader, wait_for, write_config
from harvest_local.verify import Verdict, render, verify
from harvest_local.workdir import work_dir
from harvest_local.workload import Writers, committed_versions, create_accounts

log = logging.getLogger("harvest.demo")


@dataclass
class Run:
    started: float = field(default_factory=time.monotonic)
    events: list[tuple[float, str]] = field(default_factory=list)

    def mark(self, what: str) -> None:
        t = time.monotonic() - self.started
        self.events.append((t, what))
        log.info("[%6.1fs] %s", t, what)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev demo", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="committed messages to write (default 20000)")
    parser.add_argument("--keys", type=int, default=200, help="distinct keys (default 200)")
    parser.add_argument("--partitions", type=int, default=4, help="topic partitions (default 4)")
    parser.add_argument("--writers", type=int, default=4, help="concurrent writer threads (default 4)")
    parser.add_argument("--rate", type=float, default=1500.0, help="target write rate, rows/s (default 1500)")
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark read")
    parser.add_argument("--no-kill", action="store_true", help="do not kill the leader mid-way")
    parser.add_argument("--out", type=Path, default=None, help="folder for logs and the plot (default .work/demo-*)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)-7s %(message)s", datefmt="%H:%M:%S")
    for noisy in ("py4j", "harvest_local.maven", "harvest_local.launcher"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    out = args.out or work_dir() / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    run = Run()

    with LocalServices() as services:
        ends = services.endpoints
        run.mark(f"services up: Postgres + Kafka on loopback (logs in {out})")
        schema, topic = "demo", f"demo-accounts-{uuid.uuid4().hex[:6]}"
        outbox = f"{schema}.outbox"
        from producer.schema import init_db

        create_accounts(ends.pg_dsn, schema, args.keys)
        init_db(ends.pg_dsn, outbox)
        create_tables(ends.pg_dsn, schema)
        create_topic(ends.kafka_bootstrap, topic, args.partitions)
        cfg = write_config(out / "harvest.yaml", dsn=ends.pg_dsn, bootstrap=ends.kafka_bootstrap,
                           outbox_table=outbox, group=f"demo-{uuid.uuid4().hex[:6]}")
        relays = [RelayProcess(cfg, f"relay-{i}", out).start() for i in range(2)]
        applier = subprocess.Popen(
            [sys.executable, "-m", "harvest_local.applier", "--bootstrap", ends.kafka_bootstrap, "--topic", topic,
             "--schema", schema], env={**os.environ, "HARVEST_DATA_SOURCE": ends.pg_dsn},
            stdout=(out / "applier.log").open("w"), stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: current_leader(relays) is not None, 60)
            leader = current_leader(relays)
            assert leader is not None
            run.mark(f"{leader.name} elected leader; the other relay stands by")
            writers = Writers(ends.pg_dsn, schema, outbox, topic, args.keys, args.rows, threads=args.writers,
                              rate_per_s=args.rate).start()
            ticker = _Progress(run, writers, ends.pg_dsn, schema, outbox)
            ticker.start()
            run.mark(f"{args.writers} writers started ({args.rows} rows, ~{args.rate:.0f} rows/s, 10% rolled back)")
            takeover = None
            if not args.no_kill:
                wait_for(lambda: writers.stats.committed >= args.rows * 0.4, 600, poll=0.2)
                leader = current_leader(relays)
                assert leader is not None
                before = {r.name: r.elections() for r in relays}
                leader.kill()
                killed_at = time.monotonic()
                run.mark(f"kill -9 {leader.name} (the leader) after {writers.stats.committed} committed rows")
                wait_for(lambda: any(r.elections() > before[r.name] for r in relays if r.alive), 120)
                takeover = time.monotonic() - killed_at
                run.mark(f"standby took over after {takeover:.1f}s")
            writers.join()
            stats = writers.stats
            run.mark(f"writers done: {stats.committed} committed, {stats.rolled_back} rolled back, "
                     f"{stats.long_running} long-running transactions")
            truth = committed_versions(ends.pg_dsn, schema)
            expected = sum(truth.values())
            last_progress = (time.monotonic(), -1)
            while True:
                n = len(applied_rows(ends.pg_dsn, schema))
                if n >= expected:
                    break
                if n != last_progress[1]:
                    last_progress = (time.monotonic(), n)
                elif time.monotonic() - last_progress[0] > 60:
                    run.mark(f"consumer stalled at {n}/{expected} rows")
                    break
                time.sleep(0.5)
            time.sleep(2.0)  # anything arriving late would be a duplicate: give it the chance to show
            run.mark(f"consumer applied {len(applied_rows(ends.pg_dsn, schema))} rows")
        finally:
            if "ticker" in locals():
                ticker.stop()
            for relay in relays:
                relay.stop()
            applier.terminate()
            applier.wait(20)

        applied = applied_rows(ends.pg_dsn, schema)
        verdicts = [verify("ReadCommittedIter -> Postgres", truth, [(k, v) for k, v, _, _ in applied])]
        raw_count = _raw_count(ends.kafka_bootstrap, topic)
        if not args.no_spark:
            verdicts.append(_spark_verdict(ends.kafka_bootstrap, topic, truth))
            run.mark("Spark readCommitted batch done")
    latencies = sorted((a - w) * 1000 for _, _, w, a in applied if w)
    plot = _plot(applied, run, out / "throughput.png", [t - run.started for t in stats.commit_times])
    _report(verdicts, raw_count, expected, stats, latencies, takeover, applied, plot)
    (out / "verdict.json").write_text(json.dumps([v.__dict__ for v in verdicts], indent=2))
    return 0 if all(v.ok for v in verdicts) else 1


class _Progress:
    """A progress line every few seconds: written, waiting in the outbox, applied by the consumer."""

    def __init__(self, run: Run, writers: Writers, dsn: str, schema: str, outbox: str, every: float = 3.0) -> None:
        import threading

        self.run, self.writers, self.dsn, self.schema, self.outbox, self.every = run, writers, dsn, schema, outbox, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        import psycopg
        from psycopg import sql

        schema, table = self.outbox.split(".")
        while not self._stop.wait(self.every):
            try:
                with psycopg.connect(self.dsn, connect_timeout=3) as conn:
                    backlog = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
                        sql.Identifier(schema, table))).fetchone()[0]  # type: ignore[index]
                    applied = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
                        sql.Identifier(self.schema, "applied"))).fetchone()[0]  # type: ignore[index]
            except Exception:  # progress is best effort
                continue
            log.info("[%6.1fs]   progress: %d committed by writers, %d waiting in the outbox, %d applied by "
                     "the consumer", time.monotonic() - self.run.started, self.writers.stats.committed, backlog,
                     applied)


def _raw_count(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo-count"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(hi - lo for lo, hi in (c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in parts))
    finally:
        c.close()


def _spark_verdict(bootstrap: str, topic: str, truth: dict[str, int]) -> Verdict:
    from harvest_local.spark import local_spark_session
    from spark_reader import readCommitted

    spark = local_spark_session("harvest-demo")
    try:
        rows = readCommitted(spark, topic, {"kafka.bootstrap.servers": bootstrap}).select(
            "partition", "offset", "ack_offset", "key", "value").collect()
    finally:
        spark.stop()
    rows.sort(key=lambda r: (r.partition, r.ack_offset, r.offset))
    delivered = [(bytes(r.key).decode(), int(json.loads(bytes(r.value))["version"])) for r in rows]
    return verify("Spark readCommitted (batch)", truth, delivered)


def _plot(applied: list[tuple[str, int, float | None, float]], run: Run, path: Path,
          written: list[float]) -> Path | None:
    if not applied:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = applied[0][3]
    buckets: dict[int, int] = {}
    for _, _, _, a in applied:
        buckets[int(a - t0)] = buckets.get(int(a - t0), 0) + 1
    xs = list(range(max(buckets) + 1))
    fig, ax = plt.subplots(figsize=(8, 3.2), dpi=110)
    ax.plot(xs, [buckets.get(x, 0) for x in xs], color="#2b6cb0", linewidth=1.6, label="applied by the consumer")
    offset = t0 - (time.time() - (time.monotonic() - run.started))
    wb: dict[int, int] = {}
    for t in written:
        if t - offset >= 0:
            wb[int(t - offset)] = wb.get(int(t - offset), 0) + 1
    if wb:
        ax.plot(range(max(wb) + 1), [wb.get(x, 0) for x in range(max(wb) + 1)], color="#718096",
                linewidth=1.0, linestyle=":", label="committed by writers")
    ax.legend(loc="upper left", fontsize=8)
    for t, what in run.events:
        if what.startswith("kill -9"):
            ax.axvline(t - offset, color="#c53030", linestyle="--", linewidth=1)
            ax.annotate("leader killed", (t - offset, ax.get_ylim()[1] * 0.9), color="#c53030", fontsize=8)
    ax.set_xlabel("seconds")
    ax.set_ylabel("rows/s")
    ax.set_title("harvest demo: exactly-once delivery to the consumer's table")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _report(verdicts: list[Verdict], raw_count: int, expected: int, stats, latencies: list[float],  # type: ignore[no-untyped-def]
            takeover: float | None, applied: list, plot: Path | None) -> None:
    span = (applied[-1][3] - applied[0][3]) if len(applied) > 1 else 0.0

    def pct(p: float) -> str:
        return f"{latencies[min(len(latencies) - 1, int(p * len(latencies)))]:.0f} ms" if latencies else "n/a"

    print("\nharvest demo: verdict\n")
    print(render(verdicts))
    print()
    facts = [
        ("rows committed by writers", f"{expected}"),
        ("rows rolled back (must never appear)", f"{stats.rolled_back}"),
        ("records in the topic (incl. ACKs, re-sends)", f"{raw_count}"),
        ("leader take-over after kill -9", f"{takeover:.1f} s" if takeover is not None else "not killed"),
        ("consumer throughput (mean)", f"{len(applied) / span:.0f} rows/s" if span else "n/a"),
        ("write -> applied latency p50 / p99", f"{pct(0.5)} / {pct(0.99)}"),
        ("throughput plot", str(plot) if plot else "n/a"),
    ]
    width = max(len(a) for a, _ in facts)
    for a, b in facts:
        print(f"{a:<{width}}  {b}")
    ok = all(v.ok for v in verdicts)
    print("\n" + ("OK: every committed row delivered exactly once, in per-key order, to every reader"
                  if ok else "FAILED: see the verdict table above"))
    if latencies:
        log.debug("latency median %.1f ms", statistics.median(latencies))


if __name__ == "__main__":
    sys.exit(main())
