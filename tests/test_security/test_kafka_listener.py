"""harvest_local/kafka_security.py on the session broker: SCRAM and OAUTHBEARER over verified TLS, ACLs
enforced for SASL principals, the plain listener left a super user's."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from harvest_outbox.harvest_local.kafka import EmbeddedKafka
from harvest_outbox.harvest_local.kafka_security import add_scram_user, grant_acls, unsecured_jwt

pytestmark = pytest.mark.integration


def _deliver(config: dict, topic: str, timeout: float = 30.0) -> list:
    reports: list = []
    producer = Producer({**config, "acks": "all", "message.timeout.ms": int(timeout * 1000 * 0.8)})
    producer.produce(topic, b"v", on_delivery=lambda err, _msg: reports.append(err))
    assert producer.flush(timeout) == 0
    return reports


def test_scram_and_oauthbearer_principals_get_what_acls_grant(secure_kafka: EmbeddedKafka) -> None:
    sasl = secure_kafka.sasl
    assert sasl is not None
    allowed, denied = f"sec-allowed-{uuid.uuid4().hex[:6]}", f"sec-denied-{uuid.uuid4().hex[:6]}"
    for topic in (allowed, denied):
        secure_kafka.create_topic(topic)
    user, password = f"u{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    add_scram_user(secure_kafka.bootstrap, user, password)
    acls = [
        AclBinding(
            ResourceType.TOPIC, allowed, ResourcePatternType.LITERAL, f"User:{p}", "*", op, AclPermissionType.ALLOW
        )
        for p in (user, "oauth-" + user)
        for op in (AclOperation.WRITE, AclOperation.DESCRIBE)
    ]
    grant_acls(secure_kafka.bootstrap, acls)

    assert _deliver(sasl.client_config(user, password), allowed) == [None]
    [err] = _deliver(sasl.client_config(user, password), denied, timeout=10.0)
    assert err is not None and "TOPIC_AUTHORIZATION_FAILED" in err.name()
    oauth = {**sasl.oauth_client_config(), "oauth_cb": lambda _cfg: unsecured_jwt("oauth-" + user, 60)}
    assert _deliver(oauth, allowed) == [None]
