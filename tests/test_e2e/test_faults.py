"""The fault-injection proof, short version (CI): whole-pipeline runs with faults, verified end to end.

Each plan combines faults; together they cover the kinds of the relays' world: kill -9 of the leader, a
paused leader (zombie), a Postgres restart, produce/delivery errors in the relays, consumer kills, and on a
replicated 3-node Kafka cluster (the session's, shared with tests/test_producer/cluster/) a partition
leader's node killed and the clients cut off a node (dropped packets). Two of three nodes down is
test_kafka_cluster.py's; Spark's readers under relay faults are test_pipeline.py's and the demo's. The
verifier checks the consumer's table against the committed versions in the database.
``scripts/soak.py`` runs many randomized plans, every fault kind among them.
"""

from __future__ import annotations

import pytest

from harvest_outbox.harvest_local import LocalServices
from harvest_outbox.harvest_local.faults import FaultPlan, RunResult, run_plan, summary
from harvest_outbox.harvest_local.history import FILE_NAME, History, read
from harvest_outbox.harvest_local.kafka_cluster import EmbeddedKafkaCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PLANS = [
    FaultPlan(
        seed=101,
        relays=3,
        rows=2500,
        keys=50,
        partitions=3,
        faults=("kill_leader", "consumer_kill", "postgres_restart"),
        produce_error_rate=0.02,
        delivery_error_rate=0.02,
    ),
    # outboxLayout: cursor (issue #37): a paused leader (a zombie whose commits the fence must refuse once a
    # standby took over) and a leader killed -9, with delivery errors, on the partitioned outbox (1,000-id
    # partitions retired as it goes); written slowly enough that both faults land while rows flow
    FaultPlan(
        seed=104,
        relays=2,
        rows=2000,
        keys=50,
        partitions=3,
        rate=200.0,
        faults=("pause_leader", "kill_leader"),
        produce_error_rate=0.02,
        delivery_error_rate=0.02,
        layout="cursor",
    ),
]


# on the replicated 3-node cluster (issue #45): a zombie relay, a partition leader's node killed (the single
# broker's restart is test_outages.py's broker_kill), and the clients cut off partition 0's leader, its packets
# dropped, while the cluster stays whole
CLUSTER_PLAN = FaultPlan(
    seed=102,
    relays=2,
    rows=2500,
    keys=20,
    partitions=4,
    rate=300.0,
    faults=("pause_leader", "node_kill", "client_partition_drop"),
    brokers=3,
)


@pytest.mark.parametrize(
    "plan", PLANS, ids=lambda p: "+".join(p.faults) + ("" if p.layout == "mark" else f"-{p.layout}")
)
def test_exactly_once_under_faults(plan: FaultPlan, services, tmp_path) -> None:
    history = History(tmp_path / FILE_NAME, plan.seed)
    _check(run_plan(services, plan, tmp_path, history=history), history, tmp_path)


def test_exactly_once_under_faults_on_a_replicated_cluster(
    services, kafka_cluster: EmbeddedKafkaCluster, tmp_path
) -> None:
    plan = CLUSTER_PLAN
    history = History(tmp_path / FILE_NAME, plan.seed)
    on_cluster = LocalServices.with_cluster(services, kafka_cluster)
    _check(run_plan(on_cluster, plan, tmp_path, history=history), history, tmp_path)


def _check(result: RunResult, history: History, tmp_path) -> None:
    plan = result.plan
    print("\n" + summary([result]))
    assert result.committed > 0
    assert sum(result.injected.values()) >= len(plan.faults), result.notes
    if plan.layout != "mark" or plan.brokers > 1:  # each fault, not only the error injection
        assert all(result.injected[f] for f in plan.faults), result.notes
    for verdict in result.verdicts:
        assert verdict.ok, f"{verdict} (faults: {result.notes}; logs in {tmp_path})"
    assert len(result.verdicts) == 1
    # the soak's history of the run (harvest_local/history.py): each fault injected with its target and
    # span, the consumer's progress sampled until it caught up, the verdict
    recorded = read(history.path)
    injected = {k: n for k, n in result.injected.items() if k != "produce_delivery_errors"}
    assert {k: sum(f.kind == k for f in recorded.faults) for k in injected} == injected
    assert all(f.target and recorded.started <= f.start <= f.end for f in recorded.faults)
    assert recorded.lag("ReadCommittedIter -> Postgres")[-1][1] == 0 and len(recorded.samples) >= 3
    assert recorded.end is not None and recorded.end["ok"] and recorded.end["committed"] == result.committed
