"""Keeping secrets out of logs, reprs and error messages.

Invariant: anything that may contain a password (Postgres DSNs, Kafka client properties such as
``sasl.password`` or ``ssl.key.password``) goes through these helpers before it is formatted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "<redacted>"

# Kafka property names whose values are credentials. Matched case-insensitively as substrings, so
# ``sasl.password``, ``ssl.key.password``, ``sasl.oauthbearer.client.secret`` and friends are caught.
_SECRET_KAFKA_KEY = re.compile(r"password|secret|sasl\.jaas|oauthbearer\.config|ssl\.key\.pem|token|credential",
                               re.IGNORECASE)

# key=value DSN form: password='...' or password=...; URI form: scheme://user:password@host
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)", re.IGNORECASE)
_URI_PASSWORD = re.compile(r"(://[^:/@\s]*:)([^@\s]*)(@)")
_URI_QUERY_PASSWORD = re.compile(r"([?&]password=)([^&\s]*)", re.IGNORECASE)


def is_secret_kafka_key(key: str) -> bool:
    return bool(_SECRET_KAFKA_KEY.search(key))


def redact_dsn(dsn: str) -> str:
    """Return ``dsn`` with any password replaced by ``<redacted>`` (both keyword and URI forms)."""
    out = _KV_PASSWORD.sub(lambda m: m.group(1) + REDACTED, dsn)
    out = _URI_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), out)
    return _URI_QUERY_PASSWORD.sub(lambda m: m.group(1) + REDACTED, out)


def redact_kafka_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a Kafka client config with credential values replaced by ``<redacted>``."""
    return {k: (REDACTED if is_secret_kafka_key(k) else v) for k, v in config.items()}


def redact_text(text: str, secrets: tuple[str, ...]) -> str:
    """Replace every occurrence of any of ``secrets`` (non-empty) in ``text``: last line of defence for
    messages coming from libraries (psycopg echoes parts of the DSN in some errors)."""
    for secret in secrets:
        if secret and len(secret) >= 3:
            text = text.replace(secret, REDACTED)
    return redact_dsn(text)
