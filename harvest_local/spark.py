"""Local SparkSessions whose Kafka source (spark-sql-kafka-0-10) comes from Maven Central.

Spark itself is the pyspark wheel. The connector's jars are resolved by ``maven/spark/pom.xml``;
jars whose artifact pyspark already ships (hadoop client, scala collections, codecs) are left out
so the classpath holds one version of each.

- :func:`local_spark_session`: ``local[N]``, driver and tasks in one JVM.
- :func:`cluster_spark_session`: ``local-cluster[E,C,M]``, a standalone master and E workers in
  the driver's JVM, each worker launching its executor as a separate JVM: tasks, their Python
  workers and the state stores live in other processes than the driver, as on a real cluster.
  What that takes (and what a real cluster's executors need in the same way):

  * ``SPARK_HOME`` with Spark's layout: workers launch executors with ``$SPARK_HOME/bin`` scripts'
    classpath (``$SPARK_HOME/jars``). The pyspark wheel is such a layout; it is used unless
    ``SPARK_HOME`` is set.
  * the connector jars on the executors: ``spark.jars`` (the same list as the driver's), which
    executors fetch from the driver when they start;
  * harvest importable by the executors' Python workers: they run ``PYSPARK_PYTHON`` (this
    interpreter, whose environment has harvest installed) and get ``PYTHONPATH`` with the
    project's root through ``spark.executorEnv.PYTHONPATH``, so a source checkout works too.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from harvest_outbox.harvest_local import maven, prereqs
from harvest_outbox.harvest_local.errors import ServiceError
from harvest_outbox.harvest_local.jvm import extra_options
from harvest_outbox.harvest_local.workdir import work_dir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOG_CONF = Path(__file__).resolve().parent / "conf" / "spark-log4j2.properties"
_VERSIONED = re.compile(r"^(?P<artifact>.+?)-\d[\w.\-]*\.jar$")


def connector_jars() -> list[Path]:
    import pyspark

    shipped = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [jar for jar in maven.resolve("spark") if _artifact(jar.name) not in shipped]


def local_spark_session(
    app_name: str = "harvest", cores: int = 2, extra_conf: dict[str, str] | None = None
) -> SparkSession:
    """``local[cores]``: one JVM."""
    return _session(f"local[{cores}]", app_name, max(2, cores * 2), extra_conf)


def cluster_spark_session(
    app_name: str = "harvest-cluster",
    executors: int = 2,
    cores: int = 1,
    memory_mb: int = 1024,
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    """``local-cluster[executors, cores, memory_mb]``: ``executors`` executor JVMs of ``cores`` cores
    and ``memory_mb`` MiB each, besides the driver's (see the module's docstring)."""
    for name, value in (("executors", executors), ("cores", cores), ("memory_mb", memory_mb)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: pass a positive int")
    root = Path(__file__).resolve().parents[1]
    conf = {
        "spark.executor.memory": f"{memory_mb}m",
        "spark.executorEnv.PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p),
        "spark.executorEnv.SPARK_LOCAL_IP": "127.0.0.1",
        **(extra_conf or {}),
    }
    session = _session(f"local-cluster[{executors},{cores},{memory_mb}]", app_name, max(2, executors * cores * 2), conf)
    _await_executors(session, executors, timeout_s=180.0)
    return session


def _await_executors(session: SparkSession, executors: int, timeout_s: float) -> None:
    """Executors register after the context starts; until they have, jobs run on fewer of them."""
    import time

    status = session.sparkContext._jsc.sc().getExecutorMemoryStatus  # block managers: the driver's + executors'
    deadline = time.monotonic() + timeout_s
    while (registered := status().size() - 1) < executors:
        if time.monotonic() > deadline:
            session.stop()
            raise ServiceError(
                "spark local-cluster",
                f"{registered} of {executors} executors registered within {timeout_s:.0f}s; "
                f"see the executor logs under {work_dir() / 'spark' / 'worker'} (too little memory for "
                f"{executors} executor JVMs?)",
            )
        time.sleep(0.5)


def _session(master: str, app_name: str, shuffle_partitions: int, extra_conf: dict[str, str] | None) -> SparkSession:
    prereqs.java()
    from pyspark.sql import SparkSession

    scratch = work_dir() / "spark"
    scratch.mkdir(parents=True, exist_ok=True)
    # Read by the driver's JVM when it starts (pyspark starts one per process, with the first
    # session): SPARK_HOME locates the launch scripts and jars of local-cluster executors, and
    # SPARK_WORKER_DIR keeps their work directories out of the installed pyspark package.
    import pyspark

    os.environ.setdefault("SPARK_HOME", str(Path(pyspark.__file__).resolve().parent))
    os.environ.setdefault("SPARK_WORKER_DIR", str(scratch / "worker"))
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", _python())
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", _python())
    jvm_options = extra_options()
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.jars", ",".join(str(j) for j in connector_jars()))
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.local.dir", str(scratch / "local"))
        .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
        .config(
            "spark.driver.extraJavaOptions",
            shlex.join(
                [f"-Dderby.system.home={scratch / 'derby'}", f"-Dlog4j2.configurationFile={_LOG_CONF}", *jvm_options]
            ),
        )
        .config("spark.sql.session.timeZone", "UTC")
    )
    if jvm_options:  # local-cluster's executors (local[N] runs its tasks in the driver)
        builder = builder.config("spark.executor.extraJavaOptions", shlex.join(jvm_options))
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def _artifact(filename: str) -> str:
    match = _VERSIONED.match(filename)
    return match.group("artifact") if match else filename


def _python() -> str:
    import sys

    return sys.executable
