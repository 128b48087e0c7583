"""Where a benchmark finds Postgres and Kafka: ``HARVEST_PG_DSN`` and ``HARVEST_KAFKA_BOOTSTRAP`` when both are
set (services of your own), else the embedded ones (:class:`harvest_local.LocalServices`), started now."""

from __future__ import annotations

import os
from typing import Any


def endpoints() -> tuple[Any, str, str]:
    """``(services, dsn, bootstrap)``: ``services`` is the embedded services started here (the caller stops
    them), or None when the variables named the endpoints."""
    dsn, bootstrap = os.environ.get("HARVEST_PG_DSN"), os.environ.get("HARVEST_KAFKA_BOOTSTRAP")
    if dsn and bootstrap:
        return None, dsn, bootstrap
    from harvest_outbox.harvest_local import LocalServices

    services = LocalServices().start()
    return services, services.endpoints.pg_dsn, services.endpoints.kafka_bootstrap
