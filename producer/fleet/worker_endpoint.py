"""The endpoint of a fleet run by worker processes (``fleet.workers``): one ``/metrics``, ``/healthz`` and
``/readyz`` for them all, answered from the workers' own endpoints (each on 127.0.0.1, a port of the
kernel's choosing, the file's ``prometheusBasicAuth``).

- ``/metrics``: every worker's series with a ``worker`` label added (an outbox's series come from each
  worker serving it, its leader's and its standbys'), plus ``harvest_fleet_workers{state}`` and
  ``harvest_fleet_worker_restarts{worker}``. A worker that does not answer within ``SCRAPE_TIMEOUT``
  adds no series and counts in ``harvest_fleet_worker_scrape_failures{worker}``.
- ``/readyz``: 200 when every worker runs and each outbox is ready: as its leader's worker says, or,
  when no worker leads it (another host's process may), as every worker serving it says. The body
  has each outbox's verdict with the worker it came from, and each worker's state;
  ``/readyz?outbox=<id>`` answers for that outbox alone (404 for an id no worker serves).
- ``/healthz``: 503 only when a running worker says it is stuck (its own ``/healthz``) or does not answer;
  a worker waiting to start again is the supervisor's to handle, so the process stays live.

Invariants (``tests/test_producer/fleet/test_fleet_workers.py``): a family appears once however many
workers export it; no body holds a secret (the workers' bodies are redacted by them).
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qs

from harvest_outbox.producer.fleet.workers import Workers
from harvest_outbox.producer.observe.metrics import json_route, serve_routes

#: How long the supervisor waits for a worker's endpoint.
SCRAPE_TIMEOUT = 5.0


class WorkerClient:
    """GETs of the workers' endpoints, with the fleet's basic-auth credentials."""

    def __init__(self, workers: Workers, basic_auth: str) -> None:
        self._workers = workers
        self._auth = "Basic " + base64.b64encode(basic_auth.encode()).decode() if basic_auth else ""
        self.scrape_failures = {w.index: 0 for w in workers.workers}
        # never through an HTTP proxy from the environment: the workers listen on this host
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def get(self, port: int, path: str) -> tuple[int, bytes]:
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
        if self._auth:
            req.add_header("Authorization", self._auth)
        try:
            with self._opener.open(req, timeout=SCRAPE_TIMEOUT) as resp:
                return int(resp.status), resp.read()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read()

    def each(self, path: str) -> dict[int, tuple[int, bytes] | None]:
        """``path`` from every running worker that has said its port, side by side; None for one that did
        not answer. Workers not running, or starting (no port yet), are left out."""
        known = {w.index: w.port() for w in self._workers.workers if w.pid is not None}
        ports = {index: port for index, port in known.items() if port is not None}

        def one(item: tuple[int, int]) -> tuple[int, tuple[int, bytes] | None]:
            index, port = item
            try:
                return index, self.get(port, path)
            except (OSError, ValueError):
                self.scrape_failures[index] = self.scrape_failures.get(index, 0) + 1
                return index, None

        if not ports:
            return {}
        with ThreadPoolExecutor(max_workers=len(ports), thread_name_prefix="harvest-scrape") as pool:
            return dict(pool.map(one, ports.items()))


class WorkersCollector:
    """The workers' series, each with a ``worker`` label, merged family by family."""

    def __init__(self, workers: Workers, client: WorkerClient) -> None:
        self._workers, self._client = workers, client

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
        from prometheus_client.parser import text_string_to_metric_families

        families: dict[str, Metric] = {}
        for index, answer in sorted(self._client.each("/metrics").items()):
            if answer is None or answer[0] != 200:
                continue
            for family in text_string_to_metric_families(answer[1].decode("utf-8", "replace")):
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(family.name, family.documentation, family.type)
                for sample in family.samples:
                    merged.add_sample(
                        sample.name,
                        {**sample.labels, "worker": str(index)},
                        sample.value,
                        sample.timestamp,
                        sample.exemplar,
                    )
        yield from families.values()
        statuses = self._workers.statuses()
        g = GaugeMetricFamily("harvest_fleet_workers", "Worker processes of this fleet by state", labels=["state"])
        for state in ("running", "backoff", "stopped"):
            g.add_metric([state], float(sum(1 for s in statuses if s["state"] == state)))
        yield g
        c = CounterMetricFamily(
            "harvest_fleet_worker_restarts", "Times a worker process exited and was started again", labels=["worker"]
        )
        for s in statuses:
            c.add_metric([str(s["worker"])], float(s["restarts"]))
        yield c
        f = CounterMetricFamily(
            "harvest_fleet_worker_scrape_failures",
            "Times a worker's endpoint did not answer the supervisor",
            labels=["worker"],
        )
        for index, failures in sorted(self._client.scrape_failures.items()):
            f.add_metric([str(index)], float(failures))
        yield f


def _body(answer: tuple[int, bytes] | None) -> dict[str, Any] | None:
    if answer is None:
        return None
    try:
        body = json.loads(answer[1])
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


class WorkersHealth:
    def __init__(self, workers: Workers, client: WorkerClient) -> None:
        self._workers, self._client = workers, client

    def live(self) -> tuple[int, dict[str, Any]]:
        answers = self._client.each("/healthz")  # (a worker starting, without its port yet, is live)
        stuck = sorted(i for i, a in answers.items() if a is None or a[0] != 200)
        said = {str(i): _body(a) if a is not None else "no answer" for i, a in sorted(answers.items())}
        return (200 if not stuck else 503), {
            "status": "alive" if not stuck else "dead",
            "workers": self._workers.statuses(),
            "said": said,
            "not_ok": [f"worker {i}" for i in stuck],
        }

    def ready(self, outbox: str | None) -> tuple[int, dict[str, Any]]:
        statuses = self._workers.statuses()
        if not self._workers.started.is_set():
            return 503, {"status": "not ready", "outboxes": {}, "not_ok": [], "reason": "the workers have not started"}
        bodies = {i: _body(a) for i, a in self._client.each("/readyz").items()}
        verdicts: dict[str, tuple[bool, dict[str, Any]]] = {}
        for oid in sorted({o for b in bodies.values() if b for o in b.get("outboxes", {})}):
            verdicts[oid] = _outbox_verdict(oid, bodies)
        if outbox is not None:
            if outbox not in verdicts:
                return 404, {"status": "unknown outbox", "outbox": outbox, "outboxes": sorted(verdicts)}
            ok, body = verdicts[outbox]
            return (200 if ok else 503), body
        down = [s["worker"] for s in statuses if s["state"] != "running" or bodies.get(s["worker"]) is None]
        not_ok = sorted(oid for oid, (ok, _b) in verdicts.items() if not ok)
        ok = not not_ok and not down
        return (200 if ok else 503), {
            "status": "ready" if ok else "not ready",
            "outboxes": {oid: body for oid, (_ok, body) in verdicts.items()},
            "not_ok": not_ok + [f"worker {w}" for w in down],
            "workers": statuses,
        }


def _outbox_verdict(oid: str, bodies: dict[int, dict[str, Any] | None]) -> tuple[bool, dict[str, Any]]:
    said = {
        i: (oid not in b.get("not_ok", []), b["outboxes"][oid])
        for i, b in bodies.items()
        if b and oid in b.get("outboxes", {})
    }
    leaders = [i for i, (_ok, body) in said.items() if isinstance(body, dict) and body.get("role") == "leader"]
    if leaders:
        ok, body = said[leaders[0]]
        return ok, {**body, "worker": leaders[0]}
    first = min(said)
    return all(ok for ok, _b in said.values()), {**said[first][1], "worker": first}


def start_workers_endpoint(workers: Workers, port: int, addr: str = "0.0.0.0", basic_auth: str = "") -> Any:
    """Serve the supervisor's ``/metrics``, ``/healthz`` and ``/readyz``; returns (server, thread)."""
    from prometheus_client import CollectorRegistry, make_wsgi_app

    client = WorkerClient(workers, basic_auth)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkersCollector(workers, client))
    health = WorkersHealth(workers, client)

    def ready(environ: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        outbox = parse_qs(environ.get("QUERY_STRING") or "").get("outbox", [None])[0]
        return health.ready(outbox)

    routes = {
        "/metrics": make_wsgi_app(registry),
        "/healthz": json_route(lambda _e: health.live()),
        "/readyz": json_route(ready),
    }
    return serve_routes(
        routes, "fleet-workers", port, addr, basic_auth, extra=" (+ /healthz, /readyz, of every worker)"
    )
