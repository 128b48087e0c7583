"""What a Kafka TLS, SASL or authorization error means and what to change: librdkafka's texts turned into one
sentence naming the setting (or the ACL) to fix. The one owner of these explanations: the start-up check
(:mod:`producer.kafka.probe`), the preflight (:mod:`producer.ops.preflight`) and the relay's error paths
call it.

librdkafka says "certificate verify failed" alike for an unknown CA, an expired certificate and a host name
the certificate does not carry; the start-up check tells them apart with a handshake of its own
(:class:`TlsFinding`: OpenSSL's verify code) and hands it in here.

Invariants (``tests/test_producer/kafka/test_security_errors.py``, with librdkafka's real texts):
- every explanation names what to change (a setting with its current value, or the ACL with the
  ``kafka-acls.sh`` line granting it), and where (the broker's address);
- no explanation contains ``sasl.password`` or any other secret of the client's settings: only
  ``bootstrap.servers``, ``security.protocol``, ``sasl.mechanism``, ``sasl.username`` and
  ``ssl.ca.location`` are ever quoted;
- a text that is none of these (a broker down, a timeout) is not explained (None): the caller keeps its
  own handling of transient errors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harvest_outbox.producer.kafka.acls import Acl

#: OpenSSL's verify codes (X509_V_ERR_*) the explanations tell apart.
CERT_NOT_YET_VALID, CERT_HAS_EXPIRED = 9, 10
HOSTNAME_MISMATCH, IP_ADDRESS_MISMATCH = 62, 64

#: Kafka's authorization error codes (librdkafka's names): an ACL is missing, never a row's fault.
AUTHORIZATION_ERRORS = frozenset(
    {
        "TOPIC_AUTHORIZATION_FAILED",
        "GROUP_AUTHORIZATION_FAILED",
        "CLUSTER_AUTHORIZATION_FAILED",
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    }
)

# librdkafka prefixes a broker's errors with "sasl_ssl://host:port/id: " (or "host:port/id: " in plaintext)
_BROKER = re.compile(r"^(?:[a-z_]+://)?(\[[^\]]+\]:\d+|[^\s/:]+:\d+)/\S*: ")
_MECHANISMS = re.compile(r"supported mechanisms: ([A-Za-z0-9_,-]+)")


@dataclass(frozen=True)
class TlsFinding:
    """What a TLS handshake of our own with the broker's address found: whether it ``speaks_tls`` at all,
    and when the certificate failed verification OpenSSL's ``verify_code`` and ``verify_message``."""

    speaks_tls: bool
    verify_code: int | None = None
    verify_message: str = ""


def principal_of(settings: Mapping[str, Any]) -> str:
    """The Kafka principal ``settings`` authenticate as, as ACLs name it (``User:<sasl.username>`` for SCRAM
    and PLAIN), or a description when the broker decides it (OAUTHBEARER's token, a TLS certificate)."""
    mechanism = str(settings.get("sasl.mechanism", settings.get("sasl.mechanisms", "GSSAPI"))).upper()
    user = settings.get("sasl.username")
    if _protocol(settings).startswith("SASL") and user and (mechanism.startswith("SCRAM") or mechanism == "PLAIN"):
        return f"User:{user}"
    return "the client's principal (see the broker's principal.builder)"


def _protocol(settings: Mapping[str, Any]) -> str:
    return str(settings.get("security.protocol", "PLAINTEXT")).upper()


def broker_of(text: str, settings: Mapping[str, Any]) -> str:
    """The broker a librdkafka text is about, else the configured ``bootstrap.servers``."""
    match = _BROKER.match(text)
    return match.group(1) if match else str(settings.get("bootstrap.servers", "?"))


def explain(name: str, text: str, settings: Mapping[str, Any], tls: TlsFinding | None = None) -> str | None:
    """What the error ``name`` (librdkafka's code name: ``_SSL``, ``_AUTHENTICATION``, ``_TRANSPORT`` …) with
    message ``text`` means for a client of ``settings``, and the fix; None when it is none of the security
    errors (module doc). ``tls``: the start-up check's own handshake, when it made one."""
    at = broker_of(text, settings)
    protocol = _protocol(settings)
    if "certificate verify failed" in text or (tls is not None and tls.verify_code is not None):
        return _certificate(at, settings, tls)
    if "connecting to a PLAINTEXT broker listener" in text or (
        tls is not None and not tls.speaks_tls and "SSL" in protocol
    ):
        return (
            f"the Kafka listener at {at} speaks plaintext, but security.protocol={protocol}: connect to the broker's "
            f"TLS listener (its SASL_SSL port), or set security.protocol to what this listener expects "
            f"(PLAINTEXT or SASL_PLAINTEXT)"
        )
    if "Unsupported SASL mechanism" in text:
        offered = _MECHANISMS.search(text)
        return (
            f"the Kafka broker at {at} does not enable sasl.mechanism={settings.get('sasl.mechanism', '?')}"
            f"{f' (it offers {offered.group(1)})' if offered else ''}: set sasl.mechanism to one it offers"
        )
    if name in ("_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED") or "SASL authentication error" in text:
        user = settings.get("sasl.username")
        who = f"user {user!r}" if user else "the client (sasl.username is not set)"
        return (
            f"SASL authentication failed for {who} with sasl.mechanism={settings.get('sasl.mechanism', '?')} at "
            f"{at}: check sasl.username/sasl.password (the broker has no such user, or another password, for that "
            f"mechanism)"
        )
    if tls is not None and tls.speaks_tls and "SSL" not in protocol:
        return (
            f"the Kafka listener at {at} speaks TLS, but security.protocol={protocol}: the broker listener speaks "
            f"SASL_SSL (or SSL): set security.protocol=SASL_SSL, with sasl.mechanism, sasl.username, sasl.password "
            f"and ssl.ca.location (or SSL, for a listener without SASL)"
        )
    return None


def _certificate(at: str, settings: Mapping[str, Any], tls: TlsFinding | None) -> str:
    ca = settings.get("ssl.ca.location")
    trusted = f"the CA in ssl.ca.location={ca}" if ca else "a CA this host trusts (ssl.ca.location is not set)"
    code = tls.verify_code if tls is not None else None
    detail = f" (OpenSSL: {tls.verify_message})" if tls is not None and tls.verify_message else ""
    if code == CERT_HAS_EXPIRED:
        return (
            f"the Kafka broker's certificate at {at} has expired{detail}: renew it on the broker (its listener's "
            f"ssl.keystore), or check this host's clock"
        )
    if code == CERT_NOT_YET_VALID:
        return (
            f"the Kafka broker's certificate at {at} is not valid yet{detail}: check the clocks of this host and the CA"
        )
    if code in (HOSTNAME_MISMATCH, IP_ADDRESS_MISMATCH):
        return (
            f"the Kafka broker's certificate at {at} does not name the host the client connected to{detail}: use a "
            f"bootstrap.servers name the certificate carries, or reissue the certificate with it; keep "
            f"ssl.endpoint.identification.algorithm=https"
        )
    return (
        f"the Kafka broker's certificate at {at} is not signed by {trusted}{detail}: set ssl.ca.location to the "
        f"CA certificate that signed the broker's"
    )


def missing_acl(acl: Acl, code: str) -> str:
    """The broker refused ``acl``'s operation (``code``, e.g. TOPIC_AUTHORIZATION_FAILED): who lacks what,
    why it is needed and the command that grants it."""
    return (
        f"{code}: {acl.principal} lacks {acl.describe()} ({acl.why}); grant it: {acl.command()} "
        f"(`harvest acls` prints every ACL the relay needs)"
    )
