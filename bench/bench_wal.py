"""What each relay statement costs the primary: WAL bytes, WAL records, full-page images and backend
CPU per row (issue #37, item 1). Not a test.

    python -m bench.bench_wal [--rows 200000] [--batch 5000] [--logical]

Starts its own Postgres (no Kafka: the statements are the relay's, run by hand on one connection,
exactly as ``MarkDatabase`` issues them; nothing is produced). For each loop a fresh outbox (made by
``init_db``, autovacuum off on it so no worker writes during a phase) is filled by writers (one INSERT
per row, ``--txn-rows`` rows per transaction, as applications stash), then drained by one loop:

- ``at_least_once``: the relay's mark (``UPDATE … RETURNING`` of ``batch`` rows), then the purge
  (``DELETE … = ANY(ids)``): the two statements of the at-least-once relay;
- ``sequenced``: the mark, then the fenced commit of each mark's rows as one harvest transaction (the
  fence row's ``UPDATE``, the range ``DELETE``, one ACK intent ``INSERT``), then the intent's
  confirmation (``DELETE``): the sequenced relay's statements;
- ``delete_only``: no mark: a ``SELECT`` of the next ``batch`` rows, then the purge. What a relay that
  needs no per-row claim would write (the headroom of issue #37's "no mark UPDATE" idea);
- ``truncate``: the writers' rows removed by one ``TRUNCATE`` (a partition dropped or truncated once
  delivered): the floor of any cleanup.

Every loop is measured twice: **cold**, with a ``CHECKPOINT`` between writing and draining (every page
the drain touches first logs its full image, as in production when a checkpoint falls between a row's
INSERT and its relay), and **warm**, in the same checkpoint cycle as the writes (no full-page images).
Production lies between the two; long bursts approach the cold figure for the rows written before each
checkpoint. Then ``VACUUM`` of the drained table: the dead tuples' deferred cost, billed to the loop.

WAL is measured with ``pg_current_wal_insert_lsn()`` around each statement (the server is this run's
alone) and ``pg_stat_wal`` (records, full-page images) around each phase; CPU is the backend process's
user+system time from ``/proc`` (10 ms ticks; phases last seconds). Figures are per row, and per
100k rows for WAL (the unit of the Debezium comparison in ``bench_debezium.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from bench import targets
from bench.spread import DEFAULT_REPEATS, Recorder
from harvest_outbox.harvest_local.postgres import EmbeddedPostgres
from harvest_outbox.producer.db import TxnCommit
from harvest_outbox.producer.layouts.mark.database import MarkDatabase
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

LOOPS = ("at_least_once", "sequenced", "delete_only", "truncate")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def backend_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one Postgres backend (same machine: the server is ours)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Meter:
    """WAL bytes and backend CPU per statement kind, on one connection."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.pid = conn.info.backend_pid
        self.wal: dict[str, int] = defaultdict(int)
        self.cpu: dict[str, float] = defaultdict(float)

    def lsn(self) -> int:
        return int(self.conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()[0])  # type: ignore[index]

    @contextmanager
    def statement(self, kind: str) -> Iterator[None]:
        lsn0, cpu0 = self.lsn(), backend_cpu_s(self.pid)
        yield
        self.cpu[kind] += backend_cpu_s(self.pid) - cpu0
        self.wal[kind] += self.lsn() - lsn0


def wal_stats(conn: psycopg.Connection) -> tuple[int, int, int]:
    """Cluster-wide (records, full-page images, bytes) from pg_stat_wal, flushed first."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    row = conn.execute("SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal").fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def fill(dsn: str, table: str, rows: int, keys: int, txn_rows: int) -> dict[str, Any]:
    """Writers: one INSERT per row (the stasher's statement), ``txn_rows`` rows per transaction."""
    stasher = Stasher(table)
    pad = "x" * 100
    with psycopg.connect(dsn) as conn:
        meter = Meter(conn)
        s0 = wal_stats(conn)
        conn.commit()
        with meter.statement("insert"):
            with conn.cursor() as cur:
                for start in range(0, rows, txn_rows):
                    for i in range(start, min(rows, start + txn_rows)):
                        stasher.stash(cur, OutboxRecord("bench", f"key-{i % keys}", f"{i:010d}{pad}"[:100], ()))
                    conn.commit()
        s1 = wal_stats(conn)
        conn.commit()
    return per_row({"insert": meter.wal["insert"]}, {"insert": meter.cpu["insert"]}, s0, s1, rows)


def per_row(
    wal: dict[str, int], cpu: dict[str, float], s0: tuple[int, int, int], s1: tuple[int, int, int], rows: int
) -> dict[str, Any]:
    return {
        "wal_bytes_per_100k": {k: round(v * 100_000 / rows) for k, v in wal.items()},
        "wal_bytes_per_row": {k: round(v / rows, 1) for k, v in wal.items()},
        "backend_cpu_s_per_100k": {k: round(v * 100_000 / rows, 3) for k, v in cpu.items()},
        "wal_records_per_row": round((s1[0] - s0[0]) / rows, 2),
        "wal_fpi_per_1k_rows": round((s1[1] - s0[1]) * 1000 / rows, 2),
        "wal_bytes_total_per_100k": round(sum(wal.values()) * 100_000 / rows),
    }


def drain(loop: str, dsn: str, names: OutboxNames, rows: int, batch: int) -> dict[str, Any]:
    db = MarkDatabase(dsn, names)
    try:
        conn = db.conn
        meter = Meter(conn)
        leader = uuid.uuid4()
        s0 = wal_stats(conn)
        done = 0
        if loop == "truncate":
            with meter.statement("truncate"):
                conn.execute(sql.SQL("TRUNCATE {}").format(names.outbox))
            done = rows
        elif loop == "sequenced":
            epoch, _ = _start_view(db, leader)
            producer, clock = os.urandom(6), 1 << 20
            while True:
                with meter.statement("mark"):
                    marked = db.mark(leader, batch)
                if not marked:
                    break
                ids = [r[0] for r in marked]
                clock += len(ids) + 1
                with meter.statement("fenced_commit"):
                    db.commit_txns(epoch, leader, [TxnCommit(ids, [], producer, clock, [("bench", 0)])])
                with meter.statement("confirm_ack"):
                    db.confirm_acks([(producer, clock)])
                done += len(ids)
        else:
            select = sql.SQL("SELECT {id} FROM {o} ORDER BY {id} LIMIT %s").format(
                o=names.outbox, id=sql.Identifier("id")
            )
            while True:
                if loop == "delete_only":
                    with meter.statement("select"):
                        ids = [r[0] for r in conn.execute(select, (batch,)).fetchall()]
                else:
                    with meter.statement("mark"):
                        ids = [r[0] for r in db.mark(leader, batch)]
                if not ids:
                    break
                with meter.statement("purge"):
                    db.purge(ids)
                done += len(ids)
        assert done == rows, (loop, done, rows)
        s1 = wal_stats(conn)
        figures = per_row(meter.wal, meter.cpu, s0, s1, rows)
        vac = Meter(conn)
        with vac.statement("vacuum"):
            conn.execute(sql.SQL("VACUUM {}").format(names.outbox))
        figures["vacuum_after"] = {
            "wal_bytes_per_100k": round(vac.wal["vacuum"] * 100_000 / rows),
            "backend_cpu_s_per_100k": round(vac.cpu["vacuum"] * 100_000 / rows, 3),
        }
        figures["relay_wal_bytes_per_100k_with_vacuum"] = (
            figures["wal_bytes_total_per_100k"] + figures["vacuum_after"]["wal_bytes_per_100k"]
        )
        return figures
    finally:
        db.close()


def _start_view(db: MarkDatabase, leader: uuid.UUID) -> tuple[int, Any]:
    """A sequenced leader view: bumps the fence epoch, as a new leader does."""
    epoch, intents = db.start_view(leader, "bench-wal")
    return epoch, intents


def one_run(dsn: str, loop: str, cold: bool, rows: int, batch: int, keys: int, txn_rows: int) -> dict[str, Any]:
    schema = f"wal_{uuid.uuid4().hex[:8]}"
    table = f"{schema}.outbox"
    init_db(dsn, table)
    names = OutboxNames.parse(table)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(names.outbox))
        conn.execute("CHECKPOINT")
    try:
        written = fill(dsn, table, rows, keys, txn_rows)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("ANALYZE {}").format(names.outbox))
            if cold:
                conn.execute("CHECKPOINT")
        drained = drain(loop, dsn, names, rows, batch)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    return {"write": written, "drain": drained}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=5000, help="rows per mark (the relay's adaptive mark reaches 5,000)")
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--txn-rows", type=int, default=10, help="rows per writer transaction")
    ap.add_argument("--runs", type=int, default=DEFAULT_REPEATS, help="repeats, each running every loop")
    ap.add_argument("--loops", default=",".join(LOOPS))
    ap.add_argument("--logical", action="store_true", help="wal_level = logical (as in the Debezium comparison)")
    ap.add_argument(
        "--wal-compression",
        default="off",
        choices=("off", "pglz", "lz4", "zstd"),
        help="the server's wal_compression (full-page images compressed; Postgres' default is off)",
    )
    args = ap.parse_args()
    loops = [x for x in args.loops.split(",") if x]
    for loop in loops:
        if loop not in LOOPS:
            ap.error(f"--loops: {loop!r} is not one of {', '.join(LOOPS)}")
    out: dict[str, Any] = {"rows": args.rows, "batch": args.batch, "txn_rows": args.txn_rows, "loops": {}}
    recorder = Recorder(args.runs, "none: each loop runs on a fresh outbox", targets.for_bench("wal"))
    pg = EmbeddedPostgres(logical_replication=args.logical).start()
    try:
        dsn = pg.dsn
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER SYSTEM SET wal_compression = {}").format(sql.Literal(args.wal_compression)))
            conn.execute("SELECT pg_reload_conf()")
        with psycopg.connect(dsn) as conn:
            out["wal_compression"] = conn.execute("SHOW wal_compression").fetchone()[0]  # type: ignore[index]
            out["wal_level"] = conn.execute("SHOW wal_level").fetchone()[0]  # type: ignore[index]
            out["server_version"] = conn.info.server_version
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {(loop, t): [] for loop in loops for t in ("cold", "warm")}
        for n in range(args.runs):
            # every loop once per repeat, the order rotated each repeat (bench/spread.py): the server's
            # state (its WAL segments, the catalog) drifts over the run and must not favour one loop
            order = loops[n % len(loops) :] + loops[: n % len(loops)]
            for temp in ("cold", "warm"):
                for loop in order:
                    r = one_run(dsn, loop, temp == "cold", args.rows, args.batch, args.keys, args.txn_rows)
                    runs[(loop, temp)].append(r)
                    print(f"[bench wal] {loop} {temp}: {json.dumps(r['drain'])}", file=sys.stderr, flush=True)
        for (loop, temp), rs in runs.items():
            # the run of median total WAL: one run's coherent figures rather than a mix of medians
            ranked = sorted(rs, key=lambda r: r["drain"]["wal_bytes_total_per_100k"])
            out["loops"].setdefault(loop, {})[temp] = ranked[len(ranked) // 2]
        for temp in ("cold", "warm"):
            base = runs.get(("at_least_once", temp))
            for loop in ("sequenced", "delete_only", "truncate"):
                if base and (loop, temp) in runs:
                    recorder.figure(
                        f"{loop}_to_at_least_once/{temp}",
                        [r["drain"]["wal_bytes_total_per_100k"] for r in runs[(loop, temp)]],
                        [r["drain"]["wal_bytes_total_per_100k"] for r in base],
                        f"relay WAL per row, {loop} / at-least-once, {temp}",
                    )
        out["spread"] = recorder.report()
    finally:
        pg.stop()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
