"""W3C trace context carried in record headers (``traceparent`` / ``tracestate``).

The stasher (``producer.observe.tracing``) records the stashing span's context as headers; the relay copies
them to Kafka unchanged; ``Record.traceparent`` / ``Record.tracestate`` (pure and native) read them
back through :func:`header_text`, so an application can continue the trace, e.g. with
OpenTelemetry's ``TraceContextTextMapPropagator().extract({"traceparent": record.traceparent})``.

Invariant: reading never raises: a missing header, a ``None`` value or bytes that are not UTF-8
give ``None`` (the value is then not a valid trace context anyway). The first header of that name
wins, as in the W3C spec's single-header rule.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TRACEPARENT", "TRACESTATE", "header_text"]

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"


def header_text(headers: Any, name: str) -> str | None:
    """The first ``name`` header of ``headers`` (confluent-kafka's list of (str, bytes)) as text."""
    if not headers:
        return None
    for k, v in headers:
        if k == name:
            if v is None:
                return None
            try:
                return v.decode("utf-8") if isinstance(v, (bytes, bytearray)) else str(v)
            except UnicodeDecodeError:
                return None
    return None
