"""A local SparkSession whose Kafka source (spark-sql-kafka-0-10) comes from Maven Central.

Spark itself is the pyspark wheel. The connector's jars are resolved by ``maven/spark/pom.xml``;
jars whose artifact pyspark already ships (hadoop client, scala collections, codecs) are left out
so the classpath holds one version of each.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from harvest_local import maven, prereqs
from harvest_local.workdir import work_dir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOG_CONF = Path(__file__).resolve().parent / "conf" / "spark-log4j2.properties"
_VERSIONED = re.compile(r"^(?P<artifact>.+?)-\d[\w.\-]*\.jar$")


def connector_jars() -> list[Path]:
    import pyspark

    shipped = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [jar for jar in maven.resolve("spark") if _artifact(jar.name) not in shipped]


def local_spark_session(app_name: str = "harvest", cores: int = 2, extra_conf: dict[str, str] | None = None) -> SparkSession:
    prereqs.java()
    from pyspark.sql import SparkSession

    scratch = work_dir() / "spark"
    scratch.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", _python())
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", _python())
    builder = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.jars", ",".join(str(j) for j in connector_jars()))
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(max(2, cores * 2)))
        .config("spark.local.dir", str(scratch / "local"))
        .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
        .config("spark.driver.extraJavaOptions",
                f"-Dderby.system.home={scratch / 'derby'} -Dlog4j2.configurationFile={_LOG_CONF}")
        .config("spark.sql.session.timeZone", "UTC")
    )
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
