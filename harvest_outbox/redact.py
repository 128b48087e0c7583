"""Keeping secrets out of logs, reprs and error messages.

Invariants (``tests/test_producer/config/test_redact.py``):

- anything that may contain a password (Postgres DSNs, Kafka client properties such as
  ``sasl.password`` or ``ssl.key.password``) goes through these helpers before it is formatted;
- :func:`redact_dsn` shows a DSN's values only for libpq parameters known to be harmless
  (``host``, ``dbname``, ``user``, ``sslmode``, ...): a password, an ``sslpassword`` and any key it
  does not know — a misspelling such as ``passwd=`` included — is redacted. libpq's own parser is the
  oracle: a DSN it parses is shown as libpq reads it (a password's tail that libpq takes for the host,
  as in ``u:Pw@Secret@h``, is redacted; a ``dbname`` holding a connection string, which libpq expands,
  is redacted the same way). A DSN it cannot parse is redacted from the first thing that does not
  parse (a word without ``=``, an unterminated quote) to the end;
- :func:`redact_error` cleans a free-form message (a psycopg error, our own) given the DSN it is
  about: every secret value libpq's parser finds in the DSN is removed wherever it appears, as are the
  fragments libpq quotes in its parse errors (``missing "=" after "b"``), and ``password=…`` /
  ``user:pw@`` patterns are scrubbed as a last line of defence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from harvest_outbox.librdkafka_properties import LIBRDKAFKA_PROPERTIES

REDACTED = "<redacted>"

# The one definition of "this name holds a credential" (Kafka properties, and key=value pairs in free
# text), matched case-insensitively as a substring. Derived from librdkafka's property table: every
# password, secret, key, pem, passphrase, extensions (SASL/OAUTHBEARER ones carry tokens), token and
# credentials property; ``pas+w|pwd`` also catch a misspelt password. Over-redacting a path
# (``ssl.key.location``) or a public CA (``ssl.ca.pem``) is the safe failure.
SECRET_NAME = re.compile(
    r"pas+w|pwd|passphrase|secret|key|pem|extensions|token|credential|jaas|"
    r"oauthbearer\.config",
    re.IGNORECASE,
)
#: librdkafka's credential properties, as :func:`is_secret_kafka_key` finds them in its table.
SECRET_KAFKA_PROPERTIES = frozenset(p for p in LIBRDKAFKA_PROPERTIES if SECRET_NAME.search(p))

# libpq parameters whose values are not secret (PostgreSQL 17's list, minus password, sslpassword
# and the OAuth client secret). Anything else is redacted: an unknown key is most likely a typo of
# one of the secret ones.
_SAFE_DSN_KEYS = frozenset(
    (
        "host",
        "hostaddr",
        "port",
        "dbname",
        "user",
        "passfile",
        "channel_binding",
        "connect_timeout",
        "client_encoding",
        "options",
        "application_name",
        "fallback_application_name",
        "keepalives",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
        "tcp_user_timeout",
        "replication",
        "gssencmode",
        "sslmode",
        "sslnegotiation",
        "requiressl",
        "sslcompression",
        "sslcert",
        "sslkey",
        "sslcertmode",
        "sslrootcert",
        "sslcrl",
        "sslcrldir",
        "sslsni",
        "requirepeer",
        "require_auth",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "min_protocol_version",
        "max_protocol_version",
        "krbsrvname",
        "gsslib",
        "gssdelegation",
        "service",
        "target_session_attrs",
        "load_balance_hosts",
    )
)
_URI_PREFIX = re.compile(r"^\s*postgres(?:ql)?://", re.IGNORECASE)

# Last line of defence in free-form text: key=value pairs whose key looks like a password (quoted
# with escapes, or unquoted with backslash escapes), and URI user:password@ parts.
_KV_SECRET = re.compile(
    rf"(\b[\w.]*(?:{SECRET_NAME.pattern})[\w.]*\s*=\s*)"
    r"('(?:[^'\\]|\\.)*'?|(?:\\.|[^\s\\&,;)\"'])*)",
    re.IGNORECASE,
)
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


def _uri_secret_spans(dsn: str, prefix_end: int, misparsed: bool) -> list[tuple[int, int]]:
    """Secret spans of a URI as libpq reads it (the userinfo ends at the first '@' before any '/') and,
    when libpq could not parse it (``misparsed``), also as its author may have meant it (up to the last
    '@': a password holding an unencoded '@', '/' or '?'). Over-redacting a host is the safe failure."""
    rest = dsn[prefix_end:]
    first = next((i for i, c in enumerate(rest) if c in "@/"), -1)
    ats = {
        a for a in (first if first >= 0 and rest[first] == "@" else -1, rest.rfind("@") if misparsed else -1) if a >= 0
    } or {-1}
    spans: list[tuple[int, int]] = []
    for at in sorted(ats):
        colon = rest.find(":", 0, at) if at >= 0 else -1
        if colon >= 0:
            spans.append((prefix_end + colon + 1, prefix_end + at))
        spans += _query_secret_spans(dsn, dsn.find("?", prefix_end + at + 1))
    return spans


def _query_secret_spans(dsn: str, q: int) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    if q < 0:
        return spans
    pos = q + 1
    for part in dsn[q + 1 :].split("&"):
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


def _secret_spans(dsn: str, misparsed: bool) -> list[tuple[int, int]]:
    """The secret spans of ``dsn``'s text, sorted and merged."""
    m = _URI_PREFIX.match(dsn)
    merged: list[tuple[int, int]] = []
    for start, end in sorted(_uri_secret_spans(dsn, m.end(), misparsed) if m else _conninfo_secret_spans(dsn)):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _libpq_parse(dsn: str) -> dict[str, str] | None:
    """``dsn`` as libpq itself reads it (PQconninfoParse, both forms), or None if it does not parse."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        return {k: str(v) for k, v in conninfo_to_dict(dsn).items()}
    except psycopg.Error:
        return None


def _is_conninfo(value: str) -> bool:
    """A dbname holding a connection string or URI: libpq expands it into parameters of its own."""
    return "=" in value or bool(_URI_PREFIX.match(value))


def _misplaced(key: str, value: str) -> bool:
    """A harmless key whose value holds what must be a password's tail: libpq ends a URI's userinfo at
    the first '@' (or '/'), so ``u:Pw@Secret@h`` gives host ``Secret@h``, ``u:p/ss@h/db`` port ``p`` and
    dbname ``ss@h/db``. A user name may hold an '@' (percent-encoded in a URI)."""
    return ("@" in value and key != "user") or (key == "port" and not re.fullmatch(r"[\d,]*", value))


def _shown(key: str, value: str) -> str:
    if key == "dbname" and _is_conninfo(value):
        return redact_dsn(value)
    return REDACTED if key not in _SAFE_DSN_KEYS or _misplaced(key, value) else value


def _in_input_order(dsn: str, keys: Iterable[str]) -> list[str]:
    def position(key: str) -> int:
        m = re.search(rf"(?:^|[\s?&]){re.escape(key)}\s*=", dsn)
        return m.start() if m else len(dsn)

    return sorted(keys, key=position)


def _conninfo_quoted(value: str) -> str:
    if value == REDACTED or (value and not re.search(r"[\s'\\]", value)):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _uri_quoted(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe="<>,/:")


def _render_uri(dsn: str, prefix: str, shown: dict[str, str]) -> str:
    """``shown`` (libpq's parameters, redacted) as a URI like ``dsn``: the password stays where it was."""
    from urllib.parse import quote

    rest = dsn[len(prefix) :]
    userinfo = re.match(r"[^@/]*@", rest)
    authority = ""
    if "user" in shown or (userinfo and ":" in userinfo.group(0) and "password" in shown):
        authority = quote(shown.pop("user", ""), safe="<>")
        if userinfo and ":" in userinfo.group(0) and "password" in shown:
            authority += ":" + shown.pop("password")
        authority += "@"
    host, port = shown.get("host"), shown.get("port", "")
    if host is not None and host != REDACTED and not host.startswith("/") and "," not in host + port:
        authority += (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
        shown.pop("host"), shown.pop("port", None)
    path = "/" + quote(shown.pop("dbname"), safe="<>") if "dbname" in shown else ""
    query = "&".join(f"{k}={_uri_quoted(shown[k])}" for k in _in_input_order(dsn, shown))
    return f"{prefix.strip()}{authority}{path}" + (f"?{query}" if query else "")


def redact_dsn(dsn: str) -> str:
    """``dsn`` (key=value or URI form) with every value that may be secret replaced by ``<redacted>``.
    A DSN libpq parses is rebuilt from libpq's own reading of it (so what is shown is what libpq uses,
    whatever the quoting); one it does not parse is shown with its secret spans and everything from
    the first thing it cannot parse redacted."""
    if not isinstance(dsn, str):
        return REDACTED
    params = _libpq_parse(dsn)
    if params is not None:
        shown = {k: _shown(k, v) for k, v in params.items()}
        uri = _URI_PREFIX.match(dsn)
        if uri:
            return _render_uri(dsn, uri.group(0), shown)
        return " ".join(f"{k}={_conninfo_quoted(shown[k])}" for k in _in_input_order(dsn, shown))
    out, last = [], 0
    for start, end in _secret_spans(dsn, misparsed=True):
        out.append(dsn[last:start])
        out.append(REDACTED)
        last = end
    out.append(dsn[last:])
    return "".join(out)


def _parsed_secrets(params: Mapping[str, str]) -> set[str]:
    """The secret values among libpq's ``params``, and the pieces of misplaced ones (see :func:`_misplaced`)."""
    pieces: set[str] = set()
    for key, value in params.items():
        if key == "dbname" and _is_conninfo(value):
            pieces.update(dsn_secrets(value))
        elif key not in _SAFE_DSN_KEYS:
            pieces.update((value, *value.split()))
        elif _misplaced(key, value):
            pieces.update((value, *value.split("@")[:-1]))
    return pieces


def dsn_secrets(dsn: str) -> tuple[str, ...]:
    """The secret pieces of ``dsn``: the values libpq's parser gives its secret keys, and, for text libpq
    may misparse, the pieces of its secret spans as they appear in it and as libpq would quote them back
    (unquoted, unescaped, whitespace-separated words of a misparsed rest): for :func:`redact_error`."""
    if not isinstance(dsn, str):
        return ()
    params = _libpq_parse(dsn)
    pieces = _parsed_secrets(params or {})
    for start, end in _secret_spans(dsn, misparsed=params is None):
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
