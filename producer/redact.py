"""Keeping secrets out of logs, reprs and error messages.

Invariants (``tests/test_producer/test_redact.py``):

- anything that may contain a password (Postgres DSNs, Kafka client properties such as
  ``sasl.password`` or ``ssl.key.password``) goes through these helpers before it is formatted;
- :func:`redact_dsn` shows a DSN's values only for libpq parameters known to be harmless
  (``host``, ``dbname``, ``user``, ``sslmode``, ...): a password, an ``sslpassword`` and any key it
  does not know — a misspelling such as ``passwd=`` included — is redacted. It never relies on the
  DSN being well formed: from the first thing it cannot parse (a word without ``=``, an unterminated
  quote) to the end, the text is redacted;
- :func:`redact_error` cleans a free-form message (a psycopg error, our own) given the DSN it is
  about: the DSN's secret material is removed wherever it appears, including the fragments libpq
  quotes in its parse errors (``missing "=" after "b"``), and ``password=…`` / ``user:pw@`` patterns
  are scrubbed as a last line of defence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from harvest_outbox.producer.librdkafka_properties import LIBRDKAFKA_PROPERTIES

REDACTED = "<redacted>"

# The one definition of "this name holds a credential" (Kafka properties, and key=value pairs in free
# text), matched case-insensitively as a substring. Derived from librdkafka's property table: every
# password, secret, key, pem, passphrase, extensions (SASL/OAUTHBEARER ones carry tokens), token and
# credentials property; ``pas+w|pwd`` also catch a misspelt password. Over-redacting a path
# (``ssl.key.location``) or a public CA (``ssl.ca.pem``) is the safe failure.
SECRET_NAME = re.compile(r"pas+w|pwd|passphrase|secret|key|pem|extensions|token|credential|jaas|"
                         r"oauthbearer\.config", re.IGNORECASE)
#: librdkafka's credential properties, as :func:`is_secret_kafka_key` finds them in its table.
SECRET_KAFKA_PROPERTIES = frozenset(p for p in LIBRDKAFKA_PROPERTIES if SECRET_NAME.search(p))

# libpq parameters whose values are not secret (PostgreSQL 17's list, minus password, sslpassword
# and the OAuth client secret). Anything else is redacted: an unknown key is most likely a typo of
# one of the secret ones.
_SAFE_DSN_KEYS = frozenset((
    "host", "hostaddr", "port", "dbname", "user", "passfile", "channel_binding", "connect_timeout",
    "client_encoding", "options", "application_name", "fallback_application_name", "keepalives",
    "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout", "replication",
    "gssencmode", "sslmode", "sslnegotiation", "requiressl", "sslcompression", "sslcert", "sslkey",
    "sslcertmode", "sslrootcert", "sslcrl", "sslcrldir", "sslsni", "requirepeer", "require_auth",
    "ssl_min_protocol_version", "ssl_max_protocol_version", "min_protocol_version", "max_protocol_version",
    "krbsrvname", "gsslib", "gssdelegation", "service", "target_session_attrs", "load_balance_hosts",
))
_URI_PREFIX = re.compile(r"^\s*postgres(?:ql)?://", re.IGNORECASE)

# Last line of defence in free-form text: key=value pairs whose key looks like a password (quoted
# with escapes, or unquoted with backslash escapes), and URI user:password@ parts.
_KV_SECRET = re.compile(rf"(\b[\w.]*(?:{SECRET_NAME.pattern})[\w.]*\s*=\s*)"
                        r"('(?:[^'\\]|\\.)*'?|(?:\\.|[^\s\\&,;)\"'])*)", re.IGNORECASE)
_URI_USERINFO = re.compile(r"(://[^:/@\s]*:)([^\s]*)(@)")


def is_secret_kafka_key(key: str) -> bool:
    """True for every property of :data:`SECRET_KAFKA_PROPERTIES`, and for a misspelt or unlisted name
    that reads like one (``sasl.pasword``)."""
    return bool(SECRET_NAME.search(key))


def _conninfo_secret_spans(dsn: str) -> list[tuple[int, int]]:
    """(start, end) of every secret span of a key=value DSN, following libpq's conninfo_parse."""
    spans: list[tuple[int, int]] = []
    i, n = 0, len(dsn)
    while True:
        while i < n and dsn[i].isspace():
            i += 1
        if i >= n:
            return spans
        key_start = i
        while i < n and dsn[i] != "=" and not dsn[i].isspace():
            i += 1
        key = dsn[key_start:i]
        while i < n and dsn[i].isspace():
            i += 1
        if i >= n or dsn[i] != "=" or not key:
            spans.append((key_start, n))  # not key=value: everything from here on may be a secret
            return spans
        i += 1
        while i < n and dsn[i].isspace():
            i += 1
        value_start = i
        if i < n and dsn[i] == "'":
            i += 1
            while i < n and dsn[i] != "'":
                i += 2 if dsn[i] == "\\" else 1
            if i >= n:  # unterminated quote
                spans.append((value_start, n))
                return spans
            i += 1
        else:
            while i < n and not dsn[i].isspace():
                i += 2 if dsn[i] == "\\" else 1
            i = min(i, n)
        if key.lower() not in _SAFE_DSN_KEYS and i > value_start:
            spans.append((value_start, i))


def _uri_secret_spans(dsn: str, prefix_end: int) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    rest = dsn[prefix_end:]
    # The userinfo ends at the last '@': a password may hold '/', '?' or '@' unencoded (libpq then
    # misparses it, and quotes the pieces in its errors). Over-redacting a host is the safe failure.
    at = rest.rfind("@")
    query_from = prefix_end
    if at >= 0:
        colon = rest.find(":", 0, at)
        if colon >= 0:
            spans.append((prefix_end + colon + 1, prefix_end + at))
        query_from = prefix_end + at + 1
    q = dsn.find("?", query_from)
    if q < 0:
        return spans
    pos = q + 1
    for part in dsn[q + 1:].split("&"):
        key, eq, _ = part.partition("=")
        if not eq:
            if part:
                spans.append((pos, pos + len(part)))
        elif _percent_decoded(key).strip().lower() not in _SAFE_DSN_KEYS and len(part) > len(key) + 1:
            spans.append((pos + len(key) + 1, pos + len(part)))
        pos += len(part) + 1
    return spans


def _percent_decoded(text: str) -> str:
    from urllib.parse import unquote

    return unquote(text)


def _secret_spans(dsn: str) -> list[tuple[int, int]]:
    m = _URI_PREFIX.match(dsn)
    return _uri_secret_spans(dsn, m.end()) if m else _conninfo_secret_spans(dsn)


def redact_dsn(dsn: str) -> str:
    """``dsn`` (key=value or URI form) with every value that may be secret replaced by ``<redacted>``."""
    if not isinstance(dsn, str):
        return REDACTED
    out, last = [], 0
    for start, end in _secret_spans(dsn):
        out.append(dsn[last:start])
        out.append(REDACTED)
        last = end
    out.append(dsn[last:])
    return "".join(out)


def dsn_secrets(dsn: str) -> tuple[str, ...]:
    """The secret pieces of ``dsn`` as they appear in it, and as libpq would quote them back
    (unquoted, unescaped, whitespace-separated words of a misparsed rest): for :func:`redact_error`."""
    if not isinstance(dsn, str):
        return ()
    pieces: set[str] = set()
    for start, end in _secret_spans(dsn):
        raw = dsn[start:end]
        pieces.add(raw)
        if raw.startswith("'"):
            raw = raw[1:-1] if raw.endswith("'") and len(raw) > 1 else raw[1:]
        unescaped = re.sub(r"\\(.)", r"\1", raw)
        pieces.update((raw, unescaped, _percent_decoded(raw)))
        pieces.update(raw.split())
        pieces.update(re.split(r"[\s=&]+", unescaped))
    return tuple(sorted((p for p in pieces if p), key=len, reverse=True))


def redact_error(text: str, dsn: str | None = None, secrets: Iterable[str] = ()) -> str:
    """``text`` (an error message, a log line) with the secret material of ``dsn`` and ``secrets`` removed."""
    text = str(text)
    if dsn and dsn in text:
        text = text.replace(dsn, redact_dsn(dsn))
    pieces = [*(dsn_secrets(dsn) if dsn else ()), *(s for s in secrets if s)]
    if pieces:
        # libpq quotes what it could not parse: `missing "=" after "b"`, `invalid port number: "pw"`.
        def quoted(m: re.Match[str]) -> str:
            inner = m.group(1)
            if inner and inner != "=" and any(inner in p or (len(p) >= 3 and p in inner) for p in pieces):
                return f'"{REDACTED}"'
            return m.group(0)

        text = re.sub(r'"([^"\n]*)"', quoted, text)
        for piece in pieces:
            if len(piece) >= 3:
                text = text.replace(piece, REDACTED)
    text = _KV_SECRET.sub(lambda m: m.group(1) + REDACTED, text)
    return _URI_USERINFO.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)


def redact_kafka_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a Kafka client config with credential values replaced by ``<redacted>``."""
    return {k: (REDACTED if is_secret_kafka_key(k) else v) for k, v in config.items()}


def redact_text(text: str, secrets: tuple[str, ...]) -> str:
    """Replace every occurrence of any of ``secrets`` (non-empty) in ``text``: kept for callers that
    hold secrets but no DSN; see :func:`redact_error`."""
    return redact_error(text, None, secrets)
