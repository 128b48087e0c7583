"""``python -m harvest_outbox.harvest_local check|up``: verify prerequisites, or run the services by hand."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from harvest_outbox.harvest_local import maven, prereqs
from harvest_outbox.harvest_local.errors import HarvestLocalError
from harvest_outbox.harvest_local.launcher import LocalServices


def check() -> None:
    from harvest_outbox import sequencer

    logging.getLogger(__name__).info("sequencer implementation: %s", sequencer.IMPLEMENTATION)
    prereqs.java()
    prereqs.postgres_bindir()
    maven.resolve("kafka")
    maven.resolve("spark")


def up(brokers: int = 1) -> None:
    with LocalServices(brokers) as services:
        print(f"HARVEST_PG_DSN='{services.endpoints.pg_dsn}'")
        print(f"HARVEST_KAFKA_BOOTSTRAP='{services.endpoints.kafka_bootstrap}'")
        print("# export these to point tests at these services; Ctrl-C stops them", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harvest_outbox.harvest_local", description=__doc__)
    parser.add_argument("command", choices=["check", "up"])
    parser.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="Kafka nodes for up: 1 (default) or 3, a replicated cluster (RF 3, min.insync.replicas=2)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        check() if args.command == "check" else up(args.brokers)
    except HarvestLocalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
