"""harvest_local/tls.py's invariants: the names, the file modes, the key format, an expired certificate, a
certificate signed by an existing CA."""

from __future__ import annotations

import datetime as dt
import ipaddress
import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from harvest_outbox.harvest_local.tls import SERVER_HOSTS, make_server_files


def _server_cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificates(path.read_bytes())[0]


def test_server_certificate_names_the_loopback_address_and_localhost(tmp_path: Path) -> None:
    files = make_server_files(tmp_path)
    san = _server_cert(files.cert).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address(SERVER_HOSTS[0])]
    assert san.get_values_for_type(x509.DNSName) == [SERVER_HOSTS[1]]
    chain = x509.load_pem_x509_certificates(files.cert.read_bytes())
    ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
    assert chain[0].issuer == ca.subject and chain[1] == ca
    chain[0].verify_directly_issued_by(ca)


def test_every_file_is_owner_only_and_the_key_is_unencrypted_pkcs8(tmp_path: Path) -> None:
    files = make_server_files(tmp_path)
    for path in (files.ca, files.cert, files.key, files.keystore):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    key_pem = files.key.read_bytes()
    assert key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8, not "EC PRIVATE KEY"
    load_pem_private_key(key_pem, password=None)
    assert files.keystore.read_bytes().startswith(key_pem)


def test_expired_certificate_ended_before_now_under_a_valid_ca(tmp_path: Path) -> None:
    files = make_server_files(tmp_path, expired=True)
    now = dt.datetime.now(dt.timezone.utc)
    assert _server_cert(files.cert).not_valid_after_utc < now
    assert x509.load_pem_x509_certificate(files.ca.read_bytes()).not_valid_after_utc > now


def test_a_certificate_signed_by_an_existing_ca_verifies_under_it(tmp_path: Path) -> None:
    first = make_server_files(tmp_path / "first")
    second = make_server_files(tmp_path / "second", expired=True, signed_by=first)
    assert (second.ca, second.ca_key) == (first.ca, first.ca_key)
    assert stat.S_IMODE(first.ca_key.stat().st_mode) == 0o600
    ca = x509.load_pem_x509_certificate(first.ca.read_bytes())
    _server_cert(second.cert).verify_directly_issued_by(ca)
    assert _server_cert(second.cert).not_valid_after_utc < dt.datetime.now(dt.timezone.utc)
    assert second.cert.read_bytes() != first.cert.read_bytes()
