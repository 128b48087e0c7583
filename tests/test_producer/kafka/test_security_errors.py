"""producer/kafka/security_errors.py: librdkafka's real texts (librdkafka 2.16, captured from the test
broker's SASL_SSL listener) explained with the setting to fix, never a secret."""

from __future__ import annotations

import pytest

from harvest_outbox.producer.kafka.acls import Acl
from harvest_outbox.producer.kafka.security_errors import (
    CERT_HAS_EXPIRED,
    HOSTNAME_MISMATCH,
    TlsFinding,
    broker_of,
    explain,
    missing_acl,
    principal_of,
)

PASSWORD = "pw-0123456789abcdef"
SETTINGS = {
    "bootstrap.servers": "127.0.0.1:51045",
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "relay",
    "sasl.password": PASSWORD,
    "ssl.ca.location": "/etc/kafka/ca.pem",
    "ssl.endpoint.identification.algorithm": "https",
}
VERIFY_FAILED = (
    "sasl_ssl://127.0.0.1:51045/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify "
    "failed: broker certificate could not be verified, verify that ssl.ca.location is correctly configured or root "
    "CA certificates are installed (install ca-certificates package) (after 8ms in state SSL_HANDSHAKE)"
)
BAD_PASSWORD = (
    "sasl_ssl://127.0.0.1:51045/bootstrap: SASL authentication error: Authentication failed during authentication "
    "due to invalid credentials with SASL mechanism SCRAM-SHA-512 (after 319ms in state AUTH_REQ)"
)
PLAINTEXT_PORT = (
    "sasl_ssl://127.0.0.1:37995/bootstrap: SSL handshake failed: Disconnected: SSL connection closed by peer: "
    "connecting to a PLAINTEXT broker listener? (after 7ms in state SSL_HANDSHAKE)"
)
NO_MECHANISM = (
    "sasl_ssl://127.0.0.1:51045/bootstrap: SASL PLAIN mechanism handshake failed: Broker: Unsupported SASL "
    "mechanism: broker's supported mechanisms: SCRAM-SHA-512,OAUTHBEARER (after 303ms in state AUTH_HANDSHAKE)"
)
HUNG_UP = (
    "127.0.0.1:51045/bootstrap: Disconnected: connection closed by peer: receive 0 after POLLIN (after 1ms in "
    "state APIVERSION_QUERY)"
)


@pytest.mark.parametrize(
    "name, text, settings, tls, wanted",
    [
        (
            "_SSL",
            VERIFY_FAILED,
            SETTINGS,
            TlsFinding(True, 19, "self-signed certificate in certificate chain"),
            "the Kafka broker's certificate at 127.0.0.1:51045 is not signed by the CA in "
            "ssl.ca.location=/etc/kafka/ca.pem (OpenSSL: self-signed certificate in certificate chain): set "
            "ssl.ca.location to the CA certificate that signed the broker's",
        ),
        (
            "_SSL",
            VERIFY_FAILED,
            SETTINGS,
            None,
            "is not signed by the CA in ssl.ca.location=/etc/kafka/ca.pem: set ssl.ca.location",
        ),
        (
            "_SSL",
            VERIFY_FAILED,
            {k: v for k, v in SETTINGS.items() if k != "ssl.ca.location"},
            None,
            "is not signed by a CA this host trusts (ssl.ca.location is not set)",
        ),
        (
            "_TRANSPORT",
            "sasl_ssl://127.0.0.1:50109/bootstrap: error:0A000086:SSL routines::certificate verify failed (after 1ms "
            "in state SSL_HANDSHAKE)",
            SETTINGS,
            TlsFinding(True, CERT_HAS_EXPIRED, "certificate has expired"),
            "the Kafka broker's certificate at 127.0.0.1:50109 has expired (OpenSSL: certificate has expired): renew "
            "it on the broker",
        ),
        (
            "_SSL",
            VERIFY_FAILED,
            SETTINGS,
            TlsFinding(True, HOSTNAME_MISMATCH, "Hostname mismatch, certificate is not valid for 'kafka-1'."),
            "does not name the host the client connected to (OpenSSL: Hostname mismatch, certificate is not valid "
            "for 'kafka-1'.): use a bootstrap.servers name the certificate carries",
        ),
        (
            "_AUTHENTICATION",
            BAD_PASSWORD,
            SETTINGS,
            None,
            "SASL authentication failed for user 'relay' with sasl.mechanism=SCRAM-SHA-512 at 127.0.0.1:51045: check "
            "sasl.username/sasl.password",
        ),
        (
            "_AUTHENTICATION",
            NO_MECHANISM,
            {**SETTINGS, "sasl.mechanism": "PLAIN"},
            None,
            "does not enable sasl.mechanism=PLAIN (it offers SCRAM-SHA-512,OAUTHBEARER): set sasl.mechanism to one",
        ),
        (
            "_TRANSPORT",
            PLAINTEXT_PORT,
            SETTINGS,
            None,
            "the Kafka listener at 127.0.0.1:37995 speaks plaintext, but security.protocol=SASL_SSL: connect to the "
            "broker's TLS listener",
        ),
        (
            "_TRANSPORT",
            HUNG_UP,
            {"bootstrap.servers": "127.0.0.1:51045"},
            TlsFinding(speaks_tls=True),
            "the Kafka listener at 127.0.0.1:51045 speaks TLS, but security.protocol=PLAINTEXT: the broker listener "
            "speaks SASL_SSL (or SSL): set security.protocol=SASL_SSL",
        ),
    ],
)
def test_real_texts_are_explained_with_the_fix_and_no_secret(
    name: str, text: str, settings: dict, tls: TlsFinding | None, wanted: str
) -> None:
    got = explain(name, text, settings, tls)
    assert got is not None and wanted in got, got
    assert PASSWORD not in got


@pytest.mark.parametrize(
    "name, text",
    [
        (
            "_TRANSPORT",
            "sasl_ssl://127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms in "
            "state CONNECT)",
        ),
        ("_ALL_BROKERS_DOWN", "1/1 brokers are down"),
        ("_TRANSPORT", HUNG_UP),  # a hang-up with no TLS behind it: a broker going away, say
        ("_TIMED_OUT", "Local: Timed out"),
    ],
)
def test_transient_errors_are_not_explained(name: str, text: str) -> None:
    assert explain(name, text, SETTINGS) is None
    assert explain(name, text, SETTINGS, TlsFinding(speaks_tls=True)) is None


def test_principal_and_broker_and_missing_acl() -> None:
    assert principal_of(SETTINGS) == "User:relay"
    assert principal_of({**SETTINGS, "sasl.mechanism": "OAUTHBEARER"}).startswith("the client's principal")
    assert principal_of({"sasl.username": "x"}).startswith("the client's principal")  # PLAINTEXT: no SASL
    assert broker_of(BAD_PASSWORD, SETTINGS) == "127.0.0.1:51045"
    assert broker_of("1/1 brokers are down", SETTINGS) == "127.0.0.1:51045"
    acl = Acl("relay", "User:relay", "TOPIC", "orders", "LITERAL", "WRITE", "it produces")
    text = missing_acl(acl, "TOPIC_AUTHORIZATION_FAILED")
    assert text.startswith(
        "TOPIC_AUTHORIZATION_FAILED: User:relay lacks WRITE on TOPIC 'orders' (it produces); grant it"
    )
    assert "--allow-principal User:relay --operation Write --topic orders" in text
