"""Why a Postgres server's certificate fails verification, asked of OpenSSL itself.

libpq reports every verification failure in the same words, ``SSL error: certificate verify failed``: a
certificate signed by another CA than sslrootcert's, an expired one, one not valid yet. To say which
(:mod:`producer.db.connect_errors`), :func:`probe` does what libpq did with Python's ``ssl`` (the same
OpenSSL): Postgres' SSLRequest, then a TLS handshake verifying against the same CA file and host name,
and reads OpenSSL's reason; a second, unverified handshake reads the server certificate's dates.

Invariants (``tests/test_producer/db/test_connect_errors.py``):

- nothing but the SSLRequest and the handshakes is sent: no startup message, so no user, database or
  password ever leaves for a server that just failed verification;
- it never raises: anything in the way (no answer, a timeout, a server refusing TLS, an unreadable CA
  file) gives None, and the caller explains the failure without it;
- no step of its two connections (connect, read, handshake) waits longer than ``timeout`` seconds.
"""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import struct
from dataclasses import dataclass

#: Postgres' SSLRequest: length 8, then the request code 1234.5679 (protocol docs, "SSLRequest").
SSL_REQUEST = struct.pack("!ii", 8, 80877103)

# OpenSSL's X509_V_ERR_* numbers (openssl/x509_vfy.h) the explanation tells apart.
CERT_NOT_YET_VALID = 9
CERT_HAS_EXPIRED = 10
#: The chain does not end at a CA of the trust file: unable to get the issuer's certificate (2, 20), a
#: self-signed certificate (18) or CA (19) that is not trusted, or the leaf alone without its issuer (21).
UNTRUSTED_ISSUER = frozenset({2, 18, 19, 20, 21})
HOSTNAME_MISMATCH = 62


@dataclass(frozen=True)
class Verdict:
    """OpenSSL's reason (``code``: its X509_V_ERR number, ``reason``: its words), and the validity of
    the certificate the server presents (None when it could not be read)."""

    code: int
    reason: str
    not_before: dt.datetime | None
    not_after: dt.datetime | None


def probe(host: str, port: int, cafile: str, *, server_name: str, check_host: bool, timeout: float) -> Verdict | None:
    """Why the server at ``host``:``port`` fails verification against ``cafile`` (``"system"``: the
    system's trusted CAs) and, when ``check_host``, the name ``server_name``; None when it passes or
    cannot be asked."""
    try:
        verify = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if cafile == "system":
            verify.load_default_certs()
        else:
            verify.load_verify_locations(cafile=cafile)
        verify.check_hostname = check_host
        try:
            _handshake(verify, host, port, server_name, timeout)
            return None
        except ssl.SSLCertVerificationError as exc:
            code, reason = int(exc.verify_code or 0), str(exc.verify_message or exc.reason or "")
        look = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        look.check_hostname, look.verify_mode = False, ssl.CERT_NONE
        dates = _validity(_handshake(look, host, port, server_name, timeout))
    except (OSError, ValueError):  # ssl.SSLError is an OSError
        return None
    return Verdict(code, reason, *(dates or (None, None)))


def _handshake(context: ssl.SSLContext, host: str, port: int, server_name: str, timeout: float) -> bytes:
    """The server's certificate (DER) after a handshake on a new connection; raises what ``ssl`` raises."""
    with socket.create_connection((host, port), timeout=timeout) as raw:
        raw.sendall(SSL_REQUEST)
        if raw.recv(1) != b"S":
            raise OSError("the server does not accept TLS")
        with context.wrap_socket(raw, server_hostname=server_name or None) as tls:
            return tls.getpeercert(binary_form=True) or b""


def _validity(der: bytes) -> tuple[dt.datetime, dt.datetime] | None:
    """notBefore and notAfter of a DER certificate (RFC 5280: Certificate -> tbsCertificate -> [version],
    serialNumber, signature, issuer, validity), without a parser library (``cryptography`` is optional)."""
    try:
        _, start, _ = _tlv(der, 0)  # Certificate
        _, pos, _ = _tlv(der, start)  # tbsCertificate
        tag, _, end = _tlv(der, pos)
        if tag == 0xA0:  # [0] version
            pos = end
        for _ in range(3):  # serialNumber, signature, issuer
            pos = _tlv(der, pos)[2]
        _, pos, _ = _tlv(der, pos)  # validity
        times = []
        for _ in range(2):
            tag, start, end = _tlv(der, pos)
            times.append(_time(tag, der[start:end].decode("ascii")))
            pos = end
        return times[0], times[1]
    except (IndexError, ValueError):
        return None


def _tlv(der: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, start of the value, end of the value) of the DER element at ``pos``."""
    tag, length = der[pos], der[pos + 1]
    pos += 2
    if length & 0x80:
        count = length & 0x7F
        length = int.from_bytes(der[pos : pos + count], "big")
        pos += count
    if pos + length > len(der):
        raise ValueError("truncated DER")
    return tag, pos, pos + length


def _time(tag: int, text: str) -> dt.datetime:
    if tag == 0x17:  # UTCTime, YYMMDDHHMMSSZ: years 50-99 are 19xx (RFC 5280 4.1.2.5.1)
        text = ("19" if int(text[:2]) >= 50 else "20") + text
    elif tag != 0x18:  # GeneralizedTime, YYYYMMDDHHMMSSZ
        raise ValueError(f"not a time: tag {tag:#x}")
    return dt.datetime.strptime(text, "%Y%m%d%H%M%SZ").replace(tzinfo=dt.timezone.utc)
