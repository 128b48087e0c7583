"""HTTP basic authentication for the relay's endpoint (``prometheusBasicAuth``): a WSGI app wrapped so
that only requests carrying the configured ``user:password`` reach it.

Invariants:
- the credentials are compared in constant time, over their SHA-256 digests, so neither the time of a
  refusal nor its length says how much of a guess was right;
- a refusal is ``401`` with ``WWW-Authenticate`` and a fixed body: it does not say whether the user, the
  password or the header's form was wrong, nor which paths exist (unknown paths answer ``404`` only to
  an authenticated request);
- the expected credentials live only in the wrapper's closure, as a digest: never logged nor in a repr.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Callable, Iterable
from typing import Any

from harvest_outbox.producer.observe._http_server import WsgiApp

REALM = "harvest"
_REFUSAL = b"unauthorized\n"


def _digest(credentials: bytes) -> bytes:
    return hashlib.sha256(credentials).digest()


def presented(environ: dict[str, Any]) -> bytes | None:
    """The ``user:password`` bytes of a request's ``Authorization: Basic …`` header; None without one."""
    header = environ.get("HTTP_AUTHORIZATION", "")
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic" or not token:
        return None
    try:
        return base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None


def require_basic_auth(app: WsgiApp, credentials: str) -> WsgiApp:
    """``app``, answering only requests whose basic-auth credentials are ``credentials`` (``user:password``)."""
    expected = _digest(credentials.encode("utf-8"))

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        given = presented(environ)
        # compare_digest even without a header: the refusal takes the same time whatever was sent
        ok = hmac.compare_digest(_digest(given if given is not None else b""), expected) and given is not None
        if ok:
            return app(environ, start_response)
        start_response(
            "401 Unauthorized",
            [
                ("Content-Type", "text/plain"),
                ("Content-Length", str(len(_REFUSAL))),
                ("WWW-Authenticate", f'Basic realm="{REALM}", charset="UTF-8"'),
                ("Cache-Control", "no-store"),
            ],
        )
        return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else _REFUSAL]

    return guarded
