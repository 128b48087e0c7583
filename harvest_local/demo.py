"""The main job, end to end on embedded Postgres, Kafka and Spark (README command 1).

1. Application writers run concurrent transactions: bump a per-key version in ``accounts`` and
   stash an outbox message for it, in one transaction; some roll back, some are held open.
2. Two ``harvest --uuid-sequencing`` relays (real processes): one leads, one stands by. Mid-way the
   leader is killed with SIGKILL and the standby takes over. With ``--brokers 3`` Kafka is a replicated
   3-node cluster (harvest_local/kafka_cluster.py), and later the node leading partition 0 is killed
   too (its broker and controller) and brought back after a few seconds.
3. A ``ReadCommittedIter`` consumer process applies the committed messages to a Postgres table,
   its checkpoint saved in the same transaction (exactly-once effects).
4. The backlog phase: once the writers are done, one transaction commits ``--backlog`` rows (100k by
   default; ``Stasher.stash_many``, as a batch import would) while the relays run, so the verdict
   shows the relay's own drain rate rather than the live writers' pace (a few hundred rows/s).
   Backlog rows continue each key's versions and are verified like every other row.
5. The Spark stage: the streaming pipeline (:mod:`spark_reader.pipeline`, a driver process of its
   own) runs through the live and backlog phases, keeping a Parquet event table and a latest-state
   table (``--pipeline-format delta``: Delta Lake tables, read back for the verdict by polars); its driver is
   SIGKILLed once mid-run and restarted from its checkpoints.
6. A verdict per reader (lost, duplicates, per-key order violations, phantoms from rolled-back
   transactions), throughput per phase, latency and a PNG timeline (``timeline.png``): every fault and
   phase change marked and named, rows in each table (outbox, consumer, Spark pipeline) and rows/s over time.

The relays run with default limits (:data:`RELAY_LIMITS`). :func:`run_demo` is the
whole job on given services (the test suite runs it small); :func:`main` adds the services and the
printed report.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harvest_outbox.harvest_local.applier import applied_rows, create_tables
from harvest_outbox.harvest_local.kafka import create_topic
from harvest_outbox.harvest_local.kafka_cluster import EmbeddedKafkaCluster
from harvest_outbox.harvest_local.launcher import LocalServices, ServiceEndpoints
from harvest_outbox.harvest_local.pipeline_process import CommittedFile, PipelineProcess, table_verdict
from harvest_outbox.harvest_local.relays import RelayProcess, current_leader, wait_for, write_config
from harvest_outbox.harvest_local.verify import Verdict, render, verify
from harvest_outbox.harvest_local.workdir import work_dir
from harvest_outbox.harvest_local.workload import (
    Writers,
    WriterStats,
    committed_versions,
    create_accounts,
    stash_backlog,
)

log = logging.getLogger("harvest.demo")


@dataclass
class Run:
    started: float = field(default_factory=time.monotonic)
    #: The same moment on the wall clock (the readers' tables and the pipeline's files carry wall times).
    wall: float = field(default_factory=time.time)
    events: list[tuple[float, str]] = field(default_factory=list)
    #: What the plot marks and names: ``(run seconds, short label, group)``, group one of :data:`MARK_COLORS`.
    marks: list[tuple[float, str, str]] = field(default_factory=list)

    def mark(self, what: str, label: str | None = None, group: str = "phase") -> None:
        """Log ``what``; with a ``label``, also mark it on the plot (every fault is marked and named)."""
        t = time.monotonic() - self.started
        self.events.append((t, what))
        if label is not None:
            self.marks.append((t, label, group))
        log.info("[%6.1fs] %s", t, what)


#: The plot's colour per group of marks: the relays' faults, the Kafka nodes', the Spark driver's, phases.
MARK_COLORS = {"relay": "#c53030", "kafka": "#6b46c1", "spark": "#2f855a", "phase": "#b7791f"}


@dataclass(frozen=True)
class DemoOptions:
    """What one demo run does; validated at construction."""

    rows: int = 10_000  # committed messages from the live writers
    keys: int = 200
    partitions: int = 4
    writers: int = 4
    rate: float = 1500.0  # target live write rate, rows/s
    backlog: int = 100_000  # rows committed at once after the live phase (0: no backlog phase)
    spark: bool = True
    kill: bool = True
    schema: str = "demo"
    #: the pipeline driver's master: local[N], or local-cluster[E,C,M] for executors in JVMs of their own,
    #: which the driver's kill takes with it (spark_reader.pipeline's --master)
    spark_master: str = "local[2]"
    #: the pipeline's table format (spark_reader.pipeline's --format): parquet, or delta (read back by polars)
    pipeline_format: str = "parquet"

    def __post_init__(self) -> None:
        for name in ("rows", "keys", "partitions", "writers"):
            if getattr(self, name) < 1:
                raise ValueError(f"demo option {name}: {getattr(self, name)!r} must be at least 1")
        if self.backlog < 0:
            raise ValueError(f"demo option backlog: {self.backlog!r} must be >= 0 (0 skips the backlog phase)")
        if not self.rate > 0:
            raise ValueError(f"demo option rate: {self.rate!r} must be > 0 rows/s")
        if not re.fullmatch(r"local\[\d+\]|local-cluster\[\d+,\d+,\d+\]", self.spark_master):
            raise ValueError(f"demo option spark_master: {self.spark_master!r}: pass local[N] or local-cluster[E,C,M]")
        if self.pipeline_format not in ("parquet", "delta"):
            raise ValueError(f"demo option pipeline_format: {self.pipeline_format!r}: pass parquet or delta")


@dataclass
class BacklogPhase:
    """The backlog phase's figures: commit -> outbox empty (relay), commit -> last row applied (consumer)."""

    rows: int
    committed_at: float  # wall clock
    relay_seconds: float | None = None  # None: the outbox never emptied
    consumer_seconds: float | None = None
    samples: list[tuple[float, int]] = field(default_factory=list)  # (wall clock, rows left in the outbox)

    @property
    def relay_rate(self) -> float | None:
        return self.rows / self.relay_seconds if self.relay_seconds else None

    @property
    def consumer_rate(self) -> float | None:
        return self.rows / self.consumer_seconds if self.consumer_seconds else None


@dataclass
class PipelineRun:
    """The Spark stage: the event table's committed files (rows, commit time) and the driver kill."""

    files: list[CommittedFile]
    killed_at: float | None  # run-relative seconds
    starts: int
    latest_matches: bool | None  # the latest-state table equals the committed versions (None: not read)
    format: str = "parquet"  # the tables' format (the series' label)


@dataclass
class DemoResult:
    run: Run
    verdicts: list[Verdict]
    expected: int
    raw_count: int
    stats: WriterStats
    writers_seconds: float
    takeover: float | None
    applied: list[tuple[str, int, float | None, float]]
    backlog: BacklogPhase | None
    pipeline: PipelineRun | None = None

    @property
    def ok(self) -> bool:
        latest_ok = self.pipeline is None or self.pipeline.latest_matches is True
        return bool(self.verdicts) and all(v.ok for v in self.verdicts) and latest_ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev demo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows", type=int, default=10_000, help="committed messages from the live writers (default 10000)"
    )
    parser.add_argument("--keys", type=int, default=200, help="distinct keys (default 200)")
    parser.add_argument("--partitions", type=int, default=4, help="topic partitions (default 4)")
    parser.add_argument("--writers", type=int, default=4, help="concurrent writer threads (default 4)")
    parser.add_argument("--rate", type=float, default=1500.0, help="target write rate, rows/s (default 1500)")
    parser.add_argument(
        "--backlog",
        type=int,
        default=100_000,
        help="rows committed at once after the writers, to show the relay's drain rate "
        "(default 100000; 0 skips the backlog phase)",
    )
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark pipeline")
    parser.add_argument(
        "--spark-master",
        default="local[2]",
        help="the pipeline driver's master: local[N] (default local[2]) or local-cluster[E,C,M] (E executor "
        "JVMs of C cores and M MiB, killed with the driver)",
    )
    parser.add_argument(
        "--pipeline-format",
        default="parquet",
        choices=["parquet", "delta"],
        help="the Spark pipeline's tables: parquet (default) or delta (Delta Lake through delta-rs; the verdict "
        "reads them with polars; needs the delta extra)",
    )
    parser.add_argument("--no-kill", action="store_true", help="do not kill the leader (nor a broker) mid-way")
    parser.add_argument(
        "--brokers",
        type=int,
        default=1,
        choices=[1, 3],
        help="Kafka nodes: 1 (default) or 3, a replicated cluster (RF 3, min.insync.replicas=2) whose leader "
        "node of partition 0 is killed mid-way and brought back",
    )
    parser.add_argument("--out", type=Path, default=None, help="folder for logs and the plot (default .work/demo-*)")
    args = parser.parse_args(argv)
    try:
        opts = DemoOptions(
            rows=args.rows,
            keys=args.keys,
            partitions=args.partitions,
            writers=args.writers,
            rate=args.rate,
            backlog=args.backlog,
            spark=not args.no_spark,
            kill=not args.no_kill,
            spark_master=args.spark_master,
            pipeline_format=args.pipeline_format,
        )
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)-7s %(message)s", datefmt="%H:%M:%S")
    for noisy in ("py4j", "harvest_outbox.harvest_local.maven", "harvest_outbox.harvest_local.launcher"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    out = args.out or work_dir() / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    run = Run()
    with LocalServices(args.brokers) as services:
        kafka = "a 3-node Kafka cluster" if services.cluster is not None else "Kafka"
        run.mark(f"services up: Postgres + {kafka} on loopback (logs in {out})")
        result = run_demo(services.endpoints, opts, out, run, services.cluster)
    latencies = sorted((a - w) * 1000 for _, _, w, a in result.applied if w)
    plot = _plot(result, out / "timeline.png")
    _report(result, latencies, plot)
    (out / "verdict.json").write_text(json.dumps([v.__dict__ for v in result.verdicts], indent=2))
    if result.backlog is not None:
        b = result.backlog
        (out / "backlog.json").write_text(
            json.dumps(
                {
                    "rows": b.rows,
                    "relay_seconds": b.relay_seconds,
                    "relay_rows_per_s": b.relay_rate,
                    "consumer_seconds": b.consumer_seconds,
                    "consumer_rows_per_s": b.consumer_rate,
                },
                indent=2,
            )
        )
    return 0 if result.ok else 1


#: The relays' limits in the demo beyond the fail-over timings: none. Mark sizes, in-flight records
#: and harvest-transaction sizes adapt to the backlog by default, so the backlog phase shows what a
#: new user's relay does (the "default limits" rows of the relay benchmark).
RELAY_LIMITS: dict[str, str] = {}


def run_demo(
    ends: ServiceEndpoints,
    opts: DemoOptions,
    out: Path,
    run: Run | None = None,
    cluster: EmbeddedKafkaCluster | None = None,
) -> DemoResult:
    """Everything but the services and the printed report, on ``ends``. The Spark stage runs in a
    process of its own (``local[2]``), so that its driver can be killed like a relay. With a replicated
    ``cluster`` (``--brokers 3``), the node leading the topic's partition 0 is also killed mid-way and
    brought back."""
    run = run or Run()
    schema, topic = opts.schema, f"demo-accounts-{uuid.uuid4().hex[:6]}"
    outbox = f"{schema}.outbox"
    from harvest_outbox.producer.schema.ddl import init_db

    create_accounts(ends.pg_dsn, schema, opts.keys)
    init_db(ends.pg_dsn, outbox)
    create_tables(ends.pg_dsn, schema)
    create_topic(ends.kafka_bootstrap, topic, opts.partitions)
    cfg = write_config(
        out / "harvest.yaml",
        dsn=ends.pg_dsn,
        bootstrap=ends.kafka_bootstrap,
        outbox_table=outbox,
        group=f"demo-{uuid.uuid4().hex[:6]}",
        extra_limits=RELAY_LIMITS,
    )
    relays = [RelayProcess(cfg, f"relay-{i}", out).start() for i in range(2)]
    applier = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harvest_outbox.harvest_local.applier",
            "--bootstrap",
            ends.kafka_bootstrap,
            "--topic",
            topic,
            "--schema",
            schema,
        ],
        env={**os.environ, "HARVEST_DATA_SOURCE": ends.pg_dsn},
        stdout=(out / "applier.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    # About ten micro-batches over the run's rows, so that the kill lands while rows are flowing even
    # when the driver starts after the writers are done (the backlog is then most of the work).
    pipeline = PipelineProcess(
        topic=topic,
        bootstrap=ends.kafka_bootstrap,
        root=out / "pipeline",
        logdir=out,
        master=opts.spark_master,
        max_offsets_per_trigger=max(2000, (opts.rows + opts.backlog) // 10),
        format=opts.pipeline_format,
    )
    committed_so_far = [0]  # rows committed by the writers and the backlog, for the pipeline's killer
    killer = _PipelineKiller(run, pipeline, lambda: committed_so_far[0])
    backlog: BacklogPhase | None = None
    takeover = None
    try:
        wait_for(lambda: current_leader(relays) is not None, 60, "a relay to be elected leader")
        leader = current_leader(relays)
        assert leader is not None
        run.mark(f"{leader.name} elected leader; the other relay stands by")
        if opts.spark:
            pipeline.start()
            run.mark(f"Spark pipeline started (events and latest-state tables under {pipeline.root})")
        writers = Writers(
            ends.pg_dsn, schema, outbox, topic, opts.keys, opts.rows, threads=opts.writers, rate_per_s=opts.rate
        ).start()
        committed_so_far[0] = opts.rows  # the live phase's target; the backlog adds its rows below
        if opts.spark and opts.kill:
            killer.start()
        writers_started = time.monotonic()
        ticker = _Progress(run, writers, ends.pg_dsn, schema, outbox)
        ticker.start()
        run.mark(
            f"live phase: {opts.writers} writers started ({opts.rows} rows, ~{opts.rate:.0f} rows/s, 10% rolled back)"
        )
        if opts.kill:
            wait_for(lambda: writers.stats.committed >= opts.rows * 0.4, 600, "40% of the live rows", poll=0.2)
            leader = current_leader(relays)
            assert leader is not None
            before = {r.name: r.elections() for r in relays}
            leader.kill()
            killed_at = time.monotonic()
            run.mark(
                f"kill -9 {leader.name} (the leader) after {writers.stats.committed} committed rows",
                f"kill -9 {leader.name} (leader)",
                "relay",
            )
            wait_for(
                lambda: any(r.elections() > before[r.name] for r in relays if r.alive), 120, "the standby to take over"
            )
            takeover = time.monotonic() - killed_at
            successor = current_leader(relays)
            run.mark(
                f"standby took over after {takeover:.1f}s",
                f"{successor.name if successor else 'standby'} leads ({takeover:.1f} s)",
                "relay",
            )
        if opts.kill and cluster is not None:
            wait_for(lambda: writers.stats.committed >= opts.rows * 0.7, 600, "70% of the live rows", poll=0.2)
            _kill_a_broker(run, cluster, topic, writers)
        writers.join()
        writers_seconds = time.monotonic() - writers_started
        stats = writers.stats
        run.mark(
            f"writers done: {stats.committed} committed, {stats.rolled_back} rolled back, "
            f"{stats.long_running} long-running transactions",
            "live writers done",
        )
        if opts.backlog:
            committed_so_far[0] = opts.rows + opts.backlog
            backlog = _backlog_phase(run, ends.pg_dsn, schema, outbox, topic, opts)
        truth = committed_versions(ends.pg_dsn, schema)
        expected = sum(truth.values())
        committed_so_far[0] = expected
        _await_consumer(run, ends.pg_dsn, schema, expected)
        if opts.spark:
            _await_table(run, pipeline, truth, killer)
        time.sleep(2.0)  # anything arriving late would be a duplicate: give it the chance to show
    finally:
        if "ticker" in locals():
            ticker.stop()
        killer.cancel()
        pipeline.stop()
        for relay in relays:
            relay.stop()
        applier.terminate()
        applier.wait(20)

    applied = applied_rows(ends.pg_dsn, schema)
    run.mark(f"consumer applied {len(applied)} rows")
    if backlog is not None:
        backlog_applied = [a for _, _, w, a in applied if w is None]
        if len(backlog_applied) >= backlog.rows:
            backlog.consumer_seconds = max(backlog_applied) - backlog.committed_at
            run.mark(
                f"backlog applied by the consumer in {backlog.consumer_seconds:.1f}s "
                f"({backlog.consumer_rate:,.0f} rows/s)"
            )
    verdicts = [verify("ReadCommittedIter -> Postgres", truth, [(k, v) for k, v, _, _ in applied])]
    raw_count = _raw_count(ends.kafka_bootstrap, topic)
    pipeline_run = None
    if opts.spark:
        verdicts.append(table_verdict(pipeline, truth))
        latest = pipeline.latest_versions()
        pipeline_run = PipelineRun(
            pipeline.committed_files(),
            killer.killed_at,
            pipeline.starts,
            None if latest is None else latest == truth,
            pipeline.format,
        )
        run.mark(
            f"Spark pipeline: event table read; latest-state table matches the outbox: {pipeline_run.latest_matches}"
        )
    return DemoResult(
        run, verdicts, expected, raw_count, stats, writers_seconds, takeover, applied, backlog, pipeline_run
    )


def _backlog_phase(
    run: Run, dsn: str, schema: str, outbox: str, topic: str, opts: DemoOptions, timeout: float = 600.0
) -> BacklogPhase:
    """Commit ``opts.backlog`` rows in one transaction while the relays run; time the relay's drain
    by sampling how many rows are left in the outbox (the relay deletes a row once it is committed
    to Kafka)."""
    import psycopg
    from psycopg import sql

    run.mark(f"backlog phase: committing {opts.backlog} rows in one transaction (Stasher.stash_many)")
    b = stash_backlog(dsn, schema, outbox, topic, opts.keys, opts.backlog)
    phase = BacklogPhase(b.rows, b.committed_at)
    run.mark(f"backlog committed ({b.rows} rows); the leader drains it", f"backlog committed ({b.rows:,} rows)")
    count = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(*outbox.split(".")))
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            left = conn.execute(count).fetchone()[0]  # type: ignore[index]
            now = time.time()
            phase.samples.append((now, left))
            if left == 0:
                phase.relay_seconds = now - b.committed_at
                break
            if now - b.committed_at > timeout:
                run.mark(f"backlog: {left} rows still in the outbox after {timeout:.0f}s")
                return phase
            time.sleep(0.1)
    run.mark(
        f"relay drained the backlog in {phase.relay_seconds:.1f}s ({phase.relay_rate:,.0f} rows/s)", "outbox empty"
    )
    return phase


def _await_consumer(run: Run, dsn: str, schema: str, expected: int, stall: float = 60.0) -> None:
    import psycopg
    from psycopg import sql

    count = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "applied"))
    last_progress = (time.monotonic(), -1)
    while True:
        with psycopg.connect(dsn) as conn:
            n = conn.execute(count).fetchone()[0]  # type: ignore[index]
        if n >= expected:
            return
        if n != last_progress[1]:
            last_progress = (time.monotonic(), n)
        elif time.monotonic() - last_progress[0] > stall:
            run.mark(f"consumer stalled at {n}/{expected} rows")
            return
        time.sleep(0.5)


class _Progress:
    """A progress line every few seconds: written, waiting in the outbox, applied by the consumer."""

    def __init__(self, run: Run, writers: Writers, dsn: str, schema: str, outbox: str, every: float = 3.0) -> None:
        import threading

        self.run, self.writers, self.dsn, self.schema, self.outbox, self.every = (
            run,
            writers,
            dsn,
            schema,
            outbox,
            every,
        )
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
                    backlog = conn.execute(
                        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, table))
                    ).fetchone()[0]  # type: ignore[index]
                    applied = conn.execute(
                        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(self.schema, "applied"))
                    ).fetchone()[0]  # type: ignore[index]
            except Exception:  # progress is best effort
                continue
            log.info(
                "[%6.1fs]   progress: %d committed by writers, %d waiting in the outbox, %d applied by the consumer",
                time.monotonic() - self.run.started,
                self.writers.stats.committed,
                backlog,
                applied,
            )


def _kill_a_broker(run: Run, cluster: EmbeddedKafkaCluster, topic: str, writers: Writers, down: float = 5.0) -> None:
    """kill -9 the node leading ``topic``'s partition 0, back after ``down`` seconds."""
    victim = cluster.kill_partition_leader(
        topic,
        0,
        down,
        killed=lambda n: run.mark(
            f"kill -9 Kafka node {n} (leader of partition 0) after {writers.stats.committed} committed rows",
            f"kill -9 Kafka node {n}",
            "kafka",
        ),
    )
    cluster.in_sync(topic, timeout=120)
    run.mark(f"Kafka node {victim} back, its replicas in sync", f"node {victim} back in sync", "kafka")


def _raw_count(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo-count"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(hi - lo for lo, hi in (c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in parts))
    finally:
        c.close()


class _PipelineKiller:
    """SIGKILLs the pipeline's driver once, as soon as its event table holds a third of the rows
    committed so far (``committed()``: the live target, then the backlog too), and restarts it from
    its checkpoints: the kill lands while rows are flowing, in whichever phase the driver is then."""

    def __init__(self, run: Run, pipeline: PipelineProcess, committed: Callable[[], int]) -> None:
        self.run, self.pipeline, self.committed = run, pipeline, committed
        self.killed_at: float | None = None  # run-relative seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pipeline-killer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(120)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            rows = sum(f.rows for f in self.pipeline.committed_files())
            if rows and rows * 3 >= self.committed():
                self.pipeline.kill()
                self.killed_at = time.monotonic() - self.run.started
                self.run.mark(
                    f"kill -9 the Spark pipeline's driver with {rows} rows in its table "
                    f"({self.pipeline.committed_batches()} micro-batches); restarting it from its checkpoints",
                    "kill -9 Spark driver",
                    "spark",
                )
                self.pipeline.start()
                return


def _await_table(
    run: Run, pipeline: PipelineProcess, truth: dict[str, int], killer: _PipelineKiller, stall: float = 180.0
) -> None:
    """Until the event table holds every committed row (after the kill) and the latest-state table
    every key's last version, or neither grows for ``stall`` seconds."""
    expected = sum(truth.values())
    last = (time.monotonic(), -1)
    while True:
        rows = sum(f.rows for f in pipeline.committed_files())
        killed = killer.killed_at is not None or not killer.running
        if rows >= expected and killed and pipeline.latest_versions() == truth:
            run.mark(f"Spark pipeline: event table holds {rows} rows, the latest-state table every key")
            return
        progress = rows + len(pipeline.text())  # the latest query's progress shows in its log
        if progress != last[1]:
            last = (time.monotonic(), progress)
        elif time.monotonic() - last[0] > stall or not (pipeline.alive or killer.running):
            run.mark(f"Spark pipeline stalled at {rows}/{expected} rows (see {pipeline.log})")
            return
        time.sleep(1.0)


#: A series of the plot: x (seconds since the run started) and y, drawn as steps.
Series = tuple[list[float], list[float]]


def table_series(result: DemoResult) -> dict[str, Series]:
    """Rows in each table over time, continuous from the first row to the run's end: committed to the
    outbox (the live writers' commits, then the backlog's one transaction), in the consumer's table (each
    row's ``applied_at``) and in the Spark pipeline's event table (each committed file's rows at its write
    time: exact, so no sampling is needed; a file the killed driver wrote but never committed is not in the
    table's log, and not counted)."""
    run = result.run
    end = max(
        [t for t, _ in run.events]
        + [a - run.wall for *_, a in result.applied]
        + [f.modified - run.wall for f in (result.pipeline.files if result.pipeline else [])]
        + [0.0]
    )

    def cumulative(times: list[float], weights: list[int] | None = None) -> Series:
        order = sorted(range(len(times)), key=times.__getitem__)
        xs, ys, n = [min([0.0, *times])], [0.0], 0
        for i in order:
            n += weights[i] if weights else 1
            xs.append(times[i])
            ys.append(float(n))
        xs.append(max(end, xs[-1]))
        ys.append(ys[-1])
        return xs, ys

    committed = [t - run.started for t in result.stats.commit_times]
    weights = [1] * len(committed)
    if result.backlog is not None:
        committed.append(result.backlog.committed_at - run.wall)
        weights.append(result.backlog.rows)
    out = {
        "committed to the outbox (writers, then the backlog)": cumulative(committed, weights),
        "in the consumer's table (ReadCommittedIter)": cumulative([a - run.wall for *_, a in result.applied]),
    }
    if result.pipeline is not None:
        files = result.pipeline.files
        label = "Delta" if result.pipeline.format == "delta" else "Parquet"
        out[f"in the Spark pipeline's table ({label})"] = cumulative(
            [f.modified - run.wall for f in files], [f.rows for f in files]
        )
    return out


def rate_series(result: DemoResult) -> dict[str, Series]:
    """Rows/s over time, each a continuous line: the consumer's and the live writers' per second, the
    relay's drain of the backlog (each drop of the outbox's row count over the time since the previous
    drop), and the Spark table's per micro-batch (its rows over the time since the table's previous commit)."""
    run, out = result.run, {}

    def per_second(times: list[float], first: float | None = None, last: float | None = None) -> Series:
        if not times:
            return [], []
        counts: dict[int, int] = {}
        for t in times:
            counts[int(t)] = counts.get(int(t), 0) + 1
        lo, hi = int(first if first is not None else min(counts)), int(last if last is not None else max(counts))
        xs = list(range(lo, hi + 1))
        return [float(x) for x in xs], [float(counts.get(x, 0)) for x in xs]

    applied = [a - run.wall for *_, a in result.applied]
    out["applied by the consumer"] = per_second(applied, 0.0, max(applied, default=0.0))
    out["committed by the live writers"] = per_second([t - run.started for t in result.stats.commit_times])
    b = result.backlog
    if b is not None and len(b.samples) > 1:
        # The relay takes rows out of the outbox in chunks: each observed drop over the time since the
        # previous one (a per-second difference would alternate between a burst and 0).
        drops = [(b.committed_at, b.rows)]
        for ts, left in b.samples:
            if left != drops[-1][1]:
                drops.append((ts, left))
        out["backlog drained by the relay"] = _interval_rates(
            [(t - run.wall, n0 - n1) for (_, n0), (t, n1) in itertools.pairwise(drops)],
            b.committed_at - run.wall,
        )
    if result.pipeline is not None and result.pipeline.files:
        batches: dict[float, int] = {}  # files of one micro-batch are written within a moment of each other
        for f in sorted(result.pipeline.files, key=lambda f: f.modified):
            t = f.modified - run.wall
            key = next((k for k in batches if t - k < 0.5), t)
            batches[key] = batches.get(key, 0) + f.rows
        starts = [t for t, label in run.events if label.startswith("Spark pipeline started")]
        out["into the Spark pipeline's table (per micro-batch)"] = _interval_rates(
            sorted(batches.items()), starts[0] if starts else min(batches) - 1.0
        )
    return out


def _interval_rates(arrivals: list[tuple[float, int]], start: float) -> Series:
    """Rows arriving at moments ``(t, rows)`` (sorted) as a rate over each interval since the previous
    arrival (the first since ``start``): contiguous steps, drawn ``steps-post``, back to 0 after the last."""
    xs, ys, prev = [start], [], start
    for t, rows in arrivals:
        ys.append(rows / max(t - prev, 0.1))
        xs.append(t)
        prev = t
    return xs, [*ys, 0.0]


_PLOT_WIDTH, _PLOT_FONT = 11.0, 7.5


def mark_layout(run: Run, end: float) -> list[tuple[float, str, str, int, bool]]:
    """The run's marks as ``(seconds, label, group, lane, label after the mark)``: each label in a lane
    where, at the plot's scale (``end`` seconds across), it overlaps no other label, and before its mark
    when after it would run past the axis."""
    from harvest_outbox.harvest_local._lanes import char_seconds, place_labels

    marks = sorted(run.marks)
    char = char_seconds(end * 1.02, _PLOT_WIDTH * 0.85, _PLOT_FONT)
    placed = place_labels([(t, 0.0, label) for t, label, _ in marks], char, end * 1.02)
    return [(t, label, group, lane, after) for (t, label, group), (lane, after, _) in zip(marks, placed, strict=True)]


def _plot(result: DemoResult, path: Path) -> Path | None:
    """The run at a glance: above, every fault and phase change marked and named (labels packed in lanes,
    none over another); then rows in each table over time (each reader a continuous line: its lag behind
    the outbox is the gap to the committed line); then rows/s (a symmetric log scale with a backlog: the
    live phase runs at the writers' pace, the backlog at the relay's, orders of magnitude apart; zero stays
    on the axis). Vertical lines carry the marks through both panels; the legend is below, outside them."""
    if not result.applied:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harvest_outbox.harvest_local._lanes import char_seconds

    tables, rates = table_series(result), rate_series(result)
    end = max(xs[-1] for xs, _ in tables.values() if xs)
    marks = mark_layout(result.run, end)
    n_lanes = max((m[3] for m in marks), default=0) + 1
    fig = plt.figure(figsize=(_PLOT_WIDTH, 6.2 + 0.17 * n_lanes), dpi=110, layout="constrained")
    grid = fig.add_gridspec(3, 1, height_ratios=[0.25 + 0.17 * n_lanes, 3.0, 2.2])
    strip = fig.add_subplot(grid[0])
    top = fig.add_subplot(grid[1], sharex=strip)
    bottom = fig.add_subplot(grid[2], sharex=strip)
    colors = {
        "committed": "#718096",
        "consumer": "#2b6cb0",
        "Spark": "#38a169",
        "writers": "#718096",
        "relay": "#dd6b20",
    }

    def color(name: str) -> str:
        return next((c for k, c in colors.items() if k in name), "#1a202c")

    for name, (xs, ys) in tables.items():
        style = ":" if name.startswith("committed") else "-"
        top.plot(xs, ys, drawstyle="steps-post", color=color(name), linestyle=style, linewidth=1.6, label=name)
    for name, (xs, ys) in rates.items():
        if xs:
            style = ":" if "writers" in name else "-"
            bottom.plot(xs, ys, drawstyle="steps-post", color=color(name), linestyle=style, linewidth=1.2, label=name)
    symlog = "backlog drained by the relay" in rates
    if symlog:
        bottom.set_yscale("symlog", linthresh=100)
    char = char_seconds(end * 1.02, _PLOT_WIDTH * 0.85, _PLOT_FONT)
    for t, label, group, lane, after in marks:
        c = MARK_COLORS.get(group, "#4a5568")
        for ax in (top, bottom):
            ax.axvline(t, color=c, linestyle="--", linewidth=0.9, alpha=0.8)
        strip.plot([t, t], [lane - 0.35, lane + 0.35], color=c, linewidth=1.5)
        strip.text(
            t + char * 0.6 if after else t - char * 0.6,
            lane,
            label,
            color=c,
            fontsize=_PLOT_FONT,
            va="center",
            ha="left" if after else "right",
        )
    strip.set_ylim(n_lanes - 0.5, -0.6)
    strip.set_yticks([])
    strip.tick_params(labelbottom=False, bottom=False)
    for side in ("top", "right", "left", "bottom"):
        strip.spines[side].set_visible(False)
    strip.set_title(
        "harvest demo: every committed row exactly once in the consumer's table and in the Spark pipeline's table",
        fontsize=10,
    )
    top.set_ylabel("rows in the table")
    top.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:,.0f}"))
    top.tick_params(labelbottom=False)
    bottom.set_ylabel("rows/s" + (" (symlog)" if symlog else ""))
    bottom.set_xlabel("seconds since the demo started")
    bottom.set_xlim(0, end * 1.02)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    handles = [*top.get_legend_handles_labels()[0], *bottom.get_legend_handles_labels()[0]]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    fig.savefig(path)
    plt.close(fig)
    return path


def _rate(rows: int, seconds: float | None) -> str:
    return f"{rows / seconds:,.0f}" if seconds else "n/a"


def phase_table(result: DemoResult) -> str:
    """Throughput per phase: the live phase runs at the writers' pace, the backlog at the relay's."""
    live = [(w, a) for _, _, w, a in result.applied if w is not None]
    live_span = (live[-1][1] - live[0][1]) if len(live) > 1 else None
    rows = [
        ("phase", "rows", "seconds", "rows/s"),
        (
            "live: committed by the writers",
            str(result.stats.committed),
            f"{result.writers_seconds:.1f}",
            _rate(result.stats.committed, result.writers_seconds),
        ),
        (
            "live: applied by the consumer",
            str(len(live)),
            f"{live_span:.1f}" if live_span else "n/a",
            _rate(len(live), live_span),
        ),
    ]
    b = result.backlog
    if b is not None:
        rows += [
            (
                "backlog: drained by the relay",
                str(b.rows),
                f"{b.relay_seconds:.1f}" if b.relay_seconds else "n/a",
                _rate(b.rows, b.relay_seconds),
            ),
            (
                "backlog: applied by the consumer",
                str(b.rows),
                f"{b.consumer_seconds:.1f}" if b.consumer_seconds else "n/a",
                _rate(b.rows, b.consumer_seconds),
            ),
        ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def _pipeline_facts(p: PipelineRun | None) -> list[tuple[str, str]]:
    if p is None:
        return []
    return [
        (
            "Spark pipeline driver kill -9",
            f"at {p.killed_at:.1f} s, restarted from its checkpoint" if p.killed_at is not None else "not killed",
        ),
        (
            "Spark pipeline: latest-state table = outbox",
            {True: "yes", False: "NO", None: "not committed"}[p.latest_matches],
        ),
    ]


def _report(result: DemoResult, latencies: list[float], plot: Path | None) -> None:
    def pct(p: float) -> str:
        return f"{latencies[min(len(latencies) - 1, int(p * len(latencies)))]:.0f} ms" if latencies else "n/a"

    print("\nharvest demo: verdict\n")
    print(render(result.verdicts))
    print()
    print(phase_table(result))
    print()
    backlog = result.backlog.rows if result.backlog else 0
    facts = [
        (
            "rows committed",
            f"{result.expected} ({result.expected - backlog} by live writers, {backlog} in the backlog)",
        ),
        ("rows rolled back (must never appear)", f"{result.stats.rolled_back}"),
        ("records in the topic (incl. ACKs, re-sends)", f"{result.raw_count}"),
        ("leader take-over after kill -9", f"{result.takeover:.1f} s" if result.takeover is not None else "not killed"),
        ("live write -> applied latency p50 / p99", f"{pct(0.5)} / {pct(0.99)}"),
        *_pipeline_facts(result.pipeline),
        ("timeline plot (faults, rows per table, rows/s)", str(plot) if plot else "n/a"),
    ]
    width = max(len(a) for a, _ in facts)
    for a, b in facts:
        print(f"{a:<{width}}  {b}")
    if result.backlog is not None:
        print("\nThe live phase runs at the writers' pace; the backlog phase shows what the relay itself sustains.")
    print(
        "\n"
        + (
            "OK: every committed row delivered exactly once, in per-key order, to every reader"
            if result.ok
            else "FAILED: see the verdict table above"
        )
    )
    if latencies:
        log.debug("latency median %.1f ms", statistics.median(latencies))


if __name__ == "__main__":
    sys.exit(main())
