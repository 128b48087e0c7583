"""Relay metrics: counters kept on the relay thread, snapshots for MeterRead, and the HTTP
endpoint serving ``/metrics`` (Prometheus), ``/healthz`` and ``/readyz`` (:mod:`producer.observe.health`).

Invariants:
- the hot path only increments plain ints on :class:`Metrics` (no locks, no Prometheus calls per
  record); :meth:`Metrics.snapshot` and the Prometheus collector read them, which is safe under the
  GIL for monotone counters and single-writer gauges; the SLO histograms (dwell per topic, rows per
  harvest transaction: :mod:`producer.observe._histograms`) are counted a batch of rows at a time;
- :attr:`Metrics.read_at` is set by each snapshot, which the relay loop takes at least every
  ``minMetricsInterval``: it doubles as the loop's liveness timestamp (no extra work in the loop);
- the outbox gauges (backlog, oldest unsent age, dead-letter rows) are NaN unless this relay leads:
  only the leader measures them, so nothing stale outlives a hand-over;
- the endpoint runs on its own daemon threads, a fixed few whatever its clients do
  (:mod:`producer.observe._http_server`), and only reads: GET and HEAD, ``405`` for any other method;
  ``server.shutdown()`` also closes its socket and the health probe's connection;
- with ``prometheusBasicAuth`` every path, an unknown one too, answers only an authenticated request
  (:mod:`producer.observe._http_auth`); the start-up line says whether the endpoint is reachable from the
  network and whether it authenticates, so an open endpoint is a choice on record.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harvest_outbox.producer.db import MarkedRow
from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.producer.observe._histograms import (
    TRANSACTION_ROWS_BUCKETS,
    DwellHistograms,
    cumulative,
    new_cells,
    observe,
)
from harvest_outbox.producer.observe._http_auth import require_basic_auth
from harvest_outbox.producer.observe._http_server import BoundedWSGIServer, WsgiApp

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
        #: (topic, key) pairs with dead letters (leader only): the keys ``deadLetterPolicy: haltKey`` holds.
        self.halted_keys: int | None = None
        #: ``shards: S``: the led shards' (rows, oldest unsent age), from the same query.
        self.shard_backlog: dict[int, tuple[int, float | None]] = {}
        #: ``outboxLayout: cursor``: (ids the last complete batch's reads spanned, rows it returned), the led
        #: shard with the widest; None on the mark layout or before a batch completed.
        self.cursor_scan: tuple[int, int] | None = None
        self.is_leader = False
        self.dwell = DwellHistograms()
        self.transaction_rows = new_cells(TRANSACTION_ROWS_BUCKETS)
        #: time.monotonic() of the latest snapshot (None before the first): the loop's liveness.
        self.read_at: float | None = None
        self._last_time = time.monotonic()
        self._last_delivered = 0
        self.last: MeterStats | None = None

    def snapshot(self) -> MeterStats:
        now = time.monotonic()
        interval = max(now - self._last_time, 1e-9)
        stats = MeterStats(
            interval,
            self.delivered,
            (self.delivered - self._last_delivered) / interval,
            self.dead_lettered,
            self.remarks,
            self.delivery_failures,
            self.in_flight,
            self.queued,
            self.backlog_rows,
            self.oldest_unsent_age,
            self.dead_letter_rows,
            self.is_leader,
        )
        self._last_time, self._last_delivered = now, self.delivered
        self.last = stats
        self.read_at = now
        return stats

    def observe_dwell(self, rows: Sequence[MarkedRow], now: float) -> None:
        """``rows`` reached their readers at ``now`` (``time.monotonic()``): Kafka acknowledged them
        (at-least-once) or their transaction's ACK_TXN (``--uuid-sequencing``)."""
        self.dwell.observe(rows, now)

    def observe_transaction(self, rows: int) -> None:
        """A harvest transaction of ``rows`` records committed (``--uuid-sequencing``)."""
        observe(self.transaction_rows, TRANSACTION_ROWS_BUCKETS, rows)


class RelayCollector:
    def __init__(
        self,
        metrics: Metrics,
        name: str,
        shards: Callable[[], Mapping[int, tuple[int | None, float | None]]] | None = None,
    ) -> None:
        self._m, self._name, self._shards = metrics, name, shards

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
        # Only the leader queries these; a relay that lost leadership would otherwise keep exporting
        # its last (stale) reading, and max() over the relays would alert on it forever.
        lead = m.is_leader
        yield gauge("harvest_backlog_rows", "Rows in the outbox table (leader only)", m.backlog_rows if lead else None)
        yield gauge(
            "harvest_oldest_unsent_age_seconds",
            "Age of the oldest outbox row (leader only)",
            m.oldest_unsent_age if lead else None,
        )
        yield gauge(
            "harvest_dead_letter_rows",
            "Rows in the dead-letter table (leader only)",
            m.dead_letter_rows if lead else None,
        )
        yield gauge(
            "harvest_halted_keys",
            "Keys (topic, key) with a dead letter; under deadLetterPolicy haltKey their rows wait (leader only)",
            m.halted_keys if lead else None,
        )
        scan = m.cursor_scan if lead else None
        yield gauge(
            "harvest_cursor_scan_ids",
            "outboxLayout cursor: ids the last complete batch's reads spanned, from the cursor's low to the "
            "outbox's head (widest led shard); grows while a long transaction holds low back (leader only)",
            scan[0] if scan else None,
        )
        yield gauge(
            "harvest_cursor_scan_rows",
            "outboxLayout cursor: rows that batch returned (leader only)",
            scan[1] if scan else None,
        )
        yield gauge("harvest_is_leader", "1 if this relay is the leader", 1.0 if m.is_leader else 0.0)
        yield from self._histograms()
        if self._shards is not None:
            yield from self._per_shard(self._shards())

    def _histograms(self) -> Iterator[Any]:
        """The SLO histograms (docs/health.md): dwell per topic, rows per transaction."""
        from prometheus_client.core import HistogramMetricFamily
        from prometheus_client.utils import floatToGoString

        def family(
            name: str,
            doc: str,
            labels: list[str],
            series: Iterable[tuple[list[str], list[float]]],
            bounds: Sequence[float],
        ) -> Any:
            h = HistogramMetricFamily(name, doc, labels=labels)
            for values, cells in series:
                buckets, total, _count = cumulative(cells, bounds)
                h.add_metric(values, [(floatToGoString(le), n) for le, n in buckets], total)
            return h

        dwell = self._m.dwell
        topics = sorted(list(dwell.by_topic.items()))  # list(): one C call, safe while a topic is added
        yield family(
            "harvest_dwell_seconds",
            "Seconds from a row's commit (create_time) to Kafka's acknowledgement "
            "(at-least-once) or its transaction's ACK_TXN (--uuid-sequencing)",
            ["relay", "topic"],
            (([self._name, topic], cells) for topic, cells in topics),
            dwell.bounds,
        )
        yield family(
            "harvest_transaction_rows",
            "Records per committed harvest transaction (--uuid-sequencing)",
            ["relay"],
            [([self._name], self._m.transaction_rows)],
            TRANSACTION_ROWS_BUCKETS,
        )

    def _per_shard(self, shards: Mapping[int, tuple[int | None, float | None]]) -> Iterator[Any]:
        """Series of the shards this relay leads (``shards: S``), labelled ``relay`` and ``shard``;
        a shard another relay leads is exported by that relay."""
        from prometheus_client.core import GaugeMetricFamily

        labels = ["relay", "shard"]
        families = (
            ("harvest_shard_is_leader", "1 for each shard this relay leads", lambda v: 1.0),
            ("harvest_shard_backlog_rows", "Rows of the shard in the outbox", lambda v: v[0]),
            ("harvest_shard_oldest_unsent_age_seconds", "Age of the shard's oldest outbox row", lambda v: v[1]),
        )
        for name, doc, value in families:
            g = GaugeMetricFamily(name, doc, labels=labels)
            for index, v in sorted(shards.items()):
                x = value(v)
                g.add_metric([self._name, str(index)], float("nan") if x is None else float(x))
            yield g


def json_route(answer: Callable[[dict[str, Any]], tuple[int, Any]]) -> WsgiApp:
    """A route answering ``answer(environ)``'s ``(status code, body)`` as JSON, never cached (the one
    owner of the health endpoints' bodies: a relay's, a fleet's, a fleet supervisor's)."""
    from http import HTTPStatus

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        code, payload = answer(environ)
        body = json.dumps(payload, sort_keys=True).encode()
        start_response(
            f"{code} {HTTPStatus(code).phrase}",
            [("Content-Type", "application/json"), ("Content-Length", str(len(body))), ("Cache-Control", "no-store")],
        )
        return [body]

    return app


def _json_app(evaluate: Callable[[], Any]) -> WsgiApp:
    def answer(_environ: dict[str, Any]) -> tuple[int, Any]:
        verdict = evaluate()
        return (200 if verdict.ok else 503), verdict.body

    return json_route(answer)


def _plain(
    start_response: Callable[..., Any], status: str, text: str, headers: list[tuple[str, str]] | None = None
) -> Iterable[bytes]:
    body = (text + "\n").encode()
    start_response(status, [("Content-Type", "text/plain"), ("Content-Length", str(len(body))), *(headers or [])])
    return [body]


def start_prometheus(
    metrics: Metrics,
    name: str,
    port: int,
    addr: str = "0.0.0.0",
    relay: Any = None,
    shards: Callable[[], Mapping[int, tuple[int | None, float | None]]] | None = None,
    basic_auth: str = "",
) -> Any:
    """Serve ``/metrics`` (from a private registry) on ``addr:port``, plus ``/healthz`` and
    ``/readyz`` when ``relay`` (a :class:`producer.observe.health.RelayView`) is given; returns (server, thread).
    ``shards``: the led shards' metrics of a sharded relay, exported per shard as well. ``basic_auth``
    (``user:password``): every path answers only requests with these credentials (``401`` otherwise)."""
    from prometheus_client import CollectorRegistry, make_wsgi_app

    registry = CollectorRegistry(auto_describe=False)
    registry.register(RelayCollector(metrics, name, shards))
    routes: dict[str, WsgiApp] = {"/metrics": make_wsgi_app(registry)}
    health = None
    if relay is not None:
        from harvest_outbox.producer.observe.health import Health

        health = Health(relay)
        routes["/healthz"] = _json_app(health.live)
        routes["/readyz"] = _json_app(health.ready)

    return serve_routes(
        routes,
        name,
        port,
        addr,
        basic_auth,
        on_close=[health.close] if health is not None else [],
        extra=" (+ /healthz, /readyz)" if health is not None else "",
    )


def serve_routes(
    routes: Mapping[str, WsgiApp],
    name: str,
    port: int,
    addr: str = "0.0.0.0",
    basic_auth: str = "",
    on_close: Sequence[Callable[[], None]] = (),
    extra: str = "",
) -> Any:
    """Serve read-only ``routes`` (path -> WSGI app) on ``addr:port``; returns (server, thread).
    ``on_close``: called when the server is shut down; ``extra``: what the start line adds after
    ``/metrics``."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):  # read-only endpoints: nothing answers a write or a TRACE
            return _plain(
                start_response,
                "405 Method Not Allowed",
                f"{method[:32]} not allowed; use GET or HEAD",
                [("Allow", "GET, HEAD")],
            )
        route = routes.get(environ.get("PATH_INFO") or "/")
        if route is None:
            return _plain(start_response, "404 Not Found", "not found; try " + ", ".join(sorted(routes)))
        if method == "HEAD":  # a GET without its body (prometheus_client's app refuses HEAD itself)
            body = route({**environ, "REQUEST_METHOD": "GET"}, start_response)
            for _chunk in body:
                pass
            getattr(body, "close", lambda: None)()
            return [b""]
        return route(environ, start_response)

    served = require_basic_auth(app, basic_auth) if basic_auth else app
    try:
        server = BoundedWSGIServer(addr, port, served, name)
    except OSError as exc:
        for close in on_close:
            close()
        raise ConfigError(
            f"prometheusPort: cannot listen on {addr}:{port} ({exc.strerror or exc}); pick a free "
            f"port, 0 for any free one, or omit prometheusPort to disable the endpoint"
        ) from exc
    server.on_close.extend(on_close)
    thread = threading.Thread(target=server.serve_forever, name=f"harvest-http-{name}", daemon=True)
    thread.start()
    # Said at every start, so an endpoint open to the network without authentication is a choice on record.
    log.info(
        "metrics on http://%s:%d/metrics%s, %s, %s",
        addr,
        server.server_port,
        extra,
        "this host only" if _loopback(addr) else "reachable from the network (prometheusBindAddress)",
        "basic auth required" if basic_auth else "no authentication (prometheusBasicAuth)",
    )
    return server, thread


def _loopback(addr: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost"
