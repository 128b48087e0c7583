"""Randomized fault-injection runs of the whole pipeline, with a verdict from DB and topic.

One run: application writers (rollbacks, long transactions) → 2-3 ``--uuid-sequencing`` relays →
an exactly-once applier process (``ReadCommittedIter`` + checkpoint in Postgres), while a seeded
schedule injects faults: kill -9 of the leader, SIGSTOP/SIGCONT of the leader past its heartbeat
timeout (a zombie), a Kafka broker restart, a Postgres restart, produce/delivery errors inside the
relays, and kills of the consumer; on a replicated 3-node cluster also a partition leader's node killed,
a node bounced, a node frozen, two of three nodes down and the clients cut off one node
(:data:`CLUSTER_FAULT_KINDS`); with a synchronous standby a Postgres fail-over (``postgres_failover``). A plan
also draws the relays' leader election (NELI or Postgres), their shards, the outbox layout and the delivery
mode. Afterwards :mod:`harvest_local.verify` checks, per key, that the applier's table and (optionally) a
Spark ``readCommitted`` batch hold every committed version exactly once and in order (at-least-once mode:
every committed version, first arrivals in order), and nothing from rolled-back transactions.

Used by ``tests/test_e2e/test_faults.py`` (a short version in CI) and ``scripts/soak.py``.
"""

from __future__ import annotations

import logging
import os
import random
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from random import Random
from typing import Any

from harvest_outbox.harvest_local.applier import applied_rows, create_tables
from harvest_outbox.harvest_local.history import History, Sampler, TableCounts
from harvest_outbox.harvest_local.kafka import create_topic
from harvest_outbox.harvest_local.kafka_cluster import EmbeddedKafkaCluster
from harvest_outbox.harvest_local.launcher import LocalServices
from harvest_outbox.harvest_local.pipeline_process import PipelineProcess, table_verdict
from harvest_outbox.harvest_local.relays import RelayProcess, current_leader, wait_for, write_config
from harvest_outbox.harvest_local.verify import Verdict, verify
from harvest_outbox.harvest_local.workload import Writers, committed_versions, create_accounts

log = logging.getLogger(__name__)

FAULT_KINDS = ("kill_leader", "pause_leader", "broker_restart", "postgres_restart", "consumer_kill")
#: On a replicated cluster (``brokers=3``; harvest_local/kafka_cluster.py), in place of ``broker_restart``:
#: kill -9 of the node leading partition 0 (back after 2 s), a clean bounce of a random node, a node frozen
#: (SIGSTOP) past its 3 s session timeout and woken up (a zombie broker), two of three nodes down for
#: 6 s (no controller quorum, no in-sync majority: ``NOT_ENOUGH_REPLICAS`` and timeouts), and the relays and
#: readers cut off the node leading partition 0 for 8 s, its packets dropped or its connections rejected,
#: while the cluster stays whole (the node still leads: a network partition between the clients and one broker).
CLUSTER_FAULT_KINDS = (
    "node_kill",
    "node_bounce",
    "node_pause",
    "two_nodes_down",
    "client_partition_drop",
    "client_partition_reject",
    "controller_kill",
    "rolling_bounce",
)
#: How long a client partition lasts: past the relays' 2 s heartbeat timeout and 6 s session timeout.
CLIENT_PARTITION_SECONDS = 8.0
#: With a synchronous standby (``standby=True``; harvest_local/replicated_postgres.py), at most once per plan:
#: the primary killed, the standby promoted (the run's clients follow through their multi-host DSN), and a new
#: standby built where the primary was, so the next run starts with a synchronous pair again.
FAILOVER_KIND = "postgres_failover"
#: kill -9 of the streaming pipeline's driver (its process group: Python, JVM), restarted from its
#: checkpoints after 1 s; only in plans with ``pipeline``.
PIPELINE_KILL = "pipeline_kill"
#: How long a run waits, after the consumer's verdict, for the pipeline's table to hold every committed row
#: (its driver starts a JVM, maybe twice: minutes on a loaded 2-core machine).
PIPELINE_CATCH_UP = 300.0
PIPELINE_READER = "Spark pipeline -> Parquet table"
#: What the pipeline's driver logs once its queries run (spark_reader/pipeline.py).
PIPELINE_RUNNING = "pipeline running:"
#: ``leaderElection`` values a plan draws.
ELECTIONS = ("neli", "postgres")
#: ``mode``: ``sequenced`` (``uuidSequencing``: exactly once) or ``at-least-once`` (no sequencing: every row,
#: maybe more than once, first arrivals in per-key order).
MODES = ("sequenced", "at-least-once")


@dataclass(frozen=True)
class FaultPlan:
    seed: int
    relays: int = 2
    rows: int = 3000
    keys: int = 50
    partitions: int = 3
    rate: float = 600.0
    faults: tuple[str, ...] = ()
    produce_error_rate: float = 0.0
    delivery_error_rate: float = 0.0
    spark: bool = False
    #: ``outboxLayout``: ``mark`` (goharvest's table) or ``cursor`` (the cursor layout's partitioned outbox).
    layout: str = "mark"
    #: Kafka nodes the run needs: 1, or 3 for :data:`CLUSTER_FAULT_KINDS` (the services must match).
    brokers: int = 1
    #: The run's Postgres has a synchronous standby (``LocalServices(standby=True)``), needed by :data:`FAILOVER_KIND`.
    standby: bool = False
    #: ``leaderElection`` (:data:`ELECTIONS`).
    election: str = "neli"
    #: ``shards``: 1 (one active relay) or more (the outbox split among the relays, each shard elected).
    shards: int = 1
    #: :data:`MODES`.
    mode: str = "sequenced"
    #: The streaming pipeline (``spark_reader.pipeline``: a driver process writing a Parquet event table) reads
    #: the topic throughout as a third reader, its table verified like the consumer's; it may be killed
    #: (:data:`PIPELINE_KILL`).
    pipeline: bool = False

    def __post_init__(self) -> None:
        if self.election not in ELECTIONS:
            raise ValueError(f"FaultPlan.election {self.election!r}: use one of {', '.join(ELECTIONS)}")
        if self.mode not in MODES:
            raise ValueError(f"FaultPlan.mode {self.mode!r}: use one of {', '.join(MODES)}")
        if self.shards < 1:
            raise ValueError(f"FaultPlan.shards {self.shards}: use 1 (unsharded) or more")
        if self.faults.count(FAILOVER_KIND) > 1:
            raise ValueError(
                f"FaultPlan.faults has {FAILOVER_KIND} {self.faults.count(FAILOVER_KIND)} times: a fail-over "
                "leaves no standby until the new one is built, so a plan holds at most one"
            )
        if PIPELINE_KILL in self.faults and not self.pipeline:
            raise ValueError(f"FaultPlan.faults has {PIPELINE_KILL}: set pipeline=True")
        if FAILOVER_KIND in self.faults and not self.standby:
            raise ValueError(f"FaultPlan.faults has {FAILOVER_KIND}: set standby=True (and give it the services' one)")

    @staticmethod
    def random(
        seed: int,
        rows: int = 3000,
        allow_restarts: bool = True,
        brokers: int = 1,
        standby: bool = False,
        pipeline: bool = False,
    ) -> FaultPlan:
        rng = random.Random(seed)
        kinds = [k for k in FAULT_KINDS if allow_restarts or not k.endswith("_restart")]
        if brokers > 1:  # the cluster's own faults replace the single broker's restart
            kinds = [k for k in kinds if k != "broker_restart"] + list(CLUSTER_FAULT_KINDS)
        if standby:
            kinds.append(FAILOVER_KIND)
        faults: list[str] = []
        for _ in range(rng.randint(1, 3)):
            faults.append(rng.choice([k for k in kinds if k != FAILOVER_KIND or FAILOVER_KIND not in faults]))
        errors = rng.random() < 0.5
        return FaultPlan(
            seed=seed,
            relays=rng.choice((2, 3)),
            rows=rows,
            keys=rng.choice((20, 50, 200)),
            partitions=rng.choice((1, 3, 4)),
            faults=tuple(faults),
            produce_error_rate=0.02 if errors else 0.0,
            delivery_error_rate=0.02 if errors else 0.0,
            layout=rng.choice(("mark", "cursor")),
            brokers=brokers,
            standby=standby,
            election=rng.choice(ELECTIONS),
            shards=rng.choice((1, 2, 3)),
            # exactly once is the claim: three sequenced runs for each at-least-once one
            mode=rng.choice(("sequenced", "sequenced", "sequenced", "at-least-once")),
            pipeline=pipeline,
        )._with_pipeline_kill(rng)

    def _with_pipeline_kill(self, rng: Random) -> FaultPlan:
        """A pipeline's run kills its driver half of the time (drawn last: the other draws of a seed stay)."""
        if not self.pipeline or rng.random() < 0.5:
            return self
        return replace(self, faults=(*self.faults, PIPELINE_KILL))


@dataclass
class RunResult:
    plan: FaultPlan
    verdicts: list[Verdict]
    injected: Counter[str] = field(default_factory=Counter)
    committed: int = 0
    rolled_back: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)


def run_plan(
    services: LocalServices, plan: FaultPlan, workdir: Path, spark: Any = None, history: History | None = None
) -> RunResult:
    """One run of ``plan``; with a ``history``, its faults (start, end, target) and a sample of each
    reader's progress about once a second are recorded there (harvest_local/history.py)."""
    if plan.brokers > 1 and services.cluster is None:
        raise ValueError(f"plan {plan.seed} needs a {plan.brokers}-node Kafka cluster: LocalServices(brokers=3)")
    if plan.standby and services.replicated is None:
        raise ValueError(f"plan {plan.seed} needs a Postgres standby: LocalServices(standby=True)")
    started = time.monotonic()
    if history is not None:
        history.run_started(asdict(plan))
    rng = random.Random(plan.seed)
    ends = services.endpoints
    tag = uuid.uuid4().hex[:6]
    schema, topic = f"fault_{plan.seed}_{tag}", f"fault-{plan.seed}-{tag}"
    outbox = f"{schema}.outbox"
    workdir.mkdir(parents=True, exist_ok=True)
    from harvest_outbox.producer.schema.ddl import init_db

    create_accounts(ends.pg_dsn, schema, plan.keys)
    init_db(ends.pg_dsn, outbox, layout=plan.layout, partition_ids=1000, shards=plan.shards)
    create_tables(ends.pg_dsn, schema)
    create_topic(ends.kafka_bootstrap, topic, plan.partitions)
    cfg = write_config(
        workdir / "harvest.yaml",
        dsn=ends.pg_dsn,
        bootstrap=ends.kafka_bootstrap,
        outbox_table=outbox,
        group=f"fault-{plan.seed}-{tag}",
        outbox_layout=plan.layout,
        uuid_sequencing=plan.mode == "sequenced",
        leader_election=plan.election,
        leader_lock_check_interval="200ms" if plan.election == "postgres" else None,
        shards=plan.shards if plan.shards > 1 else None,
    )
    faults = None
    if plan.produce_error_rate or plan.delivery_error_rate:
        faults = f"produce={plan.produce_error_rate},delivery={plan.delivery_error_rate},seed={plan.seed}"
    relays = [RelayProcess(cfg, f"relay-{i}", workdir, faults=faults).start() for i in range(plan.relays)]
    result = RunResult(plan, [])
    if faults:
        result.injected["produce_delivery_errors"] += 1
    applier = _start_applier(ends.pg_dsn, ends.kafka_bootstrap, topic, schema, workdir)
    pipeline = (
        PipelineProcess(topic=topic, bootstrap=ends.kafka_bootstrap, root=workdir / "pipeline", logdir=workdir)
        if plan.pipeline
        else None
    )
    sampler: Sampler | None = None
    try:
        if pipeline is not None:  # reading before the writers write: a reader throughout, not after the fact
            pipeline.start()
        wait_for(lambda: current_leader(relays) is not None, 90)
        if pipeline is not None:
            wait_for(lambda: PIPELINE_RUNNING in pipeline.text() or not pipeline.alive, 240, "the pipeline's queries")
        writers = Writers(
            ends.pg_dsn, schema, outbox, topic, plan.keys, plan.rows, threads=3, rate_per_s=plan.rate, seed=plan.seed
        ).start()
        if history is not None:
            sampler = _sampler(history, writers, ends.pg_dsn, schema, outbox, plan.layout, pipeline).start()
        schedule = sorted(rng.uniform(0.15, 0.8) for _ in plan.faults)
        for at, kind in zip(schedule, plan.faults, strict=True):

            def reached(at: float = at) -> bool:
                return writers.stats.committed >= at * plan.rows or writers.done

            wait_for(reached, 600, poll=0.1)
            applier = _inject(
                kind, services, relays, applier, cfg, workdir, ends, topic, schema, result, faults, history, pipeline
            )
        writers.join()
        result.committed, result.rolled_back = writers.stats.committed, writers.stats.rolled_back
        truth = committed_versions(ends.pg_dsn, schema)
        expected = sum(truth.values())
        _wait_applied(ends.pg_dsn, schema, expected, timeout=120)
        time.sleep(1.5)  # late duplicates, if any, get the chance to show
        applied = applied_rows(ends.pg_dsn, schema)
        once = plan.mode == "sequenced"
        result.verdicts.append(
            verify("ReadCommittedIter -> Postgres", truth, [(k, v) for k, v, _, _ in applied], exactly_once=once)
        )
        if spark is not None:
            result.verdicts.append(_spark_verdict(spark, ends.kafka_bootstrap, topic, truth, once))
        if pipeline is not None:
            result.verdicts.append(_pipeline_verdict(pipeline, truth, once, result))
    finally:
        if sampler is not None:
            sampler.stop()
        if pipeline is not None:
            pipeline.kill()
        for relay in relays:
            relay.stop(10)
        if applier.poll() is None:
            applier.terminate()
            applier.wait(10)
    result.seconds = time.monotonic() - started
    if history is not None:
        history.run_ended(
            ok=result.ok,
            committed=result.committed,
            rolled_back=result.rolled_back,
            seconds=result.seconds,
            verdicts=[asdict(v) for v in result.verdicts],
            injected=result.injected,
            notes=result.notes,
        )
    return result


def _sampler(
    history: History,
    writers: Writers,
    dsn: str,
    schema: str,
    outbox: str,
    layout: str,
    pipeline: PipelineProcess | None = None,
) -> Sampler:
    """Samples rows committed by the writers, waiting in the outbox, in the consumer's table and in the
    pipeline's event table (its committed files)."""
    counts = TableCounts(dsn)
    readers: dict[str, Callable[[], int]] = {"ReadCommittedIter -> Postgres": lambda: counts.rows(schema, "applied")}
    if pipeline is not None:
        readers[PIPELINE_READER] = lambda: sum(f.rows for f in pipeline.committed_files())
    return history.sampler(
        committed=lambda: writers.stats.committed,
        backlog=lambda: counts.backlog(outbox, layout),
        readers=readers,
        on_stop=counts.close,
    )


def _pipeline_verdict(pipeline: PipelineProcess, truth: dict[str, int], once: bool, result: RunResult) -> Verdict:
    """The pipeline's table once it holds every committed version (or :data:`PIPELINE_CATCH_UP` has passed:
    the verdict then counts what is missing as lost); a driver that died on its own is started again, as
    its operator's supervisor would, and noted."""
    deadline = time.monotonic() + PIPELINE_CATCH_UP
    while True:
        verdict = table_verdict(pipeline, truth, exactly_once=once)
        if verdict.lost == 0 or time.monotonic() > deadline:
            break
        if not pipeline.alive:
            result.notes.append(f"the pipeline's driver had exited; started again (see {pipeline.log})")
            pipeline.start()
        time.sleep(2.0)
    time.sleep(1.5)  # late duplicates, if any, get the chance to show
    return table_verdict(pipeline, truth, exactly_once=once)


def _inject(
    kind: str,
    services: LocalServices,
    relays: list[RelayProcess],
    applier: subprocess.Popen[bytes],
    cfg: Path,
    workdir: Path,
    ends,
    topic: str,
    schema: str,
    result: RunResult,
    faults: str | None,
    history: History | None = None,
    pipeline: PipelineProcess | None = None,
) -> subprocess.Popen[bytes]:
    leader = current_leader(relays)
    began, notes_before = time.time(), len(result.notes)
    if kind == "kill_leader" and leader is not None:
        leader.kill()
        relays.append(RelayProcess(cfg, f"relay-{len(relays)}", workdir, faults=faults).start())
        result.notes.append(f"killed {leader.name}")
    elif kind == "pause_leader" and leader is not None:
        leader.pause()
        time.sleep(7.0)  # past the 2 s heartbeat timeout and the 6 s session timeout: a standby takes over
        leader.resume()  # the zombie wakes up and must be fenced
        result.notes.append(f"paused {leader.name} for 7s")
    elif kind == "broker_restart" and services.kafka is not None:
        services.kafka.stop()
        time.sleep(1.0)
        services.kafka.start()
        result.notes.append("restarted Kafka")
    elif kind == FAILOVER_KIND and services.replicated is not None:
        port = services.fail_over_postgres()
        result.notes.append(f"Postgres fail-over: primary killed, standby promoted (port {port}), new standby built")
    elif kind == "postgres_restart" and services.postgres is not None:
        services.postgres.stop("fast")
        time.sleep(1.0)
        services.postgres.start()
        result.notes.append("restarted Postgres")
    elif kind == "consumer_kill":
        applier.kill()
        applier.wait()
        applier = _start_applier(ends.pg_dsn, ends.kafka_bootstrap, topic, schema, workdir)
        result.notes.append("killed the consumer")
    elif kind in CLUSTER_FAULT_KINDS and services.cluster is not None:
        _cluster_fault(kind, services.cluster, topic, result)
    elif kind == PIPELINE_KILL and pipeline is not None:
        batches = pipeline.committed_batches()
        pipeline.kill()
        time.sleep(1.0)
        pipeline.start()
        result.notes.append(f"killed the pipeline's driver after {batches} micro-batches, restarted it")
    else:
        result.notes.append(f"skipped {kind} (not applicable)")
        return applier
    result.injected[kind] += 1
    if history is not None:
        detail = "; ".join(result.notes[notes_before:])
        history.fault(kind, _fault_target(kind, leader, detail), began, time.time(), detail)
    return applier


def _fault_target(kind: str, leader: RelayProcess | None, detail: str) -> str:
    """Who a fault hit, for the soak's timeline: a relay's name, a service, or the Kafka node(s) its note names."""
    if kind in ("kill_leader", "pause_leader") and leader is not None:
        return leader.name
    fixed = {
        "broker_restart": "Kafka",
        "postgres_restart": "Postgres",
        "consumer_kill": "consumer",
        PIPELINE_KILL: "pipeline",
        FAILOVER_KIND: "Postgres",
    }
    if kind in fixed:
        return fixed[kind]
    nodes = re.search(r"Kafka nodes? (\[[\d, ]+\]|\d+)", detail)
    return f"node {nodes.group(1).strip('[]')}" if nodes else detail[:40]


def _cluster_fault(kind: str, cluster: EmbeddedKafkaCluster, topic: str, result: RunResult) -> None:
    rng = random.Random(result.plan.seed * 100 + len(result.notes))
    if kind == "node_kill":
        victim = cluster.kill_partition_leader(topic, 0, down=2.0)
        result.notes.append(f"killed Kafka node {victim} (leader of partition 0), back after 2s")
    elif kind == "controller_kill":
        victim = cluster.kill_controller(down=2.0)
        result.notes.append(f"killed Kafka node {victim} (the active controller), back after 2s")
    elif kind == "rolling_bounce":  # an upgrade's restart: every node in turn, each back before the next goes
        for node in cluster.nodes:
            cluster.stop(node.node_id)
            time.sleep(1.0)
            cluster.start_node(node.node_id)
        result.notes.append(
            f"rolling bounce of Kafka nodes {[n.node_id for n in cluster.nodes]} (controlled shutdowns)"
        )
    elif kind == "node_bounce":
        victim = rng.choice([n.node_id for n in cluster.nodes])
        cluster.stop(victim)
        time.sleep(1.0)
        cluster.start_node(victim)
        result.notes.append(f"bounced Kafka node {victim} (controlled shutdown)")
    elif kind == "node_pause":
        victim = rng.choice([n.node_id for n in cluster.nodes])
        cluster.pause(victim)
        time.sleep(5.0)  # past the 3 s session timeout: fenced, its partitions led elsewhere
        cluster.resume(victim)
        result.notes.append(f"froze Kafka node {victim} for 5s")
    elif kind == "two_nodes_down":
        down = rng.sample([n.node_id for n in cluster.nodes], 2)
        for victim in down:
            cluster.kill(victim)
        time.sleep(6.0)
        cluster.start_node(*down)
        result.notes.append(f"killed Kafka nodes {down} (no quorum, no in-sync majority), back after 6s")
    elif kind in ("client_partition_drop", "client_partition_reject"):
        mode = kind.rsplit("_", 1)[1]
        victim = cluster.leader_of(topic, 0)
        cluster.partition_clients(victim, mode)
        try:
            time.sleep(CLIENT_PARTITION_SECONDS)
        finally:
            cluster.heal_clients(victim)
        result.notes.append(
            f"cut the clients off Kafka node {victim} (leader of partition 0; {mode}) for {CLIENT_PARTITION_SECONDS:.0f}s"
        )


def _start_applier(dsn: str, bootstrap: str, topic: str, schema: str, workdir: Path) -> subprocess.Popen[bytes]:
    with (workdir / "applier.log").open("a") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "harvest_outbox.harvest_local.applier",
                "--bootstrap",
                bootstrap,
                "--topic",
                topic,
                "--schema",
                schema,
            ],
            env={**os.environ, "HARVEST_DATA_SOURCE": dsn},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _wait_applied(dsn: str, schema: str, expected: int, timeout: float) -> None:
    last, since = -1, time.monotonic()
    while True:
        try:
            # distinct versions: an at-least-once run's repeats must not pass for rows still to come
            n = len({(key, version) for key, version, _, _ in applied_rows(dsn, schema)})
        except Exception:  # the database may still be recovering
            n = last
        if n >= expected:
            return
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since > timeout:
            log.warning("applier stalled at %d/%d rows", n, expected)
            return
        time.sleep(0.3)


def _spark_verdict(spark: Any, bootstrap: str, topic: str, truth: dict[str, int], exactly_once: bool) -> Verdict:
    import json

    from harvest_outbox.spark_reader import readCommitted

    rows = (
        readCommitted(spark, topic, {"kafka.bootstrap.servers": bootstrap})
        .select("partition", "offset", "ack_offset", "key", "value")
        .collect()
    )
    rows.sort(key=lambda r: (r.partition, r.ack_offset, r.offset))
    return verify(
        "Spark readCommitted",
        truth,
        [(bytes(r.key).decode(), int(json.loads(bytes(r.value))["version"])) for r in rows],
        exactly_once=exactly_once,
    )


def summary(results: list[RunResult]) -> str:
    injected: Counter[str] = Counter()
    for r in results:
        injected.update(r.injected)
    violations = sum(v.violations for r in results for v in r.verdicts)
    lines = [
        f"runs                 {len(results)} ({sum(r.ok for r in results)} clean)",
        f"rows committed       {sum(r.committed for r in results)} (+{sum(r.rolled_back for r in results)} rolled back)",
        "faults injected      " + (", ".join(f"{k}={v}" for k, v in sorted(injected.items())) or "none"),
        f"reader verdicts      {sum(len(r.verdicts) for r in results)}",
        f"violations           {violations} (lost + order + phantoms, + duplicates where exactly once)",
        f"wall time            {sum(r.seconds for r in results):.0f}s",
    ]
    for r in results:
        status = "OK  " if r.ok else "FAIL"
        detail = "; ".join(
            f"{v.reader}: lost={v.lost} dup={v.duplicates} order={v.order_violations} phantom={v.phantoms}"
            for v in r.verdicts
            if not v.ok
        )
        lines.append(
            f"  {status} seed={r.plan.seed} relays={r.plan.relays} p={r.plan.partitions} "
            f"{r.plan.election}/{r.plan.shards} {r.plan.mode} {r.plan.layout} "
            f"faults={','.join(r.plan.faults)} errors={r.plan.produce_error_rate} "
            f"rows={r.committed} {r.seconds:.0f}s {detail}"
        )
    return "\n".join(lines)
