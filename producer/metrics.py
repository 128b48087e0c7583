"""Relay metrics: counters kept on the relay thread, snapshots for MeterRead, Prometheus exposition.

Invariant: the hot path only increments plain ints on :class:`Metrics` (no locks, no Prometheus
calls per record); :meth:`Metrics.snapshot` and the Prometheus collector read them, which is safe
under the GIL for monotone counters and single-writer gauges.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from producer.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MeterStats:
    """One metrics reading. Rates are over ``interval`` seconds since the previous reading."""

    interval: float
    delivered_total: int
    delivered_rate: float  # records/s
    dead_letters_total: int  # moved by this process
    remarks_total: int
    delivery_failures_total: int
    in_flight: int
    queued: int
    backlog_rows: int | None  # rows in the outbox (None when not leader / unknown)
    oldest_unsent_age: float | None  # seconds since the oldest outbox row was created
    dead_letter_rows: int | None  # rows in the dead-letter table
    is_leader: bool


class Metrics:
    def __init__(self) -> None:
        self.delivered = 0
        self.dead_lettered = 0
        self.remarks = 0
        self.delivery_failures = 0
        self.in_flight = 0
        self.queued = 0
        self.backlog_rows: int | None = None
        self.oldest_unsent_age: float | None = None
        self.dead_letter_rows: int | None = None
        self.is_leader = False
        self._last_time = time.monotonic()
        self._last_delivered = 0
        self.last: MeterStats | None = None

    def snapshot(self) -> MeterStats:
        now = time.monotonic()
        interval = max(now - self._last_time, 1e-9)
        stats = MeterStats(interval, self.delivered, (self.delivered - self._last_delivered) / interval,
                           self.dead_lettered, self.remarks, self.delivery_failures, self.in_flight, self.queued,
                           self.backlog_rows, self.oldest_unsent_age, self.dead_letter_rows, self.is_leader)
        self._last_time, self._last_delivered = now, self.delivered
        self.last = stats
        return stats


class _Collector:
    def __init__(self, metrics: Metrics, name: str) -> None:
        self._m, self._name = metrics, name

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        m, labels = self._m, ["relay"]

        def counter(name: str, doc: str, value: float) -> Any:
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric([self._name], value)
            return c

        def gauge(name: str, doc: str, value: float | None) -> Any:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric([self._name], float("nan") if value is None else value)
            return g

        yield counter("harvest_delivered_records", "Records delivered to Kafka and purged", m.delivered)
        yield counter("harvest_dead_lettered_records", "Records moved to the dead-letter table", m.dead_lettered)
        yield counter("harvest_remarks", "Leader refreshes (remarks) after failures", m.remarks)
        yield counter("harvest_delivery_failures", "Failed produce/delivery attempts", m.delivery_failures)
        yield gauge("harvest_in_flight_records", "Records sent, awaiting acknowledgement", m.in_flight)
        yield gauge("harvest_queued_records", "Records marked, not yet sent", m.queued)
        yield gauge("harvest_backlog_rows", "Rows in the outbox table", m.backlog_rows)
        yield gauge("harvest_oldest_unsent_age_seconds", "Age of the oldest outbox row", m.oldest_unsent_age)
        yield gauge("harvest_dead_letter_rows", "Rows in the dead-letter table", m.dead_letter_rows)
        yield gauge("harvest_is_leader", "1 if this relay is the leader", 1.0 if m.is_leader else 0.0)


def start_prometheus(metrics: Metrics, name: str, port: int, addr: str = "0.0.0.0") -> Any:
    """Serve ``/metrics`` on ``port`` from a private registry; returns (server, thread)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(metrics, name))  # type: ignore[arg-type]
    try:
        server, thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        raise ConfigError(f"prometheusPort: cannot listen on {addr}:{port} ({exc.strerror or exc}); pick a free "
                          f"port, 0 for any free one, or omit prometheusPort to disable the endpoint") from exc
    log.info("Prometheus metrics on http://%s:%d/metrics", addr, server.server_port)
    return server, thread
