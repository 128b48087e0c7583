"""A throw-away replicated KRaft Kafka cluster on loopback: three nodes, each broker and controller in one
JVM (issue #45).

Why combined nodes: a quorum of three controllers survives one lost node, as production's does, and a
broker kill is then also a controller kill (a controller fail-over whenever the active controller is
hit); split roles would take six JVMs on a two-core machine to show the same. Kafka advises split roles in
production for isolation, not for semantics: the replication protocol a client sees is the same.

What the cluster is set up to promise (what production uses and what issue #45's proofs assume):
topics and the internal ones (offsets, transaction state) replicated three times, ``min.insync.replicas=2``
(an ``acks=all`` write is acknowledged once two replicas have it: one node can be lost with no
acknowledged write lost, two down make producers wait on ``NOT_ENOUGH_REPLICAS``), unclean leader election
off (a replica that missed writes never becomes leader). The relay's producers always run ``acks=all``
with idempotence (producer/config/_kafka.py forces both), so nothing else needs setting on the client side.

Clients reach each node through its own loopback TCP proxy (:class:`harvest_local.netfault.NetFault`, on the
port the node's ``PROXIED`` listener advertises: :attr:`EmbeddedKafkaCluster.bootstrap`), while the nodes
replicate and vote over their own listeners directly. So :meth:`EmbeddedKafkaCluster.partition_clients` cuts
every client (relays, readers) off one node -- dropping its packets or rejecting its connections -- while the
cluster itself stays whole: the node keeps leading its partitions as far as the cluster knows, and clients
must wait or fail over on their own (the nasty case of a network partition between the relay and one broker).
A proxy rather than network namespaces: it needs no root (CI runs unprivileged) and does to the clients' TCP
connections what a partition does (held or reset), on the same loopback addresses. The harness's own admin
calls (:meth:`leader_of`, :meth:`in_sync`, readiness) use the direct listeners (:attr:`direct_bootstrap`).

Invariants (tests/test_e2e/test_cluster.py, tests/test_producer/cluster/test_kafka_cluster.py):
:meth:`EmbeddedKafkaCluster.start` returns once every node names all nodes as live brokers; a node killed or
stopped comes back on the same ports with its data (:meth:`EmbeddedKafkaCluster.start_node`); :meth:`leader_of`
answers from the cluster's own metadata, also while clients are cut off a node.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from harvest_outbox.harvest_local import kafka_dirs
from harvest_outbox.harvest_local.errors import ServiceError
from harvest_outbox.harvest_local.kafka import EmbeddedKafka, Replication, create_topic, new_cluster_id
from harvest_outbox.harvest_local.netfault import NetFault
from harvest_outbox.harvest_local.relays import wait_for
from harvest_outbox.harvest_local.workdir import free_port, work_dir

#: What the embedded cluster runs with (module doc).
CLUSTER_REPLICATION = Replication(factor=3, min_isr=2)
#: A dead node is fenced after 3 s without a heartbeat instead of Kafka's 9 s: leaders move sooner after a
#: kill -9, which keeps the fault tests short; it changes when, not what, the clients see.
CLUSTER_PROPERTIES = {"broker.heartbeat.interval.ms": "500", "broker.session.timeout.ms": "3000"}
#: How :meth:`EmbeddedKafkaCluster.partition_clients` cuts clients off a node: ``drop`` (packets vanish:
#: connections hang, new ones get no answer) or ``reject`` (every connection reset, new ones too).
PARTITION_MODES = ("drop", "reject")


class EmbeddedKafkaCluster:
    """``nodes`` KRaft nodes (ids 1..n) sharing one controller quorum; :attr:`bootstrap` names them all."""

    def __init__(self, nodes: int = 3, root: Path | None = None, heap: str = "512m") -> None:
        if nodes < 3:
            raise ValueError(f"a replicated cluster needs at least 3 nodes (min.insync.replicas=2 of 3), got {nodes}")
        self.root = root or work_dir() / f"kafka-cluster-{free_port()}-{os.getpid()}"
        self._claim: kafka_dirs.Claim | None = None  # the folder's lock, while this process owns it
        controller_ports = [free_port() for _ in range(nodes)]
        voters = ",".join(f"{i + 1}@127.0.0.1:{p}" for i, p in enumerate(controller_ports))
        cluster_id = new_cluster_id()
        self.replication = CLUSTER_REPLICATION
        self.nodes = [
            EmbeddedKafka(
                self.root / f"node-{i + 1}",
                heap=heap,
                node_id=i + 1,
                controller_port=controller_ports[i],
                voters=voters,
                cluster_id=cluster_id,
                replication=self.replication,
                properties=CLUSTER_PROPERTIES,
            )
            for i in range(nodes)
        ]
        #: node id -> the proxy its clients go through (to its PROXIED listener, on the port it advertises)
        self.proxies = {
            n.node_id: NetFault(
                ("127.0.0.1", n.proxied_listener_port), port=n.proxy_port, name=f"kafka-node-{n.node_id}"
            )
            for n in self.nodes
        }

    @property
    def bootstrap(self) -> str:
        """What clients use: every node through its proxy (module doc)."""
        return ",".join(n.proxied_bootstrap for n in self.nodes)

    @property
    def direct_bootstrap(self) -> str:
        """The nodes' own listeners, bypassing the proxies (for the harness's admin calls)."""
        return ",".join(n.bootstrap for n in self.nodes)

    def __repr__(self) -> str:
        return f"EmbeddedKafkaCluster(bootstrap={self.bootstrap!r}, root={str(self.root)!r})"

    def node(self, node_id: int) -> EmbeddedKafka:
        return self.nodes[node_id - 1]

    def start(self, timeout: float = 120.0) -> EmbeddedKafkaCluster:
        """Launch every node, then wait until each names all of them (no node is ready alone: a controller
        needs a majority of the quorum)."""
        if self._claim is None:  # (and sweep what killed runs left running)
            self._claim = kafka_dirs.take(self.root)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            for proxy in self.proxies.values():
                proxy.start()
            for n in self.nodes:
                n.launch()
            deadline = time.monotonic() + timeout
            for n in self.nodes:
                n.wait_ready(max(1.0, deadline - time.monotonic()), brokers=len(self.nodes))
        except BaseException:
            self.destroy()
            raise
        return self

    def kill(self, node_id: int) -> None:
        """SIGKILL one node (its broker and its controller)."""
        self.node(node_id).kill()

    def stop(self, node_id: int, timeout: float = 30.0) -> None:
        """A clean bounce's first half: controlled shutdown (leaders move first)."""
        self.node(node_id).stop(timeout)

    def start_node(self, *node_ids: int, timeout: float = 90.0) -> None:
        """Bring killed or stopped nodes back (same ports, same data), together (two of three down: neither
        is ready alone), and wait until each names all nodes as live brokers again."""
        for node_id in node_ids:
            if not self.node(node_id).alive:
                self.node(node_id).launch()
        for node_id in node_ids:
            self.node(node_id).wait_ready(timeout, brokers=len(self.nodes))

    def active_controller(self) -> int:
        """The node id of the active KRaft controller (the metadata quorum's leader), as the live nodes record
        it in their quorum state (the newest epoch wins; -1 while none is known, e.g. during an election).
        Clients cannot ask: a broker answers ``DescribeCluster`` with a random broker as "controller"."""
        best = (-1, -1)  # (epoch, leader)
        for n in self.nodes:
            if not n.alive:
                continue
            try:
                state = json.loads((n.data / "__cluster_metadata-0" / "quorum-state").read_text())
            except (OSError, ValueError):
                continue  # not written yet, or mid-write
            best = max(best, (int(state.get("leaderEpoch", -1)), int(state.get("leaderId", -1))))
        leader = best[1]
        return leader if leader > 0 and self.node(leader).alive else -1

    def kill_controller(self, down: float = 2.0) -> int:
        """kill -9 the node of the active controller (a controller fail-over: the quorum elects another), and
        bring it back after ``down`` seconds; returns its id."""
        try:
            wait_for(lambda: self.active_controller() > 0, 30, "an active KRaft controller", poll=0.2)
        except TimeoutError as exc:
            raise ServiceError("kafka", f"no active KRaft controller known: {exc}") from exc
        victim = self.active_controller()
        self.kill(victim)
        time.sleep(down)
        self.start_node(victim)
        return victim

    def kill_partition_leader(
        self, topic: str, partition: int = 0, down: float = 2.0, killed: Callable[[int], None] | None = None
    ) -> int:
        """kill -9 the node leading ``topic``'s ``partition`` (its broker and its controller: leaders, maybe
        the transaction coordinator and the active controller move), tell ``killed`` its id, and bring it
        back after ``down`` seconds; returns its id."""
        victim = self.leader_of(topic, partition)
        self.kill(victim)
        if killed is not None:
            killed(victim)
        time.sleep(down)
        self.start_node(victim)
        return victim

    def partition_clients(self, node_id: int, mode: str = "drop") -> None:
        """Cut every client off node ``node_id`` (``mode``: :data:`PARTITION_MODES`) until :meth:`heal_clients`;
        the node and its replication go on (module doc)."""
        if mode not in PARTITION_MODES:
            raise ValueError(f"partition mode {mode!r}: use one of {', '.join(PARTITION_MODES)}")
        proxy = self._proxy(node_id)
        if mode == "drop":
            proxy.blackhole()
        else:
            proxy.reset()

    def heal_clients(self, node_id: int) -> None:
        """Clients reach node ``node_id`` again (bytes a drop held are delivered, as after a healed link)."""
        self._proxy(node_id).heal()

    def pause(self, node_id: int) -> None:
        self.node(node_id).pause()

    def resume(self, node_id: int) -> None:
        self.node(node_id).resume()

    def alive(self) -> list[int]:
        return [n.node_id for n in self.nodes if n.alive]

    def leader_of(self, topic: str, partition: int = 0, timeout: float = 10.0) -> int:
        """The node id leading ``topic``'s ``partition`` now (-1: none, e.g. while an election runs)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self._live_bootstrap(), "log_level": 0})
        meta = admin.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None or partition not in meta.partitions:
            raise ServiceError("kafka", f"no metadata for {topic}[{partition}]: {None if meta is None else meta.error}")
        return int(meta.partitions[partition].leader)

    def in_sync(self, topic: str, timeout: float = 60.0) -> None:
        """Until every partition of ``topic`` has all replicas in sync again (after a node came back)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self._live_bootstrap(), "log_level": 0})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            meta = admin.list_topics(topic, timeout=5).topics.get(topic)
            if (
                meta is not None
                and meta.error is None
                and all(len(p.isrs) == len(p.replicas) and p.leader >= 0 for p in meta.partitions.values())
            ):
                return
            time.sleep(0.2)
        raise ServiceError("kafka", f"{topic}: replicas not back in sync after {timeout:.0f}s")

    def create_topic(
        self, name: str, partitions: int = 1, config: dict[str, str] | None = None, timeout: float = 30.0
    ) -> None:
        create_topic(self.direct_bootstrap, name, partitions, config, timeout)

    def destroy(self) -> None:
        for proxy in self.proxies.values():
            proxy.stop()
        for n in self.nodes:
            n.kill()
        shutil.rmtree(self.root, ignore_errors=True)
        if self._claim is not None:
            self._claim.release()
            self._claim = None

    def _proxy(self, node_id: int) -> NetFault:
        if node_id not in self.proxies:
            raise ValueError(f"node {node_id}: the cluster's nodes are {sorted(self.proxies)}")
        return self.proxies[node_id]

    def _live_bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes if n.alive) or self.direct_bootstrap
