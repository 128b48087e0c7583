"""W3C trace context on outbox records, when OpenTelemetry is installed (``harvest-outbox[otel]``).

:func:`current_trace_headers` returns the active span's ``traceparent`` (and ``tracestate`` when
the span has one) as record headers, so a trace spans app -> outbox -> Kafka -> reader: the relay
copies outbox headers to the Kafka record unchanged, and readers expose them as
``Record.traceparent`` / ``Record.tracestate``.

Invariants:
- without ``opentelemetry-api`` installed, or without a valid active span, the result is empty and
  nothing is imported or raised: the stasher behaves exactly as before;
- only the W3C trace-context fields are written (never baggage, which may carry user data), with
  the W3C propagator itself, whatever global propagator the application configured;
- the import is attempted once per process (the outcome is cached).
"""

from __future__ import annotations

from typing import Any

#: Header names, as the W3C Trace Context spec and OpenTelemetry's Kafka instrumentations spell them.
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

_propagator: Any = None  # None = not resolved yet, False = OpenTelemetry not installed


def _resolve() -> Any:
    global _propagator
    if _propagator is None:
        try:
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            _propagator = False
        else:
            _propagator = TraceContextTextMapPropagator()
    return _propagator


def available() -> bool:
    """True when ``opentelemetry-api`` is importable (trace context will be recorded)."""
    return _resolve() is not False


def current_trace_headers() -> list[tuple[str, str]]:
    """``[("traceparent", ...), ("tracestate", ...)]`` of the current span; ``[]`` without one."""
    propagator = _resolve()
    if propagator is False:
        return []
    carrier: dict[str, str] = {}
    propagator.inject(carrier)
    return [(name, carrier[name]) for name in (TRACEPARENT, TRACESTATE) if name in carrier]
