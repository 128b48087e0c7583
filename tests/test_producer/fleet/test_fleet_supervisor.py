"""The fleet's supervision, stepped through with relays that do what a scenario says (no services: what
the relays themselves do is test_fleet_failover.py's): reconciliation decides then applies, a failed
discovery keeps its outboxes, a failing relay is started again after a backoff without touching the
others, a stop ends members whatever they are doing (producer/fleet/supervisor.py, member.py)."""

from __future__ import annotations

import dataclasses
import resource
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from harvest_outbox.producer.fleet.discovery import DiscoveryError
from harvest_outbox.producer.fleet.member import Member
from harvest_outbox.producer.fleet.run import _raise_open_files_limit
from harvest_outbox.producer.fleet.spec import Discovery, FleetFile, FleetOptions, fleet_from_document
from harvest_outbox.producer.fleet.supervisor import Change, Fleet, decide

DSN = "postgres://relay:s3cret@db1:5432/app"


class ScriptedRelay:
    """A relay whose start fails, blocks or succeeds, and whose run fails or lasts, as its outbox's script says."""

    def __init__(self, config: Any, script: dict[str, list[str]], log: list[tuple[str, str]]) -> None:
        self.config = config
        self.outbox = config.outbox_table
        steps = script.get(self.outbox, [])
        self.step = steps.pop(0) if steps else "run"
        if self.step == "fail-make":
            raise ValueError("the relay cannot be made")
        self._stop = threading.Event()
        self._log = log
        self._log.append(("made", self.outbox))

    def start(self) -> ScriptedRelay:
        if self.step == "fail-start":
            raise RuntimeError(f"cannot connect to postgres://relay:s3cret@db1 for {self.outbox}")
        if self.step == "hang-start":
            self._stop.wait()  # a server that does not answer: only stop() ends the wait
        return self

    def stop(self) -> None:
        self._stop.set()

    def wait(self, timeout: float | None = None) -> bool:
        if self.step == "fail-run":
            raise RuntimeError("schema dropped")
        if self._stop.wait(timeout):
            self._log.append(("stopped", self.outbox))
            return True
        return False


def _file(tables: list[str], discover: bool = False, backoff: str = "10ms") -> FleetFile:
    doc: dict[str, Any] = {
        "harvest": {"dataSource": DSN, "name": "r"},
        "outboxes": [{"id": t.split(".")[0], "outboxTable": t} for t in tables],
        "fleet": {"restartBackoff": backoff, "restartBackoffMax": "40ms"},
    }
    if discover:
        doc["discover"] = [{"schemas": "tenant_*"}]
    return fleet_from_document(doc, {}, None, {}, {})


def _wait(cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.fixture
def log() -> list[tuple[str, str]]:
    return []


def _fleet(file: FleetFile, log: list[tuple[str, str]], script: dict[str, list[str]] | None = None, **kw: Any) -> Fleet:
    script = script if script is not None else {}
    return Fleet(file, relay_factory=lambda config: ScriptedRelay(config, script, log), **kw)


def test_decide_names_added_removed_and_changed_outboxes() -> None:
    a, b = _file(["a.outbox", "b.outbox"]).listed
    b2 = _file(["b.outbox", "c.outbox"], backoff="20ms").listed[0]
    assert decide({"a": a, "b": b}, {"b": b, "c": a}) == Change(added=("c",), removed=("a",))
    changed = _file(["b.outbox"]).listed[0]
    changed = dataclasses.replace(changed, config=dataclasses.replace(changed.config, shards=2))
    assert decide({"b": b}, {"b": changed}) == Change(changed=("b",))
    assert not decide({"b": b}, {"b": b2})  # same config: nothing to do
    assert not Change()


def test_reload_starts_new_outboxes_stops_removed_ones_and_keeps_the_rest(log: list[tuple[str, str]]) -> None:
    fleet = _fleet(_file(["a.outbox", "b.outbox"]), log).start()
    try:
        _wait(lambda: [s.state for s in fleet.statuses()] == ["running", "running"], "both running")
        kept = fleet.member("b")
        change = fleet.reload(_file(["b.outbox", "c.outbox"]))
        assert change == Change(added=("c",), removed=("a",))
        assert ("stopped", "a.outbox") in log  # joined before reload returned
        assert fleet.member("b") is kept and fleet.member("a") is None
        _wait(lambda: [s.state for s in fleet.statuses()] == ["running", "running"], "b and c running")
    finally:
        fleet.stop()
        assert fleet.wait(10)
    assert sorted(o for what, o in log if what == "stopped") == ["a.outbox", "b.outbox", "c.outbox"]


def test_a_failing_relay_is_started_again_with_backoff_and_the_others_never_notice(log: list[tuple[str, str]]) -> None:
    script = {"a.outbox": ["fail-start", "fail-make", "fail-run"]}
    fleet = _fleet(_file(["a.outbox", "b.outbox"]), log, script).start()
    try:
        # (the 4th relay's making too: a status read between the 3rd relay's failure being counted and its
        # state leaving "running" shows failures == 3 with the 3rd relay's state)
        _wait(
            lambda: (
                fleet.statuses()[0].failures == 3
                and fleet.statuses()[0].state == "running"
                and log.count(("made", "a.outbox")) == 3
            ),
            "a's 4th relay",
        )
        a, b = fleet.statuses()
        assert "s3cret" not in (a.last_error or "") and "schema dropped" in (a.last_error or "")
        assert (b.state, b.failures) == ("running", 0)
        assert log.count(("made", "b.outbox")) == 1 and log.count(("made", "a.outbox")) == 3  # one could not be made
    finally:
        fleet.stop()
        assert fleet.wait(10)


def test_stop_ends_a_member_whose_relay_hangs_in_start(log: list[tuple[str, str]]) -> None:
    fleet = _fleet(_file(["a.outbox", "b.outbox"]), log, {"a.outbox": ["hang-start"]}).start()
    _wait(lambda: fleet.statuses()[1].state == "running", "b running")
    assert fleet.statuses()[0].state == "starting"
    fleet.stop()
    assert fleet.wait(10)
    assert {s.state for s in fleet.statuses()} == {"stopped"}


def test_a_failed_discovery_keeps_what_it_found_before(log: list[tuple[str, str]]) -> None:
    answers: list[Any] = [
        [(DSN, "tenant_a.outbox"), (DSN, "tenant_b.outbox"), (DSN, "a.outbox")],  # a.outbox is listed too
        DiscoveryError("discover[0]: cannot look"),
        [(DSN, "tenant_b.outbox")],
    ]

    def discover(entry: Discovery) -> list[tuple[str, str]]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]

    fleet = _fleet(_file(["a.outbox"], discover=True), log, discover_outboxes=discover).start()
    try:
        ids = lambda: [s.id for s in fleet.statuses()]  # noqa: E731
        assert ids() == ["a", "app/tenant_a.outbox", "app/tenant_b.outbox"]  # the listed a.outbox once
        assert fleet.reload() == Change()  # the server is away: nobody stops
        assert ids() == ["a", "app/tenant_a.outbox", "app/tenant_b.outbox"]
        assert fleet.reload() == Change(removed=("app/tenant_a.outbox",))
    finally:
        fleet.stop()
        assert fleet.wait(10)


def test_a_member_makes_its_next_relay_only_after_the_last_one_stopped(log: list[tuple[str, str]]) -> None:
    file = _file(["a.outbox"])
    member = Member(
        file.listed[0], FleetOptions(restart_backoff=0.01, restart_backoff_max=0.01), lambda c: _Slow(c, log)
    )
    member.start()
    _wait(lambda: log.count(("made", "a.outbox")) >= 3, "three relays")
    member.stop()
    assert member.join(10)
    # made, stopped, made, stopped, ...: never two relays of the outbox alive at once
    events = [what for what, _ in log]
    assert all(events[i] != events[i + 1] for i in range(len(events) - 1)), events


class _Slow:
    """A relay that fails after a while and takes a while to stop."""

    def __init__(self, config: Any, log: list[tuple[str, str]]) -> None:
        self._log, self._n = log, 0
        log.append(("made", "a.outbox"))

    def start(self) -> _Slow:
        return self

    def stop(self) -> None:
        pass

    def wait(self, timeout: float | None = None) -> bool:
        self._n += 1
        if self._n < 3:
            time.sleep(0.01)
            return False
        time.sleep(0.02)
        self._log.append(("stopped", "a.outbox"))
        raise RuntimeError("lost the database")


def test_a_fleet_raises_its_open_files_soft_limit_to_the_hard_one() -> None:
    """A led outbox holds ~20 descriptors: the common soft limit of 1,024 would stop a fleet near 50."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1 << 20 if hard == resource.RLIM_INFINITY else min(hard, 1 << 20)
    assert want > 256, f"the hard limit ({hard}) leaves nothing to raise"
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        _raise_open_files_limit()
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (want, hard)
        _raise_open_files_limit()  # already there: unchanged
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (want, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
