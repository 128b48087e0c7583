"""A relay's timed drain of a filled outbox, and the medians of drain variants against a baseline:
shared by the benchmarks that compare one relay setting against another (``bench_halt``,
``bench_registry``, ``bench_spans``), so each measures the same way.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql

from bench.spread import Recorder
from harvest_outbox.producer.harvest import Harvest

__all__ = ["timed_drain", "variant_medians"]


def timed_drain(
    relay: Harvest, dsn: str, schema: str, rows: int, after_stop: Callable[[], None] | None = None
) -> dict[str, float]:
    """Start ``relay``, time it from leadership until it delivered ``rows`` and ``schema.outbox`` is
    empty (wall and this process's CPU), then stop it, run ``after_stop`` and drop ``schema``.
    Returns ``rows_per_s`` and ``cpu_s_per_100k``."""
    relay.start()
    watch = psycopg.connect(dsn, autocommit=True)
    count = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "outbox"))
    try:
        while not relay.is_leader:
            time.sleep(0.001)
        t0, c0 = time.perf_counter(), time.process_time()
        while relay.metrics.delivered < rows:
            time.sleep(0.005)
        while watch.execute(count).fetchone()[0]:  # type: ignore[index]
            time.sleep(0.001)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        watch.close()
        relay.stop()
        relay.wait(60)
        if after_stop is not None:
            after_stop()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    return {"rows_per_s": rows / elapsed, "cpu_s_per_100k": cpu / rows * 100_000}


def variant_medians(
    runs: Mapping[str, Sequence[dict[str, Any]]],
    base: str,
    keep: Sequence[str] = (),
    recorder: Recorder | None = None,
    prefix: str = "",
) -> dict[str, dict[str, Any]]:
    """Per variant: median rows/s and CPU per 100k rows, every run's rate, the ``keep`` fields of each
    run as lists, and both ratios to the ``base`` variant (``ratio_to_<base>``, ``cpu_ratio_to_<base>``).
    With a ``recorder``, each variant's rate ratio to ``base`` per round (``runs[v][i]`` against
    ``runs[base][i]``: the variants ran interleaved, one of each per round) is recorded as figure
    ``<prefix><variant>``, its CPU per row's as ``<prefix><variant>/cpu``."""
    if recorder is not None:
        for v, rs in runs.items():
            if v != base:
                recorder.figure(
                    f"{prefix}{v}",
                    [r["rows_per_s"] for r in rs],
                    [r["rows_per_s"] for r in runs[base]],
                    f"drain with {v} / with {base}, rows/s",
                )
                recorder.figure(
                    f"{prefix}{v}/cpu",
                    [r["cpu_s_per_100k"] for r in rs],
                    [r["cpu_s_per_100k"] for r in runs[base]],
                    f"relay CPU per row with {v} / with {base}",
                )
    med: dict[str, dict[str, Any]] = {
        v: {
            "rows_per_s": round(statistics.median(r["rows_per_s"] for r in rs)),
            "cpu_s_per_100k": round(statistics.median(r["cpu_s_per_100k"] for r in rs), 2),
            **{k: [r[k] for r in rs] for k in keep},
            "runs_rows_per_s": [round(r["rows_per_s"]) for r in rs],
        }
        for v, rs in runs.items()
    }
    ref = med[base]
    for m in med.values():
        m[f"ratio_to_{base}"] = round(m["rows_per_s"] / ref["rows_per_s"], 3)
        m[f"cpu_ratio_to_{base}"] = round(m["cpu_s_per_100k"] / ref["cpu_s_per_100k"], 3)
    return med
