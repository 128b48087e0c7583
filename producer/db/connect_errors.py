"""What a failed connection to Postgres means, and what fixes it: the one place libpq's TLS and
authentication failures are explained.

Every connection harvest opens goes through :func:`producer.db.credentials.open_connection` (the relay,
its election, the CLI's verbs, ``harvest check``, the health endpoint), which raises :func:`explain`'s
error, so whichever site reports the failure reports the explanation. An application's own connection
(the stasher's, a reader's checkpoint store's) gets the same with :func:`connect_explained` or
:func:`explain`.

Invariants (``tests/test_producer/db/test_connect_errors.py``, ``tests/test_security/test_postgres_tls.py``):

- each failure of :data:`RULES` (libpq's words for TLS: certificate verification, the host name, a CA file
  missing or unreadable, a server without TLS, a plaintext connection pg_hba refuses, client certificates;
  and a wrong password) becomes a :class:`PostgresConnectError` that says what is wrong and which setting
  fixes it, then keeps libpq's words (``(libpq: …)``); any other error is left alone (None);
- ``certificate verify failed`` says which failure it was: a certificate not signed by the CA in sslrootcert,
  expired (and when), not valid yet (:mod:`producer.db.cert_probe` asks OpenSSL);
- a :class:`PostgresConnectError` is a :class:`psycopg.OperationalError` (every site treats it as the
  connection failure it is: retry, back off, a clear error at start) and a
  :class:`~producer.errors.DatabaseError`, raised ``from`` libpq's error;
- no secret: the explanation reads no password (only hosts, ports, users, databases, sslmode and file
  paths), and the whole message passes through :func:`harvest_outbox.redact.redact_error` (the DSN's
  secrets and any given, such as a provider's password).
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Callable, Iterable
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from harvest_outbox.producer.db import cert_probe
from harvest_outbox.producer.errors import DatabaseError
from harvest_outbox.redact import redact_error

__all__ = ["RULES", "PostgresConnectError", "certificate_failure", "connect_explained", "explain"]

#: The longest the certificate probe's each connection may take (less when connect_timeout is less). The
#: server answered a handshake just before, so this is ample; it bounds the delay the probe adds to the
#: relay thread, which also renews the election's lease.
PROBE_TIMEOUT = 2.0
_PSYCOPG_PREFIX = "connection failed: "
_SERVER = re.compile(r'connection to server at "(?P<host>[^"]*)"(?: \((?P<addr>[^)]*)\))?, port (?P<port>\d+) failed')
_RELOAD = "then reload Postgres (SELECT pg_reload_conf())"


class PostgresConnectError(psycopg.OperationalError, DatabaseError):
    """A connection to Postgres failed for a reason :func:`explain` knows; the message says what fixes it."""


class _Settings:
    """What libpq tried: the failed connection's own settings (libpq's, defaults and PG* variables
    applied) when psycopg kept them, else the DSN's; never its password."""

    def __init__(self, exc: psycopg.Error, dsn: str) -> None:
        self._got: dict[str, str] = {}
        pgconn = getattr(exc, "pgconn", None)
        try:
            if pgconn is not None:
                for option in pgconn.info:
                    key = option.keyword.decode()
                    if key in _SHOWN and option.val is not None:
                        self._got[key] = option.val.decode()
        except Exception:  # a finished connection may keep nothing
            self._got = {}
        if not self._got and dsn:
            try:
                given = conninfo_to_dict(dsn)
            except psycopg.Error:
                given = {}
            self._got = {k: str(v) for k, v in given.items() if k in _SHOWN and v is not None}

    def get(self, key: str, default: str = "") -> str:
        return self._got.get(key) or os.environ.get(f"PG{key.upper()}", "") or default

    @property
    def sslmode(self) -> str:
        return self.get("sslmode", "prefer")

    @property
    def sslrootcert(self) -> str:
        """The CA file libpq verified against (its default: ``~/.postgresql/root.crt``)."""
        return self.get("sslrootcert") or os.path.join(os.path.expanduser("~"), ".postgresql", "root.crt")


# The settings an explanation may read; the password and sslpassword are not among them.
_SHOWN = frozenset(
    {"host", "hostaddr", "port", "user", "dbname", "sslmode", "sslrootcert", "sslcert", "connect_timeout"}
)


def explain(exc: BaseException, dsn: str = "", secrets: Iterable[str] = ()) -> PostgresConnectError | None:
    """The explained error for ``exc``, a failed connection to ``dsn`` (raise it ``from exc``); None when
    ``exc`` is none of :data:`RULES`' failures. ``secrets``: more to keep out of the message (a password
    given apart from the DSN)."""
    if isinstance(exc, PostgresConnectError) or not isinstance(exc, psycopg.OperationalError):
        return None
    text = str(exc).strip()
    for pattern, why in RULES:
        found = pattern.search(text)
        if found is None:
            continue
        # the last "connection to server at" before the failure names the server that failed
        servers = list(_SERVER.finditer(text, 0, found.start()))
        server = servers[-1] if servers else None
        message = f"{why(found, server, _Settings(exc, dsn))} (libpq: {text.removeprefix(_PSYCOPG_PREFIX)})"
        return PostgresConnectError(redact_error(message, dsn, tuple(secrets)))
    return None


def connect_explained(dsn: str, **kwargs: Any) -> psycopg.Connection:
    """``psycopg.connect(dsn, **kwargs)``, a failure :func:`explain` knows raised explained (``from``
    libpq's): for an application's own connections, such as the one it stashes rows on."""
    try:
        return psycopg.connect(dsn, **kwargs)
    except psycopg.OperationalError as exc:
        explained = explain(exc, dsn, [str(kwargs["password"])] if kwargs.get("password") else ())
        if explained is None:
            raise
        raise explained from exc


# -- the failures --------------------------------------------------------------------------------------

_Why = Callable[[re.Match[str], "re.Match[str] | None", _Settings], str]


def _verify_failed(found: re.Match[str], server: re.Match[str] | None, settings: _Settings) -> str:
    host = server.group("host") if server else settings.get("host")
    return certificate_failure(_probe(server, settings), settings.sslrootcert, host)


def certificate_failure(verdict: cert_probe.Verdict | None, ca: str, host: str) -> str:
    """What ``certificate verify failed`` was, from OpenSSL's ``verdict`` (None: the probe could not tell),
    for a server at ``host`` verified against the CA file ``ca``."""
    if verdict is None:  # both likely causes, each with its fix
        return (
            f"the server's certificate did not verify against the CA in sslrootcert={ca}: it is signed by another "
            f"CA (point sslrootcert at the CA that signed it) or it has expired (renew it)"
        )
    if verdict.code == cert_probe.CERT_HAS_EXPIRED:
        if verdict.not_after is not None and verdict.not_after < dt.datetime.now(dt.timezone.utc):
            return (
                f"the server's certificate expired on {verdict.not_after:%Y-%m-%d %H:%M:%S} UTC: renew it (a new "
                f"ssl_cert_file and ssl_key_file on the server, signed by the CA in sslrootcert={ca}), {_RELOAD}"
            )
        return (
            f"a CA certificate of the server's chain has expired (sslrootcert={ca}): renew it and point "
            f"sslrootcert at the new one"
        )
    if verdict.code == cert_probe.CERT_NOT_YET_VALID:
        since = f" (from {verdict.not_before:%Y-%m-%d %H:%M:%S} UTC)" if verdict.not_before else ""
        return f"the server's certificate is not valid yet{since}: check the clocks of this host and of the server"
    if verdict.code in cert_probe.UNTRUSTED_ISSUER:
        return f"the server's certificate is not signed by the CA in sslrootcert={ca}: point sslrootcert at the CA that signed it"
    if verdict.code == cert_probe.HOSTNAME_MISMATCH:
        return (
            f"the server's certificate does not name {host}, the host the DSN connects to: set host to a name "
            f"the certificate carries, or reissue the certificate with {host} in its subjectAltName"
        )
    return (
        f"the server's certificate failed verification against the CA in sslrootcert={ca} (OpenSSL: {verdict.reason})"
    )


def _probe(server: re.Match[str] | None, settings: _Settings) -> cert_probe.Verdict | None:
    host = server.group("host") if server else settings.get("host")
    address = (server.group("addr") if server else "") or settings.get("hostaddr") or host
    try:
        port = int(server.group("port") if server else settings.get("port", "5432"))
        timeout = min(float(settings.get("connect_timeout") or PROBE_TIMEOUT), PROBE_TIMEOUT) or PROBE_TIMEOUT
    except ValueError:
        return None
    if not address or address.startswith("/"):
        return None
    return cert_probe.probe(
        address,
        port,
        settings.sslrootcert,
        server_name=host,
        check_host=settings.sslmode == "verify-full",
        timeout=timeout,
    )


def _host_mismatch(found: re.Match[str], server: re.Match[str] | None, settings: _Settings) -> str:
    more = f" (and {found.group('more')} more)" if found.group("more") else ""
    host = found.group("host")
    return (
        f"the server's certificate is for {found.group('names')!r}{more}, not {host!r}, the host the DSN connects "
        f"to (sslmode=verify-full checks it): set host to a name the certificate carries, or reissue the "
        f"certificate with {host} in its subjectAltName"
    )


def _no_root(found: re.Match[str], server: re.Match[str] | None, settings: _Settings) -> str:
    return (
        f"sslmode={settings.sslmode} verifies the server against a CA, and the CA file {found.group('path')} does "
        f"not exist: set sslrootcert to the CA certificate (PEM) that signed the server's, or sslrootcert=system "
        f"for the system's trusted CAs"
    )


def _unreadable_root(found: re.Match[str], server: re.Match[str] | None, settings: _Settings) -> str:
    return (
        f"the CA file sslrootcert={found.group('path')} cannot be read ({found.group('why').strip()}): point "
        f"sslrootcert at a readable PEM file of the CA that signed the server's certificate"
    )


def _no_tls_at_server(found: re.Match[str], server: re.Match[str] | None, settings: _Settings) -> str:
    return (
        f"the server does not accept TLS (ssl = off in its postgresql.conf) and sslmode={settings.sslmode} "
        f"requires it: turn ssl on at the server (ssl_cert_file, ssl_key_file), {_RELOAD}"
    )


def _plaintext(found: re.Match[str], server: re.Match[str] | None, settings: _Settings) -> str:
    return (
        f"the server accepts TLS connections only (pg_hba hostssl) and this connection was plaintext "
        f"(sslmode={settings.sslmode}): set sslmode=verify-full with sslrootcert=<the CA that signed the "
        f"server's certificate>"
    )


def _no_tls_entry(found: re.Match[str], server: re.Match[str] | None, settings: _Settings) -> str:
    host, user, db = found.group("host"), found.group("user"), found.group("db")
    if found.group("verb") == "rejects":
        return f"the server's pg_hba.conf rejects user {user!r} on database {db!r} from {host}: ask its administrator"
    return (
        f"the server's pg_hba.conf has no line for user {user!r} on database {db!r} from {host} over TLS: add "
        f'"hostssl {db} {user} {host}/32 scram-sha-256" to it, {_RELOAD}'
    )


def _password(found: re.Match[str], server: re.Match[str] | None, settings: _Settings) -> str:
    return (
        f"password authentication failed for user {found.group('user')!r}: check the password (the DSN's, the "
        f"passfile's, or what dataSourcePasswordCommand / dataSourcePasswordProvider gives) and that the role "
        f"exists with LOGIN"
    )


def _client_cert(found: re.Match[str], server: re.Match[str] | None, settings: _Settings) -> str:
    cert = settings.get("sslcert") or "~/.postgresql/postgresql.crt"
    if found.group("user"):
        return (
            f"the client certificate (sslcert={cert}) does not name user {found.group('user')!r}: its CN must be "
            f"the role (or a pg_ident.conf map must allow it); use the certificate issued for that role"
        )
    return (
        f"the server requires a client certificate its CA trusts (pg_hba clientcert or cert): set sslcert and "
        f"sslkey to the certificate and key issued for this role (sslcert now: {cert})"
    )


def _client_key_mode(found: re.Match[str], server: re.Match[str] | None, settings: _Settings) -> str:
    path = found.group("path")
    return f"the client key {path} can be read by others, and libpq refuses it: chmod 600 {path}"


#: (libpq's words, what they mean and what fixes them), first match wins. The texts are libpq's
#: (PostgreSQL 15-18: fe-secure-openssl.c, fe-connect.c) and the server's (auth.c).
RULES: tuple[tuple[re.Pattern[str], _Why], ...] = (
    (re.compile(r"SSL error: certificate verify failed"), _verify_failed),
    (
        re.compile(
            r'server certificate for "(?P<names>[^"]*)"(?: \(and (?P<more>\d+) other names?\))? '
            r'does not match host name "(?P<host>[^"]*)"'
        ),
        _host_mismatch,
    ),
    (re.compile(r'root certificate file "(?P<path>[^"]*)" does not exist'), _no_root),
    (re.compile(r'could not read root certificate file "(?P<path>[^"]*)":(?P<why>[^\n]*)'), _unreadable_root),
    (re.compile(r"server does not support SSL, but SSL was required"), _no_tls_at_server),
    (
        re.compile(
            r'(?:pg_hba\.conf rejects connection|no pg_hba\.conf entry) for host "[^"]*", user "[^"]*", '
            r'database "[^"]*", (?:no encryption|SSL off)'
        ),
        _plaintext,
    ),
    (
        re.compile(
            r'(?:pg_hba\.conf (?P<verb>rejects) connection|no pg_hba\.conf entry) for host "(?P<host>[^"]*)", '
            r'user "(?P<user>[^"]*)", database "(?P<db>[^"]*)", (?:SSL encryption|SSL on)'
        ),
        _no_tls_entry,
    ),
    (re.compile(r'password authentication failed for user "(?P<user>[^"]*)"'), _password),
    (
        re.compile(
            r'certificate authentication failed for user "(?P<user>[^"]*)"|connection requires a valid client '
            r"certificate|SSL error: (?:sslv3|tlsv1|tlsv13) alert (?:certificate required|unknown ca|bad certificate)"
        ),
        _client_cert,
    ),
    (re.compile(r'private key file "(?P<path>[^"]*)" has group or world access'), _client_key_mode),
)
