"""``fleet.workers``: one fleet file relayed by worker processes under a supervisor
(producer/fleet/workers.py, producer/fleet/worker_endpoint.py).

The rules first, on plain processes (``python -c``) standing in for workers: a worker that exits is
started again after its backoff, doubled while it keeps exiting; a stop signals each worker once and
starts none again; the exit code says whether every worker stopped cleanly. Then the whole thing on
Postgres and Kafka: ``harvest -f fleet.yaml`` with ``workers: 2`` relays eight outboxes
``--uuid-sequencing`` while writers commit and roll back; the balance gives each worker a share;
the supervisor's endpoint answers for both; a worker killed with kill -9 is started again while the
other takes its outboxes; SIGTERM to the supervisor drains and stops everything; a kill -9 of the
supervisor stops its workers; and every committed row is read once, in per-key order.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from seqcheck import (
    Expected,
    SeqRelay,
    check_exactly_once,
    count_rows,
    read_intents,
    stash_or_roll_back,
    wait_for,
)

from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.producer.fleet.spec import FleetOptions, cpus, fleet_from_document
from harvest_outbox.producer.fleet.workers import WorkerRole, Workers, worker_commands
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

DOC = {
    "harvest": {"dataSource": "postgres://relay@db1/app", "leaderElection": "postgres", "name": "relay"},
    "outboxes": [{"id": "a", "outboxTable": "a.outbox"}],
}


def _fleet(options: dict[str, object]) -> FleetOptions:
    return fleet_from_document({**DOC, "fleet": options}).options


@pytest.mark.parametrize(
    ("given", "workers"),
    [(None, 1), (1, 1), (2, 2), (256, 256), ("auto", cpus())],
)
def test_workers_option(given: object, workers: int) -> None:
    assert _fleet({} if given is None else {"workers": given}).workers == workers


@pytest.mark.parametrize("given", [0, -1, 257, "two", "2", 1.5, True, None, [2]])
def test_workers_option_refused_with_the_fix(given: object) -> None:
    with pytest.raises(ConfigError) as info:
        _fleet({"workers": given})
    said = str(info.value)
    assert said.startswith("fleet.workers: ") and "from 1 to 256, or auto" in said, said


def test_worker_commands_name_each_worker_and_keep_its_endpoint_local(tmp_path: Path) -> None:
    fleet = fleet_from_document(
        {**DOC, "harvest": {**DOC["harvest"], "prometheusPort": 9090}, "fleet": {"workers": 2}}  # type: ignore[dict-item]
    )
    commands = worker_commands(fleet, ["run", "-f", "fleet.yaml", "--name", "other"], tmp_path, "py")
    assert len(commands) == 2
    for k, command in enumerate(commands):
        assert command[:6] == ["py", "-m", "harvest_outbox.producer", "run", "-f", "fleet.yaml"]
        tail = command[6:]
        # argparse takes the last of a repeated option: the worker's name and endpoint win over the supervisor's
        assert tail[tail.index("--name", 2) + 1] == f"relay-w{k}"
        assert tail[tail.index("--fleet-worker") + 1] == f"{k}/2/{os.getpid()}"
        assert tail[tail.index("--fleet-worker-port-file") + 1] == str(tmp_path / f"w{k}.port")
        assert tail[-4:] == ["--prometheus-port", "0", "--prometheus-bind-address", "127.0.0.1"]
    no_endpoint = fleet_from_document({**DOC, "fleet": {"workers": 2}})
    assert "--prometheus-port" not in worker_commands(no_endpoint, ["run"], tmp_path, "py")[0]


@pytest.mark.parametrize(
    ("value", "why"),
    [("1/2", "not <index>/<count>/<supervisor pid>"), ("2/2/7", "below the count"), ("a/b/c", "not <index>")],
)
def test_worker_role_refuses_a_bad_flag(value: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        WorkerRole.parse(value, None)


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_worker_that_exits_is_started_again_with_a_growing_backoff(tmp_path: Path) -> None:
    """Worker 0 exits at once, every time; worker 1 runs until SIGTERM, then exits 0."""
    options = FleetOptions(restart_backoff=0.1, restart_backoff_max=0.4)
    steady = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); time.sleep(60)"
    workers = Workers(options, [_python("import sys; sys.exit(3)"), _python(steady)], tmp_path)
    workers.start()

    def looked(restarts: int) -> bool:
        workers.look()
        return workers.workers[0].restarts >= restarts

    try:
        wait_for(lambda: looked(4), 10, "worker 0 started again four times")
        w0, w1 = workers.workers
        assert w0.last_exit == 3
        assert w0.backoff == 0.4, "doubled per exit, up to restartBackoffMax"
        assert w1.restarts == 0 and w1.pid is not None
        states = {s["worker"]: s["state"] for s in workers.statuses()}
        assert states[1] == "running" and states[0] in ("running", "backoff")
    finally:
        workers.stop()  # (a stop signal's handler: the flag only)
        workers.terminate()
    restarts = workers.workers[0].restarts
    time.sleep(0.6)  # longer than the backoff: a stopped supervisor starts nothing again
    workers.look()
    assert workers.workers[0].restarts == restarts
    code = workers.wait()
    w0 = workers.workers[0]
    # worker 0 ended by the stop's SIGTERM (clean) or by its own exit 3 (reported), whichever came first
    assert code == (3 if w0.proc is not None and w0.proc.returncode == 3 else 0), (code, w0.proc)
    assert all(s["state"] == "stopped" for s in workers.statuses())
    assert not tmp_path.exists(), "wait() removes the port folder"


def test_a_worker_stopping_uncleanly_makes_the_exit_code(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    stubborn = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(5)); time.sleep(60)"
    clean = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); time.sleep(60)"
    workers = Workers(FleetOptions(), [_python(clean), _python(stubborn)], tmp_path / "w")
    workers.start()
    time.sleep(0.5)  # both installed their handlers
    workers.terminate()
    workers.terminate()  # once: a second SIGTERM would end a worker's drain
    assert workers.wait() == 5


def test_workers_exiting_after_a_stop_are_reaped_by_wait_not_started_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The supervisor's loop may look at its workers after a stop signal and before ``wait()``: a worker that
    has already stopped then is left for ``wait()``, which says how it ended (it once logged "exited ...
    starting it again" and the stop's report lost it)."""
    clean = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); time.sleep(60)"
    workers = Workers(FleetOptions(restart_backoff=0.01), [_python(clean), _python(clean)], tmp_path / "w")
    (tmp_path / "w").mkdir()
    workers.start()
    time.sleep(0.5)  # both installed their handlers
    workers.terminate()
    wait_for(lambda: all(w.proc is not None and w.proc.poll() is not None for w in workers.workers), 10, "both ended")
    with caplog.at_level("INFO", logger="harvest_outbox.producer.fleet.workers"):
        workers.look()
        assert all(w.proc is not None and w.restarts == 0 for w in workers.workers)
        assert workers.wait() == 0
    said = [r.getMessage() for r in caplog.records if "stopped" in r.getMessage() or "exited" in r.getMessage()]
    assert said == ["worker 0 stopped (exit code 0)", "worker 1 stopped (exit code 0)"], said


# ---------------------------------------------------------------------------------------------- processes

PARTITIONS = 4
OUTBOXES = 8


def _yaml(path: Path, dsn: str, bootstrap: str, prefix: str) -> Path:
    listed = "\n".join(f"  - {{id: o{i}, outboxTable: {prefix}_{i}.outbox}}" for i in range(OUTBOXES))
    path.write_text(
        f"""harvest:
  baseKafkaConfig: {{bootstrap.servers: "{bootstrap}"}}
  dataSource: '{dsn}'
  uuidSequencing: true
  leaderElection: postgres
  leaderLockCheckInterval: 500ms
  prometheusPort: 0
  prometheusBindAddress: 127.0.0.1
  limits: {{minPollInterval: 100ms, idlePollInterval: 300ms, ioErrorBackoff: 100ms, txnMaxDuration: 20ms}}
outboxes:
{listed}
fleet: {{workers: 2, restartBackoff: 200ms, statementConnections: 2}}
logging: {{level: Info}}
"""
    )
    path.chmod(0o600)
    return path


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with _DIRECT.open(f"http://127.0.0.1:{port}{path}", timeout=15) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) is not running
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.integration
@pytest.mark.slow
def test_a_fleet_of_two_worker_processes_relays_exactly_once_through_a_killed_worker(
    pg_dsn: str,
    kafka_bootstrap: str,
    tmp_path: Path,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An HTTP proxy in the environment that goes nowhere: the supervisor reaches its workers directly.
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    topic = topic_factory(partitions=PARTITIONS)
    prefix = unique_name("fw")
    tables = {f"o{i}": f"{prefix}_{i}.outbox" for i in range(OUTBOXES)}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for i in range(OUTBOXES):
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(f"{prefix}_{i}")))
    for table in tables.values():
        init_db(pg_dsn, table)
    cfg = _yaml(tmp_path / "fleet.yaml", pg_dsn, kafka_bootstrap, prefix)
    exp, stop_writing = Expected(), threading.Event()

    def writer(w: int) -> None:
        rnd, seq = random.Random(w), 0
        stashers = {oid: Stasher(table) for oid, table in tables.items()}
        with psycopg.connect(pg_dsn) as conn:
            while not stop_writing.is_set():
                for oid, st in stashers.items():
                    batch = [
                        OutboxRecord(topic, f"{oid}-w{w}-k{rnd.randrange(3)}", f"{oid}-w{w}-{seq + j}", [])
                        for j in range(rnd.randint(1, 5))
                    ]
                    seq += len(batch)
                    stash_or_roll_back(conn, st, batch, rnd.random() < 0.2, exp)
                time.sleep(0.02)

    sup = SeqRelay(cfg, "fw", tmp_path)

    def worker_pids(since: int = 0) -> dict[int, int]:
        """Each worker's latest pid, as the supervisor's log says it (from offset ``since``)."""
        return {int(k): int(p) for k, p in re.findall(r"worker (\d+) started \(pid (\d+)\)", sup.text()[since:])}

    def leads(forget: tuple[int, int] | None = None) -> dict[int, set[str]]:
        """Which outboxes each worker leads now (elected, not stopped since), from the shared log;
        ``forget``: (worker, offset): that worker's lines before the offset (a process since killed)."""
        led: dict[int, set[str]] = {0: set(), 1: set()}
        text, at = sup.text(), 0
        for line in text.splitlines(keepends=True):
            at += len(line)
            m = re.search(r" fw-w(\d)/(\S+): elected leader", line) or re.search(r"relay fw-w(\d)/(\S+) stopped$", line)
            if m is None or (forget is not None and int(m.group(1)) == forget[0] and at <= forget[1]):
                continue
            if "elected leader" in line:
                led[int(m.group(1))].add(m.group(2))
            else:
                led[int(m.group(1))].discard(m.group(2))
        return led

    def port() -> int:
        m = re.search(
            r"metrics on http://127\.0\.0\.1:(\d+)/metrics \(\+ /healthz, /readyz, of every worker\)", sup.text()
        )
        assert m, "the supervisor's endpoint"
        return int(m.group(1))

    writers = [threading.Thread(target=writer, args=(w,)) for w in range(2)]
    took: dict[str, float] = {}
    try:
        took["spread"] = wait_for(
            lambda: (
                all(1 <= len(x) <= OUTBOXES // 2 for x in leads().values())
                and set().union(*leads().values()) == set(tables)
            ),
            90,
            "the outboxes spread over the two workers",
        )
        for t in writers:
            t.start()
        # one endpoint for both workers: each outbox's verdict from the worker leading it
        wait_for(lambda: _get(port(), "/readyz")[0] == 200, 60, "the supervisor ready")
        ready = json.loads(_get(port(), "/readyz")[1])
        assert set(ready["outboxes"]) == set(tables)
        led = leads()
        assert {o: b["worker"] for o, b in ready["outboxes"].items()} == {o: w for w, os_ in led.items() for o in os_}
        assert [w["state"] for w in ready["workers"]] == ["running", "running"]
        wait_for(lambda: _get(port(), "/readyz?outbox=o3")[0] == 200, 30, "o3 ready")
        assert _get(port(), "/readyz?outbox=nope")[0] == 404
        # (a relay the balance has just handed over starts again as a standby: its worker's /healthz says
        # "loop not started" until it turns, as a fleet process's does)
        wait_for(lambda: _get(port(), "/healthz")[0] == 200, 30, "the supervisor live")
        metrics = _get(port(), "/metrics")[1]
        assert metrics.count("# TYPE harvest_is_leader gauge") == 1, "a family once, however many workers"
        for w in (0, 1):
            assert f'harvest_is_leader{{outbox="o1",relay="fw-w{w}/o1",worker="{w}"}}' in metrics
        assert 'harvest_fleet_workers{state="running"} 2.0' in metrics

        # SIGHUP: passed on (each worker reads the file); a new worker count waits for a restart
        cfg.write_text(cfg.read_text().replace("workers: 2,", "workers: 3,"))
        assert sup.proc is not None
        sup.proc.send_signal(signal.SIGHUP)
        wait_for(
            lambda: (
                "fleet.workers is now 3; the 2 running workers stay" in sup.text()
                and all(
                    f"[w{w}] harvest_outbox.producer.fleet.run: SIGHUP: config read again" in sup.text() for w in (0, 1)
                )
            ),
            30,
            "the SIGHUP passed on",
        )
        cfg.write_text(cfg.read_text().replace("workers: 3,", "workers: 2,"))

        # kill -9 of a worker: the other takes its outboxes, the supervisor starts it again
        first = worker_pids()
        victim = 0 if leads()[0] else 1
        os.kill(first[victim], signal.SIGKILL)
        killed_at = len(sup.text())

        def recovered() -> bool:
            now = leads((victim, killed_at))
            return worker_pids()[victim] != first[victim] and now[0] | now[1] == set(tables)

        took["kill -9 worker"] = wait_for(recovered, 60, "the killed worker started again and every outbox led")
        assert re.search(rf"worker {victim} exited \(killed by SIGKILL\)", sup.text())
        wait_for(lambda: _get(port(), "/readyz")[0] == 200, 60, "both workers ready again")
        restarted = f'harvest_fleet_worker_restarts_total{{worker="{victim}"}} 1.0'
        wait_for(lambda: restarted in _get(port(), "/metrics")[1], 30, "the restart counted")
        time.sleep(2)

        # SIGTERM to the supervisor: both workers drain and stop, then the supervisor exits 0
        stop_writing.set()
        for t in writers:
            t.join()
        pids = worker_pids()
        code = sup.stop(60)
        lifecycle = "\n".join(re.findall(r".*(?:worker \d (?:started|exited|stopped)|SIGTERM).*", sup.text()))
        assert code == 0, lifecycle
        assert not any(_alive(p) for p in pids.values())
        stops = re.findall(r"worker \d stopped \(.*\)", sup.text())
        assert sorted(stops) == ["worker 0 stopped (exit code 0)", "worker 1 stopped (exit code 0)"], lifecycle

        # started again to drain what the stop left; then kill -9 of the supervisor: its workers stop too
        again = len(sup.text())
        sup = SeqRelay(cfg, "fw", tmp_path)
        took["drain"] = wait_for(
            lambda: all(count_rows(pg_dsn, t) == 0 and not read_intents(pg_dsn, t) for t in tables.values()),
            90,
            "every outbox drained",
        )
        wait_for(lambda: len(worker_pids(again)) == 2, 30, "both workers started again")
        pids = worker_pids(again)
        sup.kill()
        took["orphans stopped"] = wait_for(lambda: not any(_alive(p) for p in pids.values()), 30, "the workers stopped")
        res = check_exactly_once(kafka_bootstrap, topic, PARTITIONS, exp)
        assert res.acks > 0
        print(
            f"\nfleet.workers 2: {OUTBOXES} outboxes, {exp.total} rows exactly once, {len(exp.rolled_back)} rolled "
            "back; " + ", ".join(f"{k}: {v:.1f}s" for k, v in took.items())
        )
    finally:
        stop_writing.set()
        for t in writers:
            if t.is_alive():
                t.join(30)
        sup.stop()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for i in range(OUTBOXES):
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(f"{prefix}_{i}")))
