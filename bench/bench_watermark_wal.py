"""The cursor layout's cost on the primary against today's, in one run (issue #37): WAL bytes, full-page
images and backend CPU per row of the writers and of the relay's statements. Not a test.

    python -m bench.bench_watermark_wal [--rows 100000] [--batch 5000] [--partition-ids 10000]

Starts its own Postgres (no Kafka: the database side is the subject). Two loops, each cold (a
``CHECKPOINT`` between writing and draining) and warm, as ``bench.bench_wal`` measures them:

- ``at_least_once`` (the baseline): today's outbox and relay statements, ``bench.bench_wal``'s loop;
- ``watermark``: the partitioned outbox of producer/layouts/cursor/_watermark_sql.py, filled by the same writers (one
  ``INSERT`` per row, ``--txn-rows`` per transaction), drained by the cursor layout's statements: a batch
  start (snapshot, head, xid), pages of ``--batch`` rows read between two snapshots, one fenced cursor
  ``UPDATE`` per page, then every delivered partition truncated.

Prints JSON: per loop and temperature the writers' and the relay's WAL and CPU per row, and the ratios
watermark / at_least_once of the relay side and of the total. Then the cost of a long transaction: one
transaction holds an xid open (``SELECT pg_current_xact_id()``, nothing written) while the rows are written
and drained, so ``low`` cannot pass them: every later batch re-reads them all (filtered, not published);
``long_txn`` reports the backend CPU and wall time of such a batch, and that nothing was truncated.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from typing import Any

import psycopg
from psycopg import sql

from bench.bench_wal import Meter, one_run, per_row, wal_stats
from harvest_outbox.harvest_local.postgres import EmbeddedPostgres
from harvest_outbox.producer.layouts.cursor._watermark import read_page, retirable
from harvest_outbox.producer.layouts.cursor._watermark_sql import WatermarkSession, ddl


def fill(dsn: str, schema: str, rows: int, keys: int, txn_rows: int) -> dict[str, Any]:
    insert = sql.SQL("INSERT INTO {}.outbox (topic, key, value) VALUES ('bench', %s, %s)").format(
        sql.Identifier(schema)
    )
    pad = "x" * 100
    with psycopg.connect(dsn) as conn:
        meter = Meter(conn)
        s0 = wal_stats(conn)
        conn.commit()
        with meter.statement("insert"), conn.cursor() as cur:
            for start in range(0, rows, txn_rows):
                for i in range(start, min(rows, start + txn_rows)):
                    cur.execute(insert, (f"key-{i % keys}".encode(), f"{i:010d}{pad}"[:100].encode()))
                conn.commit()
        s1 = wal_stats(conn)
        conn.commit()
    return per_row({"insert": meter.wal["insert"]}, {"insert": meter.cpu["insert"]}, s0, s1, rows)


def drain(dsn: str, schema: str, rows: int, batch: int, retire: bool = True) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        db = WatermarkSession(conn, schema)
        meter = Meter(conn)
        s0 = wal_stats(conn)
        epoch, cursor = db.new_view()
        got = 0
        for _ in range(3):  # three batches: the rows, then two for the probe to pass them (low)
            with meter.statement("batch_start"):
                cursor = db.begin_batch(cursor)
            while True:
                with meter.statement("read"):
                    page = read_page(cursor, db.read(cursor, batch), batch)
                got += len(page.rows)
                with meter.statement("cursor_commit"):
                    db.commit(epoch, page.after)
                cursor = page.after
                if page.complete:
                    break
        if got != rows:
            raise RuntimeError(f"the cursor layout's drain read {got} rows, not {rows}")
        with meter.statement("truncate"):
            parts = db.partitions() if retire else []
            for start, end in retirable([(a, b) for a, b, _n in parts], cursor):
                name = next(n for a, b, n in parts if (a, b) == (start, end))
                if db.truncate(name) != "truncated":
                    raise RuntimeError(f"partition {name} was not truncated")
        s1 = wal_stats(conn)
    return per_row(dict(meter.wal), dict(meter.cpu), s0, s1, rows)


def rescan(dsn: str, schema: str, rows: int, batch: int, batches: int) -> dict[str, Any]:
    """With a transaction open since before the rows were written: the cost of each further batch."""
    import time

    with psycopg.connect(dsn, autocommit=True) as conn:
        db = WatermarkSession(conn, schema)
        meter = Meter(conn)
        epoch, cursor = db.load()
        walls = []
        for _ in range(batches):
            t0 = time.perf_counter()
            with meter.statement("batch"):
                cursor = db.begin_batch(cursor)
                while True:
                    page = read_page(cursor, db.read(cursor, batch), batch)
                    if page.rows:
                        raise RuntimeError(f"a batch re-published {len(page.rows)} rows")
                    db.commit(epoch, page.after)
                    cursor = page.after
                    if page.complete:
                        break
            walls.append(time.perf_counter() - t0)
        parts = db.partitions()
        kept = len(parts) - len(retirable([(a, b) for a, b, _n in parts], cursor))
    walls.sort()
    return {
        "rows_written_while_open": rows,
        "scan_width_rows": rows - cursor.scan_from() + 1,
        "backend_cpu_ms_per_batch": round(meter.cpu["batch"] * 1000 / batches, 1),
        "wall_ms_per_batch_median": round(walls[len(walls) // 2] * 1000, 1),
        "wal_bytes_per_batch": round(meter.wal["batch"] / batches),
        "partitions_kept": kept,
    }


def watermark_run(
    dsn: str, cold: bool, rows: int, batch: int, keys: int, txn_rows: int, part: int, long_txn: int = 0
) -> dict[str, Any]:
    schema = f"wm_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        for stmt in ddl(schema, part, rows // part + 1):
            conn.execute(stmt)
        conn.execute("CHECKPOINT")
    holder = psycopg.connect(dsn) if long_txn else None
    try:
        if holder is not None:
            holder.execute("SELECT pg_current_xact_id()")  # an xid, held open across the fill and the drain
        written = fill(dsn, schema, rows, keys, txn_rows)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, "outbox")))
            if cold:
                conn.execute("CHECKPOINT")
        drained = drain(dsn, schema, rows, batch, retire=holder is None)
        if holder is not None:
            return {"write": written, "drain": drained, "long_txn": rescan(dsn, schema, rows, batch, long_txn)}
    finally:
        if holder is not None:
            holder.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    return {"write": written, "drain": drained}


def total(run: dict[str, Any], side: str) -> float:
    return float(run[side]["wal_bytes_total_per_100k"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=5000, help="rows per page (and per mark for the baseline)")
    ap.add_argument("--partition-ids", type=int, default=10_000)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--txn-rows", type=int, default=10)
    ap.add_argument(
        "--long-txn-batches", type=int, default=5, help="batches measured under a long transaction (0: skip)"
    )
    args = ap.parse_args()
    out: dict[str, Any] = {"rows": args.rows, "batch": args.batch, "partition_ids": args.partition_ids, "loops": {}}
    pg = EmbeddedPostgres().start()
    try:
        dsn = pg.dsn
        with psycopg.connect(dsn) as conn:
            out["server_version"] = conn.info.server_version
            out["data_checksums"] = conn.execute("SHOW data_checksums").fetchone()[0]  # type: ignore[index]
        for temp in ("cold", "warm"):
            cold = temp == "cold"
            base = one_run(dsn, "at_least_once", cold, args.rows, args.batch, args.keys, args.txn_rows)
            new = watermark_run(dsn, cold, args.rows, args.batch, args.keys, args.txn_rows, args.partition_ids)
            out["loops"].setdefault("at_least_once", {})[temp] = base
            out["loops"].setdefault("watermark", {})[temp] = new
            out.setdefault("ratios", {})[temp] = {
                "relay_wal": round(total(new, "drain") / total(base, "drain"), 4),
                "total_wal": round(
                    (total(new, "write") + total(new, "drain")) / (total(base, "write") + total(base, "drain")), 4
                ),
            }
            print(f"[bench watermark wal] {temp}: {json.dumps(out['ratios'][temp])}", file=sys.stderr, flush=True)
        if args.long_txn_batches:
            held = watermark_run(
                dsn, False, args.rows, args.batch, args.keys, args.txn_rows, args.partition_ids, args.long_txn_batches
            )
            out["long_txn"] = held["long_txn"]
            print(f"[bench watermark wal] long transaction: {json.dumps(out['long_txn'])}", file=sys.stderr, flush=True)
    finally:
        pg.stop()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
