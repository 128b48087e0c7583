"""The fleet's one HTTP endpoint: ``/metrics`` with every series labelled by ``outbox``, and
``/healthz`` / ``/readyz`` per outbox.

- ``/metrics``: each outbox relay's series (docs/metrics.md) with an ``outbox`` label added, plus
  ``harvest_fleet_outboxes{state}`` and ``harvest_fleet_relay_failures{outbox}``. Cardinality: the
  single relay's series times the number of outboxes (per topic for the dwell histogram, per led
  shard for a sharded outbox).
- ``/readyz``: 200 when every outbox's relay is ready (as a single relay's ``/readyz`` says: running,
  loop turning, its database answering); the body has each outbox's verdict. ``/readyz?outbox=<id>``
  answers for that outbox alone (404 for an unknown id).
- ``/healthz``: 503 only when an outbox's relay loop is stuck (a hung call; restarting the process is
  the cure). An outbox whose relay failed and waits to start again is the fleet's to handle, so the
  process stays live.

Invariants (``tests/test_producer/fleet/test_fleet_endpoint.py``):
- reading the endpoint never touches a relay's connections or threads (as a single relay's health);
  the database probes are one per ``dataSource``, not one per outbox;
- no body holds a secret (errors pass through ``redact_error``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import parse_qs

from harvest_outbox.producer.fleet.member import MemberStatus
from harvest_outbox.producer.fleet.supervisor import Fleet
from harvest_outbox.producer.observe.health import DatabaseProbe, Health, Verdict
from harvest_outbox.producer.observe.metrics import RelayCollector, json_route, serve_routes


class FleetCollector:
    """Every member relay's series, each with an ``outbox`` label."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily, Metric

        statuses = self._fleet.statuses()
        families: dict[str, Metric] = {}
        for status in statuses:
            relay = status.relay
            if relay is None or not hasattr(relay, "metrics"):
                continue
            shards = getattr(relay, "shard_metrics", None)
            for family in RelayCollector(relay.metrics, relay.config.name, shards).collect():
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(family.name, family.documentation, family.type)
                for sample in family.samples:
                    merged.add_sample(sample.name, {**sample.labels, "outbox": status.id}, sample.value)
        yield from families.values()
        counts: dict[str, int] = {}
        for status in statuses:
            counts[status.state] = counts.get(status.state, 0) + 1
        g = GaugeMetricFamily("harvest_fleet_outboxes", "Outboxes of this fleet process by state", labels=["state"])
        for state in ("starting", "running", "backoff", "stopped"):
            g.add_metric([state], float(counts.get(state, 0)))
        yield g
        from prometheus_client.core import CounterMetricFamily

        c = CounterMetricFamily(
            "harvest_fleet_relay_failures", "Times an outbox's relay failed and was started again", labels=["outbox"]
        )
        for status in statuses:
            c.add_metric([status.id], float(status.failures))
        yield c


class FleetHealth:
    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        self._probes: dict[str, DatabaseProbe] = {}

    def _health(self, status: MemberStatus) -> Health | None:
        relay = status.relay
        if relay is None or not hasattr(relay, "metrics"):
            return None
        dsn = relay.config.data_source
        probe = self._probes.get(dsn)
        if probe is None:
            probe = self._probes[dsn] = DatabaseProbe(dsn)
        return Health(relay, probe)

    def verdict(self, status: MemberStatus, ready: bool) -> Verdict:
        health = self._health(status) if status.state == "running" else None
        if health is None:
            reason = status.last_error or status.state
            body = {"outbox": status.id, "state": status.state, "failures": status.failures, "reason": reason}
            # Waiting to start again is the fleet at work, not a stuck process: live, not ready.
            return Verdict(not ready, {"status": "not ready" if ready else "alive", **body})
        verdict = health.ready() if ready else health.live()
        return Verdict(verdict.ok, {"outbox": status.id, "failures": status.failures, **verdict.body})

    def answer(self, ready: bool, outbox: str | None) -> tuple[int, dict[str, Any]]:
        if ready and not self._fleet.started.is_set():
            return 503, {"status": "not ready", "outboxes": {}, "not_ok": [], "reason": "the fleet has not started"}
        statuses = self._fleet.statuses()
        if outbox is not None:
            chosen = [s for s in statuses if s.id == outbox]
            if not chosen:
                return 404, {"status": "unknown outbox", "outbox": outbox, "outboxes": [s.id for s in statuses]}
            verdict = self.verdict(chosen[0], ready)
            return verdict.http_status, verdict.body
        verdicts = {s.id: self.verdict(s, ready) for s in statuses}
        ok = all(v.ok for v in verdicts.values())
        word = ("ready" if ok else "not ready") if ready else ("alive" if ok else "dead")
        return (200 if ok else 503), {
            "status": word,
            "outboxes": {oid: v.body for oid, v in verdicts.items()},
            "not_ok": sorted(oid for oid, v in verdicts.items() if not v.ok),
        }

    def close(self) -> None:
        for probe in self._probes.values():
            probe.close()


def _json(health: FleetHealth, ready: bool) -> Callable[..., Iterable[bytes]]:
    def answer(environ: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        outbox = parse_qs(environ.get("QUERY_STRING") or "").get("outbox", [None])[0]
        return health.answer(ready, outbox)

    return json_route(answer)


def start_fleet_endpoint(fleet: Fleet, port: int, addr: str = "0.0.0.0", basic_auth: str = "") -> Any:
    """Serve the fleet's ``/metrics``, ``/healthz`` and ``/readyz``; returns (server, thread)."""
    from prometheus_client import CollectorRegistry, make_wsgi_app

    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(fleet))
    health = FleetHealth(fleet)
    routes = {"/metrics": make_wsgi_app(registry), "/healthz": _json(health, False), "/readyz": _json(health, True)}
    return serve_routes(
        routes, "fleet", port, addr, basic_auth, on_close=[health.close], extra=" (+ /healthz, /readyz per outbox)"
    )
