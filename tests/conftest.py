"""Shared fixtures: real services started once per test run, isolated per test.

- ``services`` (session): Postgres + Kafka from :mod:`harvest_local` (the local launcher by default;
  ``HARVEST_PG_DSN`` / ``HARVEST_KAFKA_BOOTSTRAP`` name existing ones;
  ``HARVEST_TEST_SERVICES=testcontainers`` uses Docker when an engine answers). Started lazily, so a
  run of pure-logic tests starts nothing.
- ``spark`` (session): a local SparkSession with Spark's Kafka source.
- Isolation: ``topic_factory`` makes uniquely named topics; ``pg_schema`` a fresh schema per test
  (dropped afterwards); ``unique_name`` a short unique identifier.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from harvest_local import LocalServices

# librdkafka's connection-closed chatter is noise in test logs.
logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def services() -> Iterator[LocalServices]:
    from harvest_local import LocalServices

    with LocalServices() as running:
        yield running


@pytest.fixture(scope="session")
def pg_dsn(services: LocalServices) -> str:
    return services.endpoints.pg_dsn


@pytest.fixture(scope="session")
def kafka_bootstrap(services: LocalServices) -> str:
    return services.endpoints.kafka_bootstrap


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from harvest_local.spark import local_spark_session

    session = local_spark_session("harvest-tests")
    yield session
    session.stop()


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
    from harvest_local.kafka import create_topic

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
