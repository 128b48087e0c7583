"""Kafka ACLs for the tests' SASL principals, granted through the session broker's plain listener (its
principal is a super user: harvest_local/kafka_security.py)."""

from __future__ import annotations

from typing import Any

from confluent_kafka.admin import AclBinding, AclPermissionType

from harvest_outbox.harvest_local.kafka_security import grant_acls


def grant(bootstrap: str, principal: str, grants: list[tuple[Any, str, Any, list[Any]]]) -> None:
    """ALLOW ``principal`` (``User:<principal>``) each (resource type, name, pattern type, operations)."""
    acls = [
        AclBinding(kind, name, pattern, f"User:{principal}", "*", op, AclPermissionType.ALLOW)
        for kind, name, pattern, ops in grants
        for op in ops
    ]
    grant_acls(bootstrap, acls)
