"""Relay benchmark (not a test): backlog drain throughput against the database's own limit,
idle-to-delivery latency, and goharvest side by side.

    .venv/bin/python -m bench.bench_relay [--rows 100000] [--big-rows 1000000] [--runs 5] [--big-runs 5]

Uses the project's own Postgres + Kafka (harvest_local.LocalServices; or HARVEST_PG_DSN /
HARVEST_KAFKA_BOOTSTRAP). Prints one JSON document:
- db_limit: the database's own mark+purge loop on the same table shape (the relay's own mark
  UPDATE … RETURNING of ``batch`` rows, then one DELETE … = ANY(ids), one connection, nothing
  else): the physical limit of any relay using these statements on this database. Measured per
  backlog size, interleaved with the relay runs; ``batch`` is the most rows the relay's adaptive
  mark reaches (5,000). The same loop with goharvest's mark statement (``id IN (SELECT id …)``,
  which the relay replaced by a TID scan) is reported beside it, and so is the loop with the mark
  committing asynchronously on a second connection, as the relay's does (``db_loop_async_mark``:
  the limit of the relay's exact statements; the purge stays synchronous), and the loop deleting
  each mark's rows as the sequenced relay's fenced commit names them, an id range minus its holes
  (``db_loop_range_delete``: at-least-once purges in delivery order, whose batches are no range);
- drains: a backlog (100-byte values, ``keys`` keys, ``partitions`` partitions) moved by one relay
  (NELI election included), timed from leadership to the outbox being empty; for both modes
  (at-least-once, ``--uuid-sequencing``), with the **defaults a new user gets** (a config with only
  connection settings and heartbeatTimeout) and tuned (markQueryRecords 5000, maxInFlightRecords
  5000), for a 100k and a 1M backlog: rows/s (median), ratio to the db_limit, relay CPU seconds per
  100k rows (process CPU: the relay's Python thread, its DB workers and librdkafka's threads) and
  peak RSS;
- kafka_limit: the Kafka side's own limit under the relay's rules, no database: the same records,
  already in memory, produced by one confluent-kafka producer with the relay's producer settings
  (idempotent, acks=all, linger.ms 1, the Java client's key placement) and goharvest's ordering rule
  (at most one record in flight per key), to the same broker. Relay figures are reported against it
  too: a relay cannot beat the slower of the two loops, and on a small machine both share its cores;
- warm-up: before anything is timed, rounds of a default-limits drain of each mode and two Kafka
  loops are run and discarded until the Kafka loop has settled (``warm_up``: at least
  ``WARMUP_ROUNDS``, ~1.2M records). A freshly started embedded broker runs its first ~million
  records in the JVM's interpreter, which no long-running broker does: after three warm-up drains
  per mode, six Kafka loops in a row on fresh services gave 207k, 226k, 237k, 274k, 321k and
  311k rows/s, and later ones 350-410k (2026-11-25); with that shorter warm-up the first timed
  round came out ~25 % slower for every relay;
- a ``CHECKPOINT`` before every backlog is written: each 100k run writes ~40 MB (the database loop)
  to ~80 MB (a relay) of WAL, and a checkpoint that Postgres starts on its own during one timed
  run but not another made single database-loop runs vary from 176k to 238k rows/s in one series;
  with the checkpoint first, six rounds gave 235-240k (one 197k) and the relays' spread halved.
  Each run then writes to pages already written since the checkpoint (no full-page images);
- goharvest: goharvest itself (Go) on the same backlog, when a Go toolchain is present, in ``--runs``
  alternating pairs with harvest's at-least-once drain under the same limits (:func:`goharvest_pairs`);
- latency: rows stashed one per transaction at ``--rate`` rows/s, default limits; commit ->
  consumer receipt, p50/p99 in ms (the relay idles on LISTEN/NOTIFY between rows; sequenced also
  through a ``ReadCommittedIter``, which yields a record once its transaction's ACK is read: no
  target, that path adds the fenced commit and the ACK), and the share of
  one core the relay's own threads used meanwhile. Each mode gets a new topic and a new relay; the
  first ``--latency-warmup`` seconds after the first row are reported on their own and the figures
  are of the ``--latency-seconds`` after them. Kafka alone (a producer with the relay's settings, a
  new topic, the same consumer, no database) is measured the same way as the baseline: a freshly
  created topic's first ~1.5 s stall deliveries by 40-150 ms whoever produces (seen with the plain
  producer, with or without Nagle, with or without a pause after creating the topic), which no
  long-lived topic has; in a 10 s window those stalls alone made the p99. The phase starts with a
  ``CHECKPOINT``: the drains before it leave gigabytes of WAL and dirty pages, and a checkpoint that
  Postgres starts on its own in the middle of the phase stalls every commit for ~100 ms (seen as
  p99s of 100+ ms that no idle relay's database has).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import threading
import time
import uuid
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition
from psycopg import sql

from bench import targets
from bench.backlog import backlog_records, fill_backlog
from bench.services import endpoints
from bench.spread import DEFAULT_REPEATS, Recorder
from harvest_outbox.harvest_local.kafka import create_topic
from harvest_outbox.producer.config import AUTO_MARK_RECORDS, HarvestConfig, Limits
from harvest_outbox.producer.db import id_range
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.layouts.mark.database import MarkDatabase
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

# What a new user writes: connection settings and heartbeatTimeout, nothing else.
DEFAULT_LIMITS: dict[str, Any] = dict(heartbeat_timeout=5.0)
TUNED_LIMITS: dict[str, Any] = dict(heartbeat_timeout=5.0, mark_query_records=5000, max_in_flight_records=5000)
TARGET_RATIO = 0.75  # of the database's own mark+purge loop, defaults, both modes
TARGET_SEQ_RATIO = 0.9  # sequenced / at-least-once
WARMUP_ROUNDS = 4  # at least: a drain of each mode and two Kafka loops each (~1.2M records)
WARMUP_MAX_ROUNDS = 10
WARMUP_PLATEAU = 0.9  # warmed once the last round's Kafka loops reach this share of the best one so far


def _config(dsn: str, bootstrap: str, table: str, limits: dict[str, Any], sequenced: bool) -> HarvestConfig:
    return HarvestConfig(
        data_source=dsn,
        outbox_table=table,
        base_kafka_config={"bootstrap.servers": bootstrap},
        leader_group_id=f"bench-{uuid.uuid4().hex[:8]}",
        limits=Limits(**limits),
        uuid_sequencing=sequenced,
    )


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def new_topic(bootstrap: str, partitions: int) -> str:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions)
    return topic


_NO_CHECKPOINT: list[str] = []


def checkpoint(dsn: str) -> None:
    """``CHECKPOINT`` now, so that none starts during the timed run that follows (see the module doc).
    Without the privilege (superuser or pg_checkpoint) the runs go on without it, said once."""
    if _NO_CHECKPOINT:
        return
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
    except psycopg.Error as exc:
        _NO_CHECKPOINT.append(str(exc).strip())
        print(f"[bench relay] runs without a CHECKPOINT before each backlog: {_NO_CHECKPOINT[0]}", file=sys.stderr)


class _Backlog:
    """A fresh schema + outbox filled with ``rows`` rows for ``topic`` (a new topic when None); the
    schema is dropped on exit."""

    def __init__(
        self, dsn: str, bootstrap: str, rows: int, keys: int, partitions: int, topic: str | None = None
    ) -> None:
        self.dsn, self.rows = dsn, rows
        self.schema = f"bench_{uuid.uuid4().hex[:8]}"
        self.table = f"{self.schema}.outbox"
        self.topic = topic or new_topic(bootstrap, partitions)
        checkpoint(dsn)
        init_db(dsn, self.table)
        fill_backlog(dsn, self.table, self.topic, rows, keys)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(self.schema, "outbox")))

    def __enter__(self) -> _Backlog:
        return self

    def __exit__(self, *exc: object) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(self.schema)))


def drain_once(
    dsn: str,
    bootstrap: str,
    rows: int,
    keys: int,
    partitions: int,
    sequenced: bool,
    limits: dict[str, Any],
    topic: str | None = None,
) -> dict[str, Any]:
    with _Backlog(dsn, bootstrap, rows, keys, partitions, topic) as b:
        relay = Harvest(_config(dsn, bootstrap, b.table, limits, sequenced)).start()
        peak_rss, peak_mark = _rss_mb(), 0
        # Purges are written behind delivery: the run ends when the outbox is empty. The connection
        # that looks is opened before the clock starts (opening it took ~3 ms of a ~0.6 s run).
        watch = psycopg.connect(dsn, autocommit=True)
        count = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(b.schema, "outbox"))
        try:
            while not relay.is_leader:
                time.sleep(0.001)
            t0, c0 = time.perf_counter(), time.process_time()
            while relay.metrics.delivered < rows:
                time.sleep(0.005)
                peak_rss, peak_mark = max(peak_rss, _rss_mb()), max(peak_mark, relay.core.mark_size.value)
            while watch.execute(count).fetchone()[0]:  # type: ignore[index]
                time.sleep(0.001)
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        finally:
            watch.close()
            relay.stop()
            relay.wait(60)
    return {
        "rows_per_s": rows / elapsed,
        "cpu_s_per_100k": cpu / rows * 100_000,
        "peak_rss_mb": peak_rss,
        "peak_mark_size": peak_mark,
        "remarks": relay.metrics.remarks,
    }


# goharvest's own mark statement (the relay addresses the marked rows by ctid instead).
GOHARVEST_MARK = """
    UPDATE {o} SET leader_id = %s
    WHERE id IN (SELECT id FROM {o} WHERE leader_id IS NULL OR leader_id <> %s ORDER BY id LIMIT %s)
    RETURNING id, kafka_topic, convert_to(kafka_key, 'UTF8'), convert_to(kafka_value, 'UTF8'), kafka_header_keys,
              kafka_header_values"""


def kafka_limit_once(bootstrap: str, rows: int, keys: int, partitions: int, topic: str) -> float:
    """The Kafka side's own loop (see the module doc): rows / seconds from the first produce to the
    last acknowledgement. The producer connects (and gets its producer id) before the clock starts,
    as the relay's does before it is elected."""
    from confluent_kafka import Producer

    conf = HarvestConfig(
        data_source="postgresql://unused", outbox_table="unused", base_kafka_config={"bootstrap.servers": bootstrap}
    ).producer_config()
    producer = Producer(conf)
    producer.list_topics(timeout=10)
    records = [(r.key.encode(), r.value.encode()) for r in backlog_records(topic, 0, rows, keys)]
    in_flight: set[bytes] = set()
    delivered = [0]

    def acked(err: Any, msg: Any) -> None:
        assert err is None, err
        delivered[0] += 1
        in_flight.discard(msg.key())

    t0, sent = time.perf_counter(), 0
    while delivered[0] < rows:
        while sent < rows and records[sent][0] not in in_flight:
            key, value = records[sent]
            in_flight.add(key)
            producer.produce(topic, value, key, on_delivery=acked)
            sent += 1
        producer.poll(0.001)
    elapsed = time.perf_counter() - t0
    producer.flush(10)
    return rows / elapsed


def db_limit_once(
    dsn: str,
    bootstrap: str,
    rows: int,
    keys: int,
    partitions: int,
    batch: int,
    topic: str | None = None,
    statement: str = "relay",
) -> float:
    """The database's own loop: a mark statement (the relay's, or goharvest's), then one multi-id
    DELETE, repeated on one connection until the outbox is empty. ``statement="relay_async_mark"``:
    the relay's mark on a second connection committing asynchronously, as the relay's does (the
    DELETE stays synchronous on the first); ``statement="relay_range_delete"``: the relay's mark,
    then the rows deleted as the sequenced commit names them (an id range minus its holes)."""
    with _Backlog(dsn, bootstrap, rows, keys, partitions, topic) as b:
        names = OutboxNames.parse(b.table)
        db = MarkDatabase(dsn, names)
        mark_db = MarkDatabase(dsn, names, async_commit=True) if statement == "relay_async_mark" else db
        leader = uuid.uuid4()
        goharvest = sql.SQL(GOHARVEST_MARK).format(o=sql.Identifier(b.schema, "outbox"))
        range_delete = sql.SQL("DELETE FROM {} WHERE id BETWEEN %s AND %s AND id <> ALL(%s::bigint[])").format(
            sql.Identifier(b.schema, "outbox")
        )
        try:
            conn = db.conn
            _ = mark_db.conn  # connected before the clock starts
            t0, done = time.perf_counter(), 0
            while True:
                if statement == "goharvest":
                    marked = conn.execute(goharvest, (leader, leader, batch), binary=True).fetchall()
                else:
                    marked = mark_db.mark(leader, batch)
                if not marked:
                    break
                ids = [r[0] for r in marked]
                span = id_range(ids) if statement == "relay_range_delete" else None
                if span is not None:
                    conn.execute(range_delete, span)
                else:
                    db.purge(ids)
                done += len(marked)
            elapsed = time.perf_counter() - t0
        finally:
            db.close()
            if mark_db is not db:
                mark_db.close()
    assert done == rows, (done, rows)
    return rows / elapsed


def _latency_figures(rows: list[tuple[float, float]], warmup: float, rate: float, seconds: float) -> dict[str, Any]:
    """p50/p99 of (sent, received) pairs after the first ``warmup`` seconds, and the worst of the
    warm-up window on its own (see the module doc: a fresh topic's first second)."""
    if not rows:
        return {"rate_rows_per_s": rate, "rows": 0, "received": 0}
    t0 = min(t for t, _ in rows)
    steady = sorted(r - t for t, r in rows if t - t0 >= warmup)
    start = sorted(r - t for t, r in rows if t - t0 < warmup)
    worst = max(rows, key=lambda tr: tr[1] - tr[0])

    def pct(xs: list[float], q: int) -> float | None:
        return round(statistics.quantiles(xs, n=100)[q - 1] * 1000, 2) if len(xs) > 1 else None

    return {
        "rate_rows_per_s": rate,
        "rows": len(steady),
        "seconds": seconds,
        "p50_ms": pct(steady, 50),
        "p99_ms": pct(steady, 99),
        "max_ms": round(steady[-1] * 1000, 2) if steady else None,
        "warmup_seconds": warmup,
        "warmup_p99_ms": pct(start, 99),
        "warmup_max_ms": round(start[-1] * 1000, 2) if start else None,
        "worst_at_s": round(worst[0] - t0, 2),
    }


def _trickle(write_one: Any, rate: float, n: int) -> None:
    """Call ``write_one(i)`` ``n`` times at ``rate`` per second (on schedule, not after each other)."""
    start = time.perf_counter()
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        write_one(i)


def _receive(
    topic: str, bootstrap: str, sent: dict[bytes, float], n: int, deadline: float, read_committed: bool = False
) -> list[tuple[float, float]]:
    """(sent, received) perf_counter pairs of the values in ``sent``, read by a plain consumer, or
    with ``read_committed`` by a ``ReadCommittedIter`` (a record counts once its ACK is read)."""
    if read_committed:
        from harvest_outbox.consumer import ReadCommittedIter

        reader: Any = ReadCommittedIter({"bootstrap.servers": bootstrap}, topics=[topic])

        def next_value() -> bytes | None:
            r = reader.poll(0.05)
            return r.value if r is not None else None
    else:
        reader = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": f"lat-{uuid.uuid4()}", "enable.auto.commit": False}
        )
        reader.assign([TopicPartition(topic, p, 0) for p in range(8)])

        def next_value() -> bytes | None:
            m = reader.poll(0.05)  # poll, not consume(n): consume waits for n messages or the timeout
            return m.value() if m is not None and not m.error() else None

    out: list[tuple[float, float]] = []
    try:
        while len(out) < n and time.perf_counter() < deadline:
            value = next_value()
            if value is None:
                continue
            now = time.perf_counter()
            t = sent.get(value)
            if t is not None:
                out.append((t, now))
    finally:
        reader.close()
    return out


def latency(
    dsn: str,
    bootstrap: str,
    rate: float,
    seconds: float,
    keys: int,
    sequenced: bool = False,
    warmup: float = 2.0,
    read_committed: bool = False,
) -> dict[str, Any]:
    """Commit -> consumer receipt of rows stashed one per transaction at ``rate`` (module doc);
    ``read_committed``: receipt by a ``ReadCommittedIter`` (sequenced only: after the ACK)."""
    schema = f"lat_{uuid.uuid4().hex[:8]}"
    table = f"{schema}.outbox"
    topic = f"lat-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 8)
    init_db(dsn, table)
    relay = Harvest(_config(dsn, bootstrap, table, DEFAULT_LIMITS, sequenced)).start()
    sent: dict[bytes, float] = {}
    n = int(rate * (warmup + seconds))
    try:
        while not relay.is_leader:
            time.sleep(0.01)
        window: list[tuple[float, dict[int, float]]] = []  # (start, relay threads' CPU then)

        def write() -> None:
            st = Stasher(table)
            with psycopg.connect(dsn) as conn:

                def one(i: int) -> None:
                    if i == int(rate * warmup):  # the measured window starts: relay CPU from here
                        window.append((time.perf_counter(), _thread_cpu_s(_relay_threads(relay))))
                    value = f"{i:010d}"
                    with conn.transaction():
                        st.stash(conn, OutboxRecord(topic, f"key-{i % keys}", value))
                        # stamped just before COMMIT (stamping after could race the consumer)
                        sent[value.encode()] = time.perf_counter()

                _trickle(one, rate, n)

        w = threading.Thread(target=write)
        w.start()
        rows = _receive(topic, bootstrap, sent, n, time.perf_counter() + warmup + seconds + 30, read_committed)
        w.join()
        start, before = window[0] if window else (time.perf_counter(), {})
        used = sum(u - before.get(tid, 0.0) for tid, u in _thread_cpu_s(_relay_threads(relay)).items())
        elapsed = time.perf_counter() - start
    finally:
        relay.stop()
        relay.wait(60)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    figures = _latency_figures(rows, warmup, rate, seconds)
    figures["received"] = len(rows)
    # share of one core used by the relay's own threads (relay loop, mark and write workers), measured window
    figures["relay_python_cpu_share"] = round(used / elapsed, 3) if elapsed > 0 else None
    return figures


def kafka_latency(bootstrap: str, rate: float, seconds: float, keys: int, warmup: float = 2.0) -> dict[str, Any]:
    """Kafka's own produce -> consumer receipt at ``rate``: the relay's producer settings, a new topic and
    the same consumer as :func:`latency`, no database and no relay. The baseline of the latency figures."""
    from confluent_kafka import Producer

    topic = f"lat-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 8)
    conf = HarvestConfig(
        data_source="postgresql://unused", outbox_table="unused", base_kafka_config={"bootstrap.servers": bootstrap}
    ).producer_config()
    producer = Producer(conf)
    producer.list_topics(timeout=10)  # connected before the clock starts, as a standby relay's producer is
    sent: dict[bytes, float] = {}
    n = int(rate * (warmup + seconds))

    def write() -> None:
        def one(i: int) -> None:
            value = f"{i:010d}".encode()
            sent[value] = time.perf_counter()
            producer.produce(topic, value, f"key-{i % keys}".encode())
            producer.poll(0)

        _trickle(one, rate, n)
        producer.flush(10)

    w = threading.Thread(target=write)
    w.start()
    rows = _receive(topic, bootstrap, sent, n, time.perf_counter() + warmup + seconds + 30)
    w.join()
    figures = _latency_figures(rows, warmup, rate, seconds)
    figures["received"] = len(rows)
    return figures


def _thread_cpu_s(native_ids: list[int]) -> dict[int, float]:
    """CPU seconds (user + system) each of the given threads of this process has used."""
    ticks = os.sysconf("SC_CLK_TCK")
    used: dict[int, float] = {}
    for tid in native_ids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        used[tid] = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14 and 15 of stat)
    return used


def _relay_threads(relay: Harvest) -> list[int]:
    """The relay's own Python threads (relay loop, mark and write workers; not librdkafka's)."""
    threads = [relay._thread, *relay.core.exec._threads, *relay.core.mark_exec._threads]  # type: ignore[union-attr]
    return [t.native_id for t in threads if t is not None and t.native_id is not None]


def warm_up(dsn: str, bootstrap: str, rows: int, keys: int, partitions: int, topic: str) -> dict[str, Any]:
    """Untimed rounds (a default-limits drain of each mode, then two Kafka loops) until the broker's
    JIT has settled: at least :data:`WARMUP_ROUNDS`, then until a round's Kafka loops reach
    :data:`WARMUP_PLATEAU` of the best one so far (at most :data:`WARMUP_MAX_ROUNDS`). Returns the
    number of rounds and every Kafka loop's rows/s (two per round), for the report."""
    kafka: list[int] = []
    for n in range(1, WARMUP_MAX_ROUNDS + 1):
        print(f"[bench relay] warm-up round {n} (untimed)", file=sys.stderr, flush=True)
        for sequenced in (False, True):
            drain_once(dsn, bootstrap, rows, keys, partitions, sequenced, DEFAULT_LIMITS, topic)
        last = [round(kafka_limit_once(bootstrap, rows, keys, partitions, topic)) for _ in range(2)]
        kafka += last
        if n >= WARMUP_ROUNDS and min(last) >= WARMUP_PLATEAU * max(kafka):
            break
    return {"rounds": n, "kafka_limit_rows_per_s": kafka}


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def goharvest_pairs(
    dsn: str, bootstrap: str, args: argparse.Namespace, topic: str, recorder: Recorder
) -> dict[str, Any]:
    """goharvest (Go) and harvest at-least-once drain the same backlog, default and tuned limits, in ``args.runs``
    alternating pairs (the order within a pair swapped each repeat): each figure's ratio is harvest / goharvest."""
    from bench.bench_goharvest import run_goharvest

    go_limits = {"defaults": None, "tuned": {"markQueryRecords": 5000, "maxInFlightRecords": 5000}}
    ours_limits = {"defaults": DEFAULT_LIMITS, "tuned": TUNED_LIMITS}
    go_runs: dict[str, list[dict[str, Any]]] = {s: [] for s in go_limits}
    ours_runs: dict[str, list[float]] = {s: [] for s in go_limits}

    def goharvest_once(sname: str) -> dict[str, Any] | None:
        schema = f"gh_{uuid.uuid4().hex[:8]}"
        try:
            return run_goharvest(
                dsn,
                bootstrap,
                f"{schema}.outbox",
                args.rows,
                go_limits[sname],
                keys=args.keys,
                partitions=args.partitions,
            )
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))

    for n in range(args.runs):
        for sname in go_limits:
            print(f"[bench relay] goharvest pair {n + 1}/{args.runs}, {sname} limits", file=sys.stderr, flush=True)
            for side in ("go", "ours") if n % 2 == 0 else ("ours", "go"):
                if side == "go":
                    res = goharvest_once(sname)
                    if res is None:
                        return {"skipped": "no Go toolchain"}
                    go_runs[sname].append(res)
                else:
                    ours = drain_once(
                        dsn, bootstrap, args.rows, args.keys, args.partitions, False, ours_limits[sname], topic
                    )
                    ours_runs[sname].append(ours["rows_per_s"])
    go: dict[str, Any] = {}
    for sname, runs in go_runs.items():
        rates = [r["rows_per_s"] for r in runs]
        go[sname] = {
            "rows_per_s": statistics.median(rates),
            "runs_rows_per_s": [round(x) for x in rates],
            "limits": runs[0]["limits"],
            "duplicates": [r["kafka"]["duplicates"] for r in runs],
        }
        recorder.figure(
            f"goharvest/{sname}",
            ours_runs[sname],
            rates,
            f"harvest at-least-once / goharvest (Go), {sname} limits, {args.rows}-row backlog, rows/s",
        )
        go[f"harvest_at_least_once_rows_per_s/{sname}"] = round(statistics.median(ours_runs[sname]))
    return go


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--big-rows", type=int, default=1_000_000, help="the large backlog (0: skip it)")
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5, help="runs of the small backlog (a drain lasts under a second)")
    ap.add_argument("--big-runs", type=int, default=DEFAULT_REPEATS)
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--latency-seconds", type=float, default=10.0, help="the measured window of the latency phase")
    ap.add_argument(
        "--latency-warmup",
        type=float,
        default=2.0,
        help="seconds of the latency phase before the measured window (reported on their own)",
    )
    ap.add_argument("--no-goharvest", action="store_true", help="skip goharvest even when Go is present")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    services, dsn, bootstrap = endpoints()
    modes = {"at_least_once": False, "sequenced": True}
    settings = {"defaults": DEFAULT_LIMITS, "tuned": TUNED_LIMITS}
    recorder = Recorder(
        args.runs,
        "one untimed drain and produce loop (report's setup.warmup); every figure's runs interleaved",
        targets.for_bench("relay"),
    )
    sizes = [(args.rows, args.runs)] + ([(args.big_rows, args.big_runs)] if args.big_rows else [])
    report: dict[str, Any] = {
        "setup": {
            "keys": args.keys,
            "partitions": args.partitions,
            "value_bytes": 100,
            "cpus": os.cpu_count(),
            "defaults": DEFAULT_LIMITS,
            "tuned": TUNED_LIMITS,
            "db_limit_batch": AUTO_MARK_RECORDS,
        },
        "backlogs": {},
    }
    try:
        # One long-lived topic for every drain and Kafka loop, as an outbox's topics are. A drain into
        # a topic created moments before pays the broker's start-up of new partitions (measured on
        # its own below), which no relay of a running system meets.
        topic = new_topic(bootstrap, args.partitions)
        report["setup"]["warmup"] = warm_up(dsn, bootstrap, min(args.rows, 100_000), args.keys, args.partitions, topic)
        for rows, runs in sizes:
            limit_runs: list[float] = []
            kafka_runs: list[float] = []
            goharvest_runs: list[float] = []
            async_mark_runs: list[float] = []
            range_delete_runs: list[float] = []
            new_topic_runs: list[dict[str, Any]] = []
            drains: dict[str, list[dict[str, Any]]] = {f"{m}/{s}": [] for m in modes for s in settings}
            for _ in range(runs):  # interleaved, so every figure sees the same machine state
                limit_runs.append(
                    db_limit_once(dsn, bootstrap, rows, args.keys, args.partitions, AUTO_MARK_RECORDS, topic)
                )
                goharvest_runs.append(
                    db_limit_once(
                        dsn,
                        bootstrap,
                        rows,
                        args.keys,
                        args.partitions,
                        AUTO_MARK_RECORDS,
                        topic,
                        statement="goharvest",
                    )
                )
                async_mark_runs.append(
                    db_limit_once(
                        dsn,
                        bootstrap,
                        rows,
                        args.keys,
                        args.partitions,
                        AUTO_MARK_RECORDS,
                        topic,
                        statement="relay_async_mark",
                    )
                )
                range_delete_runs.append(
                    db_limit_once(
                        dsn,
                        bootstrap,
                        rows,
                        args.keys,
                        args.partitions,
                        AUTO_MARK_RECORDS,
                        topic,
                        statement="relay_range_delete",
                    )
                )
                kafka_runs.append(kafka_limit_once(bootstrap, rows, args.keys, args.partitions, topic))
                for m, sequenced in modes.items():
                    for sname, limits in settings.items():
                        print(f"[bench relay] {rows} rows, {m}, {sname}", file=sys.stderr, flush=True)
                        drains[f"{m}/{sname}"].append(
                            drain_once(dsn, bootstrap, rows, args.keys, args.partitions, sequenced, limits, topic)
                        )
                if rows == args.rows:
                    print(f"[bench relay] {rows} rows, at_least_once, defaults, new topic", file=sys.stderr, flush=True)
                    new_topic_runs.append(
                        drain_once(dsn, bootstrap, rows, args.keys, args.partitions, False, DEFAULT_LIMITS)
                    )
            limit = statistics.median(limit_runs)
            go_limit = statistics.median(goharvest_runs)
            kafka_limit = statistics.median(kafka_runs)
            async_limit = statistics.median(async_mark_runs)
            range_limit = statistics.median(range_delete_runs)
            entry: dict[str, Any] = {
                "db_limit_rows_per_s": {"runs": [round(x) for x in limit_runs], "median": round(limit)},
                "db_loop_goharvest_statement_rows_per_s": {
                    "runs": [round(x) for x in goharvest_runs],
                    "median": round(go_limit),
                },
                "db_loop_async_mark_rows_per_s": {
                    "runs": [round(x) for x in async_mark_runs],
                    "median": round(async_limit),
                },
                "db_loop_range_delete_rows_per_s": {
                    "runs": [round(x) for x in range_delete_runs],
                    "median": round(range_limit),
                },
                "kafka_limit_rows_per_s": {"runs": [round(x) for x in kafka_runs], "median": round(kafka_limit)},
            }
            for name, rs in drains.items():
                med = _median(rs, "rows_per_s")
                entry[name] = {
                    "rows_per_s": round(med),
                    "runs": [round(r["rows_per_s"]) for r in rs],
                    "ratio_to_db_limit": round(med / limit, 3),
                    "ratio_to_goharvest_statement_loop": round(med / go_limit, 3),
                    "ratio_to_db_loop_async_mark": round(med / async_limit, 3),
                    "ratio_to_db_loop_range_delete": round(med / range_limit, 3),
                    "ratio_to_kafka_limit": round(med / kafka_limit, 3),
                    "cpu_s_per_100k_rows": round(_median(rs, "cpu_s_per_100k"), 3),
                    "peak_rss_mb": round(max(r["peak_rss_mb"] for r in rs)),
                    "peak_mark_size": max(r["peak_mark_size"] for r in rs),
                    "remarks": sum(r["remarks"] for r in rs),
                }
            if new_topic_runs:
                med = _median(new_topic_runs, "rows_per_s")
                entry["at_least_once/defaults/new_topic"] = {
                    "rows_per_s": round(med),
                    "runs": [round(r["rows_per_s"]) for r in new_topic_runs],
                    "ratio_to_db_limit": round(med / limit, 3),
                    "ratio_to_long_lived_topic": round(med / entry["at_least_once/defaults"]["rows_per_s"], 3),
                }
            for sname in settings:
                entry[f"sequenced_to_at_least_once/{sname}"] = round(
                    entry[f"sequenced/{sname}"]["rows_per_s"] / entry[f"at_least_once/{sname}"]["rows_per_s"], 3
                )
            entry["meets_targets"] = (
                all(entry[f"{m}/defaults"]["ratio_to_db_limit"] >= TARGET_RATIO for m in modes)
                and entry["sequenced_to_at_least_once/defaults"] >= TARGET_SEQ_RATIO
            )
            report["backlogs"][str(rows)] = entry
            # per run: the drain against the database loop (and at-least-once) of the same round
            for sname in settings:
                for m in modes:
                    rates = [r["rows_per_s"] for r in drains[f"{m}/{sname}"]]
                    recorder.figure(
                        f"{rows}/{m}/{sname}_to_db_limit",
                        rates,
                        limit_runs,
                        f"relay drain, {m}, {sname} limits / the database loop, {rows}-row backlog",
                        target_key=f"{m}_to_db_limit" if sname == "defaults" else "",
                    )
                    recorder.figure(
                        f"{rows}/{m}/{sname}_to_kafka_limit",
                        rates,
                        kafka_runs,
                        f"relay drain, {m}, {sname} limits / the Kafka produce loop, {rows}-row backlog",
                    )
                recorder.figure(
                    f"{rows}/{sname}/sequenced_to_at_least_once",
                    [r["rows_per_s"] for r in drains[f"sequenced/{sname}"]],
                    [r["rows_per_s"] for r in drains[f"at_least_once/{sname}"]],
                    f"relay drain, sequenced / at-least-once, {sname} limits, {rows}-row backlog",
                    target_key="sequenced_to_at_least_once" if sname == "defaults" else "",
                )
            if new_topic_runs:
                recorder.figure(
                    f"{rows}/new_topic_to_long_lived",
                    [r["rows_per_s"] for r in new_topic_runs],
                    [r["rows_per_s"] for r in drains["at_least_once/defaults"]],
                    f"relay drain into a new topic / into the long-lived one, {rows}-row backlog",
                )
                recorder.figure(
                    f"{rows}/new_topic_to_db_limit",
                    [r["rows_per_s"] for r in new_topic_runs],
                    limit_runs,
                    f"relay drain into a new topic / the database loop, {rows}-row backlog",
                )
        if not args.no_goharvest:
            report["goharvest"] = goharvest_pairs(dsn, bootstrap, args, topic, recorder)
        checkpoint(dsn)
        warm = args.latency_warmup
        report["idle_to_delivery_latency"] = {
            "kafka": kafka_latency(bootstrap, args.rate, args.latency_seconds, args.keys, warm),
            "at_least_once": latency(dsn, bootstrap, args.rate, args.latency_seconds, args.keys, warmup=warm),
            "sequenced": latency(
                dsn, bootstrap, args.rate, args.latency_seconds, args.keys, sequenced=True, warmup=warm
            ),
            # what a sequenced pipeline's application sees: a record counts once its ACK is read
            "sequenced_read_committed": latency(
                dsn,
                bootstrap,
                args.rate,
                args.latency_seconds,
                args.keys,
                sequenced=True,
                warmup=warm,
                read_committed=True,
            ),
        }
    finally:
        if services is not None:
            services.stop()
    lat = report["idle_to_delivery_latency"]
    report["latency_meets_targets"] = all(
        (v.get("p50_ms") or 1e9) <= 5 and (v.get("p99_ms") or 1e9) <= 20
        for k, v in lat.items()
        if k in ("at_least_once", "sequenced")
    )
    report["spread"] = recorder.report()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
