"""Where it is honest to lose (issue #45 item 4): an unclean leader election on the replicated cluster.

The guarantees table assumes unclean leader election off (docs/reliability.md "Replicated Kafka
clusters"). This test breaks that assumption on purpose and checks that the loss is *reported*, not
hidden: the relay committed rows in Postgres (deleted from the outbox, harvest transactions committed in
Kafka, acknowledged by the one in-sync replica), then the only replica holding them dies and a replica that
missed them is elected leader. The read-committed reader then lacks them, and the verifier
(:func:`harvest_local.verify.verify` over what a final ``ReadCommittedIter`` delivers) counts each one as
lost. The same sequence with unclean election off loses nothing: the partition waits offline for the
replica that holds the rows.

The sequence, on a topic of one partition replicated on nodes 1 and 2 (node 3 keeps the controller
quorum), ``min.insync.replicas=1`` so the writes are acknowledged while node 2 is down:

1. rows relayed while both replicas run (they survive either way);
2. node 2 stopped (controlled shutdown: it leaves the ISR); more rows relayed, held by node 1 only;
3. node 1 killed -9; node 2 started (nodes 2 and 3 are the quorum);
4. unclean on: node 2 becomes leader, the rows of step 2 are gone (node 1 truncates to node 2's log when
   it comes back). Unclean off: no leader until node 1 is back, then everything is there.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from relaylib import fault_config, outbox_backlog
from seqcheck import Expected, read_intents, wait_for, write_traffic
from sequenced_log import read_committed_to_end

from harvest_outbox.harvest_local.errors import ServiceError
from harvest_outbox.harvest_local.kafka_cluster import EmbeddedKafkaCluster
from harvest_outbox.harvest_local.verify import Verdict, render, verify
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HOLDER, LAGGARD = 1, 2  # the topic's replicas; node 3 only votes


@pytest.fixture
def cluster(kafka_cluster: EmbeddedKafkaCluster) -> EmbeddedKafkaCluster:
    return kafka_cluster  # the session's (tests/conftest.py)


def _create_topic(cluster: EmbeddedKafkaCluster, topic: str, unclean: bool) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    config = {"min.insync.replicas": "1", "unclean.leader.election.enable": str(unclean).lower()}
    new = NewTopic(topic, num_partitions=1, replica_assignment=[[HOLDER, LAGGARD]], config=config)
    admin.create_topics([new])[topic].result(30)
    wait_for(lambda: _leader(cluster, topic) == HOLDER, 30, f"{topic}'s leader on node {HOLDER}")


def _leader(cluster: EmbeddedKafkaCluster, topic: str) -> int | None:
    """The partition's leader (-1: none), None while the metadata does not know the topic yet."""
    try:
        return cluster.leader_of(topic)
    except ServiceError:
        return None


def _relay_rows(pg_dsn: str, table: str, topic: str, exp: Expected, writer: int, names: OutboxNames) -> None:
    """Commit rows and wait until the relay has delivered them and confirmed their ACKs (so no record of
    theirs is still to be written when a node goes down)."""
    write_traffic(pg_dsn, table, topic, exp, writer, txs=25, keys=10, max_batch=6)
    wait_for(lambda: outbox_backlog(pg_dsn, names, "mark") == 0, 60, "the outbox relayed")
    wait_for(lambda: not read_intents(pg_dsn, table), 60, "ACK intents confirmed")


def _final_read(bootstrap: str, topic: str, exp: Expected) -> Verdict:
    """What a final read-committed reader delivers, as the verifier's (key, version): a row's version is
    its place in its key's commit order."""
    version = {value: (key, i + 1) for key, values in exp.by_key.items() for i, value in enumerate(values)}
    delivered: list[tuple[str, int]] = []
    for msg in read_committed_to_end({"bootstrap.servers": bootstrap}, [topic]):
        value = msg.value
        assert value is not None and value not in exp.rolled_back, f"rolled-back row delivered: {value!r}"
        delivered.append(version.get(value, ("?", 0)))
    truth = {key: len(values) for key, values in exp.by_key.items()}
    return verify("final ReadCommittedIter", truth, delivered)


@pytest.mark.parametrize("unclean", [True, False], ids=["unclean-on-loss-reported", "unclean-off-nothing-lost"])
def test_an_unclean_election_loses_committed_rows_and_the_verifier_reports_them(
    unclean: bool,
    cluster: EmbeddedKafkaCluster,
    pg_dsn: str,
    pg_schema: str,
    unique_name: Callable[[str], str],
) -> None:
    topic = unique_name("t")
    _create_topic(cluster, topic, unclean)
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table)
    exp = Expected()
    relay = Harvest(fault_config(pg_dsn, cluster.bootstrap, table, unique_name("g"), sequenced=True), lambda e: None)
    relay.start()
    try:
        _relay_rows(pg_dsn, table, topic, exp, 0, names)
        replicated = exp.total
        cluster.stop(LAGGARD)
        _relay_rows(pg_dsn, table, topic, exp, 1, names)  # acknowledged by node 1 alone
        held_by_one = exp.total - replicated
    finally:
        relay.stop()
        relay.wait(30)
    assert replicated > 20 and held_by_one > 20

    cluster.kill(HOLDER)
    cluster.node(LAGGARD).launch()
    cluster.node(LAGGARD).wait_ready(90, brokers=2)
    if unclean:
        wait_for(lambda: _leader(cluster, topic) == LAGGARD, 60, "the unclean election of the laggard")
    else:
        time.sleep(5)  # past the 3 s broker session: an election would have happened by now
        assert cluster.leader_of(topic) == -1, "a replica that missed writes became leader with unclean election off"
    cluster.start_node(HOLDER)
    cluster.in_sync(topic)

    verdict = _final_read(cluster.bootstrap, topic, exp)
    print("\n" + render([verdict]))
    assert verdict.duplicates == verdict.order_violations == verdict.phantoms == 0, verdict
    if unclean:
        # Every row held by node 1 alone is reported lost, none of those that both replicas held.
        assert verdict.lost == held_by_one, render([verdict])
        assert verdict.delivered == replicated
    else:
        assert verdict.ok and verdict.delivered == exp.total, render([verdict])
