"""Pure logic of /healthz and /readyz (the HTTP side runs against real relays in test_health.py)."""

from __future__ import annotations

import socket
import time
import uuid
from dataclasses import dataclass, field

import pytest

from harvest_outbox.producer.config import HarvestConfig, Limits
from harvest_outbox.producer.harvest import State
from harvest_outbox.producer.observe.health import DatabaseProbe, Health
from harvest_outbox.producer.observe.metrics import Metrics


class CountingProbe(DatabaseProbe):
    def __init__(self, error: str | None = None, ttl: float = 1.0) -> None:
        super().__init__("host=unused", ttl=ttl)
        self.error, self.calls = error, 0

    def _probe(self) -> str | None:
        self.calls += 1
        return self.error


@dataclass
class View:
    state: State = State.RUNNING
    is_leader: bool = False
    leader_id: uuid.UUID | None = None
    metrics: Metrics = field(default_factory=Metrics)
    config: HarvestConfig = field(
        default_factory=lambda: HarvestConfig(
            name="r1",
            data_source="host=db password=hunter2",
            limits=Limits(min_metrics_interval=0.1, liveness_timeout=0.5),
        )
    )


def test_verdicts_follow_state_loop_and_database() -> None:
    view, probe = View(), CountingProbe()
    health = Health(view, probe)  # type: ignore[arg-type]
    assert health.live().body["reason"] == "relay loop has not completed an iteration yet"
    view.metrics.snapshot()
    live, ready = health.live(), health.ready()
    assert (live.http_status, live.body["status"]) == (200, "alive")
    assert (ready.http_status, ready.body["role"], ready.body["database"]) == (200, "standby", "ok")
    view.is_leader, view.leader_id = True, uuid.uuid4()
    assert health.ready().body["role"] == "leader" and health.ready().body["leader_id"] == str(view.leader_id)
    view.state = State.STOPPING
    assert health.ready().body["reason"] == "stopping" and health.live().http_status == 200  # still draining
    for state, reason in ((State.CREATED, "not started"), (State.STOPPED, "stopped")):
        view.state = state
        assert health.ready().body["reason"] == reason == health.live().body["reason"]
        assert health.ready().http_status == health.live().http_status == 503
    view.state = State.RUNNING
    view.metrics.read_at = time.monotonic() - 0.6
    body = health.live().body
    assert body["status"] == "dead" and body["reason"].startswith("relay loop stalled: no iteration for 0.6s")
    assert health.ready().body["database"] == "not checked"  # a stalled relay is not probed further


def test_database_probe_is_cached_and_its_error_makes_not_ready() -> None:
    view, probe = View(), CountingProbe("database unreachable: boom", ttl=60)
    view.metrics.snapshot()
    health = Health(view, probe)  # type: ignore[arg-type]
    for _ in range(5):
        verdict = health.ready()
        assert verdict.http_status == 503 and verdict.body["reason"] == "database unreachable: boom"
    assert probe.calls == 1  # a tight probe loop costs the database one query per TTL
    assert health.live().http_status == 200  # the database is a readiness concern, not liveness


def test_real_probe_against_a_closed_port_is_secret_free() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    probe = DatabaseProbe(f"host=127.0.0.1 port={port} user=u password=hunter2 dbname=d", timeout=1.0)
    error = probe.check()
    assert error is not None and error.startswith("database unreachable:") and "hunter2" not in error
    probe.close()


@pytest.mark.parametrize("bad", [0, -1.0])
def test_liveness_timeout_must_be_positive(bad: float) -> None:
    from harvest_outbox.producer.errors import ConfigError

    with pytest.raises(ConfigError, match=r"limits\.livenessTimeout"):
        Limits(liveness_timeout=bad)
