"""Many outboxes, one process (issue #48): what a fleet (``harvest -f fleet.yaml`` relaying many outboxes)
costs per outbox, and whether it relays a row as cheaply and as fairly as one relay per outbox. Not a test.

    python -m bench.bench_outboxes [--sizes 1,10,50,100] [--rows 200000] [--burst 1000000] [--repeats 5] [--quick]

Every relay is its own process, as users run it: a fleet is ``harvest -f fleet.yaml`` (started by
:class:`harvest_local.relays.RelayProcess`) with a new user's config: the connection settings,
``leaderElection: postgres``, the listed outboxes (``{id: t000, outboxTable: b_t000.outbox}``, one schema each,
tables made by ``init_db``, what ``harvest init-db`` runs), at-least-once unless ``--sequenced``; nothing tuned.
A one-outbox relay is ``harvest -f harvest.yaml`` with the same keys and its one ``outboxTable``. Writers and
consumers are threads and connections of this script. Services: ``harvest_local.LocalServices`` (or
HARVEST_PG_DSN / HARVEST_KAFKA_BOOTSTRAP).

Process figures come from /proc: CPU seconds from ``/proc/<pid>/stat`` (utime + stime, every thread),
RSS and threads from ``/proc/<pid>/status``, PSS (shared pages split between the processes that map them: the
fair sum over several processes) from ``/proc/<pid>/smaps_rollup``. Connections from ``pg_stat_activity``:
each relay process's ``dataSource`` carries an ``application_name`` of its own (``bo-<process>``), which every
connection of the relay keeps except those that name themselves ``harvest-<role>:<relay name>`` (election,
layout guard) and a fleet's pooled statement connections (``harvest-statements:<name>``); these are counted,
and the change in the server's client backends (the fleet's shared sessions with them) is reported beside
them. ``--statement-connections`` sets the fleets' ``fleet.statementConnections`` (0: no pool, the fleet as it
was before it); ``--cpu-outboxes`` the outboxes of part 2's and 3's fleet.

1. **Idle cost per outbox**: fleets of ``--sizes`` outboxes, one at a time. Per size: the seconds from the
   process's start until its log says ``elected leader`` for every outbox, then after ``--settle`` seconds
   the CPU over ``--idle`` seconds (no rows written), RSS, PSS, threads and connections; and the
   least-squares slope of each over the sizes (per outbox) with its intercept (the process's own). A size
   whose connections would not fit is not started: the connections per outbox measured on the sizes before
   it, times the size, against ``max_connections`` less the reserved slots and the backends already open;
   the JSON says which size stopped there and why.
2. **CPU per relayed row**: ``--rows`` rows, spread evenly over 10 outboxes of one fleet process, against the
   same rows in the one outbox of a one-outbox process; all the processes run side by side, led and idle, and
   drain in alternation (bench/spread.py: baseline first in even repeats, the order reversed in odd ones).
   Two more sides split the difference: the same rows in *one* outbox of the fleet (its 9 others idle), and
   spread over 10 outboxes of 10 one-outbox processes (their CPU summed): the cost of spreading rows over
   10 relays, apart from the cost of running those relays in one process. Rows are written server-side
   (``INSERT ... SELECT generate_series``, one transaction for the lot: the relays see every row at once, at
   the commit) so that no writer competes for the CPU. The relay process's CPU from just before the commit
   until every outbox is empty (rows are deleted once delivered), per row; the paired ratio fleet / single
   is the figure (target ≤ 1.2). The fleet's CPU includes its 10 outboxes' idle cost over the drain, as a
   user pays it; the JSON also gives each side with the idle rate of part 1 taken off.
3. **Fairness**: the same 10-outbox fleet; a trickle of one-row transactions at ``--trickle-rate`` rows/s into
   outbox 1 runs throughout, read by a plain confluent-kafka consumer on a thread. Windows in alternation:
   *quiet* (``--quiet`` seconds, nothing else written) and *burst* (``--burst`` rows committed at once into
   outbox 0, the window lasting from that commit until outbox 0 is empty). Latency of a trickle row: commit
   -> receipt, as bench_latency measures it (the writer's stamp just before ``COMMIT``, kept by row index;
   the row's value is its index; the consumer's stamp when ``poll()`` returns it). Per window p50 / p99 /
   max of the rows committed in it; the paired ratio burst p99 / quiet p99 is the figure (target ≤ 2). The
   trickle runs ``--settle`` seconds untimed before the first window. Per window the machine's CPUs' busy
   share (``/proc/stat``: the other processes on a shared machine show there), and the writer's late starts
   and slow transactions (over 100 ms), so that a window's tail can be told from a stalled writer or a
   saturated machine. A *bystander*: the same trickle into the one-outbox process's outbox (a process of
   its own, sharing nothing with the burst but the machine), its p99 ratio over the same windows: what the
   burst's load alone does to a relay's latency, so that the fleet's own share can be told apart.
4. **10 processes or one**: 10 one-outbox processes (``b_t000..b_t009``), started together, against part
   1's 10-outbox fleet: sums of RSS, PSS, threads, connections and idle CPU, and the time until every outbox
   is led. One measurement of each side.
5. **A standby fleet**: a second 10-outbox fleet process on the same outboxes while the first leads them
   all (how a fleet is made highly available): its idle figures once its log shows every outbox's election
   started.

Before anything is timed, ``--warm-records`` records are produced untimed (a fresh broker's JIT: bench_relay's
module doc), and one drain pair of part 2 runs untimed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import targets
from bench.bench_latency import percentile, warm_broker
from bench.services import endpoints
from bench.spread import DEFAULT_REPEATS, Recorder

PARTITIONS = 8
FLEET = 10  # outboxes of parts 2-4's fleet
SCHEMA = "b_t{:03d}"
SINGLE_SCHEMA = "b_single"
#: Part 2's 10 one-outbox processes' outboxes.
PROCESS_SCHEMAS = [f"b_p{i:03d}" for i in range(FLEET)]
#: The outboxes of part 2's fleet run by worker processes (``fleet.workers``).
WORKER_SCHEMAS = [f"b_w{i:03d}" for i in range(FLEET)]
#: Connections the bench itself may still open while a fleet runs (its watcher, writer, filler, spares).
OWN_MARGIN = 8
PARTS = ("idle", "processes", "standby", "cpu", "fairness")
FULL: dict[str, Any] = {
    "sizes": "1,10,100,1000",
    "rows": 200_000,
    "burst": 1_000_000,
    "repeats": DEFAULT_REPEATS,
    "idle": 10.0,
    "settle": 5.0,
    "quiet": 20.0,
    "warm_records": 1_000_000,
}
QUICK: dict[str, Any] = {
    "sizes": "1,10,50",
    "rows": 20_000,
    "burst": 100_000,
    "repeats": 2,
    "idle": 5.0,
    "settle": 2.0,
    "quiet": 5.0,
    "warm_records": 100_000,
}


def _log(msg: str) -> None:
    print(f"[bench outboxes] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- /proc and figures (pure)
def stat_cpu_ticks(stat: str) -> tuple[int, int]:
    """(utime, stime) in clock ticks, every thread, from the text of ``/proc/<pid>/stat``; the command
    name in parentheses may hold spaces or parentheses, so the fields are counted after its last ``)``."""
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def status_fields(status: str) -> dict[str, int]:
    """``rss_kb`` (VmRSS) and ``threads`` (Threads) from the text of ``/proc/<pid>/status``."""
    out: dict[str, int] = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key == "VmRSS":
            out["rss_kb"] = int(value.split()[0])
        elif key == "Threads":
            out["threads"] = int(value.split()[0])
    if set(out) != {"rss_kb", "threads"}:
        raise ValueError(f"/proc status without VmRSS and Threads: found {sorted(out)}")
    return out


def pss_kb(smaps_rollup: str) -> int:
    """Pss (kB) from the text of ``/proc/<pid>/smaps_rollup``."""
    for line in smaps_rollup.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    raise ValueError("/proc smaps_rollup without a Pss line")


def slope(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """The least-squares line through (xs, ys): (slope, intercept). Needs two distinct xs."""
    if len(xs) != len(ys) or len(set(xs)) < 2:
        raise ValueError(f"slope: needs as many ys as xs and two distinct xs, got xs={list(xs)} ys={list(ys)}")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return b, my - b * mx


def fits(size: int, per_outbox: float, max_connections: int, reserved: int, open_now: int, margin: int) -> bool:
    """Whether ``size`` outboxes of ``per_outbox`` connections each fit in the server's slots left."""
    return size * per_outbox <= max_connections - reserved - open_now - margin


def led_ids(log_text: str, name: str) -> set[str]:
    """The outbox ids a fleet named ``name`` (or its worker processes, ``<name>-w<k>``) logged
    ``<name>/<id>: elected leader`` for."""
    return set(re.findall(rf" {re.escape(name)}(?:-w\d+)?/(\S+): elected leader", log_text))


def window_latencies_ms(
    commit_ns: dict[int, int], receipt_ns: dict[int, int], start_ns: int, end_ns: int
) -> tuple[list[float], int]:
    """Commit -> receipt (ms, ascending) of the rows committed in [start_ns, end_ns), and how many of
    them were never received."""
    rows = [i for i, c in commit_ns.items() if start_ns <= c < end_ns]
    got = sorted((receipt_ns[i] - commit_ns[i]) / 1e6 for i in rows if i in receipt_ns)
    return got, len(rows) - len(got)


def latency_summary(latencies_ms: Sequence[float]) -> dict[str, float | None]:
    xs = sorted(latencies_ms)

    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 2)

    return {"p50_ms": r(percentile(xs, 50)), "p99_ms": r(percentile(xs, 99)), "max_ms": r(xs[-1] if xs else None)}


def cpu_times(proc_stat: str) -> tuple[int, int]:
    """(busy, total) jiffies of every CPU from the text of ``/proc/stat`` (its ``cpu`` line; idle and
    iowait are not busy)."""
    fields = [int(x) for x in proc_stat.splitlines()[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """The machine's CPUs' busy share between two :func:`cpu_times` (1.0: every core busy)."""
    total = after[1] - before[1]
    return round((after[0] - before[0]) / total, 3) if total > 0 else None


def worst(events: Sequence[tuple[float, float]], keep: int = 5) -> dict[str, Any]:
    """How many (wall-clock s, ms) events there were (the first 100 are kept), and the ``keep`` longest."""
    return {"count": len(events), "worst": sorted(events, key=lambda e: -e[1])[:keep]}


def spread(values: Sequence[float], digits: int = 3) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


# ----------------------------------------------------------------------------- processes
def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


@dataclass
class Sample:
    """A process's /proc figures at one moment."""

    cpu_s: float
    system_s: float
    rss_kb: int
    pss_kb: int
    threads: int

    @classmethod
    def of_all(cls, pids: Sequence[int]) -> Sample:
        """The sum over ``pids`` (a fleet's supervisor and its workers)."""
        parts = [cls.of(p) for p in pids]
        return cls(*(sum(getattr(x, f) for x in parts) for f in ("cpu_s", "system_s", "rss_kb", "pss_kb", "threads")))

    @classmethod
    def of(cls, pid: int) -> Sample:
        status = status_fields(_read(f"/proc/{pid}/status"))
        user, system = stat_cpu_ticks(_read(f"/proc/{pid}/stat"))
        tick = os.sysconf("SC_CLK_TCK")
        return cls(
            (user + system) / tick,
            system / tick,
            status["rss_kb"],
            pss_kb(_read(f"/proc/{pid}/smaps_rollup")),
            status["threads"],
        )


#: Options every fleet of the run gets in its ``fleet`` section (``--shared-producer``).
FLEET_OPTIONS: dict[str, Any] = {}


class Relay:
    """One ``harvest -f <yaml>`` process: a fleet of ``tables`` or, with ``fleet=False``, one relay."""

    def __init__(
        self,
        workdir: Path,
        name: str,
        dsn: str,
        bootstrap: str,
        tables: Sequence[str],
        fleet: bool,
        sequenced: bool,
        statement_connections: int | None = None,
        workers: int = 1,
    ) -> None:
        from psycopg.conninfo import make_conninfo

        from harvest_outbox.harvest_local.relays import RelayProcess

        self.name, self.tables, self.fleet = name, list(tables), fleet
        self.app = f"bo-{name}"
        self.ids = [f"t{i:03d}" for i in range(len(tables))] if fleet else [name]
        source = make_conninfo(dsn, application_name=self.app)
        lines = [
            "harvest:",
            f'  baseKafkaConfig: {{bootstrap.servers: "{bootstrap}"}}',
            f"  dataSource: '{source}'",
            "  leaderElection: postgres",
            *(["  uuidSequencing: true"] if sequenced else []),
        ]
        if fleet:
            options = {
                **FLEET_OPTIONS,
                **({"statementConnections": statement_connections} if statement_connections is not None else {}),
                **({"workers": workers} if workers > 1 else {}),
            }
            lines += [
                "outboxes:",
                *(f"  - {{id: {i}, outboxTable: {t}}}" for i, t in zip(self.ids, tables, strict=True)),
                *([f"fleet: {{{', '.join(f'{k}: {v}' for k, v in options.items())}}}"] if options else []),
            ]
        else:
            lines.append(f"  outboxTable: {tables[0]}")
        yaml = workdir / f"{name}.yaml"
        yaml.write_text("\n".join([*lines, "logging: {level: Info}", ""]))
        yaml.chmod(0o600)
        self.process = RelayProcess(yaml, name, workdir)
        self.started = 0.0

    def start(self) -> Relay:
        self.started = time.monotonic()
        self.process.start()
        return self

    @property
    def pid(self) -> int:
        assert self.process.proc is not None
        return int(self.process.proc.pid)

    def pids(self) -> list[int]:
        """The process and its children (a fleet's worker processes)."""
        return [self.pid, *children(self.pid)]

    def led(self) -> set[str]:
        text = self.process.text()
        if self.fleet:
            return led_ids(text, self.name)
        return {self.name} if f" {self.name}: elected leader" in text else set()

    def failures(self) -> int:
        return int(self.process.text().count("relay failed"))

    def failure_reasons(self, most: int = 3) -> list[str]:
        """The first ``most`` distinct reasons of the relay's failures (its log says them redacted), each
        without the outbox id, so that the same reason on many outboxes shows once."""
        reasons: list[str] = []
        for m in re.finditer(r"relay failed \((.*)\); starting it again", self.process.text()):
            if m.group(1) not in reasons:
                reasons.append(m.group(1))
        return reasons[:most]

    def stop(self) -> None:
        self.process.stop(120)


def children(pid: int) -> list[int]:
    """``pid``'s child processes (Linux's ``/proc/<pid>/task/<tid>/children``)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        out += [int(c) for c in _read(str(task / "children")).split()]
    return out


def stop_all(relays: Sequence[Relay]) -> None:
    """SIGTERM to every process first, so they stop in parallel; then wait for each."""
    for r in relays:
        if r.process.alive and r.process.proc is not None:
            r.process.proc.send_signal(signal.SIGTERM)
    for r in relays:
        r.stop()


def wait_led(relays: Sequence[Relay], timeout: float, poll: float = 0.05) -> float:
    """Seconds from the first process's start until every outbox of ``relays`` is led."""
    began = min(r.started for r in relays)
    deadline = time.monotonic() + timeout
    pending = list(relays)
    while pending:
        pending = [r for r in pending if r.led() != set(r.ids)]
        for r in pending:
            if not r.process.alive:
                raise SystemExit(f"bench_outboxes: {r.name} exited; its log: {r.process.log}")
        if time.monotonic() > deadline:
            missing = {r.name: sorted(set(r.ids) - r.led())[:5] for r in pending}
            raise SystemExit(f"bench_outboxes: not every outbox led after {timeout:g}s: {missing}")
        time.sleep(poll)
    return round(time.monotonic() - began, 2)


class Db:
    """The bench's own connection: outbox set-up, fills, drain watching, pg_stat_activity."""

    def __init__(self, dsn: str) -> None:
        import psycopg

        self.dsn = dsn
        self.conn = psycopg.connect(dsn, autocommit=True, application_name="bench-outboxes")

    def settings(self) -> tuple[int, int]:
        row = self.conn.execute(
            "SELECT current_setting('max_connections')::int, current_setting('superuser_reserved_connections')::int"
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def client_backends(self) -> int:
        row = self.conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
        ).fetchone()
        assert row is not None
        return int(row[0])

    def connections(self, relay: Relay) -> int:
        """The relay process's statement connections: its ``application_name``, ``harvest-<role>:<its relay
        names>``, or a fleet's pool (``harvest-statements:<name>``); not its shared election, layout and LISTEN
        sessions (``backends_added`` has them)."""
        named = f"harvest-%:{relay.name}/%" if relay.fleet else f"harvest-%:{relay.name}"
        row = self.conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s OR application_name LIKE %s "
            "OR application_name = %s",
            (relay.app, named, f"harvest-statements:{relay.name}"),
        ).fetchone()
        assert row is not None
        return int(row[0])

    def make_outboxes(self, schemas: Sequence[str]) -> None:
        from psycopg import sql

        from harvest_outbox.producer.schema.ddl import init_db

        for schema in schemas:
            self.conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
            self.conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
            init_db(self.conn, f"{schema}.outbox")

    def drop(self, schemas: Sequence[str]) -> None:
        from psycopg import sql

        for schema in schemas:
            self.conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))

    def fill(self, parts: Sequence[tuple[str, int]], topic: str) -> int:
        """Rows into each (schema, rows), one transaction, written by the server (100-byte values, 1,000
        keys); returns the wall-clock ns just before COMMIT."""
        from psycopg import sql

        insert = (
            "INSERT INTO {} (kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values) "
            "SELECT %s, 'key-' || (i %% 1000), lpad(i::text, 10, '0') || repeat('x', 90), '{{}}', '{{}}' "
            "FROM generate_series(0, %s - 1) AS i"
        )
        self.conn.execute("BEGIN")
        try:
            for schema, rows in parts:
                self.conn.execute(sql.SQL(insert).format(sql.Identifier(schema, "outbox")), (topic, rows))
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        stamp = time.time_ns()
        self.conn.execute("COMMIT")
        return stamp

    def wait_empty(self, schemas: Sequence[str], timeout: float, poll: float = 0.005) -> None:
        from psycopg import sql

        query = sql.SQL("SELECT {}").format(
            sql.SQL(" AND ").join(
                sql.SQL("NOT EXISTS (SELECT 1 FROM {})").format(sql.Identifier(s, "outbox")) for s in schemas
            )
        )
        deadline = time.monotonic() + timeout
        while not self.conn.execute(query).fetchone()[0]:  # type: ignore[index]
            if time.monotonic() > deadline:
                raise SystemExit(f"bench_outboxes: {list(schemas)[:3]}... not drained after {timeout:g}s")
            time.sleep(poll)


def idle_figures(db: Db, relays: Sequence[Relay], settle: float, idle: float) -> dict[str, Any]:
    """Sums over ``relays`` (all led): idle CPU share of a core over ``idle`` s, RSS, PSS, threads, connections."""
    time.sleep(settle)
    before = {r.name: Sample.of(r.pid) for r in relays}
    t0 = time.monotonic()
    time.sleep(idle)
    after = {r.name: Sample.of(r.pid) for r in relays}
    elapsed = time.monotonic() - t0
    return {
        "idle_cpu_share": round(sum(after[n].cpu_s - before[n].cpu_s for n in after) / elapsed, 4),
        "rss_mb": round(sum(s.rss_kb for s in after.values()) / 1024, 1),
        "pss_mb": round(sum(s.pss_kb for s in after.values()) / 1024, 1),
        "threads": sum(s.threads for s in after.values()),
        "connections": sum(db.connections(r) for r in relays),
        "client_backends": db.client_backends(),
    }


# ----------------------------------------------------------------------------- part 1 and 4
def idle_sizes(db: Db, workdir: Path, dsn: str, bootstrap: str, args: argparse.Namespace) -> dict[str, Any]:
    max_conn, reserved = db.settings()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    measured: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    per_outbox = 5.0  # the first size's guess; measured from then on
    for size in sizes:
        open_now = db.client_backends()
        if not fits(size, per_outbox, max_conn, reserved, open_now, OWN_MARGIN):
            skipped[str(size)] = (
                f"{size} outboxes x {per_outbox:g} connections = {size * per_outbox:g} > {max_conn} max_connections "
                f"- {reserved} reserved - {open_now} open - {OWN_MARGIN} for the bench = "
                f"{max_conn - reserved - open_now - OWN_MARGIN} slots"
            )
            _log(f"size {size}: not started: {skipped[str(size)]}")
            continue
        before = db.client_backends()
        relay = Relay(
            workdir,
            f"f{size}",
            dsn,
            bootstrap,
            [f"{SCHEMA.format(i)}.outbox" for i in range(size)],
            True,
            args.sequenced,
            args.statement_connections,
        )
        _log(f"idle fleet of {size}: starting")
        relay.start()
        try:
            # A fleet that cannot lead them all in 10 minutes has failed; its log is read at most twice a
            # second (a 1,000-outbox log is megabytes, and reading it must not slow the start measured).
            led_s = wait_led([relay], min(60 + 3 * size, 600), poll=0.05 if size < 100 else 0.5)
            # A large fleet's start settles slowly (the relays that failed to start are started again after
            # their backoff): 30 ms per outbox at least, 30 s for 1,000.
            figures = idle_figures(db, [relay], max(args.settle, 0.03 * size), args.idle)
        finally:
            relay.stop()
        added = figures.pop("client_backends") - before
        figures = {"led_s": led_s, **figures, "backends_added": added}
        figures["failures"] = relay.failures()
        if figures["failures"]:
            figures["failure_reasons"] = relay.failure_reasons()
        measured[str(size)] = figures
        per_outbox = figures["connections"] / size
        _log(f"idle fleet of {size}: {figures}")
    out: dict[str, Any] = {"sizes": measured, "skipped": skipped, "max_connections": max_conn, "reserved": reserved}
    if len(measured) >= 2:
        xs = [float(s) for s in measured]
        out["per_outbox"] = {}
        for key in ("rss_mb", "pss_mb", "threads", "connections", "idle_cpu_share", "led_s"):
            b, a = slope(xs, [float(m[key]) for m in measured.values()])
            out["per_outbox"][key] = {"slope": round(b, 4), "intercept": round(a, 3)}
        per = out["per_outbox"]["connections"]["slope"]
        out["fits_at_most"] = int((max_conn - reserved - OWN_MARGIN - db.client_backends()) // per) if per > 0 else None
    return out


def processes_vs_fleet(
    db: Db, workdir: Path, dsn: str, bootstrap: str, args: argparse.Namespace, fleet: dict[str, Any] | None
) -> dict[str, Any]:
    before = db.client_backends()
    relays = [
        Relay(workdir, f"s{i:03d}", dsn, bootstrap, [f"{SCHEMA.format(i)}.outbox"], False, args.sequenced)
        for i in range(FLEET)
    ]
    _log(f"{FLEET} one-outbox processes: starting")
    for r in relays:
        r.start()
    try:
        led_s = wait_led(relays, 180)
        figures = idle_figures(db, relays, args.settle, args.idle)
    finally:
        stop_all(relays)
    added = figures.pop("client_backends") - before
    processes = {"led_s": led_s, **figures, "backends_added": added}
    _log(f"{FLEET} one-outbox processes: {processes}")
    out: dict[str, Any] = {"processes": processes, "fleet": fleet}
    if fleet:
        out["fleet_over_processes"] = {
            k: round(fleet[k] / processes[k], 3) if processes[k] else None
            for k in ("rss_mb", "pss_mb", "threads", "connections", "idle_cpu_share", "led_s")
        }
    return out


def standby_cost(db: Db, workdir: Path, dsn: str, bootstrap: str, args: argparse.Namespace) -> dict[str, Any]:
    """A second fleet process on the same 10 outboxes, a standby of each (the first leads them): its idle
    figures, once its log shows every outbox's election started."""
    tables = [f"{SCHEMA.format(i)}.outbox" for i in range(FLEET)]
    leader = Relay(workdir, "lead", dsn, bootstrap, tables, True, args.sequenced, args.statement_connections)
    standby = Relay(workdir, "standby", dsn, bootstrap, tables, True, args.sequenced, args.statement_connections)
    _log(f"standby fleet of {FLEET}: starting")
    leader.start()
    try:
        wait_led([leader], 120)
        before = db.client_backends()
        standby.start()
        deadline = time.monotonic() + 120
        while len(re.findall(r": Postgres leader election on ", standby.process.text())) < FLEET:
            if time.monotonic() > deadline or not standby.process.alive:
                raise SystemExit(
                    f"bench_outboxes: the standby fleet did not start its elections: {standby.process.log}"
                )
            time.sleep(0.1)
        figures = idle_figures(db, [standby], args.settle, args.idle)
        led = sorted(standby.led())
    finally:
        stop_all([leader, standby])
    added = figures.pop("client_backends") - before
    out = {**figures, "backends_added": added, "outboxes": FLEET, "led_by_the_standby": led}
    _log(f"standby fleet of {FLEET}: {out}")
    return out


# ----------------------------------------------------------------------------- part 2
def drain(db: Db, relays: Sequence[Relay], schemas: Sequence[str], rows: int, topic: str) -> dict[str, float]:
    """``rows`` spread evenly over ``schemas``, committed at once; the CPU of ``relays``' processes (summed)
    from just before the commit until every outbox is empty."""
    per = rows // len(schemas)
    parts = [(s, per + (1 if i < rows % len(schemas) else 0)) for i, s in enumerate(schemas)]
    pids = [r.pids() for r in relays]
    before = [Sample.of_all(p) for p in pids]
    t0 = time.monotonic()
    db.fill(parts, topic)
    db.wait_empty(schemas, 600)
    elapsed = time.monotonic() - t0
    after = [Sample.of_all(p) for p in pids]
    cpu = sum(a.cpu_s - b.cpu_s for a, b in zip(after, before, strict=True))
    system = sum(a.system_s - b.system_s for a, b in zip(after, before, strict=True))
    return {
        "cpu_us_per_row": cpu / rows * 1e6,
        "rows_per_s": rows / elapsed,
        "seconds": elapsed,
        "cpu_s": cpu,
        "system_share": system / cpu if cpu else 0.0,
    }


def _wait_spread(relay: Relay, workers: int, timeout: float = 60) -> dict[str, list[str]]:
    """Until the balance has given every worker of ``relay`` (a fleet run by worker processes) some of its
    outboxes (a worker's leadership as the log says it now: elected, not stopped since); returns who leads what."""
    name = re.escape(relay.name)
    deadline = time.monotonic() + timeout
    while True:
        led: dict[str, set[str]] = {}
        for line in relay.process.text().splitlines():
            if m := re.search(rf" {name}-w(\d+)/(\S+): elected leader", line):
                led.setdefault(m.group(1), set()).add(m.group(2))
            elif m := re.search(rf"relay {name}-w(\d+)/(\S+) stopped$", line):
                led.get(m.group(1), set()).discard(m.group(2))
        if len([w for w in led.values() if w]) == workers or time.monotonic() > deadline:
            return {w: sorted(ids) for w, ids in sorted(led.items())}
        time.sleep(0.5)


# ----------------------------------------------------------------------------- part 3
class Trickle:
    """One-row transactions at ``rate`` into ``table``, and a consumer of ``topic`` on its own thread."""

    def __init__(self, dsn: str, bootstrap: str, table: str, topic: str, rate: float) -> None:
        self.dsn, self.bootstrap, self.table, self.topic, self.rate = dsn, bootstrap, table, topic, rate
        self.commit_ns: dict[int, int] = {}
        self.receipt_ns: dict[int, int] = {}
        self.max_lag_ms = 0.0
        #: (wall-clock s, ms behind the schedule) of rows started over 100 ms late: when the writer waited
        self.late: list[tuple[float, float]] = []
        #: (wall-clock s, ms) of the writer's transactions that took over 100 ms (INSERT and COMMIT)
        self.slow: list[tuple[float, float]] = []
        self._stop_writing = threading.Event()
        self._stop_reading = threading.Event()
        self._ready = threading.Event()
        self.errors: list[BaseException] = []
        self._writer = threading.Thread(target=self._write, name="trickle-writer", daemon=True)
        self._reader = threading.Thread(target=self._read, name="trickle-consumer", daemon=True)

    def start(self) -> Trickle:
        self._reader.start()
        if not self._ready.wait(60):
            raise SystemExit("bench_outboxes: the trickle's consumer got no assignment in 60 s")
        self._writer.start()
        return self

    def _write(self) -> None:
        import psycopg

        from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

        try:
            st = Stasher(self.table)
            with psycopg.connect(self.dsn, application_name="bench-trickle") as conn:
                start = time.perf_counter()
                i = 0
                while not self._stop_writing.is_set():
                    delay = start + i / self.rate - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                    else:
                        self.max_lag_ms = max(self.max_lag_ms, -delay * 1000)
                        if -delay > 0.1 and len(self.late) < 100:
                            self.late.append((round(time.time(), 3), round(-delay * 1000, 1)))
                    began = time.time()
                    with conn.transaction():
                        st.stash(conn, OutboxRecord(self.topic, f"key-{i % 16}", f"{i:010d}"))
                        self.commit_ns[i] = time.time_ns()  # just before COMMIT (bench_latency's stamp)
                    took = time.time() - began
                    if took > 0.1 and len(self.slow) < 100:
                        self.slow.append((round(began, 3), round(took * 1000, 1)))
                    i += 1
        except BaseException as exc:
            self.errors.append(exc)

    def _read(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        try:
            consumer = Consumer(
                {"bootstrap.servers": self.bootstrap, "group.id": f"bo-{uuid.uuid4()}", "enable.auto.commit": False}
            )
            consumer.assign([TopicPartition(self.topic, p, 0) for p in range(PARTITIONS)])
            consumer.poll(0.1)
            self._ready.set()
            try:
                while not self._stop_reading.is_set():
                    m = consumer.poll(0.05)
                    now = time.time_ns()
                    if m is None or m.error():
                        continue
                    value = m.value() or b""
                    if value.isdigit():
                        self.receipt_ns.setdefault(int(value), now)  # a redelivery counts at its first
            finally:
                consumer.close()
        except BaseException as exc:
            self._ready.set()
            self.errors.append(exc)

    def finish(self, grace: float) -> None:
        self._stop_writing.set()
        self._writer.join(30)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and not set(self.commit_ns) <= set(self.receipt_ns):
            time.sleep(0.1)
        self._stop_reading.set()
        self._reader.join(30)
        if self.errors:
            raise SystemExit(f"bench_outboxes: the trickle failed: {self.errors[0]!r}")


def fairness(
    db: Db,
    relay: Relay,
    dsn: str,
    bootstrap: str,
    args: argparse.Namespace,
    recorder: Recorder,
    burst_schema: str = SCHEMA.format(0),
    trickle_schema: str = SCHEMA.format(1),
    other_schema: str | None = None,
) -> dict[str, Any]:
    """``other_schema``: a third trickle, into an outbox another worker process of ``relay`` leads (a fleet run
    by ``fleet.workers``; ``trickle_schema``'s outbox is then led by the burst's worker)."""
    from harvest_outbox.harvest_local.kafka import create_topic

    hexid = uuid.uuid4().hex[:8]
    trickle_topic, burst_topic, bystander_topic = f"bo-trickle-{hexid}", f"bo-burst-{hexid}", f"bo-by-{hexid}"
    for t in (trickle_topic, burst_topic, bystander_topic):
        create_topic(bootstrap, t, PARTITIONS)
    trickle = Trickle(dsn, bootstrap, f"{trickle_schema}.outbox", trickle_topic, args.trickle_rate).start()
    other = None
    if other_schema is not None:
        other_topic = f"bo-other-{hexid}"
        create_topic(bootstrap, other_topic, PARTITIONS)
        other = Trickle(dsn, bootstrap, f"{other_schema}.outbox", other_topic, args.trickle_rate).start()
    # The same trickle into the outbox of the one-outbox process, which shares nothing with the burst but
    # the machine: what the burst's load alone does to a relay's latency.
    bystander = Trickle(dsn, bootstrap, f"{SINGLE_SCHEMA}.outbox", bystander_topic, args.trickle_rate).start()
    windows: dict[str, list[tuple[int, int, dict[str, Any]]]] = {"quiet": [], "burst": []}
    try:
        time.sleep(args.settle)  # the trickle's first rows, untimed: a new topic's first produce requests

        def quiet() -> None:
            t0, cpu0 = time.time_ns(), cpu_times(_read("/proc/stat"))
            time.sleep(args.quiet)
            busy = busy_share(cpu0, cpu_times(_read("/proc/stat")))
            windows["quiet"].append((t0, time.time_ns(), {"machine_busy": busy}))

        def burst() -> None:
            began = time.time()
            t0 = db.fill([(burst_schema, args.burst)], burst_topic)
            cpu0 = cpu_times(_read("/proc/stat"))
            extra = {"fill_s": round(t0 / 1e9 - began, 2)}
            m0 = time.monotonic()
            db.wait_empty([burst_schema], 900, poll=0.02)
            took = time.monotonic() - m0
            extra.update(drain_s=round(took, 2), rows_per_s=round(args.burst / took))
            windows["burst"].append(
                (t0, time.time_ns(), {**extra, "machine_busy": busy_share(cpu0, cpu_times(_read("/proc/stat")))})
            )

        for n in range(args.repeats):
            _log(f"fairness, repeat {n + 1}/{args.repeats}")
            for run in (quiet, burst) if n % 2 == 0 else (burst, quiet):
                run()
                time.sleep(1.0)  # between windows: the last rows of one are not the next one's
    finally:
        trickle.finish(60)
        bystander.finish(60)
        if other is not None:
            other.finish(60)
    out: dict[str, Any] = {
        "trickle_rate": args.trickle_rate,
        "writer_max_lag_ms": round(trickle.max_lag_ms, 1),
        "writer_late": worst(trickle.late),
        "writer_slow_transactions": worst(trickle.slow),
    }
    for kind, ws in windows.items():
        runs = []
        for t0, t1, extra in ws:
            lat, lost = window_latencies_ms(trickle.commit_ns, trickle.receipt_ns, t0, t1)
            by_lat, by_lost = window_latencies_ms(bystander.commit_ns, bystander.receipt_ns, t0, t1)
            runs.append(
                {
                    "rows": len(lat) + lost,
                    "lost": lost,
                    **latency_summary(lat),
                    **extra,
                    "bystander": {"rows": len(by_lat) + by_lost, "lost": by_lost, **latency_summary(by_lat)},
                }
            )
            if other is not None:
                o_lat, o_lost = window_latencies_ms(other.commit_ns, other.receipt_ns, t0, t1)
                runs[-1]["other_worker"] = {"rows": len(o_lat) + o_lost, "lost": o_lost, **latency_summary(o_lat)}
        out[kind] = runs
    out["bystander_writer_max_lag_ms"] = round(bystander.max_lag_ms, 1)
    for q in ("p99", "p50"):
        pairs = [(b[f"{q}_ms"], a[f"{q}_ms"]) for b, a in zip(out["burst"], out["quiet"], strict=True)]
        if all(x is not None and y for x, y in pairs):
            recorder.figure(
                f"trickle_{q}_burst",
                [x for x, _ in pairs],
                [y for _, y in pairs],
                f"trickle commit -> receipt {q} during another outbox's {args.burst:,}-row burst / with no burst",
            )
        pairs = [
            (b["bystander"][f"{q}_ms"], a["bystander"][f"{q}_ms"])
            for b, a in zip(out["burst"], out["quiet"], strict=True)
        ]
        if all(x is not None and y for x, y in pairs):
            recorder.figure(
                f"bystander_{q}_burst",
                [x for x, _ in pairs],
                [y for _, y in pairs],
                f"the same trickle through a one-outbox process of its own, {q} during the fleet's burst / with "
                "no burst: what the burst's load on the machine alone does",
            )
        if other is None:
            continue
        pairs = [
            (b["other_worker"][f"{q}_ms"], a["other_worker"][f"{q}_ms"])
            for b, a in zip(out["burst"], out["quiet"], strict=True)
        ]
        if all(x is not None and y for x, y in pairs):
            recorder.figure(
                f"other_worker_{q}_burst",
                [x for x, _ in pairs],
                [y for _, y in pairs],
                f"the same trickle into an outbox another worker process of the fleet leads, {q} during the burst "
                "/ with no burst",
            )
    return out


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", help=f"fleet sizes of part 1, comma-separated (default {FULL['sizes']})")
    ap.add_argument("--rows", type=int, help=f"part 2's backlog (default {FULL['rows']:,})")
    ap.add_argument("--burst", type=int, help=f"part 3's burst (default {FULL['burst']:,})")
    ap.add_argument("--trickle-rate", type=float, default=50.0, help="part 3's trickle, rows/s")
    ap.add_argument("--quiet", type=float, help=f"part 3's quiet window, seconds (default {FULL['quiet']:g})")
    ap.add_argument("--repeats", type=int, help=f"repeat pairs of parts 2 and 3 (default {FULL['repeats']})")
    ap.add_argument("--idle", type=float, help=f"seconds of idle CPU measured per process (default {FULL['idle']:g})")
    ap.add_argument(
        "--settle", type=float, help=f"seconds after every outbox is led, before --idle (default {FULL['settle']:g})"
    )
    ap.add_argument(
        "--warm-records", type=int, help=f"records produced untimed first (default {FULL['warm_records']:,})"
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=2,
        help="part 2's fifth side: a fleet run by this many worker processes (fleet.workers); 1: not run (default 2)",
    )
    ap.add_argument(
        "--fairness-workers",
        action="store_true",
        help="part 3 on the fleet run by --workers worker processes: a trickle in the burst's worker, one in another",
    )
    ap.add_argument("--sequenced", action="store_true", help="uuidSequencing: true (default: at-least-once)")
    ap.add_argument(
        "--cpu-outboxes", type=int, default=FLEET, help=f"outboxes of part 2's and 3's fleet (default {FLEET})"
    )
    ap.add_argument(
        "--statement-connections",
        type=int,
        help="the fleets' fleet.statementConnections (default: the fleet's own default; 0: no pool)",
    )
    ap.add_argument(
        "--shared-producer",
        choices=("true", "false"),
        help="the fleets' fleet.sharedProducer (default: the fleet's own, false; true: one Kafka producer per "
        "process for its at-least-once outboxes)",
    )
    ap.add_argument("--parts", default=",".join(PARTS), help=f"which parts to run: {', '.join(PARTS)}")
    ap.add_argument("--quick", action="store_true", help=f"a smoke run: {QUICK} unless given")
    ap.add_argument("--workdir", help="where the relays' configs and logs go (default: a temporary folder, removed)")
    args = ap.parse_args(argv)
    if args.shared_producer is not None:
        FLEET_OPTIONS["sharedProducer"] = args.shared_producer
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:  # given on the command line: kept, --quick or not
            setattr(args, key, value)
    parts = set(args.parts.split(","))
    if parts - set(PARTS):
        ap.error(f"--parts: unknown {sorted(parts - set(PARTS))}; known: {', '.join(PARTS)}")
    services, dsn, bootstrap = endpoints()
    recorder = Recorder(
        args.repeats,
        f"{args.warm_records:,} records produced untimed; one drain pair of each side untimed",
        targets.for_bench("outboxes"),
    )
    result: dict[str, Any] = {"setup": {k: v for k, v in vars(args).items() if k != "workdir"}}
    tmp = None if args.workdir else tempfile.TemporaryDirectory(prefix="bench-outboxes-")
    workdir = Path(args.workdir or tmp.name)  # type: ignore[union-attr]
    workdir.mkdir(parents=True, exist_ok=True)
    db = Db(dsn)
    max_size = max([int(s) for s in args.sizes.split(",") if s] + [FLEET, args.cpu_outboxes])
    schemas = [SCHEMA.format(i) for i in range(max_size)]
    try:
        _log(f"broker warm-up: {args.warm_records} records (untimed)")
        result["setup"]["broker_warmup_s"] = warm_broker(bootstrap, args.warm_records)
        _log(f"{max_size + 1} outboxes: init_db")
        db.make_outboxes([*schemas, SINGLE_SCHEMA, *PROCESS_SCHEMAS, *WORKER_SCHEMAS])
        if "idle" in parts:
            result["idle"] = idle_sizes(db, workdir, dsn, bootstrap, args)
        if "processes" in parts:
            fleet10 = (result.get("idle") or {}).get("sizes", {}).get(str(FLEET))
            result["processes_vs_fleet"] = processes_vs_fleet(db, workdir, dsn, bootstrap, args, fleet10)
        if "standby" in parts:
            result["standby"] = standby_cost(db, workdir, dsn, bootstrap, args)
        if parts & {"cpu", "fairness"}:
            result.update(
                drain_and_fairness(
                    db,
                    workdir,
                    dsn,
                    bootstrap,
                    args,
                    recorder,
                    parts,
                    result.get("idle"),
                    result.get("processes_vs_fleet"),
                )
            )
    finally:
        db.drop([*schemas, SINGLE_SCHEMA, *PROCESS_SCHEMAS, *WORKER_SCHEMAS])
        db.conn.close()
        if services is not None:
            services.stop()
        if tmp is not None:
            tmp.cleanup()
    result["spread"] = recorder.report()
    print(json.dumps(result, indent=1))
    return 0


def drain_and_fairness(
    db: Db,
    workdir: Path,
    dsn: str,
    bootstrap: str,
    args: argparse.Namespace,
    recorder: Recorder,
    parts: set[str],
    idle: dict[str, Any] | None,
    result_processes: dict[str, Any] | None,
) -> dict[str, Any]:
    from harvest_outbox.harvest_local.kafka import create_topic

    out: dict[str, Any] = {}
    n = args.cpu_outboxes  # part 2's (and 3's) fleet
    fleet_schemas = [SCHEMA.format(i) for i in range(n)]
    fleet = Relay(
        workdir,
        "drain",
        dsn,
        bootstrap,
        [f"{s}.outbox" for s in fleet_schemas],
        True,
        args.sequenced,
        args.statement_connections,
    )
    single = Relay(workdir, "single", dsn, bootstrap, [f"{SINGLE_SCHEMA}.outbox"], False, args.sequenced)
    processes = (
        [
            Relay(workdir, f"p{i:03d}", dsn, bootstrap, [f"{s}.outbox"], False, args.sequenced)
            for i, s in enumerate(PROCESS_SCHEMAS)
        ]
        if "cpu" in parts
        else []
    )
    workers = (
        [
            Relay(
                workdir,
                "workers",
                dsn,
                bootstrap,
                [f"{s}.outbox" for s in WORKER_SCHEMAS],
                True,
                args.sequenced,
                args.statement_connections,
                args.workers,
            )
        ]
        if ("cpu" in parts or args.fairness_workers) and args.workers > 1
        else []
    )
    for r in (fleet, single, *processes, *workers):
        r.start()
    try:
        out["led_s"] = {"fleet": wait_led([fleet], 120), "single": wait_led([single], 120)}
        if processes:
            out["led_s"]["processes"] = wait_led(processes, 180)
        if workers:
            out["led_s"]["workers"] = wait_led(workers, 120)
            out["workers_led"] = _wait_spread(workers[0], args.workers)
        if "cpu" in parts:
            topic = f"bo-drain-{uuid.uuid4().hex[:8]}"
            create_topic(bootstrap, topic, PARTITIONS)
            runs: dict[str, list[dict[str, float]]] = {"fleet": [], "single": [], "fleet_one_busy": [], "processes": []}
            if workers:
                runs["fleet_workers"] = []

            def fleet_drain() -> dict[str, float]:
                return drain(db, [fleet], fleet_schemas, args.rows, topic)

            def single_drain() -> dict[str, float]:
                return drain(db, [single], [SINGLE_SCHEMA], args.rows, topic)

            def one_busy_drain() -> dict[str, float]:
                return drain(db, [fleet], fleet_schemas[:1], args.rows, topic)

            def processes_drain() -> dict[str, float]:
                return drain(db, processes, PROCESS_SCHEMAS, args.rows, topic)

            def workers_drain() -> dict[str, float]:
                return drain(db, workers, WORKER_SCHEMAS, args.rows, topic)

            _log("cpu per row: one untimed pair")
            single_drain()
            fleet_drain()
            processes_drain()
            if workers:
                workers_drain()
            for repeat in range(args.repeats):
                sides = [
                    ("single", single_drain),
                    ("fleet", fleet_drain),
                    ("fleet_one_busy", one_busy_drain),
                    ("processes", processes_drain),
                    *([("fleet_workers", workers_drain)] if workers else []),
                ]
                for side, run in sides if repeat % 2 == 0 else sides[::-1]:
                    runs[side].append(run())
                    _log(f"cpu per row, repeat {repeat + 1}: {side} {runs[side][-1]}")
            per_row = f"CPU per row, {args.rows:,} rows"
            one_outbox = "in one outbox of a one-outbox process"
            figures = [  # (figure, contestant side, baseline side, what it compares)
                (
                    "cpu_per_row",
                    "fleet",
                    "single",
                    f"relay process {per_row} over {n} outboxes of a fleet / {one_outbox}",
                ),
                (
                    "cpu_per_row_one_busy",
                    "fleet_one_busy",
                    "single",
                    f"relay process {per_row} in one outbox of the {n}-outbox fleet (the others idle) / {one_outbox}",
                ),
                (
                    "cpu_per_row_processes",
                    "processes",
                    "single",
                    f"{per_row} over {FLEET} outboxes of {FLEET} one-outbox processes (summed) / {one_outbox}",
                ),
                (
                    "cpu_per_row_fleet_vs_processes",
                    "fleet",
                    "processes",
                    f"CPU per row: one fleet process over {n} outboxes / {FLEET} one-outbox processes (summed)",
                ),
            ]
            if workers:
                figures += [
                    (
                        "cpu_per_row_workers",
                        "fleet_workers",
                        "single",
                        f"relay {per_row} over {n} outboxes of a fleet run by {args.workers} worker processes "
                        f"(fleet.workers; supervisor and workers summed) / {one_outbox}",
                    ),
                    (
                        "cpu_per_row_workers_vs_fleet",
                        "fleet_workers",
                        "fleet",
                        f"CPU per row: a fleet run by {args.workers} worker processes / one fleet process, {n} outboxes",
                    ),
                ]
            for figure, side, base, what in figures:
                recorder.figure(
                    figure, [r["cpu_us_per_row"] for r in runs[side]], [r["cpu_us_per_row"] for r in runs[base]], what
                )
            recorder.figure(
                "rows_per_s",
                [r["rows_per_s"] for r in runs["fleet"]],
                [r["rows_per_s"] for r in runs["single"]],
                "drain rate, fleet of 10 / one-outbox process",
            )
            sizes = (idle or {}).get("sizes", {})
            fleet_idle = (sizes.get(str(n)) or {}).get("idle_cpu_share")
            idle_share = {
                "fleet": fleet_idle,
                "fleet_one_busy": fleet_idle,
                "single": (sizes.get("1") or {}).get("idle_cpu_share"),
                "processes": ((result_processes or {}).get("processes") or {}).get("idle_cpu_share"),
                "fleet_workers": None,
            }
            out["cpu"] = {}
            for side, rs in runs.items():
                share = idle_share[side]
                net = [(r["cpu_s"] - share * r["seconds"]) / args.rows * 1e6 for r in rs] if share is not None else None
                out["cpu"][side] = {
                    "cpu_us_per_row": spread([r["cpu_us_per_row"] for r in rs], 2),
                    "rows_per_s": spread([r["rows_per_s"] for r in rs], 0),
                    "drain_s": spread([r["seconds"] for r in rs], 2),
                    "system_share": spread([r["system_share"] for r in rs], 3),
                    **({"cpu_us_per_row_less_idle": spread(net, 2)} if net else {}),
                }
            if all(out["cpu"][s].get("cpu_us_per_row_less_idle") for s in ("fleet", "single")):
                f, s = (out["cpu"][x]["cpu_us_per_row_less_idle"]["median"] for x in ("fleet", "single"))
                out["cpu"]["ratio_less_idle_of_medians"] = round(f / s, 3)
            stop_all([*processes, *([] if args.fairness_workers else workers)])  # not in part 3's way
        if "fairness" in parts and args.fairness_workers and workers:
            # the burst into an outbox of one worker, a trickle into another of that worker's, and one into an
            # outbox the other worker leads
            led = _wait_spread(workers[0], args.workers)
            out["workers_led_fairness"] = led
            by_id = {oid: w for w, ids in led.items() for oid in ids}
            burst_id = sorted(by_id)[0]
            same = sorted(i for i in by_id if by_id[i] == by_id[burst_id] and i != burst_id)
            other = sorted(i for i in by_id if by_id[i] != by_id[burst_id])
            if not same or not other:
                raise RuntimeError(f"--fairness-workers: the workers' leaderships do not allow it: {led}")
            schema = {oid: WORKER_SCHEMAS[int(oid[1:])] for oid in by_id}
            out["fairness"] = fairness(
                db, workers[0], dsn, bootstrap, args, recorder, schema[burst_id], schema[same[0]], schema[other[0]]
            )
        elif "fairness" in parts:
            out["fairness"] = fairness(db, fleet, dsn, bootstrap, args, recorder)
        out["failures"] = {r.name: r.failures() for r in (fleet, single, *processes, *workers)}
        out["failure_reasons"] = {
            r.name: r.failure_reasons() for r in (fleet, single, *processes, *workers) if r.failures()
        }
    finally:
        stop_all([fleet, single, *processes, *workers])
    return out


if __name__ == "__main__":
    raise SystemExit(main())
