"""Pick and start the services a run needs: local launcher (default), named ones, or testcontainers.

Selection, in order:
1. ``HARVEST_PG_DSN`` / ``HARVEST_KAFKA_BOOTSTRAP``: use those existing services (each on its own);
2. ``HARVEST_TEST_SERVICES=testcontainers`` and a Docker engine answers: testcontainers' Postgres
   and Kafka modules;
3. otherwise the local launcher (:class:`EmbeddedPostgres`, or with ``standby=True`` a primary and its
   synchronous standby, :class:`~harvest_local.replicated_postgres.ReplicatedPostgres`, reached through a
   multi-host DSN; and :class:`EmbeddedKafka`, or with ``brokers=3`` the replicated
   :class:`~harvest_local.kafka_cluster.EmbeddedKafkaCluster`).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from harvest_outbox.harvest_local.errors import PrerequisiteError
from harvest_outbox.harvest_local.kafka import EmbeddedKafka
from harvest_outbox.harvest_local.kafka_cluster import EmbeddedKafkaCluster
from harvest_outbox.harvest_local.kafka_security import SaslListener
from harvest_outbox.harvest_local.postgres import EmbeddedPostgres
from harvest_outbox.harvest_local.replicated_postgres import ReplicatedPostgres
from harvest_outbox.harvest_local.workdir import work_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceEndpoints:
    pg_dsn: str
    kafka_bootstrap: str
    #: The broker's SASL_SSL listener (``LocalServices(secure=True)``): its address, CA and client settings.
    kafka_sasl: SaslListener | None = None

    def __repr__(self) -> str:
        return f"ServiceEndpoints(pg_dsn=<redacted>, kafka_bootstrap={self.kafka_bootstrap!r})"


class LocalServices(AbstractContextManager["LocalServices"]):
    """Postgres + Kafka for one run. ``postgres``/``kafka`` are set when this run owns them; ``brokers``: 1 (one
        combined node) or 3 and more (a replicated cluster: ``cluster``, ``kafka`` stays None). ``standby``: Postgres
        is a primary and a synchronous standby (``replicated``; ``postgres`` is its primary now, and follows it
        through :meth:`fail_over_postgres`). ``logical_replication``: the Postgres it starts runs ``wal_level = logical``
    (Debezium's slots; not with ``standby``). ``secure``: the broker also has a SASL_SSL listener (SCRAM-SHA-512,
        OAUTHBEARER, ACLs; :mod:`harvest_local.kafka_security`) with a CA and certificate made at start-up
        (``endpoints.kafka_sasl``); its plain listener stays open to every client, as a super user."""

    def __init__(
        self, brokers: int = 1, standby: bool = False, secure: bool = False, logical_replication: bool = False
    ) -> None:
        if brokers != 1 and brokers < 3:
            raise ValueError(f"brokers must be 1 or at least 3 (a replicated cluster), got {brokers}")
        if secure and brokers != 1:
            raise ValueError("secure=True: the SASL_SSL listener is on the single-node broker only; use brokers=1")
        if logical_replication and standby:
            raise ValueError("logical_replication=True: not with standby=True (the replicated pair is physical)")
        self.brokers = brokers
        self.standby = standby
        self.logical_replication = logical_replication
        self.secure = secure
        self.sasl: SaslListener | None = None
        self.postgres: EmbeddedPostgres | None = None
        self.replicated: ReplicatedPostgres | None = None
        self.kafka: EmbeddedKafka | None = None
        self.cluster: EmbeddedKafkaCluster | None = None
        self.mode = "local"
        self._containers: list[Any] = []
        self._endpoints: ServiceEndpoints | None = None
        self._borrowed = False  # with_cluster: the services belong to others, stop() leaves them be

    @property
    def endpoints(self) -> ServiceEndpoints:
        if self._endpoints is None:
            raise RuntimeError("LocalServices not started")
        return self._endpoints

    def start(self) -> LocalServices:
        pg_dsn = os.environ.get("HARVEST_PG_DSN")
        bootstrap = os.environ.get("HARVEST_KAFKA_BOOTSTRAP")
        want_containers = os.environ.get("HARVEST_TEST_SERVICES", "local") == "testcontainers"
        if want_containers and not (pg_dsn and bootstrap):
            if _docker_engine_answers():
                pg_dsn, bootstrap = self._start_containers(pg_dsn, bootstrap)
                self.mode = "testcontainers"
            else:
                log.warning(
                    "HARVEST_TEST_SERVICES=testcontainers but no Docker engine answers; using the local launcher"
                )
        started = time.monotonic()
        try:
            if not pg_dsn and self.standby:
                self.replicated = ReplicatedPostgres().start()
                self.postgres, pg_dsn = self.replicated.primary, self.replicated.dsn
            elif not pg_dsn:
                self.postgres = EmbeddedPostgres(logical_replication=self.logical_replication).start()
                pg_dsn = self.postgres.dsn
            if not bootstrap and self.brokers > 1:
                self.cluster = EmbeddedKafkaCluster(self.brokers).start()
                bootstrap = self.cluster.bootstrap
            elif not bootstrap:
                if self.secure:
                    try:
                        from harvest_outbox.harvest_local.tls import make_server_files
                    except ImportError as exc:
                        raise PrerequisiteError(
                            "the cryptography package (secure=True makes a CA and certificates)",
                            "pip install 'harvest-outbox[local]'",
                        ) from exc

                    tls = make_server_files(work_dir() / f"tls-{os.getpid()}-{time.monotonic_ns()}")
                    self.sasl = SaslListener(tls)
                self.kafka = EmbeddedKafka(sasl=self.sasl).start()
                bootstrap = self.kafka.bootstrap
        except BaseException:
            self.stop()
            raise
        if self.mode == "local" and (os.environ.get("HARVEST_PG_DSN") or os.environ.get("HARVEST_KAFKA_BOOTSTRAP")):
            self.mode = "existing" if not (self.postgres or self.kafka) else "mixed"
        log.info("services up in %.1fs (mode=%s, kafka=%s)", time.monotonic() - started, self.mode, bootstrap)
        self._endpoints = ServiceEndpoints(pg_dsn, bootstrap, self.sasl)
        return self

    @classmethod
    def with_cluster(cls, services: LocalServices, cluster: EmbeddedKafkaCluster) -> LocalServices:
        """``services``' Postgres with ``cluster`` for Kafka, both already running: for a run on a replicated
        cluster that shares a session's services instead of starting its own. Their owners stop them; this
        object's :meth:`stop` leaves them running."""
        shared = cls(brokers=len(cluster.nodes))
        shared.postgres, shared.replicated, shared.cluster = services.postgres, services.replicated, cluster
        shared.mode, shared._borrowed = services.mode, True
        shared._endpoints = ServiceEndpoints(services.endpoints.pg_dsn, cluster.bootstrap)
        return shared

    def fail_over_postgres(self) -> int:
        """Kill the primary and promote the standby, which gets a new standby (ReplicatedPostgres.failover);
        :attr:`endpoints` stay valid. Returns the new primary's port."""
        if self.replicated is None:
            raise RuntimeError("no standby to fail over to: start the services with LocalServices(standby=True)")
        port = self.replicated.failover()
        self.postgres = self.replicated.primary
        return port

    def stop(self) -> None:
        if self._borrowed:
            return
        postgres = self.replicated if self.replicated is not None else self.postgres
        for service in (self.kafka, self.cluster, postgres):
            if service is not None:
                try:
                    service.destroy()
                except Exception:  # shutting down: report, keep going
                    log.exception("stopping %r", service)
        if self.sasl is not None:
            shutil.rmtree(self.sasl.tls.ca.parent, ignore_errors=True)
        for container in self._containers:
            try:
                container.stop()
            except Exception:
                log.exception("stopping container %r", container)
        self._containers.clear()

    def __enter__(self) -> LocalServices:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _start_containers(self, pg_dsn: str | None, bootstrap: str | None) -> tuple[str, str]:
        try:
            from testcontainers.kafka import KafkaContainer
            from testcontainers.postgres import PostgresContainer
        except ImportError as exc:
            raise PrerequisiteError("the testcontainers package", "pip install -e '.[test]'") from exc
        if not pg_dsn:
            pg = PostgresContainer("postgres:16-alpine", driver=None)
            pg.start()
            self._containers.append(pg)
            pg_dsn = (
                f"host={pg.get_container_host_ip()} port={pg.get_exposed_port(5432)} "
                f"user={pg.username} password={pg.password} dbname={pg.dbname}"
            )
        if not bootstrap:
            kafka = KafkaContainer().with_kraft()
            kafka.with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
            kafka.start()
            self._containers.append(kafka)
            bootstrap = kafka.get_bootstrap_server()
        return pg_dsn, bootstrap


def _docker_engine_answers() -> bool:
    try:
        import docker  # testcontainers depends on it

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False
