"""``python -m harvest_outbox.harvest_local check|up``: verify prerequisites, or run the services by hand."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from harvest_outbox.harvest_local import maven, prereqs
from harvest_outbox.harvest_local.errors import HarvestLocalError
from harvest_outbox.harvest_local.kafka_security import SaslListener, add_scram_user, grant_acls
from harvest_outbox.harvest_local.launcher import LocalServices


def check() -> None:
    from harvest_outbox import sequencer

    logging.getLogger(__name__).info("sequencer implementation: %s", sequencer.IMPLEMENTATION)
    prereqs.java()
    prereqs.postgres_bindir()
    maven.resolve("kafka")
    maven.resolve("spark")


def up(brokers: int = 1, secure: bool = False) -> None:
    with LocalServices(brokers, secure=secure) as services:
        print(f"HARVEST_PG_DSN='{services.endpoints.pg_dsn}'")
        print(f"HARVEST_KAFKA_BOOTSTRAP='{services.endpoints.kafka_bootstrap}'")
        if services.endpoints.kafka_sasl is not None:
            _print_sasl(services.endpoints.kafka_bootstrap, services.endpoints.kafka_sasl)
        print("# export these to point tests at these services; Ctrl-C stops them", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})


def _print_sasl(admin_bootstrap: str, sasl: SaslListener) -> None:
    """A SCRAM user allowed everything on the SASL_SSL listener, for trying a secured config by hand (the
    tests grant their principals exactly what each part needs: docs/security.md)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    user, password = "harvest", os.urandom(12).hex()
    add_scram_user(admin_bootstrap, user, password)
    every = [
        AclBinding(
            kind, name, ResourcePatternType.LITERAL, f"User:{user}", "*", AclOperation.ALL, AclPermissionType.ALLOW
        )
        for kind, name in (
            (ResourceType.TOPIC, "*"),
            (ResourceType.GROUP, "*"),
            (ResourceType.TRANSACTIONAL_ID, "*"),
            (ResourceType.BROKER, "kafka-cluster"),
        )
    ]
    grant_acls(admin_bootstrap, every)
    config = sasl.client_config(user, password)
    print(f"# SASL_SSL listener ({user!r} may do anything on it; the plain listener above is a super user's):")
    print("# baseKafkaConfig:")
    for key, value in config.items():
        print(f"#   {key}: {value}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harvest_outbox.harvest_local", description=__doc__)
    parser.add_argument("command", choices=["check", "up"])
    parser.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="Kafka nodes for up: 1 (default) or 3, a replicated cluster (RF 3, min.insync.replicas=2)",
    )
    parser.add_argument(
        "--secure",
        action="store_true",
        help="up: the broker also gets a SASL_SSL listener (SCRAM-SHA-512, OAUTHBEARER, ACLs) with a CA made at "
        "start-up, and a SCRAM user to try it with (docs/security.md)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        check() if args.command == "check" else up(args.brokers, args.secure)
    except HarvestLocalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
