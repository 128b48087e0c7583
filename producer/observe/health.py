"""Liveness and readiness of a running relay, for ``/healthz`` and ``/readyz``.

- **live** (``/healthz``): the relay loop is turning. The loop takes a metrics reading (the one
  behind ``MeterRead`` and ``/metrics``) at least every ``limits.minMetricsInterval``; when the
  latest one is older than ``limits.livenessTimeout`` the loop is stuck (a hung database call, a
  deadlock, a blocked event handler) and the process should be restarted.
- **ready** (``/readyz``): the relay is running (started, not asked to stop), live, and connected:
  its database answers a trivial query (checked on a connection of our own, at most once per
  :data:`PROBE_TTL` however often the endpoint is polled, with a short connect/statement timeout).
  The 200 body says whether this relay is the ``leader`` or a ``standby``; a standby is ready too
  (it is healthy and can take over), so a readiness gate never waits for an election.

Invariants:
- evaluating health never touches the relay's own connections or thread: it reads what the loop
  already publishes (``metrics.read_at``, ``state``, ``is_leader``), so a probe can neither slow
  nor break the relay;
- a response body never contains a secret (database errors pass through ``redact_error``);
- the JSON bodies have a fixed shape: ``status``, ``relay``, ``state``, ``role``, ``leader_id``,
  ``loop_age_seconds``, plus ``database`` on ``/readyz`` and ``reason`` when not live / not ready.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg

from harvest_outbox.producer.db.credentials import open_connection
from harvest_outbox.redact import redact_error

log = logging.getLogger(__name__)

#: Seconds a database probe result is reused: probes are cheap, but a tight probe loop must not
#: become a load on the database.
PROBE_TTL = 1.0
#: Seconds the probe may take to connect / run ``SELECT 1`` before the database counts as unreachable.
PROBE_TIMEOUT = 2.0


class LoopReadings(Protocol):
    """What health reads of the relay's metrics (:class:`producer.observe.metrics.Metrics`): when the loop
    last took a reading (``time.monotonic()``, None before the first)."""

    read_at: float | None


class RelayView(Protocol):
    """What health needs from :class:`producer.harvest.Harvest` (read-only)."""

    @property
    def state(self) -> Any: ...  # producer.harvest.State

    @property
    def is_leader(self) -> bool: ...

    @property
    def leader_id(self) -> uuid.UUID | None: ...

    metrics: LoopReadings
    config: Any  # producer.config.HarvestConfig


@dataclass(frozen=True)
class Verdict:
    ok: bool
    body: dict[str, Any]

    @property
    def http_status(self) -> int:
        return 200 if self.ok else 503


class DatabaseProbe:
    """``SELECT 1`` on a dedicated autocommit connection, result cached for ``ttl`` seconds."""

    def __init__(self, dsn: str, ttl: float = PROBE_TTL, timeout: float = PROBE_TIMEOUT) -> None:
        self._dsn, self._ttl, self._timeout = dsn, ttl, timeout
        self._conn: psycopg.Connection | None = None
        self._lock = threading.Lock()
        self._checked_at = -float("inf")
        self._error: str | None = "not checked yet"

    def check(self) -> str | None:
        """None when the database answered, else why not (secret-free)."""
        with self._lock:
            now = time.monotonic()
            if now - self._checked_at >= self._ttl:
                self._error = self._probe()
                self._checked_at = time.monotonic()
            return self._error

    def _probe(self) -> str | None:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = open_connection(
                    self._dsn,
                    autocommit=True,
                    connect_timeout=max(1, int(self._timeout)),
                    application_name="harvest-health",
                )
                self._conn.execute(f"SET statement_timeout = {int(self._timeout * 1000)}")
            self._conn.execute("SELECT 1").fetchone()
            return None
        except psycopg.Error as exc:
            self.close()
            return f"database unreachable: {redact_error(str(exc), self._dsn).strip() or type(exc).__name__}"

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:  # already broken: nothing to release
                pass


class Health:
    """Evaluates ``/healthz`` and ``/readyz`` for one relay."""

    def __init__(self, relay: RelayView, probe: DatabaseProbe | None = None) -> None:
        self._relay = relay
        self._probe = probe if probe is not None else DatabaseProbe(relay.config.data_source)

    def _base(self) -> dict[str, Any]:
        r = self._relay
        read_at = r.metrics.read_at
        leader_id = r.leader_id
        return {
            "relay": r.config.name,
            "state": getattr(r.state, "value", str(r.state)),
            "role": "leader" if r.is_leader else "standby",
            "leader_id": None if leader_id is None else str(leader_id),
            "loop_age_seconds": None if read_at is None else round(time.monotonic() - read_at, 3),
        }

    def _loop_problem(self, body: dict[str, Any]) -> str | None:
        age = body["loop_age_seconds"]
        timeout = self._relay.config.limits.liveness_timeout
        if body["state"] == "created":
            return "not started"
        if body["state"] == "stopped":
            return "stopped"
        if age is None:
            return "relay loop has not completed an iteration yet"
        if age > timeout:
            return f"relay loop stalled: no iteration for {age:.1f}s (livenessTimeout {timeout:g}s)"
        return None

    def live(self) -> Verdict:
        body = self._base()
        problem = self._loop_problem(body)
        if problem is not None:
            return Verdict(False, {"status": "dead", **body, "reason": problem})
        return Verdict(True, {"status": "alive", **body})

    def ready(self) -> Verdict:
        body = self._base()
        if body["state"] != "running":  # not started, or stopping: draining, a standby must take over
            problem: str | None = "not started" if body["state"] == "created" else body["state"]
        else:
            problem = self._loop_problem(body)
        db_error = self._probe.check() if problem is None else None
        body["database"] = "ok" if problem is None and db_error is None else (db_error or "not checked")
        problem = problem or db_error
        if problem is not None:
            return Verdict(False, {"status": "not ready", **body, "reason": problem})
        return Verdict(True, {"status": "ready", **body})

    def close(self) -> None:
        self._probe.close()
