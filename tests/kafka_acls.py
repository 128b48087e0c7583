"""SASL principals of the tests and their Kafka ACLs, granted through the session broker's plain listener (its
principal is a super user: harvest_local/kafka_security.py)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from confluent_kafka.admin import AclBinding, AclPermissionType

from harvest_outbox.harvest_local.kafka_security import add_scram_user, grant_acls

if TYPE_CHECKING:
    from harvest_outbox.harvest_local.kafka import EmbeddedKafka
    from harvest_outbox.producer.kafka.acls import Acl


def grant(bootstrap: str, principal: str, grants: list[tuple[Any, str, Any, list[Any]]]) -> None:
    """ALLOW ``principal`` (``User:<principal>``) each (resource type, name, pattern type, operations)."""
    acls = [
        AclBinding(kind, name, pattern, f"User:{principal}", "*", op, AclPermissionType.ALLOW)
        for kind, name, pattern, ops in grants
        for op in ops
    ]
    grant_acls(bootstrap, acls)


class Principal:
    """A SCRAM user on a broker's SASL_SSL listener (``kafka.sasl``), and the librdkafka settings it logs in
    with (``client``: the relay config's ``baseKafkaConfig``, a reader's config)."""

    def __init__(self, kafka: EmbeddedKafka, prefix: str = "relay") -> None:
        assert kafka.sasl is not None, "the broker has no SASL_SSL listener (EmbeddedKafka(sasl=...))"
        self.user, self.password = f"{prefix}-{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}"
        self.name = f"User:{self.user}"
        self.kafka = kafka
        add_scram_user(kafka.bootstrap, self.user, self.password)
        self.client = kafka.sasl.client_config(self.user, self.password)

    def grant(self, acls: list[Acl]) -> None:
        """Create ``acls`` (producer/kafka/acls.py's) and wait until the broker's authorizer holds them."""
        grant_acls(self.kafka.bootstrap, [a.binding() for a in acls])
