"""``python -m harvest_outbox.harvest_local.pipeline_local``: the streaming pipeline (:mod:`spark_reader.pipeline`)
on a local Spark with the connector jars from Maven (``--master local[N]`` or ``local-cluster[E,C,M]``), and with
``--embedded`` against the embedded services (Kafka from ``$HARVEST_KAFKA_BOOTSTRAP``, as ``./dev services``
prints it, or started here; the topic created if missing; the tables under ``.work/pipeline/<topic>``).

Dev tooling, as the rest of harvest_local: the library's own entry point (``python -m
harvest_outbox.spark_reader.pipeline``) takes its session from ``spark-submit`` and imports nothing of this
package (tests/test_foundation/test_reader_imports.py). The options are the library's, plus these two.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

from harvest_outbox.spark_reader.errors import ReaderConfigError
from harvest_outbox.spark_reader.pipeline import build_parser, config_from_args, configure_logging, run

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def session(master: str) -> SparkSession:
    """A local Spark session of ``master`` (local[N] or local-cluster[E,C,M]) with the connector jars."""
    from harvest_outbox.harvest_local import spark as local

    if master.startswith("local-cluster["):
        executors, cores, memory = (int(x) for x in master[len("local-cluster[") : -1].split(","))
        return local.cluster_spark_session("harvest-pipeline", executors, cores, memory)
    if master.startswith("local["):
        return local.local_spark_session("harvest-pipeline", cores=int(master[len("local[") : -1]))
    raise ReaderConfigError(f"--master {master!r}: pass local[N] or local-cluster[E,C,M] (or use spark-submit)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(prog="python -m harvest_outbox.harvest_local.pipeline_local")
    parser.add_argument(
        "--master",
        default="local[2]",
        help="local[N] (default local[2]) or local-cluster[E,C,M], with the connector jars from Maven",
    )
    parser.add_argument(
        "--embedded",
        action="store_true",
        help="against the embedded services: Kafka from $HARVEST_KAFKA_BOOTSTRAP (./dev services) or started here, "
        "the topic created if missing, tables under .work/pipeline/<topic>",
    )
    args = parser.parse_args(argv)
    configure_logging()
    services = None
    try:
        bootstrap, root = args.bootstrap, args.root
        if args.embedded:
            from harvest_outbox.harvest_local.kafka import create_topic
            from harvest_outbox.harvest_local.launcher import LocalServices
            from harvest_outbox.harvest_local.workdir import work_dir

            if bootstrap is None:
                services = LocalServices().start()
                bootstrap = services.endpoints.kafka_bootstrap
                log.info("embedded Kafka at %s", bootstrap)
            try:
                create_topic(bootstrap, args.topic, 4)
            except Exception as exc:  # it exists already: the usual case against ./dev services
                log.info("topic %s not created (%s)", args.topic, exc)
            root = root or str(work_dir() / "pipeline" / args.topic)
        if bootstrap is None:
            raise ReaderConfigError("--bootstrap: missing. Fix: pass the brokers, or --embedded")
        cfg = config_from_args(args, bootstrap, root)
        return run(session(args.master), cfg, max_restarts=args.max_restarts)
    except ReaderConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if services is not None:
            services.stop()


if __name__ == "__main__":
    sys.exit(main())
