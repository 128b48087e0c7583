"""producer/db/connect_errors.py and cert_probe.py without Postgres: libpq's own words for each TLS and password
failure become a message naming what is wrong and the setting that fixes it (libpq's words kept, no secret);
``certificate verify failed`` is told apart by what OpenSSL says of the server's certificate (a TLS server
in a thread answers the probe as Postgres does). On a real server: tests/test_security/test_postgres_tls.py."""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from harvest_outbox.harvest_local.tls import make_server_files
from harvest_outbox.harvest_local.workdir import free_port
from harvest_outbox.producer.db import cert_probe
from harvest_outbox.producer.db.connect_errors import PostgresConnectError, certificate_failure, explain
from harvest_outbox.producer.errors import DatabaseError

SECRET = "hunter2-Secret"
DSN = f"host=db.example port=5432 user=relay password={SECRET} dbname=app sslmode=verify-full sslrootcert=/etc/ca.pem"
AT = 'connection failed: connection to server at "db.example" (10.0.0.5), port 5432 failed: '
NO_ROOT = (
    'root certificate file "/home/app/.postgresql/root.crt" does not exist\nEither provide the file, use the '
    "system's trusted roots with sslrootcert=system, or change sslmode to disable server certificate verification."
)


@pytest.mark.parametrize(
    ("libpq", "dsn", "says"),
    [
        (
            'FATAL:  password authentication failed for user "relay"',
            DSN,
            "password authentication failed for user 'relay': check the password (the DSN's, the passfile's, or "
            "what dataSourcePasswordCommand / dataSourcePasswordProvider gives)",
        ),
        (
            'FATAL:  pg_hba.conf rejects connection for host "10.0.0.9", user "relay", database "app", no encryption',
            DSN.replace("verify-full", "disable"),
            "the server accepts TLS connections only (pg_hba hostssl) and this connection was plaintext "
            "(sslmode=disable): set sslmode=verify-full with sslrootcert=",
        ),
        (
            'FATAL:  no pg_hba.conf entry for host "10.0.0.9", user "relay", database "app", no encryption',
            DSN.replace("verify-full", "allow"),
            "the server accepts TLS connections only (pg_hba hostssl)",
        ),
        (  # PostgreSQL 13 and older
            'FATAL:  no pg_hba.conf entry for host "10.0.0.9", user "relay", database "app", SSL off',
            DSN.replace("verify-full", "disable"),
            "the server accepts TLS connections only (pg_hba hostssl)",
        ),
        (
            'FATAL:  no pg_hba.conf entry for host "10.0.0.9", user "relay", database "app", SSL encryption',
            DSN,
            "the server's pg_hba.conf has no line for user 'relay' on database 'app' from 10.0.0.9 over TLS: add "
            '"hostssl app relay 10.0.0.9/32 scram-sha-256"',
        ),
        (
            'FATAL:  pg_hba.conf rejects connection for host "10.0.0.9", user "relay", database "app", SSL encryption',
            DSN,
            "the server's pg_hba.conf rejects user 'relay' on database 'app' from 10.0.0.9: ask its administrator",
        ),
        (
            'server certificate for "db.internal" (and 2 other names) does not match host name "db.example"',
            DSN,
            "the server's certificate is for 'db.internal' (and 2 more), not 'db.example', the host the DSN "
            "connects to (sslmode=verify-full checks it): set host to a name the certificate carries",
        ),
        (
            'server certificate for "db.internal" does not match host name "db.example"',
            DSN,
            "the server's certificate is for 'db.internal', not 'db.example'",
        ),
        (
            NO_ROOT,
            DSN.replace(" sslrootcert=/etc/ca.pem", ""),
            "sslmode=verify-full verifies the server against a CA, and the CA file /home/app/.postgresql/root.crt "
            "does not exist: set sslrootcert to the CA certificate (PEM) that signed the server's",
        ),
        (
            'could not read root certificate file "/etc/ca.pem": no certificate or crl found',
            DSN,
            "the CA file sslrootcert=/etc/ca.pem cannot be read (no certificate or crl found): point sslrootcert "
            "at a readable PEM file",
        ),
        (
            "server does not support SSL, but SSL was required",
            DSN.replace("verify-full", "require"),
            "the server does not accept TLS (ssl = off in its postgresql.conf) and sslmode=require requires it",
        ),
        (
            'FATAL:  certificate authentication failed for user "relay"',
            DSN + " sslcert=/etc/relay.crt",
            "the client certificate (sslcert=/etc/relay.crt) does not name user 'relay'",
        ),
        (
            "FATAL:  connection requires a valid client certificate",
            DSN,
            "the server requires a client certificate its CA trusts (pg_hba clientcert or cert): set sslcert",
        ),
        ("SSL error: tlsv13 alert certificate required", DSN, "the server requires a client certificate"),
        (
            'private key file "/home/app/.postgresql/postgresql.key" has group or world access; file must have '
            "permissions u=rw (0600) or less if owned by the current user, or permissions u=rw,g=r (0640) or less "
            "if owned by root",
            DSN,
            "chmod 600 /home/app/.postgresql/postgresql.key",
        ),
    ],
)
def test_libpqs_words_become_what_to_fix_keeping_them_and_no_secret(libpq: str, dsn: str, says: str) -> None:
    failed = psycopg.OperationalError(AT + libpq)
    explained = explain(failed, dsn)
    assert isinstance(explained, PostgresConnectError)
    assert isinstance(explained, psycopg.OperationalError) and isinstance(explained, DatabaseError)
    text = str(explained)
    assert text.startswith(says) or says in text, text
    assert text.endswith(f"(libpq: {AT.removeprefix('connection failed: ')}{libpq})"), text
    assert SECRET not in text


def test_a_certificate_that_fails_verification_unprobed_names_both_likely_causes() -> None:
    # nothing listens there: the probe cannot ask, and says so by giving nothing
    failed = psycopg.OperationalError(
        f'connection failed: connection to server at "127.0.0.1", port {free_port()} failed: SSL error: '
        "certificate verify failed"
    )
    text = str(explain(failed, DSN))
    assert text.startswith(
        "the server's certificate did not verify against the CA in sslrootcert=/etc/ca.pem: it is signed by "
        "another CA (point sslrootcert at the CA that signed it) or it has expired (renew it)"
    ), text


def test_a_secret_in_libpqs_words_or_given_apart_is_redacted() -> None:
    failed = psycopg.OperationalError(AT + f'FATAL:  password authentication failed for user "{SECRET}"')
    assert SECRET not in str(explain(failed, DSN))
    provided = "Pr0vided-pw"
    failed = psycopg.OperationalError(AT + f'FATAL:  password authentication failed for user "{provided}"')
    assert provided not in str(explain(failed, DSN.replace(SECRET, ""), [provided]))


@pytest.mark.parametrize(
    "error",
    [
        psycopg.OperationalError(AT + "Connection refused\n\tIs the server running on that host?"),
        psycopg.ProgrammingError('password authentication failed for user "relay"'),  # not a connection's
        PostgresConnectError("password authentication failed for user 'relay': check the password"),  # done
        ValueError("certificate verify failed"),
    ],
    ids=["refused", "not-operational", "already-explained", "not-psycopg"],
)
def test_other_errors_are_left_alone(error: Exception) -> None:
    assert explain(error, DSN) is None


# Fixed dates, not now's: the parameters name the test, and two xdist workers must collect the same names.
PAST = dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)
FUTURE = dt.datetime(2099, 1, 1, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize(
    ("verdict", "says"),
    [
        (
            cert_probe.Verdict(10, "certificate has expired", PAST - dt.timedelta(days=9), PAST),
            "the server's certificate expired on 2020-01-01 00:00:00 UTC: renew it",
        ),
        (  # the server's own is valid: a CA of its chain expired
            cert_probe.Verdict(10, "certificate has expired", PAST, FUTURE),
            "a CA certificate of the server's chain has expired (sslrootcert=/etc/ca.pem)",
        ),
        (
            cert_probe.Verdict(
                9, "certificate is not yet valid", dt.datetime(2031, 1, 2, tzinfo=dt.timezone.utc), None
            ),
            "the server's certificate is not valid yet (from 2031-01-02 00:00:00 UTC): check the clocks",
        ),
        *(
            (
                cert_probe.Verdict(code, "unable to get local issuer certificate", None, None),
                "the server's certificate is not signed by the CA in sslrootcert=/etc/ca.pem: point sslrootcert "
                "at the CA that signed it",
            )
            for code in sorted(cert_probe.UNTRUSTED_ISSUER)
        ),
        (
            cert_probe.Verdict(62, "Hostname mismatch, certificate is not valid for 'db.example'.", None, None),
            "the server's certificate does not name db.example, the host the DSN connects to",
        ),
        (
            cert_probe.Verdict(23, "certificate revoked", None, None),
            "the server's certificate failed verification against the CA in sslrootcert=/etc/ca.pem "
            "(OpenSSL: certificate revoked)",
        ),
    ],
)
def test_what_openssl_says_of_the_certificate_names_the_fix(verdict: cert_probe.Verdict, says: str) -> None:
    assert certificate_failure(verdict, "/etc/ca.pem", "db.example").startswith(says)


class _TlsServer:
    """Answers Postgres' SSLRequest with ``answer`` then, for ``S``, a TLS handshake with the given chain."""

    def __init__(self, cert: Path, key: Path, answer: bytes = b"S") -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)  # accept() wakes to see ``stopped``
        self.stopped = threading.Event()
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    assert conn.recv(8) == cert_probe.SSL_REQUEST
                    conn.sendall(self.answer)
                    if self.answer == b"S":
                        with self.context.wrap_socket(conn, server_side=True) as tls:
                            tls.recv(1)
                except (OSError, AssertionError):
                    pass

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(5)
        self.listener.close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("probe")
    good = make_server_files(folder / "good")
    expired = make_server_files(folder / "expired", expired=True, signed_by=good)
    other = make_server_files(folder / "other")
    return {
        "ca": good.ca,
        "good": good.cert,
        "good-key": good.key,
        "expired": expired.cert,
        "expired-key": expired.key,
        "other": other.cert,
        "other-key": other.key,
    }


@pytest.fixture
def serve(certs: dict[str, Path]) -> Iterator[object]:
    servers: list[_TlsServer] = []

    def start(kind: str, answer: bytes = b"S") -> int:
        servers.append(_TlsServer(certs[kind], certs[f"{kind}-key"], answer))
        return servers[-1].port

    yield start
    for server in servers:
        server.close()


def _probe(port: int, ca: Path, name: str = "localhost") -> cert_probe.Verdict | None:
    return cert_probe.probe("127.0.0.1", port, str(ca), server_name=name, check_host=True, timeout=5)


def test_the_probe_reads_openssls_reason_and_the_certificates_dates(serve: object, certs: dict[str, Path]) -> None:
    start = serve  # type: ignore[assignment]
    assert _probe(start("good"), certs["ca"]) is None  # it verifies: nothing to tell
    expired = _probe(start("expired"), certs["ca"])
    assert expired is not None and expired.code == cert_probe.CERT_HAS_EXPIRED, expired
    assert expired.not_after is not None and expired.not_after < dt.datetime.now(dt.timezone.utc)
    unsigned = _probe(start("other"), certs["ca"])
    assert unsigned is not None and unsigned.code in cert_probe.UNTRUSTED_ISSUER, unsigned
    misnamed = _probe(start("good"), certs["ca"], name="db.example")
    assert misnamed is not None and misnamed.code == cert_probe.HOSTNAME_MISMATCH, misnamed


def test_the_probe_gives_nothing_when_it_cannot_ask(serve: object, certs: dict[str, Path], tmp_path: Path) -> None:
    start = serve  # type: ignore[assignment]
    assert _probe(start("good", answer=b"N"), certs["ca"]) is None  # the server refuses TLS
    assert _probe(free_port(), certs["ca"]) is None  # nothing listens
    assert _probe(start("other"), tmp_path / "missing.pem") is None  # no CA file to verify with


@pytest.mark.parametrize("not_after", [dt.datetime(2049, 12, 31, 23, 59, 58), dt.datetime(2051, 6, 1, 12, 0, 0)])
def test_the_validity_is_read_from_der_in_both_time_encodings(not_after: dt.datetime) -> None:
    # RFC 5280: UTCTime through 2049, GeneralizedTime from 2050
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "t")])
    before = dt.datetime(2020, 2, 3, 4, 5, 6)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(before)
        .not_valid_after(not_after)
        .sign(key, hashes.SHA256())
    )
    from cryptography.hazmat.primitives.serialization import Encoding

    utc = dt.timezone.utc
    assert cert_probe._validity(cert.public_bytes(Encoding.DER)) == (
        before.replace(tzinfo=utc),
        not_after.replace(tzinfo=utc),
    )
    assert cert_probe._validity(b"\x30\x05\x30") is None  # truncated
