"""How the relay's config values are written: Go-style durations, a default relay name, a listen address.

Invariants:
- :func:`parse_duration` reads Go's syntax (``"500ms"``, ``"1m30s"``, ``"0"``) and refuses a bare number
  (Go reads nanoseconds, people mean seconds); :func:`format_duration` writes seconds in that syntax;
- every refusal is a :class:`~producer.errors.ConfigError` naming the field, the value (abridged by
  :func:`~producer.errors.shown`) and a fix.
"""

from __future__ import annotations

import math
import os
import re
import socket
from typing import Any

from harvest_outbox.producer._kafka_names import NOT_A_NAME_CHAR
from harvest_outbox.producer.errors import SHOWN_CHARS, ConfigError, shown

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def key_text(key: Any) -> str:
    """A mapping key as an error message's path shows it: plain when a short string, else :func:`shown`."""
    return key if isinstance(key, str) and len(key) <= SHOWN_CHARS and key.isprintable() else shown(key)


def parse_duration(value: Any, field_name: str) -> float:
    """Go-style duration (``"500ms"``, ``"1m30s"``, ``"0"``) -> seconds. Bare numbers are refused:
    Go reads them as nanoseconds, people mean seconds; we make them say which."""
    if isinstance(value, bool) or not isinstance(value, str):
        raise ConfigError(
            f"{field_name}: {shown(value)} is not a duration; write it with a unit, e.g. '500ms', '5s', '1m30s'"
        )
    text = value.strip()
    if text == "0":
        return 0.0
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ConfigError(
            f"{field_name}: {shown(value)} is not a duration; use Go syntax with units "
            f"ns/us/ms/s/m/h, e.g. '500ms', '5s', '1m30s'"
        )
    return total


def format_duration(seconds: float) -> str:
    if seconds == 0:
        return "0"
    if not math.isfinite(seconds) or seconds < 0:
        return repr(seconds)
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    if seconds < 60:
        return f"{seconds:g}s"
    return f"{seconds / 60:g}m" if seconds < 3600 else f"{seconds / 3600:g}h"


def default_name() -> str:
    host = NOT_A_NAME_CHAR.sub("_", socket.gethostname() or "localhost")
    import time

    return f"{host}_{os.getpid()}_{int(time.time())}"


#: Where /metrics, /healthz and /readyz listen unless told otherwise: every IPv4 interface, so a
#: Prometheus server or a kubelet on another host can reach them (bind 127.0.0.1 to keep them local).
DEFAULT_BIND_ADDRESS = "0.0.0.0"
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


def check_bind_address(value: Any, field_name: str = "prometheusBindAddress") -> str:
    """An IPv4/IPv6 literal or a host name to bind the HTTP endpoint to (no port, no brackets)."""
    import ipaddress

    fix = "e.g. '0.0.0.0' (all IPv4 interfaces), '127.0.0.1' (this host only), '::' or a host name"
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{field_name}: {shown(value)} is not an address to listen on; {fix}")
    text = value.strip()
    if text.startswith("[") and text.endswith("]"):
        raise ConfigError(f"{field_name}: {shown(value)}: write the IPv6 address without brackets, e.g. '::1'")
    try:
        ipaddress.ip_address(text)
        return text
    except ValueError:
        pass
    if text.count(":") == 1:
        raise ConfigError(
            f"{field_name}: {shown(value)} contains a port; put the port in prometheusPort and "
            f"only the address here, {fix}"
        )
    if not _HOSTNAME.match(text) or text.replace(".", "").isdigit():
        raise ConfigError(f"{field_name}: {shown(value)} is neither an IP address nor a host name; {fix}")
    return text


def check_basic_auth(value: str) -> bool:
    """Whether ``value`` is ``user:password`` with both parts non-empty (the user may not hold ``:``)."""
    user, colon, password = value.partition(":")
    return bool(user and colon and password)
