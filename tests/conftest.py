"""Shared fixtures: real services started once per test run (per worker: ``./dev test`` runs two
pytest-xdist workers, grouped by :mod:`xdist_groups`), isolated per test.

- ``services`` (session): Postgres + Kafka from :mod:`harvest_local` (the local launcher by default;
  ``HARVEST_PG_DSN`` / ``HARVEST_KAFKA_BOOTSTRAP`` name existing ones;
  ``HARVEST_TEST_SERVICES=testcontainers`` uses Docker when an engine answers). Started lazily, so a
  run of pure-logic tests starts nothing. ``logical_pg_dsn`` (session): a second Postgres with
  ``wal_level = logical``, for the tests that run Debezium; ``two_phase_pg_dsn`` (session): one with
  ``max_prepared_transactions`` > 0, for two-phase-commit writers. ``schema_registry`` (session): an
  Apicurio Registry (Confluent-compatible API), for the schema-registry tests. ``secure_pg`` (session): a
  Postgres that takes TCP over verified TLS only (``EmbeddedPostgres(tls=...)``), for the tests that ask. ``kafka_cluster``: a
  replicated 3-node Kafka cluster, started for the tests that use it and stopped after the last of them.
- ``spark``: a ``local[2]`` SparkSession with Spark's Kafka source; ``spark_cluster``: a
  ``local-cluster[2,1,1024]`` one (two executor JVMs besides the driver); ``spark_any``: each of
  the two, for the handful of reader tests that run on both. pyspark allows one SparkContext per
  process, so the sessions take turns (each started once per switch): tests marked ``cluster``
  run after all others, so a run switches once.
- Isolation: ``topic_factory`` makes uniquely named topics; ``pg_schema`` a fresh schema per test
  (dropped afterwards); ``unique_name`` a short unique identifier.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
import xdist_groups

from harvest_outbox.harvest_local import jvm

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from harvest_outbox.harvest_local import LocalServices
    from harvest_outbox.harvest_local.kafka import EmbeddedKafka
    from harvest_outbox.harvest_local.kafka_cluster import EmbeddedKafkaCluster
    from harvest_outbox.harvest_local.postgres import EmbeddedPostgres
    from harvest_outbox.harvest_local.registry import EmbeddedRegistry

# librdkafka's connection-closed chatter is noise in test logs.
logging.getLogger("py4j").setLevel(logging.WARNING)

# Every JVM the suite starts (Kafka nodes, Spark, Debezium, the registry) on the JIT's first tier: about half
# the CPU to start and to run a test's short work, where three workers' services share two cores; the
# benchmarks leave it unset (harvest_local/jvm.py). Set before any service starts.
os.environ.setdefault(jvm.VARIABLE, "-XX:TieredStopAtLevel=1")


@pytest.fixture(scope="session")
def services() -> Iterator[LocalServices]:
    from harvest_outbox.harvest_local import LocalServices

    with LocalServices(secure=True) as running:
        yield running


class _ClusterWhileNeeded:
    """The worker's replicated 3-node KRaft cluster (harvest_local/kafka_cluster.py): started by the first test
    that asks, stopped after the last of a run of tests asking (the tests using it share a worker and run one
    after another: tests/xdist_groups.py), started again should a later one ask. Idle, its three nodes take
    ~0.15 of a core, which the rest of the suite's run would otherwise pay for."""

    def __init__(self) -> None:
        self.running: EmbeddedKafkaCluster | None = None

    def get(self) -> EmbeddedKafkaCluster:
        if self.running is None:
            from harvest_outbox.harvest_local.kafka_cluster import EmbeddedKafkaCluster

            self.running = EmbeddedKafkaCluster().start()
        return self.running

    def stop(self) -> None:
        if self.running is not None:
            running, self.running = self.running, None
            running.destroy()


_CLUSTER = _ClusterWhileNeeded()


@pytest.fixture
def kafka_cluster() -> EmbeddedKafkaCluster:
    """The replicated 3-node cluster (:class:`_ClusterWhileNeeded`). Each test leaves every node running."""
    return _CLUSTER.get()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the item's own teardown: stop the cluster when the next test does not use it."""
    try:
        return (yield)
    finally:
        if "kafka_cluster" in getattr(item, "fixturenames", ()) and (
            nextitem is None or "kafka_cluster" not in getattr(nextitem, "fixturenames", ())
        ):
            _CLUSTER.stop()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _CLUSTER.stop()


@pytest.fixture(scope="session")
def pg_dsn(services: LocalServices) -> str:
    return services.endpoints.pg_dsn


@pytest.fixture(scope="session")
def kafka_bootstrap(services: LocalServices) -> str:
    return services.endpoints.kafka_bootstrap


@pytest.fixture(scope="session")
def secure_kafka(services: LocalServices) -> Iterator[EmbeddedKafka]:
    """A broker with a SASL_SSL listener (``.sasl``: SCRAM-SHA-512 and OAUTHBEARER over verified TLS, ACLs on;
    harvest_local/kafka_security.py) besides its plain one (``.bootstrap``: a super user's, for admin work).
    The session's broker when we started it; when ``HARVEST_KAFKA_BOOTSTRAP`` names a broker of the user's,
    one of our own, for the tests that ask."""
    if services.kafka is not None and services.kafka.sasl is not None:
        yield services.kafka
        return
    from harvest_outbox.harvest_local.kafka import EmbeddedKafka as Broker
    from harvest_outbox.harvest_local.kafka_security import SaslListener
    from harvest_outbox.harvest_local.tls import make_server_files
    from harvest_outbox.harvest_local.workdir import work_dir

    tls = make_server_files(work_dir() / f"tls-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    own = Broker(sasl=SaslListener(tls)).start()
    try:
        yield own
    finally:
        own.destroy()


@pytest.fixture(scope="session")
def secure_pg() -> Iterator[EmbeddedPostgres]:
    """A Postgres of our own that takes TCP over verified TLS only (hostssl, scram-sha-256; ``.dsn`` has
    ``sslmode=verify-full sslrootcert=<.tls.ca>``, ``.socket_dsn`` is the superuser's trusted socket), started
    only for the tests that ask; ``.serve_certificate`` swaps its certificate (give ``.tls`` back after)."""
    import shutil

    from harvest_outbox.harvest_local.postgres import EmbeddedPostgres as Server
    from harvest_outbox.harvest_local.tls import make_server_files
    from harvest_outbox.harvest_local.workdir import work_dir

    folder = work_dir() / f"pgtls-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    server = Server(tls=make_server_files(folder)).start()
    try:
        yield server
    finally:
        server.destroy()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def logical_pg_dsn() -> Iterator[str]:
    """A Postgres with ``wal_level = logical`` (Debezium's replication slots), started only for the
    tests that ask; ``HARVEST_PG_DSN`` is used instead when that server already runs with it."""
    import os

    import psycopg

    from harvest_outbox.harvest_local import EmbeddedPostgres

    existing = os.environ.get("HARVEST_PG_DSN")
    if existing:
        with psycopg.connect(existing) as conn:
            if conn.execute("SHOW wal_level").fetchone() == ("logical",):
                yield existing
                return
    server = EmbeddedPostgres(logical_replication=True).start()
    try:
        yield server.dsn
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def two_phase_pg_dsn() -> Iterator[str]:
    """A Postgres with ``max_prepared_transactions = 10`` (two-phase-commit writers: PREPARE TRANSACTION),
    started only for the tests that ask; ``HARVEST_PG_DSN`` is used instead when that server allows them."""
    import os

    import psycopg

    from harvest_outbox.harvest_local import EmbeddedPostgres

    existing = os.environ.get("HARVEST_PG_DSN")
    if existing:
        with psycopg.connect(existing) as conn:
            if int(conn.execute("SHOW max_prepared_transactions").fetchone()[0]) > 0:  # type: ignore[index]
                yield existing
                return
    server = EmbeddedPostgres(max_prepared_transactions=10).start()
    try:
        yield server.dsn
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[EmbeddedRegistry]:
    """A real Apicurio Registry (in-memory, Confluent-compatible API at ``.url``), started only for
    the tests that ask; the first run builds it from Maven Central (~2 min). Tests that stop it
    (registry outages) ``start()`` it again before they end, and it comes back empty."""
    from harvest_outbox.harvest_local.registry import EmbeddedRegistry

    registry = EmbeddedRegistry().start()
    try:
        yield registry
    finally:
        registry.destroy()


class _SparkSessions:
    """The process's one SparkContext: a ``local`` or a ``cluster`` session, switched on demand."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.session: SparkSession | None = None

    def get(self, kind: str) -> SparkSession:
        if self.kind != kind:
            from harvest_outbox.harvest_local.spark import cluster_spark_session, local_spark_session

            self.stop()
            self.session = (
                local_spark_session("harvest-tests")
                if kind == "local"
                else cluster_spark_session("harvest-tests-cluster")
            )
            self.kind = kind
        assert self.session is not None
        return self.session

    def stop(self) -> None:
        if self.session is not None:
            self.session.stop()
        self.kind, self.session = None, None


@pytest.fixture(scope="session")
def _spark_sessions() -> Iterator[_SparkSessions]:
    sessions = _SparkSessions()
    yield sessions
    sessions.stop()


@pytest.fixture
def spark(_spark_sessions: _SparkSessions) -> SparkSession:
    return _spark_sessions.get("local")


@pytest.fixture
def spark_cluster(_spark_sessions: _SparkSessions) -> SparkSession:
    return _spark_sessions.get("cluster")


@pytest.fixture(params=["local", pytest.param("cluster", marks=pytest.mark.cluster)])
def spark_any(request: pytest.FixtureRequest, _spark_sessions: _SparkSessions) -> SparkSession:
    return _spark_sessions.get(request.param)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``cluster`` last (stable otherwise): one switch of the SparkContext per run.
    On a pytest-xdist worker (``./dev test`` runs two) also grouped and ordered (:mod:`xdist_groups`)."""
    items.sort(key=lambda item: item.get_closest_marker("cluster") is not None)
    xdist_groups.write_groups(config, items)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    xdist_groups.configure_node(node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    return xdist_groups.make_scheduler(config, log)


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """``unique_name("orders")`` -> ``orders_<test>_<random>``: safe as topic, table or schema name."""
    test = "".join(ch if ch.isalnum() else "_" for ch in request.node.name)[:30].strip("_").lower()

    def make(prefix: str) -> str:
        return f"{prefix}_{test}_{uuid.uuid4().hex[:8]}"

    return make


@pytest.fixture
def topic_factory(kafka_bootstrap: str, unique_name: Callable[[str], str]) -> Callable[..., str]:
    """``topic_factory(partitions=1, prefix="t", config=None)`` creates a fresh topic, returns its name."""
    from harvest_outbox.harvest_local.kafka import create_topic

    def make(partitions: int = 1, prefix: str = "t", config: dict[str, str] | None = None) -> str:
        name = unique_name(prefix)
        create_topic(kafka_bootstrap, name, partitions, config)
        return name

    return make


@pytest.fixture
def pg_schema(pg_dsn: str, unique_name: Callable[[str], str]) -> Iterator[str]:
    """A fresh, empty schema for this test; dropped (cascade) afterwards."""
    import psycopg
    from psycopg import sql

    name = unique_name("s")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    yield name
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
