"""Certificates for the embedded services' TLS listeners, made at start-up: a throw-away CA and a
server certificate it signs, for ``127.0.0.1`` and ``localhost``.

Invariants (``tests/test_local/test_tls.py``):

1. The server certificate names ``127.0.0.1`` (an IP SAN) and ``localhost`` (a DNS SAN), so clients
   verify the host as production clients do (librdkafka's ``ssl.endpoint.identification.algorithm=https``,
   libpq's ``sslmode=verify-full``) while connecting to the loopback address.
2. Every file is written owner-only (0600) before it holds a key: Postgres refuses a key file others
   can read, and a key never sits world-readable, even for a moment.
3. Keys are unencrypted PKCS#8 PEM, the one format both Kafka's PEM keystore and Postgres read.
4. ``not_after`` in the past makes an expired certificate (the error path tests need one); the CA
   itself stays valid, so an expired-certificate failure is about the server's certificate alone.
5. ``signed_by``: a server certificate signed by an existing CA (its ``ca`` and ``ca_key``), so a server
   can swap in another certificate (an expired one) that its clients' ``sslrootcert`` still trusts.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: The names every server certificate carries (invariant 1).
SERVER_HOSTS = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class TlsFiles:
    """Where a CA and a server certificate it signed were written.

    ``ca``: the CA's certificate (what clients trust: ``ssl.ca.location``, ``sslrootcert``);
    ``cert``: the server's certificate followed by the CA's (a chain); ``key``: the server's key;
    ``keystore``: key and chain in one file (Kafka's ``ssl.keystore.type=PEM``); ``ca_key``: the CA's
    key, to sign another server certificate with (invariant 5)."""

    ca: Path
    cert: Path
    key: Path
    keystore: Path
    ca_key: Path


def _write_private(path: Path, data: bytes) -> None:
    """Create ``path`` 0600 before any byte lands in it (invariant 2)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "harvest_local"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def make_ca(folder: Path, name: str = "ca") -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate, Path]:
    """A self-signed CA valid for a day, written to ``folder/<name>.pem`` (its key to ``<name>.key``)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    subject = _name(f"harvest_local {name}")
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    path = folder / f"{name}.pem"
    _write_private(path, cert.public_bytes(serialization.Encoding.PEM))
    _write_private(folder / f"{name}.key", _pkcs8(key))
    return key, cert, path


def _pkcs8(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_server_files(
    folder: Path, *, expired: bool = False, ca_name: str = "ca", signed_by: TlsFiles | None = None
) -> TlsFiles:
    """A new CA and a server certificate it signs for :data:`SERVER_HOSTS`, in ``folder``.

    ``expired``: the server certificate's validity ended an hour ago (invariant 4). ``signed_by``: no new
    CA; the certificate is signed by that one's (invariant 5)."""
    if signed_by is None:
        ca_key, ca_cert, ca_path = make_ca(folder, ca_name)
        ca_key_path = folder / f"{ca_name}.key"
    else:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        loaded = load_pem_private_key(signed_by.ca_key.read_bytes(), password=None)
        assert isinstance(loaded, ec.EllipticCurvePrivateKey)
        ca_key, ca_cert = loaded, x509.load_pem_x509_certificate(signed_by.ca.read_bytes())
        ca_path, ca_key_path = signed_by.ca, signed_by.ca_key
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    not_after = now - dt.timedelta(hours=1) if expired else now + dt.timedelta(days=1)
    san = x509.SubjectAlternativeName(
        [x509.IPAddress(ipaddress.ip_address(SERVER_HOSTS[0])), x509.DNSName(SERVER_HOSTS[1])]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(SERVER_HOSTS[1]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(min(now - dt.timedelta(minutes=5), not_after - dt.timedelta(hours=1)))
        .not_valid_after(not_after)
        .add_extension(san, critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = _pkcs8(key)
    chain = cert.public_bytes(serialization.Encoding.PEM) + ca_cert.public_bytes(serialization.Encoding.PEM)
    files = TlsFiles(
        ca=ca_path,
        cert=folder / "server.crt",
        key=folder / "server.key",
        keystore=folder / "server.pem",
        ca_key=ca_key_path,
    )
    _write_private(files.cert, chain)
    _write_private(files.key, key_pem)
    _write_private(files.keystore, key_pem + chain)
    return files
