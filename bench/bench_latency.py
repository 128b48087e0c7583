"""Commit -> consumer latency as users run the relay (issue #51). Not a test.

    python -m bench.bench_latency [--rates 50,500,5000] [--seconds 60] [--warmup 10] [--configs ...] [--quick]

Every party is its own process, as in production: the relay is ``harvest -f harvest.yaml`` (started by
:class:`harvest_local.relays.RelayProcess`, the ``harvest`` command's module) with a new user's config
(``harvest init-db -f`` then a YAML with only the connection settings, the outbox table, the mode, and
``outboxLayout`` (when not the new outbox's default, the cursor layout) / ``shards`` where the configuration says so; a leader group of its own per run, so no run
inherits another's); the writers (one row per transaction through the Stasher, on one shared schedule at the
rate; one process per 1,000 rows/s unless ``--writers`` says otherwise: one Python process with one connection
does not reach 5,000 committed rows/s on 2 cores; rows still unwritten when the schedule ends are left
unwritten, and the achieved rate is reported), a plain consumer, and for ``--uuid-sequencing`` a
``ReadCommittedIter`` too, are children of this script (``python -m bench.bench_latency
writer|kafka-writer|consumer``). Services: ``harvest_local.LocalServices`` (or HARVEST_PG_DSN /
HARVEST_KAFKA_BOOTSTRAP).

Configurations: ``<layout>/<mode>/<shards>``, layout ``mark`` or ``cursor``, mode ``at_least_once`` or
``sequenced``, shards 1 or 2 (``shards: 2``: one sharded relay process leading both shards). Each run gets a
new outbox schema and a new 8-partition topic. Before the writer starts, probe rows (16 keys) are stashed
until every consumer has received a whole round of them: the relay is leader and the pipeline delivers. The
first ``--warmup`` seconds of the writer's rows are left out (a new topic's first seconds stall deliveries
whoever produces: see bench_relay's module doc); the figures are of the ``--seconds`` after them.

Kafka alone, the baseline: a producer with the relay's producer settings (``HarvestConfig.producer_config``)
in its own process, producing the same values and keys at the same rate to a new topic, no database; the same
consumer process. The relay figures are reported as ratios to it (same rate, same run).

Clocks and the timeline of a row: every process is on this machine, so wall-clock stamps compare
(``time.time_ns``). ``commit``: the writer's stamp just before ``COMMIT`` (stamping after could race the
consumer); the writer records it, and when ``COMMIT`` returned, per row, in its own file (joined here by the
row's value, its index), rather than in the value: a stamp in the value could only be taken before the INSERT.
``produce``: the record's timestamp, CreateTime, which librdkafka sets when the relay calls ``produce()`` (the
relay passes none at at-least-once and 0 — "now" — when sequenced; ms resolution, so the commit -> produce and
produce -> receipt splits are +- 1 ms). ``receipt``: the consumer's stamp when ``poll()`` returned the record
(for ``ReadCommittedIter``: when it yielded it, after its transaction's ACK). The broker's append time is not
separated: a ``LogAppendTime`` topic replaces CreateTime, so one record cannot carry both; produce -> receipt
holds the producer's linger, the broker's append and replication, and the consumer's fetch, and Kafka alone's
produce -> receipt is that path's own figure for comparison.

Repeats: ``--repeats`` (default 5) runs of Kafka alone and of every configuration per rate, interleaved (Kafka
alone first in even repeats, last in odd ones); each configuration's p99 over Kafka alone's is taken per repeat
(bench/spread.py: the JSON's ``spread``), and the published percentiles are each configuration's repeat of median
p99. ``--quick``: 3 repeats.

Figures per run: p50 / p99 / p99.9 / max of commit -> receipt (ms) over the rows committed in the window;
rows lost (committed in the window, not received before the deadline); the writer's achieved rate and worst
lag behind its schedule; the relay process's CPU share of one core over the writer's run; the same
percentiles of commit -> produce and produce -> receipt; and the timeline of the ``--worst`` slowest rows
(commit, COMMIT's own duration, commit -> produce, produce -> receipt, when in the window), with how the
rows above p99 split their time between the relay (commit -> produce) and Kafka (produce -> receipt).

What the broker and the machine did meanwhile (bench/broker_view.py): with its own services the bench turns
on the broker's request log, and samples the CPUs' busy share every 50 ms. Per run: the broker's produce and
fetch requests' queue phases (time spent waiting for one of its threads, p99 / max / how many 20 ms or more)
and the mean CPU busy share; per slow row, over its [produce, receipt] window, the longest such queue phase
(``broker_queue_ms``) and the busiest 50 ms (``cpu_busiest``, 1.0: every core busy). A slow row with a long
broker queue phase waited for the broker's JVM to run, not for the relay.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import broker_view, targets
from bench.spread import DEFAULT_REPEATS, Recorder
from harvest_outbox.harvest_local.jvm import VARIABLE as JVM_VARIABLE
from harvest_outbox.producer.layouts.choice import NEW_OUTBOX

LAYOUTS = ("mark", "cursor")
MODES = ("at_least_once", "sequenced")
SHARDS = (1, 2)
ALL_CONFIGS = tuple(f"{lay}/{mode}/{s}" for lay in LAYOUTS for mode in MODES for s in SHARDS)
DEBEZIUM = "debezium"  # the peer, as its users run it (run_debezium)
#: Debezium's outbox table, as its docs give it.
DEBEZIUM_DDL = (
    "CREATE TABLE {} (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, "
    "aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb)"
)
PROBE_KEYS = 16
PARTITIONS = 8
DSN_VAR = "BENCH_LATENCY_DSN"
#: issue #51's bound on p99 at 500 rows/s: 2x Kafka alone's p99 plus this many ms, per mode
SLACK_MS = {"at_least_once": 5.0, "sequenced": 10.0}
WRITER_RATE = 1000  # rows/s per writer process by default (one connection, one row per transaction)
QUICK = {"rates": "500", "seconds": 5.0, "warmup": 2.0, "warm_records": 100_000, "repeats": 3}


# ----------------------------------------------------------------------------- figures (pure)
def percentile(sorted_xs: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ascending ``sorted_xs``, linear between closest ranks
    (numpy's default): ``q`` 0 is the minimum, 100 the maximum. None for no values."""
    if not sorted_xs:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0-100")
    pos = (len(sorted_xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def summary_ms(values_ns: Sequence[int]) -> dict[str, float | None]:
    """p50 / p99 / p99.9 / max in ms (2 decimals) of nanosecond durations."""
    xs = sorted(values_ns)

    def ms(v: float | None) -> float | None:
        return None if v is None else round(v / 1e6, 2)

    return {
        "p50_ms": ms(percentile(xs, 50)),
        "p99_ms": ms(percentile(xs, 99)),
        "p99_9_ms": ms(percentile(xs, 99.9)),
        "max_ms": ms(xs[-1] if xs else None),
    }


def latency_figures(
    commit_ns: Sequence[int],
    done_ns: Sequence[int],
    received: dict[int, tuple[int, ...]],
    warmup_s: float,
    worst: int = 10,
) -> dict[str, Any]:
    """The figures of one run (module doc). ``commit_ns[i]`` / ``done_ns[i]``: row ``i``'s stamp before
    ``COMMIT`` and when it returned; ``received[i]``: (record timestamp in ms, receipt ns). Rows committed in
    the first ``warmup_s`` seconds after the first row are left out, and so are rows never written (a
    ``commit_ns`` of 0)."""
    written = [i for i, c in enumerate(commit_ns) if c]  # 0: not written (the writers ran out of time)
    if not written:
        return {"rows": 0}
    t0 = min(commit_ns[i] for i in written)
    window = [i for i in written if commit_ns[i] - t0 >= warmup_s * 1e9]
    got = [i for i in window if i in received]
    total = [received[i][1] - commit_ns[i] for i in got]
    to_produce = [received[i][0] * 1_000_000 - commit_ns[i] for i in got]
    to_receipt = [received[i][1] - received[i][0] * 1_000_000 for i in got]
    figures: dict[str, Any] = {
        "rows": len(window),
        "received": len(got),
        "lost": len(window) - len(got),
        **summary_ms(total),
        "commit_to_produce": summary_ms(to_produce),
        "produce_to_receipt": summary_ms(to_receipt),
    }
    p99 = percentile(sorted(total), 99)
    tail = [k for k, v in enumerate(total) if p99 is not None and v > p99]
    if tail:
        relay = sum(max(0, to_produce[k]) for k in tail)
        kafka = sum(max(0, to_receipt[k]) for k in tail)
        figures["above_p99"] = {
            "rows": len(tail),
            "mean_ms": round(sum(total[k] for k in tail) / len(tail) / 1e6, 2),
            "commit_to_produce_share": round(relay / (relay + kafka), 3) if relay + kafka else None,
        }
    order = sorted(range(len(got)), key=lambda k: total[k], reverse=True)[:worst]
    w0 = t0 + int(warmup_s * 1e9)
    figures["worst"] = [
        {
            "row": got[k],
            "at_s": round((commit_ns[got[k]] - w0) / 1e9, 3),
            "commit_unix_s": round(commit_ns[got[k]] / 1e9, 3),  # to match the broker's and relay's logs
            "total_ms": round(total[k] / 1e6, 2),
            "commit_call_ms": round((done_ns[got[k]] - commit_ns[got[k]]) / 1e6, 2),
            "commit_to_produce_ms": round(to_produce[k] / 1e6, 2),
            "produce_to_receipt_ms": round(to_receipt[k] / 1e6, 2),
            **({"partition": received[got[k]][2], "offset": received[got[k]][3]} if len(received[got[k]]) > 3 else {}),
        }
        for k in order
    ]
    return figures


def attribute(
    result: dict[str, Any],
    requests: broker_view.BrokerRequests | None,
    cpu: broker_view.CpuSampler,
    began: float,
    ended: float,
) -> None:
    """Add to a run's figures what the broker and the machine did: over the run, the broker's request queue
    times and the mean CPU busy share; per slow row, over its [produce, receipt] window, the longest queue
    phase of a request the broker completed (``broker_queue_ms``) and the busiest 50 ms of the CPUs
    (``cpu_busiest``: 1.0 is every core busy)."""
    result["cpu_busy_mean"] = cpu.mean(began, ended)
    if requests is not None:
        result["broker_requests"] = requests.summary(began, ended)
    topic = result.get("topic", "")
    for kind in ("plain", "read_committed", None):
        figures = result if kind is None else result.get(kind)
        if not isinstance(figures, dict) or "worst" not in figures:
            continue
        client = f"lat-{'rc' if kind == 'read_committed' else 'plain'}-{topic}"
        for row in figures["worst"]:
            produced = row["commit_unix_s"] + row["commit_to_produce_ms"] / 1000
            received = row["commit_unix_s"] + row["total_ms"] / 1000
            if requests is not None:
                row["broker_queue_ms"] = requests.queue_ms(produced, received)
                if "offset" in row:
                    appended = requests.appended_at(topic, row["partition"], row["offset"])
                    fetched = requests.fetched_at(client, row["partition"], row["offset"])
                    if appended is not None:
                        row["produce_to_append_ms"] = round((appended - produced) * 1000, 1)
                    if appended is not None and fetched is not None:
                        row["append_to_fetch_ms"] = round((fetched - appended) * 1000, 1)
                    if fetched is not None:
                        row["fetch_to_receipt_ms"] = round((received - fetched) * 1000, 1)
            row["cpu_busiest"] = cpu.busiest(produced, received)


def merge_writers(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One writer's view of several: each row's stamps from the writer that wrote it (the others hold 0), the
    rate all achieved together over the longest one's time, the worst lag of any."""
    n = len(parts[0]["commit_ns"])
    commit, done = [0] * n, [0] * n
    for part in parts:
        for i, (c, d) in enumerate(zip(part["commit_ns"], part["done_ns"], strict=True)):
            if c:
                commit[i], done[i] = c, d
    elapsed = max(p["elapsed_s"] for p in parts)
    return {
        "commit_ns": commit,
        "done_ns": done,
        "achieved_rate": round(sum(p["written"] for p in parts) / elapsed, 1) if elapsed > 0 else None,
        "max_lag_ms": max(p["max_lag_ms"] for p in parts),
    }


def ratios(run: dict[str, Any], kafka: dict[str, Any]) -> dict[str, float | None]:
    """Each percentile of ``run`` over Kafka alone's (same rate, same run)."""
    out: dict[str, float | None] = {}
    for key in ("p50_ms", "p99_ms", "p99_9_ms", "max_ms"):
        a, b = run.get(key), kafka.get(key)
        out[key.removesuffix("_ms")] = round(a / b, 2) if a is not None and b else None
    return out


# ----------------------------------------------------------------------------- child processes
def _schedule(
    rate: float, n: int, one: Callable[[int], None], index: int = 0, of: int = 1, start_at: float | None = None
) -> dict[str, Any]:
    """``one(i)`` for the rows i < n with i % ``of`` == ``index``, row i due ``i / rate`` seconds after
    ``start_at`` (wall clock; default now): on schedule, not after each other. Rows still unwritten when the
    schedule ends are not written (a writer that cannot keep the rate writes fewer rows in the same time). The
    rows written, the seconds taken and the worst lag behind the schedule."""
    start = time.perf_counter() + ((start_at - time.time()) if start_at is not None else 0.0)
    end = start + n / rate
    lag, written = 0.0, 0
    for i in range(index, n, of):
        now = time.perf_counter()
        if now > end:
            break
        delay = start + i / rate - now
        if delay > 0:
            time.sleep(delay)
        else:
            lag = max(lag, -delay)
        one(i)
        written += 1
    return {"written": written, "elapsed_s": time.perf_counter() - start, "max_lag_ms": round(lag * 1000, 2)}


def debezium_insert(table: str) -> Any:
    """One row into Debezium's outbox table (:data:`DEBEZIUM_DDL`): parameters (id, aggregate id, payload as
    JSON text). The payload is the row's index, a JSON number, which the event router sends as the value."""
    from psycopg import sql

    return sql.SQL(
        "INSERT INTO {} (id, aggregatetype, aggregateid, type, payload) VALUES (%s, 'Latency', %s, 'RowWritten', %s)"
    ).format(sql.Identifier(*table.split(".")))


def writer(args: argparse.Namespace) -> int:
    """Rows written one per transaction at ``--rate`` (stashed, or with ``--debezium`` inserted into Debezium's
    table); per row the stamps before COMMIT and after."""
    import psycopg

    from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

    commit = [0] * args.n
    done = [0] * args.n
    st = Stasher(args.table)
    insert = debezium_insert(args.table)
    with psycopg.connect(os.environ[DSN_VAR]) as conn:

        def stash(i: int) -> None:
            st.stash(conn, OutboxRecord(args.topic, f"key-{i % args.keys}", f"{i:010d}"))

        def insert_row(i: int) -> None:  # Debezium's table, the statement its users write
            conn.execute(insert, (uuid.uuid4(), f"key-{i % args.keys}", str(i)))

        write = insert_row if args.debezium else stash

        def one(i: int) -> None:
            with conn.transaction():
                write(i)
                commit[i] = time.time_ns()  # just before COMMIT
            done[i] = time.time_ns()

        stats = _schedule(args.rate, args.n, one, args.index, args.of, args.start_at)
    Path(args.out).write_text(json.dumps({"commit_ns": commit, "done_ns": done, **stats}))
    return 0


def kafka_writer(args: argparse.Namespace) -> int:
    """Kafka alone: the same values and keys produced at ``--rate`` with the relay's producer settings."""
    from confluent_kafka import Producer

    from harvest_outbox.producer.config import HarvestConfig

    conf = HarvestConfig(
        data_source="postgresql://unused",
        outbox_table="unused",
        base_kafka_config={"bootstrap.servers": args.bootstrap},
    ).producer_config()
    producer = Producer(conf)
    producer.list_topics(timeout=10)  # connected before the clock starts, as a running relay's producer is
    stamps = [0] * args.n

    def one(i: int) -> None:
        stamps[i] = time.time_ns()
        producer.produce(args.topic, f"{i:010d}".encode(), f"key-{i % args.keys}".encode())
        producer.poll(0)

    stats = _schedule(args.rate, args.n, one)
    producer.flush(30)
    Path(args.out).write_text(json.dumps({"commit_ns": stamps, "done_ns": stamps, **stats}))
    return 0


def consumer(args: argparse.Namespace) -> int:
    """Receives the topic from its start; touches ``<out>.ready`` once a whole probe round arrived; writes
    (row, record timestamp ms, receipt ns) of every row value when it has ``--n`` of them, at the deadline,
    or when ``<out>.stop`` exists."""
    from confluent_kafka import Consumer, TopicPartition

    out = Path(args.out)
    ready, stop = Path(f"{out}.ready"), Path(f"{out}.stop")
    if args.read_committed:
        from harvest_outbox.consumer import ReadCommittedIter

        reader: Any = ReadCommittedIter(
            {"bootstrap.servers": args.bootstrap, "client.id": f"lat-rc-{args.topic}"}, topics=[args.topic]
        )

        def poll() -> tuple[bytes, int, int, int] | None:
            r = reader.poll(0.05)
            return None if r is None else (r.value or b"", r.timestamp or 0, r.partition, r.offset)
    else:
        reader = Consumer(
            {
                "bootstrap.servers": args.bootstrap,
                "group.id": f"lat-{uuid.uuid4()}",
                "enable.auto.commit": False,
                "client.id": f"lat-plain-{args.topic}",  # names this run's fetches in the broker's request log
            }
        )
        reader.assign([TopicPartition(args.topic, p, 0) for p in range(PARTITIONS)])

        def poll() -> tuple[bytes, int, int, int] | None:
            m = reader.poll(0.05)
            if m is None or m.error():
                return None
            return m.value() or b"", m.timestamp()[1], m.partition(), m.offset()

    rows: list[tuple[int, int, int, int, int]] = []
    probes: dict[bytes, int] = {}
    deadline = time.time() + args.deadline
    checked = 0.0
    try:
        while len(rows) < args.n and time.time() < deadline:
            got = poll()
            now = time.time_ns()
            if got is not None:
                value, ts, partition, offset = got
                value = value.strip(b'"')  # Debezium's payload column is jsonb: a probe is a JSON string
                if value.isdigit():
                    rows.append((int(value), ts, now, partition, offset))
                elif value.startswith(b"probe:"):
                    rnd = value.rsplit(b":", 1)[0]
                    probes[rnd] = probes.get(rnd, 0) + 1
                    if probes[rnd] == PROBE_KEYS:
                        ready.touch()
            if now / 1e9 - checked > 0.5:
                checked = now / 1e9
                if stop.exists():
                    break
    finally:
        reader.close()
    out.write_text(json.dumps(rows))
    return 0


# ----------------------------------------------------------------------------- the orchestrator
def _child(role: str, *argv: object, dsn: str | None = None) -> subprocess.Popen[bytes]:
    """``python -m bench.bench_latency <role>``; a DSN travels in the environment, never on a command line."""
    env = {**os.environ, **({DSN_VAR: dsn} if dsn else {})}
    return subprocess.Popen(
        [sys.executable, "-m", "bench.bench_latency", role, *map(str, argv)], stdin=subprocess.DEVNULL, env=env
    )


def _cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def minimal_yaml(
    path: Path, dsn: str, bootstrap: str, table: str, group: str, sequenced: bool, layout: str, shards: int
) -> Path:
    """What a new user writes: connection settings, the outbox, the mode; the layout and shards when not the
    defaults. Nothing tuned (no limits, no producer properties)."""
    lines = [
        "harvest:",
        "  baseKafkaConfig:",
        f'    bootstrap.servers: "{bootstrap}"',
        f'  dataSource: "{dsn}"',
        f"  outboxTable: {table}",
        f"  leaderGroupID: {group}",
        f"  leaderTopic: {group}-leader",
        f"  uuidSequencing: {'true' if sequenced else 'false'}",
    ]
    if layout != NEW_OUTBOX.name:  # unset, init-db gives a new outbox the default's layout (cursor)
        lines.append(f"  outboxLayout: {layout}")
    if shards > 1:
        lines.append(f"  shards: {shards}")
    path.write_text("\n".join([*lines, "logging:", "  level: Info", ""]))
    os.chmod(path, 0o600)
    return path


class Run:
    """One measured run's files and children."""

    def __init__(self, workdir: Path, label: str) -> None:
        self.dir = workdir / label.replace("/", "_")
        self.dir.mkdir(parents=True)
        self.consumers: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def start_consumers(self, bootstrap: str, topic: str, n: int, deadline: float, read_committed: bool) -> None:
        kinds = ["plain", *(["read_committed"] if read_committed else [])]
        for kind in kinds:
            out = self.dir / f"consumer-{kind}.json"
            extra = ["--read-committed"] if kind == "read_committed" else []
            proc = _child(
                "consumer",
                "--bootstrap",
                bootstrap,
                "--topic",
                topic,
                "--n",
                n,
                "--deadline",
                deadline,
                "--out",
                out,
                *extra,
            )
            self.consumers.append((kind, proc, out))

    def wait_ready(self, probe: Callable[[int], None], timeout: float = 90.0) -> float:
        """Probe rounds until every consumer has received a whole one; the seconds it took."""
        start = time.monotonic()
        rnd = 0
        while not all(Path(f"{out}.ready").exists() for _, _, out in self.consumers):
            if time.monotonic() - start > timeout:
                raise SystemExit(f"bench_latency: no probe round delivered within {timeout:g}s (see {self.dir})")
            for kind, proc, _ in self.consumers:
                if proc.poll() is not None:
                    raise SystemExit(f"bench_latency: the {kind} consumer exited with {proc.returncode}")
            probe(rnd)
            rnd += 1
            time.sleep(0.5)
        return round(time.monotonic() - start, 2)

    def finish_consumers(self, grace: float) -> dict[str, dict[int, tuple[int, ...]]]:
        end = time.monotonic() + grace
        for _, proc, out in self.consumers:
            try:
                proc.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                Path(f"{out}.stop").touch()
                proc.wait(30)
        received: dict[str, dict[int, tuple[int, ...]]] = {}
        for kind, _, out in self.consumers:
            first = received.setdefault(kind, {})
            for i, ts, at, partition, offset in json.loads(out.read_text()):
                # a redelivery (at-least-once) counts at its first
                first.setdefault(int(i), (int(ts), int(at), int(partition), int(offset)))
        return received


def warm_broker(bootstrap: str, records: int) -> float:
    """Untimed: ``records`` produced as fast as they go with the relay's producer settings, so that the broker's
    JIT has compiled its hot paths before anything is measured (a fresh embedded broker runs its first ~million
    records in the interpreter, which no long-running broker does: bench_relay's module doc). Seconds taken."""
    from confluent_kafka import Producer

    from harvest_outbox.harvest_local.kafka import create_topic
    from harvest_outbox.producer.config import HarvestConfig

    if records <= 0:
        return 0.0
    topic = f"lat-warm-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, PARTITIONS)
    conf = HarvestConfig(
        data_source="postgresql://unused", outbox_table="unused", base_kafka_config={"bootstrap.servers": bootstrap}
    ).producer_config()
    producer = Producer(conf)
    start = time.monotonic()
    value = b"x" * 10
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, f"key-{i % 1000}".encode())
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    producer.flush(120)
    return round(time.monotonic() - start, 1)


def run_kafka(bootstrap: str, workdir: Path, rate: float, args: argparse.Namespace) -> dict[str, Any]:
    from confluent_kafka import Producer

    from harvest_outbox.harvest_local.kafka import create_topic

    topic = f"lat-kafka-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, PARTITIONS)
    n = int(rate * (args.warmup + args.seconds))
    run = Run(workdir, f"kafka-{rate:g}")
    run.start_consumers(bootstrap, topic, n, 3 * (args.warmup + args.seconds) + 300, False)
    prober = Producer({"bootstrap.servers": bootstrap})

    def probe(rnd: int) -> None:
        for k in range(PROBE_KEYS):
            prober.produce(topic, f"probe:{rnd}:{k}".encode(), f"key-{k}".encode())
        prober.flush(10)

    ready_s = run.wait_ready(probe)
    out = run.dir / "writer.json"
    w = _child(
        "kafka-writer",
        "--bootstrap",
        bootstrap,
        "--topic",
        topic,
        "--rate",
        rate,
        "--n",
        n,
        "--keys",
        args.keys,
        "--out",
        out,
    )
    if w.wait() != 0:
        raise SystemExit("bench_latency: the Kafka writer failed")
    received = run.finish_consumers(30)["plain"]
    written = merge_writers([json.loads(out.read_text())])
    figures = latency_figures(written["commit_ns"], written["done_ns"], received, args.warmup, args.worst)
    return {
        "topic": topic,
        "ready_s": ready_s,
        "achieved_rate": written["achieved_rate"],
        "max_lag_ms": written["max_lag_ms"],
        **figures,
    }


def run_relay(
    dsn: str, bootstrap: str, workdir: Path, rate: float, config: str, args: argparse.Namespace
) -> dict[str, Any]:
    from harvest_outbox.harvest_local.kafka import create_topic
    from harvest_outbox.harvest_local.relays import RelayProcess
    from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

    layout, mode, shards = config.split("/")
    sequenced = mode == "sequenced"
    hexid = uuid.uuid4().hex[:8]
    schema, topic = f"lat_{hexid}", f"lat-{hexid}"
    table = f"{schema}.outbox"
    create_topic(bootstrap, topic, PARTITIONS)
    run = Run(workdir, f"{config}-{rate:g}")
    yaml = minimal_yaml(run.dir / "harvest.yaml", dsn, bootstrap, table, f"lat-{hexid}", sequenced, layout, int(shards))
    init = subprocess.run(
        [sys.executable, "-m", "harvest_outbox.producer", "init-db", "-f", str(yaml)], capture_output=True, text=True
    )
    if init.returncode != 0:
        raise SystemExit(f"bench_latency: harvest init-db failed: {init.stderr}")
    relay = RelayProcess(yaml, "relay", run.dir).start()
    st = Stasher(table)

    def alive() -> None:
        if not relay.alive:
            raise SystemExit(f"bench_latency: the relay exited; its log: {relay.log}")

    def probe_rows(conn: Any, rnd: int) -> None:
        for k in range(PROBE_KEYS):
            st.stash(conn, OutboxRecord(topic, f"key-{k}", f"probe:{rnd}:{k}"))

    try:
        assert relay.proc is not None
        contestant = Contestant(relay.proc.pid, alive, probe_rows, ())
        return measure(dsn, bootstrap, run, rate, topic, table, sequenced, contestant, args)
    finally:
        relay.stop()
        _drop_schema(dsn, schema)


def run_debezium(dsn: str, bootstrap: str, workdir: Path, rate: float, args: argparse.Namespace) -> dict[str, Any]:
    """Debezium as its users run it: a Kafka Connect worker (its own JVM) with the Postgres connector and the
    outbox event router on Debezium's table, defaults but ``poll.interval.ms`` (``--debezium-poll-ms``). The
    worker is started for the run and stopped after it, so no idle JVM shares the machine with harvest's runs.
    The record's timestamp (the timeline's *produce*) is the router's default, Debezium's event timestamp:
    when the connector handled the change."""
    import psycopg
    from psycopg import sql

    from harvest_outbox.harvest_local.debezium import DebeziumOutbox, OutboxConnector
    from harvest_outbox.harvest_local.kafka import create_topic

    hexid = uuid.uuid4().hex[:8]
    schema, topic = f"lat_{hexid}", f"lat-{hexid}"
    table = f"{schema}.outbox"
    create_topic(bootstrap, topic, PARTITIONS)
    run = Run(workdir, f"{DEBEZIUM}-{rate:g}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL(DEBEZIUM_DDL).format(sql.Identifier(schema, "outbox")))
    connector = OutboxConnector(
        f"lat_{hexid}",
        table,
        {"route.topic.replacement": topic},
        options={"poll.interval.ms": str(args.debezium_poll_ms)},
        topic_partitions=PARTITIONS,
    )
    worker = DebeziumOutbox(dsn, bootstrap, [connector], root=run.dir / "connect")
    insert = debezium_insert(table)

    def alive() -> None:
        worker.wait_for_records([], 0, timeout=5)  # raises at once if the worker died or its task failed

    def probe_rows(conn: Any, rnd: int) -> None:
        for k in range(PROBE_KEYS):
            conn.execute(insert, (uuid.uuid4(), f"key-{k}", json.dumps(f"probe:{rnd}:{k}")))

    try:
        worker.start()
        assert worker.pid is not None
        contestant = Contestant(worker.pid, alive, probe_rows, ("--debezium",))
        return measure(dsn, bootstrap, run, rate, topic, table, False, contestant, args)
    finally:
        worker.destroy()  # its slot and publication too: a slot left behind would pin WAL for the later runs
        _drop_schema(dsn, schema)


@dataclass(frozen=True)
class Contestant:
    """What :func:`measure` needs of a running relay: its process (for its CPU share), a check that raises
    if it died, how to write one probe round into its table, and the writers' extra flags."""

    pid: int
    check: Callable[[], None]
    probe_rows: Callable[[Any, int], None]
    writer_flags: tuple[str, ...]


def measure(
    dsn: str,
    bootstrap: str,
    run: Run,
    rate: float,
    topic: str,
    table: str,
    sequenced: bool,
    contestant: Contestant,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One run against a relay that is running: consumers started, probes until they receive, the writers on
    their schedule, the figures."""
    import psycopg

    n = int(rate * (args.warmup + args.seconds))
    try:
        run.start_consumers(bootstrap, topic, n, 3 * (args.warmup + args.seconds) + 300, sequenced)
        with psycopg.connect(dsn) as conn:

            def probe(rnd: int) -> None:
                contestant.check()
                with conn.transaction():
                    contestant.probe_rows(conn, rnd)

            ready_s = run.wait_ready(probe)
        writers = args.writers or max(1, math.ceil(rate / WRITER_RATE))
        outs = [run.dir / f"writer-{w}.json" for w in range(writers)]
        start_at = time.time() + 1.0  # every writer's schedule starts then (they import first)
        cpu0, t0 = _cpu_s(contestant.pid), time.monotonic()
        procs = [
            _child(
                "writer",
                *("--table", table, "--topic", topic, "--rate", rate, "--n", n, "--keys", args.keys),
                *("--index", w, "--of", writers, "--start-at", repr(start_at), "--out", out),
                *contestant.writer_flags,
                dsn=dsn,
            )
            for w, out in enumerate(outs)
        ]
        if any(p.wait() != 0 for p in procs):
            raise SystemExit("bench_latency: a writer failed")
        cpu1, t1 = _cpu_s(contestant.pid), time.monotonic()
        received = run.finish_consumers(30)
    finally:
        for _, proc, _ in run.consumers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
    written = merge_writers([json.loads(out.read_text()) for out in outs])
    result: dict[str, Any] = {
        "topic": topic,
        "ready_s": ready_s,
        "writers": writers,
        "achieved_rate": written["achieved_rate"],
        "max_lag_ms": written["max_lag_ms"],
        "relay_cpu_share": round((cpu1 - cpu0) / (t1 - t0), 3) if cpu0 is not None and cpu1 is not None else None,
    }
    for kind, rows in received.items():
        result[kind] = latency_figures(written["commit_ns"], written["done_ns"], rows, args.warmup, args.worst)
    return result


def _require_logical(dsn: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        level = conn.execute("SHOW wal_level").fetchone()[0]  # type: ignore[index]
    if level != "logical":
        raise SystemExit(
            f"bench_latency: configuration {DEBEZIUM!r} needs Postgres with wal_level = logical; HARVEST_PG_DSN's "
            f"server has wal_level = {level}. Set it (and restart the server), or leave {DEBEZIUM!r} out of --configs."
        )


def _drop_schema(dsn: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _paired(runs: list[dict[str, Any]], kafka_runs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], Any]]:
    """(a configuration's run, Kafka alone's of the same repeat), where both have a plain p99."""
    return [
        (r, k)
        for r, k in zip(runs, kafka_runs, strict=True)
        if (r.get("plain") or {}).get("p99_ms") is not None and k.get("p99_ms")
    ]


def _median_run(runs: list[dict[str, Any]], key: Callable[[dict[str, Any]], float | None]) -> dict[str, Any]:
    """The run whose ``key`` is the median of ``runs`` (the upper one of an even count); runs without it last."""
    ranked = sorted(runs, key=lambda r: (key(r) is None, key(r) or 0.0))
    return {**ranked[len(ranked) // 2], "repeats": len(runs)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("writer", "kafka-writer", "consumer"):
        return _child_main(argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="50,500,5000", help="rows/s, comma-separated")
    ap.add_argument("--seconds", type=float, default=60.0, help="the measured window, after the warm-up")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds of rows left out first")
    ap.add_argument(
        "--configs",
        default=",".join([*ALL_CONFIGS, DEBEZIUM]),
        help=f"layout/mode/shards or {DEBEZIUM}, comma-separated",
    )
    ap.add_argument(
        "--debezium-poll-ms",
        type=int,
        default=10,
        help="Debezium's poll.interval.ms (its default is 500; issue #51 compares against a tuned 10)",
    )
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument(
        "--warm-records", type=int, default=1_000_000, help="records produced untimed first (the broker's JIT)"
    )
    ap.add_argument(
        "--writers",
        type=int,
        default=0,
        help=f"writer processes sharing the rate (default: one per {WRITER_RATE:,} rows/s)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=DEFAULT_REPEATS,
        help="runs of Kafka alone and of each configuration, interleaved (ratios per repeat pair)",
    )
    ap.add_argument("--worst", type=int, default=10, help="rows in each run's timeline of the slowest")
    ap.add_argument("--quick", action="store_true", help=f"a smoke run: {QUICK} unless given")
    ap.add_argument("--workdir", help="where the runs' files go (default: a temporary folder, removed)")
    args = ap.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) == ap.get_default(key):
                setattr(args, key, value)
    configs = [c for c in args.configs.split(",") if c]
    for c in configs:
        if c not in (*ALL_CONFIGS, DEBEZIUM):
            ap.error(f"unknown configuration {c!r}; choose from {', '.join([*ALL_CONFIGS, DEBEZIUM])}")
    rates = [float(r) for r in args.rates.split(",") if r]
    services = None
    tmp = None if args.workdir else tempfile.TemporaryDirectory(prefix="bench-latency-")
    workdir = Path(args.workdir or tmp.name)  # type: ignore[union-attr]
    workdir.mkdir(parents=True, exist_ok=True)
    request_log: Path | None = None
    dsn, bootstrap = os.environ.get("HARVEST_PG_DSN"), os.environ.get("HARVEST_KAFKA_BOOTSTRAP")
    if not (dsn and bootstrap):
        from harvest_outbox.harvest_local import LocalServices

        option, request_log = broker_view.jvm_options(workdir)
        os.environ[JVM_VARIABLE] = f"{os.environ.get(JVM_VARIABLE, '')} {option}".strip()
        services = LocalServices(logical_replication=DEBEZIUM in configs).start()
        dsn, bootstrap = services.endpoints.pg_dsn, services.endpoints.kafka_bootstrap
    if DEBEZIUM in configs:
        _require_logical(dsn)
    results: dict[str, Any] = {}
    warm_s = None
    cpu = broker_view.CpuSampler().start()
    requests = broker_view.BrokerRequests(request_log) if request_log is not None else None
    recorder = Recorder(
        args.repeats,
        f"{args.warm_records:,} records produced untimed first; each run's first {args.warmup:g} s left out",
        targets.for_bench("latency"),
    )

    def record(name: str, pairs: list[tuple[float, float]], what: str, target_key: str | None = None) -> None:
        """A figure from every repeat's (contestant, baseline) pair; none when a repeat lacks its pair."""
        if len(pairs) == args.repeats:
            recorder.figure(name, [a for a, _ in pairs], [b for _, b in pairs], what, target_key)

    try:
        print(f"[bench latency] broker warm-up: {args.warm_records} records (untimed)", file=sys.stderr, flush=True)
        warm_s = warm_broker(bootstrap, args.warm_records)
        for rate in rates:
            key = f"{rate:g}"
            repeats: dict[str, list[dict[str, Any]]] = {"kafka": [], **{c: [] for c in configs}}
            for n in range(args.repeats):
                # Kafka alone first in even repeats, last in odd ones (bench/spread.py): drift hits both
                for config in ["kafka", *configs] if n % 2 == 0 else [*configs, "kafka"]:
                    print(f"[bench latency] {key} rows/s, repeat {n + 1}: {config}", file=sys.stderr, flush=True)
                    here = workdir / f"repeat-{n + 1}"  # each run's folder is named for its config and rate
                    began = time.time()
                    if config == "kafka":
                        run = run_kafka(bootstrap, here, rate, args)
                    elif config == DEBEZIUM:
                        run = run_debezium(dsn, bootstrap, here, rate, args)
                    else:
                        run = run_relay(dsn, bootstrap, here, rate, config, args)
                    repeats[config].append(run)
                    if requests is not None:
                        requests.take()  # this run's request log lines (and the log emptied)
                    attribute(run, requests, cpu, began, time.time())
            kafka_runs = repeats["kafka"]
            for config in configs:
                for r, kafka in zip(repeats[config], kafka_runs, strict=True):
                    for kind in ("plain", "read_committed"):
                        if kind in r:
                            r[kind]["to_kafka_alone"] = ratios(r[kind], kafka)
                for kind in ("plain", "read_committed"):
                    pairs = [
                        (r[kind]["p99_ms"], k["p99_ms"])
                        for r, k in zip(repeats[config], kafka_runs, strict=True)
                        if kind in r and r[kind].get("p99_ms") is not None and k.get("p99_ms")
                    ]
                    record(
                        f"{key}/{config}/{kind}/p99",
                        pairs,
                        f"commit -> receipt p99, harvest {config} ({kind}) / Kafka alone's, {key} rows/s",
                    )
                if config == DEBEZIUM:
                    continue
                # issue #51's bound: p99 <= 2x Kafka alone's + 5 ms (at-least-once) or + 10 ms (sequenced)
                slack = SLACK_MS["sequenced" if "/sequenced/" in config else "at_least_once"]
                bounds = [
                    (r["plain"]["p99_ms"], 2 * k["p99_ms"] + slack) for r, k in _paired(repeats[config], kafka_runs)
                ]
                record(
                    f"{key}/{config}/plain/p99_to_bound",
                    bounds,
                    f"commit -> receipt p99, harvest {config} / (2x Kafka alone's p99 + {slack:g} ms), {key} rows/s",
                    f"{key}/p99_to_bound" if key == "500" else "",
                )
                if DEBEZIUM in configs:
                    for pct in ("p50", "p99", "p99_9", "max"):
                        pairs = [
                            (r["plain"][f"{pct}_ms"], d["plain"][f"{pct}_ms"])
                            for r, d in zip(repeats[config], repeats[DEBEZIUM], strict=True)
                            if (r.get("plain") or {}).get(f"{pct}_ms") is not None
                            and (d.get("plain") or {}).get(f"{pct}_ms")
                        ]
                        record(
                            f"{key}/{config}/plain/{pct}_to_debezium",
                            pairs,
                            f"commit -> receipt {pct}, harvest {config} / Debezium's "
                            f"(poll.interval.ms {args.debezium_poll_ms}), {key} rows/s",
                            f"{key}/to_debezium" if key == "500" else "",
                        )
            # the published percentiles: each configuration's repeat of median p99 (one run's coherent
            # figures, not a mix), beside its Kafka-alone repeat of the same round
            results[key] = {"kafka": _median_run(kafka_runs, lambda r: r.get("p99_ms"))}
            for config in configs:
                results[key][config] = _median_run(repeats[config], lambda r: (r.get("plain") or {}).get("p99_ms"))
    finally:
        cpu.stop()
        if services is not None:
            services.stop()
        if tmp is not None:
            tmp.cleanup()
    setup = {k: v for k, v in vars(args).items() if k != "workdir"}
    print(
        json.dumps(
            {
                "setup": {**setup, "cpus": os.cpu_count(), "broker_warmup_s": warm_s},
                "rates": results,
                "spread": recorder.report(),
            },
            indent=2,
        )
    )
    return 0


def _child_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m bench.bench_latency {argv[0]}")
    ap.add_argument("--out", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--rate", type=float, default=0.0)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--table")
    ap.add_argument("--bootstrap")
    ap.add_argument("--deadline", type=float, default=300.0)
    ap.add_argument("--read-committed", action="store_true")
    ap.add_argument("--index", type=int, default=0, help="this writer writes the rows i % --of == --index")
    ap.add_argument("--of", type=int, default=1)
    ap.add_argument("--start-at", type=float, help="wall-clock time the writers' schedule starts")
    ap.add_argument("--debezium", action="store_true", help="write into Debezium's outbox table")
    args = ap.parse_args(argv[1:])
    return {"writer": writer, "kafka-writer": kafka_writer, "consumer": consumer}[argv[0]](args)


if __name__ == "__main__":
    sys.exit(main())
