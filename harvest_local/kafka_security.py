"""A SASL_SSL listener for the embedded broker: TLS with a certificate made at start-up, SCRAM-SHA-512
users and OAUTHBEARER with Kafka's unsecured-JWT validator (for tests: it checks a token's claims and
expiry, not a signature), and ACLs enforced by KRaft's ``StandardAuthorizer``.

Invariants (``tests/test_local/test_kafka_security.py``):

1. The broker's plain listeners are untouched: their principal is ``User:ANONYMOUS``, a super user, so
   every test and tool that talks plaintext keeps working; the SASL_SSL listener's principals get only
   what ACLs grant them (``allow.everyone.if.no.acl.found=false``).
2. A client of the SASL_SSL listener verifies the broker's certificate and host name
   (:meth:`SaslListener.client_config` sets ``ssl.endpoint.identification.algorithm=https`` and the CA).
3. An OAUTHBEARER session lasts no longer than its token (``connections.max.reauth.ms`` is set): a client
   whose token expires without a refresh is disconnected, so token rotation is really exercised.
4. Passwords never appear in a repr.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harvest_outbox.harvest_local.workdir import free_port

if TYPE_CHECKING:  # tls.py needs cryptography (the local extra); the broker runs without it
    from confluent_kafka.admin import AclBinding

    from harvest_outbox.harvest_local.tls import TlsFiles

#: The listener's name in the broker's config (Kafka lower-cases it in ``listener.name.<name>.``).
LISTENER = "SASL_SSL"
SCRAM = "SCRAM-SHA-512"
OAUTHBEARER = "OAUTHBEARER"
#: The longest an authenticated session lives before the client must re-authenticate (invariant 3);
#: an OAUTHBEARER session ends earlier, when its token expires.
MAX_REAUTH_MS = 60_000


@dataclass(frozen=True)
class SaslListener:
    """Where the SASL_SSL listener listens and the certificate it serves."""

    tls: TlsFiles
    port: int = field(default_factory=free_port)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def broker_properties(self) -> dict[str, str]:
        """What :class:`harvest_local.kafka.EmbeddedKafka` adds to its config (listeners are merged there)."""
        prefix = f"listener.name.{LISTENER.lower()}."
        return {
            "sasl.enabled.mechanisms": f"{SCRAM},{OAUTHBEARER}",
            f"{prefix}ssl.keystore.type": "PEM",
            f"{prefix}ssl.keystore.location": str(self.tls.keystore),
            f"{prefix}ssl.client.auth": "none",
            f"{prefix}scram-sha-512.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            # No server callback handler: Kafka's default for OAUTHBEARER is the unsecured validator.
            f"{prefix}oauthbearer.sasl.jaas.config": (
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
                'unsecuredLoginStringClaim_sub="broker";'
            ),
            f"{prefix}connections.max.reauth.ms": str(MAX_REAUTH_MS),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:ANONYMOUS",
            "allow.everyone.if.no.acl.found": "false",
        }

    def client_config(self, user: str, password: str, mechanism: str = SCRAM) -> dict[str, Any]:
        """librdkafka settings for ``user`` on this listener, verifying the broker (invariant 2)."""
        return {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": password,
            "ssl.ca.location": str(self.tls.ca),
            "ssl.endpoint.identification.algorithm": "https",
        }

    def oauth_client_config(self) -> dict[str, Any]:
        """librdkafka settings for OAUTHBEARER on this listener; the caller adds the token (``oauth_cb``)."""
        return {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": OAUTHBEARER,
            "ssl.ca.location": str(self.tls.ca),
            "ssl.endpoint.identification.algorithm": "https",
        }


def add_scram_user(bootstrap: str, user: str, password: str, timeout: float = 30.0) -> None:
    """Create (or reset) SCRAM-SHA-512 credentials for ``user``, through the plain listener
    (``bootstrap``: its principal is a super user)."""
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    upsert = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), password.encode()
    )
    for future in admin.alter_user_scram_credentials([upsert], request_timeout=timeout).values():
        future.result(timeout)


def grant_acls(bootstrap: str, bindings: list[AclBinding], timeout: float = 30.0) -> None:
    """Create ``bindings`` through the plain listener (``bootstrap``: a super user's) and wait until the
    authorizer holds them: the controller commits an ACL before every broker's authorizer has applied it, and a
    client that connects in between is refused."""
    import time

    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})  # kept: its futures die with it
    for future in admin.create_acls(bindings).values():
        future.result(timeout)
    deadline = time.monotonic() + timeout
    for principal in sorted({b.principal for b in bindings}):
        # None matches any resource name and host (confluent-kafka's documented filter); its stubs say str.
        anything: Any = None
        mine = AclBindingFilter(
            ResourceType.ANY,
            anything,
            ResourcePatternType.ANY,
            principal,
            anything,
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
        want = {b for b in bindings if b.principal == principal}
        while not want <= set(admin.describe_acls(mine).result(timeout)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the broker's authorizer did not hold the ACLs of {principal} after {timeout:.0f}s")
            time.sleep(0.05)


def unsecured_jwt(subject: str, lifetime_s: float, now: float | None = None) -> tuple[str, float]:
    """An unsigned JWT (``alg: none``) for Kafka's unsecured OAUTHBEARER validator, and its expiry (epoch
    seconds): the pair confluent-kafka's ``oauth_cb`` returns."""
    import base64
    import json
    import time

    issued = time.time() if now is None else now
    expires = issued + lifetime_s

    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj, separators=(",", ":")).encode()).rstrip(b"=").decode()

    token = f"{part({'alg': 'none'})}.{part({'sub': subject, 'iat': int(issued), 'exp': int(expires)})}."
    return token, expires


#: The principal of :func:`reader_token`'s tokens (``User:<this>`` in ACLs).
READER_SUBJECT = "harvest-oauth-reader"


def reader_token() -> tuple[str, float]:
    """A one-minute :func:`unsecured_jwt` for :data:`READER_SUBJECT`: a token provider of no arguments that a
    Spark reader names in a string option (``kafka.oauth_cb``), importable in every Python worker."""
    return unsecured_jwt(READER_SUBJECT, 60)
