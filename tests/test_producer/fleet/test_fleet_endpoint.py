"""The fleet's endpoint answers from what its members publish: every relay series with an ``outbox``
label, the fleet's own counts, and per-outbox readiness where a relay waiting to be started again is
not ready but alive (producer/fleet/endpoint.py)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from harvest_outbox.producer.fleet.endpoint import FleetCollector, FleetHealth
from harvest_outbox.producer.fleet.member import MemberStatus
from harvest_outbox.producer.observe.metrics import Metrics


def _relay(delivered: int) -> Any:
    metrics = Metrics()
    metrics.delivered = delivered
    config = SimpleNamespace(name=f"r/{delivered}", data_source="postgres://relay:s3cret@127.0.0.1:1/app")
    return SimpleNamespace(metrics=metrics, config=config)


class _Fleet:
    def __init__(self, statuses: list[MemberStatus], started: bool = True) -> None:
        self._statuses = statuses
        self.started = threading.Event()
        if started:
            self.started.set()

    def statuses(self) -> list[MemberStatus]:
        return self._statuses


def test_every_series_carries_its_outbox_and_the_fleet_counts_states_and_failures() -> None:
    fleet = _Fleet(
        [
            MemberStatus("billing", "running", 0, None, _relay(5)),
            MemberStatus("db2/t1.outbox", "running", 2, None, _relay(7)),
            MemberStatus("gone", "backoff", 3, "lost the database", None),
        ]
    )
    families = {f.name: f for f in FleetCollector(fleet).collect()}  # type: ignore[arg-type]
    delivered = {s.labels["outbox"]: s.value for s in families["harvest_delivered_records"].samples}
    assert delivered == {"billing": 5.0, "db2/t1.outbox": 7.0}
    assert {s.labels["relay"] for s in families["harvest_delivered_records"].samples} == {"r/5", "r/7"}
    states = {s.labels["state"]: s.value for s in families["harvest_fleet_outboxes"].samples}
    assert states == {"starting": 0.0, "running": 2.0, "backoff": 1.0, "stopped": 0.0}
    failures = {s.labels["outbox"]: s.value for s in families["harvest_fleet_relay_failures"].samples}
    assert failures == {"billing": 0.0, "db2/t1.outbox": 2.0, "gone": 3.0}


def test_an_outbox_waiting_to_start_again_is_not_ready_but_alive_and_an_unknown_one_is_404() -> None:
    health = FleetHealth(_Fleet([MemberStatus("gone", "backoff", 3, "lost the database", None)]))  # type: ignore[arg-type]
    code, body = health.answer(ready=True, outbox=None)
    assert code == 503 and body["not_ok"] == ["gone"]
    assert body["outboxes"]["gone"]["reason"] == "lost the database"
    assert health.answer(ready=False, outbox=None)[0] == 200
    assert health.answer(ready=True, outbox="gone")[0] == 503
    code, body = health.answer(ready=True, outbox="nope")
    assert (code, body["outboxes"]) == (404, ["gone"])


def test_a_fleet_that_has_not_looked_for_its_outboxes_is_not_ready() -> None:
    health = FleetHealth(_Fleet([], started=False))  # type: ignore[arg-type]
    assert health.answer(ready=True, outbox=None)[0] == 503
    assert health.answer(ready=False, outbox=None)[0] == 200
