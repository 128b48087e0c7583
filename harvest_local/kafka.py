"""A throw-away single-node KRaft Kafka broker (combined broker + controller) on loopback.

The broker is the official Apache Kafka server from Maven Central (``maven/kafka/pom.xml``, version
pinned there), run with the machine's Java 17. Auto topic creation is off: callers create topics.

Besides its plain listener (:attr:`EmbeddedKafka.bootstrap`) the broker has a second one,
``PROXIED``, that advertises :attr:`EmbeddedKafka.proxied_bootstrap` — an address nobody listens on
until a test puts a :class:`harvest_local.netfault.NetFault` there (``NetFault(("127.0.0.1",
kafka.proxied_listener_port), port=kafka.proxy_port)``). A client bootstrapped through the proxy
is told, in every metadata response, to reach the broker through the proxy again, so all its
traffic crosses it (a proxy in front of the plain listener would be bypassed after the first
metadata response).
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from harvest_outbox.harvest_local import kafka_dirs, maven, prereqs
from harvest_outbox.harvest_local.child_process import kill_child, stop_child
from harvest_outbox.harvest_local.errors import ServiceError
from harvest_outbox.harvest_local.jvm import extra_options
from harvest_outbox.harvest_local.kafka_security import LISTENER, SaslListener
from harvest_outbox.harvest_local.workdir import free_port, tail, work_dir

log = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parent / "conf"
#: Files the broker and its tools create: owner only.
UMASK = 0o077


@dataclass(frozen=True)
class Replication:
    """The replication settings of a node's internal topics and its topics' defaults: one node holds one
    copy; a cluster (:mod:`harvest_local.kafka_cluster`) holds ``factor`` copies and acknowledges an
    ``acks=all`` write once ``min_isr`` have it (unclean leader election is off either way)."""

    factor: int = 1
    min_isr: int = 1


class EmbeddedKafka:
    """One KRaft node (broker and controller in one process). Alone, it is its own quorum; a cluster gives
    each node its ``node_id``, the shared ``voters`` (``id@host:port,...``), ``cluster_id`` and replication."""

    def __init__(
        self,
        root: Path | None = None,
        port: int | None = None,
        heap: str = "768m",
        *,
        node_id: int = 1,
        controller_port: int | None = None,
        voters: str | None = None,
        cluster_id: str | None = None,
        replication: Replication = Replication(),
        properties: dict[str, str] | None = None,
        sasl: SaslListener | None = None,
    ) -> None:
        self.port = port or free_port()
        self.sasl = sasl  # a SASL_SSL listener besides the plain ones (harvest_local.kafka_security)
        self.controller_port = controller_port or free_port()
        self.node_id = node_id
        self.voters = voters or f"{node_id}@127.0.0.1:{self.controller_port}"
        self.cluster_id = cluster_id
        self.replication = replication
        self.properties = dict(properties or {})  # over the defaults below
        self.proxied_listener_port = free_port()  # the broker's PROXIED listener
        self.proxy_port = free_port()  # what PROXIED advertises: where a test's proxy listens
        self.root = root or work_dir() / f"kafka-{self.port}-{os.getpid()}"
        self.data = self.root / "data"
        self.heap = heap
        self._proc: subprocess.Popen[bytes] | None = None
        self._claim: kafka_dirs.Claim | None = None  # the folder's lock, while this process owns it
        self._java = prereqs.java()
        self._classpath = os.pathsep.join(str(j) for j in maven.resolve("kafka"))

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def proxied_bootstrap(self) -> str:
        """Bootstrap through the test proxy (only reachable while one runs on :attr:`proxy_port`)."""
        return f"127.0.0.1:{self.proxy_port}"

    def pause(self) -> None:
        """SIGSTOP the broker (a frozen broker, for fault tests); :meth:`resume` continues it."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)

    @property
    def log_file(self) -> Path:
        return self.root / "server.log"

    def __repr__(self) -> str:
        return f"EmbeddedKafka(bootstrap={self.bootstrap!r}, root={str(self.root)!r})"

    def start(self, timeout: float = 90.0) -> EmbeddedKafka:
        self.launch()
        self.wait_ready(timeout)
        return self

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def launch(self) -> None:
        """Format the data folder if new and start the JVM, without waiting (a cluster's nodes are launched
        together: none is ready before a majority of the controllers runs)."""
        # The broker's data (every message of every test topic) and logs are this user's only: the
        # directory is 0700 and the JVM and its tools run with umask 077, so the files they create
        # are 0600 / 0700 (Kafka's own defaults follow the umask, usually 022: world-readable).
        if self._claim is None:  # (and sweep what killed runs left running)
            self._claim = kafka_dirs.take(self.root)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.root.chmod(0o700)  # also when an earlier run created it with another mode
        props = self.root / "server.properties"
        if not props.exists():
            props.touch(mode=0o600)
            props.write_text(self._properties())
        if not (self.data / "meta.properties").exists():  # not formatted yet (or a format failed)
            cluster_id = self.cluster_id or new_cluster_id()
            # "=" form: a base64 id may start with "-", which the tool would parse as an option.
            self._java_run("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", f"--config={props}")
        with open(os.open(self.root / "stdout.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as out:
            self._proc = subprocess.Popen(
                [*self._jvm(), "kafka.Kafka", str(props)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.root,
                umask=UMASK,
                start_new_session=True,  # a Ctrl-C in the terminal is ours to handle, not the broker's
            )

    def stop(self, timeout: float = 30.0) -> None:
        """Controlled shutdown, keeping the data (``start()`` brings it back on the same port)."""
        proc, self._proc = self._proc, None
        stop_child(proc, timeout)

    def kill(self) -> None:
        """SIGKILL the broker (a crash, for fault tests); ``start()`` recovers."""
        proc, self._proc = self._proc, None
        kill_child(proc)

    def destroy(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)
        if self._claim is not None:
            self._claim.release()
            self._claim = None

    def create_topic(
        self, name: str, partitions: int = 1, config: dict[str, str] | None = None, timeout: float = 30.0
    ) -> None:
        create_topic(self.bootstrap, name, partitions, config, timeout)

    # -- internals -----------------------------------------------------------------------------

    def _jvm(self) -> list[str]:
        return [
            self._java,
            "-Xms256m",
            f"-Xmx{self.heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dkafka.logs.dir={self.root}",
            f"-Dlog4j2.configurationFile={CONF_DIR / 'log4j2.properties'}",
            *extra_options(),  # last: a -D of HARVEST_JVM_OPTS overrides ours (bench_latency's request log)
            "-cp",
            self._classpath,
        ]

    def _java_run(self, main: str, *args: str) -> None:
        proc = subprocess.run([*self._jvm(), main, *args], capture_output=True, text=True, cwd=self.root, umask=UMASK)
        if proc.returncode != 0:
            # A JVM failure is a stack trace: its first lines name the exception and its message, the
            # last ones are frames nobody needs.
            output = (proc.stderr + proc.stdout).strip()
            head = "\n".join(line for line in output.splitlines() if not line.lstrip().startswith("at "))
            raise ServiceError("kafka", f"{main} {args[0]} failed (exit {proc.returncode}): {head[:1500]}")

    def _properties(self) -> str:
        r = self.replication
        listeners = f"PLAINTEXT://127.0.0.1:{self.port},PROXIED://127.0.0.1:{self.proxied_listener_port}"
        advertised = f"PLAINTEXT://127.0.0.1:{self.port},PROXIED://127.0.0.1:{self.proxy_port}"
        protocols = "PLAINTEXT:PLAINTEXT,PROXIED:PLAINTEXT,CONTROLLER:PLAINTEXT"
        secure: dict[str, str] = {}
        if self.sasl is not None:
            listeners += f",{LISTENER}://{self.sasl.bootstrap}"
            advertised += f",{LISTENER}://{self.sasl.bootstrap}"
            protocols += f",{LISTENER}:SASL_SSL"
            secure = self.sasl.broker_properties()
        lines = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.voters,
            "listeners": f"{listeners},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": advertised,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": protocols,
            "log.dirs": str(self.data),
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            "default.replication.factor": str(r.factor),
            "min.insync.replicas": str(r.min_isr),
            "unclean.leader.election.enable": "false",
            "offsets.topic.replication.factor": str(r.factor),
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": str(r.factor),
            "transaction.state.log.min.isr": str(r.min_isr),
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": str(r.factor),
            "share.coordinator.state.topic.min.isr": str(r.min_isr),
            "group.initial.rebalance.delay.ms": "0",
            "num.network.threads": "2",
            "num.io.threads": "4",
            "log.retention.hours": "-1",
            "message.max.bytes": "1048588",
            **secure,
            **self.properties,
        }
        return "".join(f"{k}={v}\n" for k, v in lines.items())

    def wait_ready(self, timeout: float, brokers: int = 1) -> None:
        """Until this node answers metadata naming ``brokers`` live brokers (a cluster's: all of them)."""
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        last = ""
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise ServiceError(
                    "kafka",
                    f"broker exited with code {self._proc.returncode}",
                    tail(self.log_file) or tail(self.root / "stdout.log"),
                )
            try:
                meta = admin.list_topics(timeout=2)
                if len(meta.brokers) >= brokers:
                    return
            except Exception as exc:  # KafkaException while the broker is starting
                last = str(exc)
            time.sleep(0.3)
        self.kill()
        raise ServiceError(
            "kafka", f"not ready after {timeout:.0f}s ({last})", tail(self.log_file) or tail(self.root / "stdout.log")
        )


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def create_topic(
    bootstrap: str, name: str, partitions: int = 1, config: dict[str, str] | None = None, timeout: float = 30.0
) -> None:
    """Create a topic and wait until its partitions have leaders (auto-creation is off)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    # replication -1: the brokers' default.replication.factor (1 on one node, 3 on the embedded cluster)
    futures = admin.create_topics([NewTopic(name, partitions, -1, config=config or {})], request_timeout=timeout)
    futures[name].result(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        topic = admin.list_topics(name, timeout=5).topics.get(name)
        if (
            topic
            and topic.error is None
            and len(topic.partitions) == partitions
            and all(p.leader >= 0 for p in topic.partitions.values())
        ):
            return
        time.sleep(0.1)
    raise ServiceError("kafka", f"topic {name!r} has no leaders after {timeout:.0f}s")


def count_records(bootstrap: str, topics: list[str], timeout: float = 10.0) -> int:
    """Records the ``topics`` hold now (high minus low watermark, summed); a topic that does not
    exist yet holds none (a Connect worker creates its topics on the first record), nor does a
    partition whose leader is still being elected (the moments after creation)."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    not_ready = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART}

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"harvest-count-{uuid.uuid4()}"})
    try:
        total = 0
        for topic in topics:
            meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
            if meta is None or meta.error is not None:
                continue
            for partition in meta.partitions:
                try:
                    low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)
                except KafkaException as exc:
                    if exc.args[0].code() not in not_ready:
                        raise
                    continue
                total += high - low
        return total
    finally:
        consumer.close()


@dataclass(frozen=True)
class ReadRecord:
    """A record as :func:`read_to_end` returns it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def topic_ends(bootstrap: str, topics: list[str]) -> dict[str, int]:
    """Each non-empty partition's high watermark now, by journal name (``topic/partition``): what a
    ``ReadCommittedIter``'s checkpoint must read through to have read the topics to their end."""
    from confluent_kafka import Consumer, TopicPartition

    from harvest_outbox.sequencer import journal_name

    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": f"harvest-ends-{uuid.uuid4()}", "log_level": 0})
    ends: dict[str, int] = {}
    try:
        for topic in topics:
            for p in probe.list_topics(topic, timeout=10).topics[topic].partitions:
                lo, hi = probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                if hi > lo:
                    ends[journal_name(topic, p)] = hi
    finally:
        probe.close()
    return ends


def read_to_end(bootstrap: str, topics: list[str], timeout: float = 60.0) -> list[ReadRecord]:
    """Every record of ``topics`` (all partitions, read-uncommitted) up to the high watermarks taken
    when it starts, in partition then offset order. Raises TimeoutError if the end is not reached in
    ``timeout`` seconds (a short read must not pass for a whole one)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"harvest-read-{uuid.uuid4()}", "enable.auto.commit": False}
    )
    try:
        meta = consumer.list_topics(timeout=10).topics
        parts = [TopicPartition(t, p, 0) for t in topics for p in meta[t].partitions]
        ends = {(tp.topic, tp.partition): consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts}
        consumer.assign(parts)
        at = {k: 0 for k in ends}
        out: list[ReadRecord] = []
        deadline = time.monotonic() + timeout
        while any(at[k] < ends[k] for k in ends):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topics}: at {at} of {ends} after {timeout:.0f}s")
            for msg in consumer.consume(1000, 0.5):
                if msg.error() is not None:
                    continue
                topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
                assert topic is not None and partition is not None and offset is not None  # a consumed record's
                at[(topic, partition)] = offset + 1
                # (a consumed record's headers are a list of (str, bytes | None): the type allows more)
                headers: list[tuple[str, bytes | None]] = list(msg.headers() or [])  # type: ignore[arg-type]
                out.append(ReadRecord(topic, partition, offset, msg.key(), msg.value(), headers))
        return sorted(out, key=lambda r: (r.topic, r.partition, r.offset))
    finally:
        consumer.close()
