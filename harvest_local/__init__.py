"""Real Postgres, Kafka and Spark on loopback, started by the project itself.

Used by the test suite, the demo (``harvest demo``) and the benchmarks. No Docker engine is
needed: Postgres comes from Debian's packages (``initdb``/``pg_ctl``), the Kafka broker from the
official Apache jars on Maven Central (``maven/kafka/pom.xml``), Spark from the pyspark wheel plus
its Kafka source from Maven Central (``maven/spark/pom.xml``).

Invariants:
- every service listens on 127.0.0.1 only, on a port found free at start;
- every file a service writes lives under the work folder (``.work/`` in a checkout, or
  ``$HARVEST_WORK_DIR``), and its log goes to a file there, never to our stdout; except, under
  root, Postgres's folder: its unprivileged server user may not reach the checkout, so the folder
  lives in a root-only run dir (:mod:`harvest_local.pgdirs`), linked from the work folder;
- a service that fails to become ready within its timeout is stopped and raises
  :class:`ServiceError` with the tail of its log.
"""

from harvest_outbox.harvest_local.errors import HarvestLocalError, PrerequisiteError, ServiceError
from harvest_outbox.harvest_local.kafka import EmbeddedKafka
from harvest_outbox.harvest_local.launcher import LocalServices, ServiceEndpoints
from harvest_outbox.harvest_local.postgres import EmbeddedPostgres
from harvest_outbox.harvest_local.workdir import work_dir

__all__ = [
    "EmbeddedKafka",
    "EmbeddedPostgres",
    "HarvestLocalError",
    "LocalServices",
    "PrerequisiteError",
    "ServiceEndpoints",
    "ServiceError",
    "work_dir",
]
