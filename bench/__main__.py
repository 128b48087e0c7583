"""``./dev bench``: run every benchmark, each in its own process with its own services, then
write ``bench/results.json`` and the benchmark table of docs/benchmarks.md (between the BENCH markers).

Each benchmark prints one JSON object and compares against a baseline measured in the same run, in
alternation, ≥ 5 repeats by default; its ``spread`` (bench/spread.py) holds each ratio's median and
min-max over the repeat pairs, the machine, its load at start and end, and the warm-up. The table shows
ranges; a result from before ranges were recorded is marked "range pending", never given one.

    python -m bench                          # all, full size
    python -m bench --quick                  # smaller workloads, fewer repeats (a smoke run; writes nothing)
    python -m bench sequencer spark          # some
    python -m bench --check [names]          # check size (CHECK: mostly quick workloads, 5 repeats): ratios against
                                             # the published ranges; exit 1 if one falls outside
    python -m bench --check --publish names  # the same, then publish today's figures: the table's results
                                             # and the check reference (results.json, docs)
    python -m bench --check --reference names  # ... the check reference only (the table keeps its results)
    python -m bench --table-only             # rewrite the docs table from results.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.spread import DEFAULT_REPEATS, Check, check, load_average

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results.json"
TABLE_PAGE = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- BENCH:BEGIN -->", "<!-- BENCH:END -->"

# name -> (script, full args, quick args). Full: each script's defaults (≥ 5 repeat pairs, DEFAULT_REPEATS).
# Quick: small workloads and 2 repeats (a smoke run: the range of 2 pairs is no range to publish).
BENCHES: dict[str, tuple[str, list[str], list[str]]] = {
    "sequencer": ("bench_sequencer.py", [], ["--repeat", "2", "--txns", "10"]),
    "relay": (
        "bench_relay.py",
        [],
        ["--rows", "20000", "--big-rows", "0", "--runs", "2", "--latency-seconds", "3", "--latency-warmup", "1"],
    ),
    "consumer": ("bench_consumer.py", [], ["--records", "100000", "--runs", "2"]),
    "spark": ("bench_spark.py", [], ["--records", "100000", "--repeat", "2"]),
    "spark_stream": ("bench_spark_stream.py", [], ["--records", "100000", "--repeat", "2"]),
    "stasher": ("bench_stasher.py", [], ["--rows", "2000", "--repeat", "2"]),
    "reader_memory": ("bench_reader_memory.py", [], ["--records", "100000,200000", "--micro-batch", "50000"]),
    "shards": ("bench_shards.py", [], ["--rows", "50000", "--relays", "1,2", "--runs", "2"]),
    "spans": ("bench_spans.py", [], ["--rows", "5000", "--runs", "2"]),
    "registry": ("bench_registry.py", [], ["--rows", "5000", "--runs", "2", "--modes", "at_least_once"]),
    "pipeline": ("bench_pipeline.py", [], ["--rows", "50000", "--repeat", "2"]),
    "wal": ("bench_wal.py", ["--rows", "100000"], ["--rows", "20000", "--runs", "2"]),
    "cursor_relay": (
        "bench_cursor_relay.py",
        [],
        ["--rows", "20000", "--runs", "2", "--warmup-rows", "0", "--partition-ids", "10000", "--idle-after", "1"],
    ),
    "latency": ("bench_latency.py", [], ["--quick", "--repeats", "2"]),
    "relay_limit": ("bench_relay_limit.py", [], ["--rows", "100000", "--runs", "2", "--warmup-rows", "300000"]),
    "outboxes": ("bench_outboxes.py", [], ["--quick"]),
    "debezium": (
        "bench_debezium.py",
        [],
        [
            "--rows",
            "50000",
            "--runs",
            "1",
            "--warmup-rows",
            "10000",
            "--fault-rows",
            "20000",
            "--latency-repeats",
            "1",
            "--latency-seconds",
            "3",
            "--latency-warmup",
            "1",
        ],
    ),
}


# ``--check``: appended to the quick workload (argparse takes the last value): the default repeat count, so
# a re-run is minutes, not hours, and its range has 5 pairs; the cheap ones (sequencer, stasher, consumer)
# at their full workload, where a pass of the small one lasts a tenth of a second and its ratio is mostly
# noise. Benchmarks without an entry publish no paired ratios (reader_memory: one run per topic size;
# debezium: not yet converted).
CHECK: dict[str, list[str]] = {
    "sequencer": ["--txns", "40", "--repeat", str(DEFAULT_REPEATS)],
    "relay": ["--runs", str(DEFAULT_REPEATS)],
    "consumer": ["--records", "1000000", "--runs", str(DEFAULT_REPEATS)],
    "spark": ["--repeat", str(DEFAULT_REPEATS)],
    "spark_stream": ["--repeat", str(DEFAULT_REPEATS)],
    "stasher": ["--rows", "10000", "--repeat", str(DEFAULT_REPEATS)],
    "shards": ["--runs", str(DEFAULT_REPEATS)],
    "spans": ["--runs", str(DEFAULT_REPEATS)],
    "registry": ["--runs", str(DEFAULT_REPEATS)],
    "pipeline": ["--repeat", str(DEFAULT_REPEATS)],
    "wal": ["--runs", str(DEFAULT_REPEATS)],
    "cursor_relay": ["--runs", str(DEFAULT_REPEATS)],
    "latency": ["--repeats", str(DEFAULT_REPEATS)],
    "relay_limit": ["--runs", str(DEFAULT_REPEATS)],
    "outboxes": ["--parts", "cpu,fairness", "--repeats", str(DEFAULT_REPEATS)],
}


def _get(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float) and v < 10:
        return f"{v:.2f}{unit}"
    if isinstance(v, (int, float)):
        return f"{v:,.0f}{unit}"
    return str(v)


PENDING = "median only, range pending"


def _num(v: float) -> str:
    """A ratio: two decimals, two significant digits below 0.1 (0.0041), one from 10 up, none from 100."""
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}" if abs(v) >= 0.1 else f"{v:.2g}"


def _figure(r: dict[str, Any], name: str) -> dict[str, Any] | None:
    fig = _get(r, "spread", "figures", name)
    return fig if isinstance(fig, dict) else None


def _ratio(r: dict[str, Any], name: str, legacy: Any = None) -> str:
    """A ratio as the table shows it: the median of the paired ratios and their range, from the run's
    ``spread`` (bench/spread.py); a result from before ranges were recorded shows its single figure,
    marked as such rather than given a range it does not have."""
    fig = _figure(r, name)
    if fig is not None:
        return f"{_num(fig['median'])} ({_num(fig['min'])}–{_num(fig['max'])}, {fig['pairs']} pairs)"
    if isinstance(legacy, (int, float)):
        return f"{_num(float(legacy))} ({PENDING})"
    return "n/a"


def _target(r: dict[str, Any], text: str, *names: str) -> str:
    """The target column: its text, and the verdict of each named figure that has a registered target."""
    figs = [fig for n in names if (fig := _figure(r, n)) is not None and fig.get("target")]
    verdicts = [
        # each verdict names its target when there are several; the range is the stored ratios' (3 decimals):
        # rounded to 2, a range could read as meeting the target it misses
        (f"{fig['target']} " if len(figs) > 1 else "")
        + fig["verdict"]
        + (f" ({fig['min']}–{fig['max']})" if fig["verdict"] == "not met" else "")
        for fig in figs
    ]
    return f"{text}: {'; '.join(verdicts)}" if verdicts and text else text


def _relay_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    out: list[tuple[str, str, str, str]] = []
    for size, b in (r.get("backlogs") or {}).items():
        rows = f"{int(size) // 1000}k" if int(size) < 1_000_000 else f"{int(size) / 1e6:g}M"
        out.append(
            (
                f"Database limit: mark+purge loop, {rows} backlog (rows/s)",
                _fmt(_get(b, "db_limit_rows_per_s", "median")),
                "the relay's statements, one connection, 5,000 rows per statement; with goharvest's mark "
                f"statement: {_fmt(_get(b, 'db_loop_goharvest_statement_rows_per_s', 'median'))}; with the "
                f"relay's asynchronous mark: {_fmt(_get(b, 'db_loop_async_mark_rows_per_s', 'median'))}; with "
                f"the sequenced commit's range delete: {_fmt(_get(b, 'db_loop_range_delete_rows_per_s', 'median'))}",
                "",
            )
        )
        if b.get("kafka_limit_rows_per_s"):
            out.append(
                (
                    f"Kafka limit: produce loop, {rows} records (rows/s)",
                    _fmt(_get(b, "kafka_limit_rows_per_s", "median")),
                    "the relay's producer settings, one record in flight per key, records in memory, no database",
                    "",
                )
            )
        for mode, label in (("at_least_once", "at-least-once"), ("sequenced", "--uuid-sequencing")):
            for setting in ("defaults", "tuned"):
                d = b.get(f"{mode}/{setting}") or {}
                extra = ""
                if mode == "sequenced":
                    extra = (
                        f"; {_ratio(r, f'{size}/{setting}/sequenced_to_at_least_once', b.get(f'sequenced_to_at_least_once/{setting}'))}"
                        " of at-least-once"
                    )
                limit_fig, kafka_fig = f"{size}/{mode}/{setting}_to_db_limit", f"{size}/{mode}/{setting}_to_kafka_limit"
                out.append(
                    (
                        f"Relay drain, {label}, {'default limits' if setting == 'defaults' else 'tuned'}, {rows} (rows/s)",
                        _fmt(d.get("rows_per_s")),
                        f"{_ratio(r, limit_fig, d.get('ratio_to_db_limit'))} of the database limit{extra}; "
                        + (
                            f"{_ratio(r, kafka_fig, d.get('ratio_to_kafka_limit'))} of the Kafka limit; "
                            if "ratio_to_kafka_limit" in d
                            else ""
                        )
                        + f"{_fmt(d.get('cpu_s_per_100k_rows'))} CPU s per 100k rows; {_fmt(d.get('peak_rss_mb'))} MB RSS",
                        _target(
                            r,
                            "≥ 0.75 of the database limit"
                            + (", ≥ 0.9 of at-least-once" if mode == "sequenced" else ""),
                            limit_fig,
                            f"{size}/{setting}/sequenced_to_at_least_once" if mode == "sequenced" else "",
                        )
                        if setting == "defaults"
                        else "",
                    )
                )
        fresh = b.get("at_least_once/defaults/new_topic")
        if fresh:
            out.append(
                (
                    f"Relay drain, at-least-once, default limits, {rows}, into a topic created just before (rows/s)",
                    _fmt(fresh.get("rows_per_s")),
                    f"{_ratio(r, f'{size}/new_topic_to_db_limit', fresh.get('ratio_to_db_limit'))} of the database "
                    f"limit; {_ratio(r, f'{size}/new_topic_to_long_lived', fresh.get('ratio_to_long_lived_topic'))} of the "
                    "same drain into a long-lived topic "
                    "(the broker's start-up of new partitions)",
                    "",
                )
            )
    go = r.get("goharvest") or {}
    if "defaults" in go:
        out.append(
            (
                "goharvest (Go), default / tuned limits, same backlog (rows/s)",
                f"{_fmt(_get(go, 'defaults', 'rows_per_s'))} / {_fmt(_get(go, 'tuned', 'rows_per_s'))}",
                "harvest at-least-once over goharvest, same limits: "
                f"{_ratio(r, 'goharvest/defaults', go.get('harvest_at_least_once_to_goharvest/defaults'))} / "
                f"{_ratio(r, 'goharvest/tuned', go.get('harvest_at_least_once_to_goharvest/tuned'))}",
                "",
            )
        )
    elif go:
        out.append(("goharvest (Go)", "n/a", str(go.get("skipped", "")), ""))
    lats = r.get("idle_to_delivery_latency") or {}
    kafka = lats.get("kafka") or {}
    for mode, lat in lats.items():
        warm = (
            f"; first {_fmt(lat.get('warmup_seconds'))} s after the topic's creation: p99 "
            f"{_fmt(lat.get('warmup_p99_ms'))}, max {_fmt(lat.get('warmup_max_ms'))}"
            if "warmup_p99_ms" in lat
            else ""
        )
        if mode == "kafka":
            out.append(
                (
                    "Kafka alone: produce -> receipt at 500 rows/s, p50 / p99 (ms)",
                    f"{_fmt(lat.get('p50_ms'))} / {_fmt(lat.get('p99_ms'))}",
                    "the relay's producer settings, a new topic, the same consumer; no database" + warm,
                    "",
                )
            )
            continue
        base = f"; Kafka alone {_fmt(kafka.get('p50_ms'))} / {_fmt(kafka.get('p99_ms'))}" if kafka else ""
        if mode == "sequenced_read_committed":
            out.append(
                (
                    "Relay idle-to-read-committed latency at 500 rows/s, sequenced, through ReadCommittedIter, "
                    "p50 / p99 (ms)",
                    f"{_fmt(lat.get('p50_ms'))} / {_fmt(lat.get('p99_ms'))}",
                    "default limits; a record is yielded once its transaction's ACK is read (adds the fenced "
                    "commit and the ACK record to the delivery path)" + warm,
                    "",
                )
            )
            continue
        out.append(
            (
                f"Relay idle-to-delivery latency at 500 rows/s, {mode.replace('_', '-')}, p50 / p99 (ms)",
                f"{_fmt(lat.get('p50_ms'))} / {_fmt(lat.get('p99_ms'))}",
                "default limits"
                + (
                    f"; relay threads use {lat['relay_python_cpu_share']:.2f} of a core"
                    if lat.get("relay_python_cpu_share") is not None
                    else ""
                )
                + base
                + warm,
                "≤ 5 / ≤ 20",
            )
        )
    return out


def _shard_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    out: list[tuple[str, str, str, str]] = []
    rows = f"{r.get('rows', 0) / 1e6:g}M" if r.get("rows", 0) >= 1_000_000 else f"{r.get('rows', 0) // 1000}k"
    base = r.get("unsharded/1") or {}
    out.append(
        (
            f"One unsharded relay process, {rows} backlog (rows/s)",
            _fmt(base.get("rows_per_s")),
            f"{_fmt(base.get('ratio_to_db_limit'))} of the database limit "
            f"({_fmt(r.get('db_limit_rows_per_s'))}); {_fmt(base.get('cpu_s_per_100k_rows_all_relays'))} CPU s "
            "per 100k rows",
            "",
        )
    )
    for name, d in r.items():
        if not name.startswith("shards") or not isinstance(d, dict):
            continue
        n = name.split("/")[1]
        shares = " / ".join(f"{x:.2f}" for x in d.get("shares", []))
        cpu = " / ".join(f"{x:.2f}" for x in d.get("cpu_s_per_100k_rows_per_relay", []))
        out.append(
            (
                f"Sharded (S = {r.get('shards')}), {n} relay process(es), {rows} backlog (rows/s)",
                _fmt(d.get("rows_per_s")),
                f"{_ratio(r, f'{name}_to_unsharded', d.get('ratio_to_unsharded'))} of one unsharded relay; shares "
                f"{shares}; CPU s per 100k "
                f"rows per relay {cpu}",
                "rows spread evenly, CPU per row flat",
            )
        )
    return out


def _span_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """bench_spans.py: relay spans on against off, per mode; off against off is the noise band."""
    out: list[tuple[str, str, str, str]] = []
    rows = (_get(r, "setup", "rows") or 0) // 1000
    for mode, label in (("at_least_once", "at-least-once"), ("sequenced", "--uuid-sequencing")):
        off, noise = _get(r, "modes", mode, "off") or {}, _get(r, "modes", mode, "off_again") or {}
        for variant, what in (("on_1", "sampleRatio 1"), ("on_0.01", "sampleRatio 0.01")):
            d = _get(r, "modes", mode, variant) or {}
            out.append(
                (
                    f"Relay spans on, {label}, {what}, {rows}k backlog (rows/s)",
                    _fmt(d.get("rows_per_s")),
                    f"{_ratio(r, f'{mode}/{variant}', d.get('ratio_to_off'))} of spans off "
                    f"({_fmt(off.get('rows_per_s'))}), CPU per row {_ratio(r, f'{mode}/{variant}/cpu', d.get('cpu_ratio_to_off'))}; "
                    f"off against off {_ratio(r, f'{mode}/off_again', noise.get('ratio_to_off'))}, CPU per row "
                    f"{_ratio(r, f'{mode}/off_again/cpu', noise.get('cpu_ratio_to_off'))} (the noise)",
                    "spans off: unchanged within noise",
                )
            )
    return out


def _registry_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """bench_registry.py: each encoding at the relay against none, per mode."""
    out: list[tuple[str, str, str, str]] = []
    variants = (
        ("avro", "Avro encoding", "≥ 0.7"),
        ("avro_worker", "Avro encoding in a child process (encodeWorker)", ""),
        ("protobuf", "Protobuf encoding", ""),
        ("json_schema", "JSON Schema encoding", ""),
    )
    for mode, label in (("at_least_once", "at-least-once"), ("sequenced", "--uuid-sequencing")):
        off, again = _get(r, "modes", mode, "off"), _get(r, "modes", mode, "off_again")
        if not off:
            continue
        noise = (
            f"; the same drain again: {_ratio(r, f'{mode}/off_again', again.get('ratio_to_off'))} (noise)"
            if again
            else ""
        )
        for variant, what, target in variants:
            got = _get(r, "modes", mode, variant)
            if not got:
                continue
            out.append(
                (
                    f"Relay drain with {what}, {label} (rows/s)",
                    _fmt(got.get("rows_per_s")),
                    f"{_ratio(r, f'{mode}/{variant}', got.get('ratio_to_off'))} of no encoding "
                    f"({_fmt(off.get('rows_per_s'))}); schema-id cache hit rate {got.get('schema_id_cache_hit_rate')}"
                    + noise,
                    _target(r, target, f"{mode}/{variant}"),
                )
            )
    return out


def _pipeline_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """bench_pipeline.py: outbox commit -> the pipeline's event table (Parquet, Delta), end to end."""
    out = []
    formats = r.get("formats") or {"parquet": r}
    ratio = r.get("ratio_delta_vs_parquet") or {}
    for fmt, f in formats.items():
        m = f.get("median_rows_per_s") or {}
        mem = f.get("median_driver_memory_peak_mb") or {}
        vs = (
            f"; {_ratio(r, 'delta_vs_parquet', ratio.get('end_to_end_event_table'))} of Parquet end to end, "
            f"{_fmt(ratio.get('pipeline_alone'))} alone ({_fmt(m.get('pipeline_alone'))} rows/s)"
            if fmt == "delta" and ratio
            else ""
        )
        relay = _ratio(r, f"{fmt}/end_to_end_to_relay", f.get("ratio_end_to_end_vs_relay"))
        if relay == "n/a" and fmt == "parquet":  # a result from before the formats: one figure, unprefixed
            relay = _ratio(r, "end_to_end_to_relay", f.get("ratio_end_to_end_vs_relay"))
        out.append(
            (
                f"Outbox commit -> Spark pipeline's {fmt.capitalize()} table, {_fmt(r.get('rows'))}-row backlog (rows/s)",
                _fmt(m.get("end_to_end_event_table")),
                f"{relay} of the relay's drain ({_fmt(m.get('relay_drain'))}); "
                f"slowest stage: {f.get('slowest_stage')}; driver peak {_fmt(mem.get('process_group'))} MB "
                f"(Python {_fmt(mem.get('python_driver'))} MB){vs}",
                _target(r, "Delta ≥ 0.8 of Parquet", "delta_vs_parquet") if fmt == "delta" else "",
            )
        )
    return out


def _wal_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """bench_wal.py: the relay's WAL per row, cold (checkpoint between write and relay) and warm."""
    out: list[tuple[str, str, str, str]] = []
    loops = r.get("loops") or {}
    for loop, label in (("at_least_once", "relay (either mode)"), ("delete_only", "no mark, delete only")):
        cold = _get(loops, loop, "cold", "drain", "wal_bytes_total_per_100k")
        warm = _get(loops, loop, "warm", "drain", "wal_bytes_total_per_100k")
        write = _get(loops, loop, "cold", "write", "wal_bytes_per_100k", "insert")
        if cold is None:
            continue
        out.append(
            (
                f"WAL per 100k relayed rows, {label}, cold / warm (MB)",
                f"{_fmt(_mb(cold))} / {_fmt(_mb(warm))}",
                f"writers' INSERTs {_fmt(_mb(write))} MB (docs/primary-cost.md)"
                + (
                    f"; cold / warm to the relay's: {_ratio(r, f'{loop}_to_at_least_once/cold')} / "
                    f"{_ratio(r, f'{loop}_to_at_least_once/warm')}"
                    if loop != "at_least_once" and _figure(r, f"{loop}_to_at_least_once/cold")
                    else ""
                ),
                "",
            )
        )
    return out


def _relay_limit_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """bench_relay_limit.py: the relay against a raw read + produce loop, cursor layout (docs/relay-cost.md)."""
    out: list[tuple[str, str, str, str]] = []
    raw = _get(r, "raw", "rows_per_s", "median")
    rows = _get(r, "setup", "rows")
    for v, label in (
        ("sequenced/defaults", "sequenced, defaults"),
        ("sequenced/tuned", "sequenced, tuned"),
        ("at_least_once/defaults", "at-least-once, defaults"),
        ("at_least_once/tuned", "at-least-once, tuned"),
    ):
        got = r.get(v)
        if not got:
            continue
        out.append(
            (
                f"Relay drain, outboxLayout cursor, {label}, {_fmt(rows)}-row burst (rows/s)",
                _fmt(_get(got, "rows_per_s", "median")),
                f"{_ratio(r, v)} of a raw read+produce loop ({_fmt(raw)}); CPU per row "
                f"{_fmt(_get(got, 'cpu_ratio_to_raw', 'median'))}x the raw loop's (docs/relay-cost.md)",
                _target(r, "≥ 0.7 sequenced, ≥ 0.5 at-least-once (issue #47)", v),
            )
        )
    return out


def _percent(share: Any) -> str:
    """A share of a core as a percentage (0.0085 -> 0.85%)."""
    return "n/a" if not isinstance(share, (int, float)) else f"{share * 100:.2g}%"


def _outboxes_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """bench_outboxes.py: a fleet's cost per outbox, its CPU per row and fairness (docs/benchmarks.md, "Many
    outboxes, one process")."""
    out: list[tuple[str, str, str, str]] = []
    idle = r.get("idle") or {}
    per = idle.get("per_outbox") or {}
    if per:
        sizes = "/".join(idle.get("sizes") or {})
        skipped = "; ".join(f"{k} not started: {v}" for k, v in (idle.get("skipped") or {}).items())
        out.append(
            (
                f"Fleet idle cost per outbox, fleets of {sizes} (RSS MB, threads, connections, idle CPU of a core)",
                f"{_fmt(_get(per, 'rss_mb', 'slope'))}, {_fmt(_get(per, 'threads', 'slope'))}, "
                f"{_fmt(_get(per, 'connections', 'slope'))}, {_percent(_get(per, 'idle_cpu_share', 'slope'))}",
                f"least-squares slopes over the sizes; {skipped or 'every size started'}",
                "",
            )
        )
    cpu = r.get("cpu") or {}
    if cpu:
        rows = _get(r, "setup", "rows")
        out.append(
            (
                f"Fleet CPU per relayed row, {_fmt(rows)} rows over 10 outboxes of one process (µs/row)",
                _fmt(_get(cpu, "fleet", "cpu_us_per_row", "median")),
                f"{_ratio(r, 'cpu_per_row')} of a one-outbox process draining the same rows "
                f"({_fmt(_get(cpu, 'single', 'cpu_us_per_row', 'median'))}); one busy outbox of the 10 "
                f"{_ratio(r, 'cpu_per_row_one_busy')}; the same rows over 10 one-outbox processes "
                f"{_ratio(r, 'cpu_per_row_processes')}",
                _target(r, "≤ 1.2", "cpu_per_row"),
            )
        )
    fair = r.get("fairness") or {}
    if fair.get("burst"):
        burst = _get(r, "setup", "burst")
        p99s = [w.get("p99_ms") for w in fair["burst"] if w.get("p99_ms") is not None]
        out.append(
            (
                f"Fleet fairness: a {_fmt(fair.get('trickle_rate'))} rows/s trickle's commit->receipt p99 while "
                f"another outbox drains a {_fmt(burst)}-row burst (ms)",
                _fmt(sorted(p99s)[len(p99s) // 2] if p99s else None),
                f"{_ratio(r, 'trickle_p99_burst')} of its p99 with no burst; p50 {_ratio(r, 'trickle_p50_burst')}; "
                f"the same trickle through a process of its own (the machine's share): "
                f"{_ratio(r, 'bystander_p99_burst')}",
                _target(r, "≤ 2", "trickle_p99_burst"),
            )
        )
    sb = r.get("standby") or {}
    if sb:
        n = sb.get("outboxes") or 10
        led = len(sb.get("led_by_the_standby") or [])
        out.append(
            (
                f"A second fleet process on the same {n} outboxes, started after the first led them all; the balance "
                f"gave it {led} (connections, threads, idle CPU of a core)",
                f"{_fmt(sb.get('connections'))}, {_fmt(sb.get('threads'))}, {_percent(sb.get('idle_cpu_share'))}",
                f"RSS {_fmt(sb.get('rss_mb'))} MB, PSS {_fmt(sb.get('pss_mb'))} MB (one measurement)",
                "",
            )
        )
    pvf = r.get("processes_vs_fleet") or {}
    if pvf.get("fleet_over_processes"):
        ratio = pvf["fleet_over_processes"]
        out.append(
            (
                "10 outboxes in one fleet process / in 10 one-outbox processes (PSS MB)",
                f"{_fmt(_get(pvf, 'fleet', 'pss_mb'))} / {_fmt(_get(pvf, 'processes', 'pss_mb'))}",
                f"ratio PSS {_fmt(ratio.get('pss_mb'))}, RSS {_fmt(ratio.get('rss_mb'))}, threads "
                f"{_fmt(ratio.get('threads'))}, connections {_fmt(ratio.get('connections'))}, idle CPU "
                f"{_fmt(ratio.get('idle_cpu_share'))} (one measurement each)",
                "",
            )
        )
    return out


def _cursor_relay_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """bench_cursor_relay.py: the relay on outboxLayout: cursor against mark, per mode, in one run."""
    out: list[tuple[str, str, str, str]] = []
    med, ratios = r.get("medians") or {}, r.get("ratios_cursor_over_mark") or {}
    for mode, label in (("at_least_once", "at-least-once"), ("sequenced", "sequenced")):
        mark, cursor, ratio = med.get(f"{mode}/mark") or {}, med.get(f"{mode}/cursor") or {}, ratios.get(mode) or {}
        if not cursor:
            continue
        out.append(
            (
                f"Relay WAL per row, outboxLayout cursor / mark, {label}, cold (B)",
                f"{_fmt(cursor.get('relay_wal_bytes_per_row'))} / {_fmt(mark.get('relay_wal_bytes_per_row'))}",
                f"ratio {_ratio(r, f'{mode}/relay_wal_per_row', ratio.get('relay_wal_per_row'))}; total with the "
                f"writers' {_fmt(ratio.get('total_wal_per_row'))}; "
                f"drain {_fmt(cursor.get('rows_per_s'))} / {_fmt(mark.get('rows_per_s'))} rows/s "
                f"(ratio {_ratio(r, f'{mode}/rows_per_s', ratio.get('drain_rate'))}) (docs/primary-cost.md)",
                _target(
                    r, "relay WAL ≤ 0.5x, drain ≥ 1x (issue #37)", f"{mode}/relay_wal_per_row", f"{mode}/rows_per_s"
                ),
            )
        )
        if cursor.get("pg_relay_cpu_s_per_100k") is not None:
            out.append(
                (
                    f"Postgres CPU per 100k relayed rows, outboxLayout cursor / mark, {label} (s)",
                    f"{_fmt(cursor.get('pg_relay_cpu_s_per_100k'))} / {_fmt(mark.get('pg_relay_cpu_s_per_100k'))}",
                    f"relay side (its backends {_fmt(cursor.get('pg_relay_backends_cpu_s_per_100k'))} / "
                    f"{_fmt(mark.get('pg_relay_backends_cpu_s_per_100k'))}); with the writers' "
                    f"{_fmt(cursor.get('pg_total_cpu_s_per_100k'))} / {_fmt(mark.get('pg_total_cpu_s_per_100k'))}; "
                    f"relay side cursor / mark {_ratio(r, f'{mode}/pg_relay_cpu_s_per_100k', ratio.get('pg_relay_cpu_per_row'))} "
                    "(docs/primary-cost.md)",
                    "≤ Debezium's (issue #37)",
                )
            )
    return out


def _small(v: Any) -> str:
    """A ratio far below 1 (0.0075), which _fmt's two decimals would round away."""
    return f"{v:.2g}" if isinstance(v, float) else _fmt(v)


def _mb(v: Any) -> Any:
    return v / 1e6 if isinstance(v, (int, float)) else None


def _debezium_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """bench_debezium.py: not yet converted to paired repeats (bench/spread.py): its ratios are of medians."""
    return [(a, b, f"{c} ({PENDING})" if c else c, d) for a, b, c, d in _debezium_median_rows(r)]


def _debezium_median_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    n = _get(r, "setup", "rows") or 0
    size = f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n // 1000}k"
    modes = ("at_least_once", "sequenced", "debezium")
    burst = {m: _get(r, m, "burst") or {} for m in modes}
    dd = _get(r, "debezium", "burst_insert_delete") or {}
    ratio = {m: _get(r, "harvest_to_debezium", m) or {} for m in modes[:2]}
    # the latency comparison as users run both (bench_latency's, Debezium at poll.interval.ms 10); a run before
    # it measured harvest in the bench's process and Debezium at its defaults
    from bench.bench_debezium import latency_of

    users = bool(r.get("latency"))
    lat = {m: latency_of(r, m) if users else _get(r, m, "trickle") or {} for m in modes}
    fault = {m: _get(r, m, "fault") or {} for m in modes}

    def wal(b: dict[str, Any]) -> Any:
        parts = [
            b.get("wal_write_bytes_per_100k"),
            b.get("wal_relay_bytes_per_100k"),
            _get(b, "vacuum_after", "wal_bytes_per_100k"),
        ]
        return sum(parts) / 1e6 if all(isinstance(p, (int, float)) for p in parts) else None

    def both(key: str) -> str:
        return f"{_fmt(ratio['at_least_once'].get(key))}x / {_fmt(ratio['sequenced'].get(key))}x"

    def dl(d: dict[str, Any]) -> str:
        return f"{_fmt(d.get('duplicates'))} / {_fmt(d.get('losses'))}"

    who = "harvest at-least-once / sequenced / Debezium"
    slot = _get(r, "debezium", "burst", "slot", "after_offset_flush") or {}
    mach = r.get("machine") or {}  # the run may be newer than the table's header, on another machine
    on = f" (on {mach.get('cpus')} cores, {mach.get('cpu_model') or 'unknown CPU'})" if mach else ""
    return [
        (
            f"Debezium side by side{on}: {size}-row burst, commit -> last record in Kafka, {who} (rows/s)",
            " / ".join(_fmt(burst[m].get("rows_per_s")) for m in modes),
            f"harvest {both('rows_per_s')} Debezium; Debezium with the insert-then-delete pattern: "
            f"{_fmt(dd.get('rows_per_s'))}",
            "≥ Debezium",
        ),
        (
            f"Debezium side by side: trickle at 500 rows/s, commit -> plain consumer, p50 / p99, {who} (ms)"
            + (", each as its own process" if users else ""),
            "; ".join(f"{_fmt(lat[m].get('p50_ms'))} / {_fmt(lat[m].get('p99_ms'))}" for m in modes),
            f"p50 {both('trickle_p50')}, p99 {both('trickle_p99')} Debezium's "
            + (
                "(poll.interval.ms 10; the ranges: `latency`)"
                if users
                else "(its default poll.interval.ms, 500: the connector waits that long for events; harvest in the "
                "benchmark's process)"
            ),
            "below Debezium's",
        ),
        (
            "Debezium side by side: WAL per 100k rows, writing + relaying + the VACUUM after, harvest at-least-once / "
            "sequenced / Debezium keeping rows / Debezium insert-then-delete (MB)",
            " / ".join(_fmt(wal(b)) for b in (*burst.values(), dd)),
            f"harvest {both('wal_total_to_keep_rows')} Debezium keeping rows, "
            f"{both('wal_total_to_insert_delete')} insert-then-delete; writing alone "
            f"{_fmt(_mb(burst['at_least_once'].get('wal_write_bytes_per_100k')))} (harvest's columns and index) vs "
            f"{_fmt(_mb(burst['debezium'].get('wal_write_bytes_per_100k')))}; relaying: harvest's mark and delete "
            f"{_fmt(_mb(burst['at_least_once'].get('wal_relay_bytes_per_100k')))}, Debezium "
            f"{_fmt(_mb(burst['debezium'].get('wal_relay_bytes_per_100k')))}",
            "",
        ),
        (
            f"Debezium side by side: Postgres CPU s per 100k rows while relaying, {who}",
            " / ".join(_fmt(burst[m].get("postgres_cpu_s_per_100k")) for m in modes),
            f"harvest {both('postgres_cpu')} Debezium (its walsender decodes; harvest marks and deletes); with the "
            f"VACUUM after, {both('postgres_cpu_with_vacuum_to_insert_delete')} Debezium insert-then-delete; the "
            f"relay itself: harvest {_fmt(burst['at_least_once'].get('relay_cpu_s_per_100k'))}, Connect's JVM "
            f"{_fmt(burst['debezium'].get('relay_cpu_s_per_100k'))} CPU s",
            "",
        ),
        (
            "Debezium side by side: the table's growth per 100k rows of a burst (MB) and its dead tuples after, harvest "
            "at-least-once / Debezium keeping rows / Debezium insert-then-delete",
            " / ".join(
                f"{_fmt(_mb(b.get('table_growth_bytes_per_100k')))}, {_fmt(_get(b, 'table_after', 'dead_tuples'))}"
                for b in (burst["at_least_once"], burst["debezium"], dd)
            ),
            f"Debezium's slot after its last record and an offset flush: lag {_fmt(_mb(slot.get('lag_bytes')))} MB, "
            f"WAL retained {_fmt(_mb(slot.get('retained_wal_bytes')))} MB; harvest has no slot",
            "",
        ),
        (
            f"Debezium side by side: kill -9 mid-burst ({_fmt(_get(r, 'setup', 'fault_rows'))} rows), duplicates / "
            f"losses by a plain consumer, {who}",
            "; ".join(dl(fault[m].get("plain_consumer") or {}) for m in modes),
            f"sequenced through ReadCommittedIter: {dl(fault['sequenced'].get('read_committed') or {})}; harvest's "
            f"standby led after {_fmt(fault['at_least_once'].get('takeover_s'))} / "
            f"{_fmt(fault['sequenced'].get('takeover_s'))} s, Debezium's worker restarted in "
            f"{_fmt(fault['debezium'].get('restart_s'))} s",
            "losses 0; ReadCommittedIter 0 / 0",
        ),
        *_debezium_cursor_rows(r, size),
    ]


def _debezium_cursor_rows(r: dict[str, Any], size: str) -> list[tuple[str, str, str, str]]:
    """bench_debezium.py's outboxLayout: cursor contestants against the mark layout and Debezium (issue #37's
    targets), when the run had them."""
    cur = {m: _get(r, f"cursor_{m}", "burst") or {} for m in ("at_least_once", "sequenced")}
    if not any(cur.values()):
        return []
    mark, dbz = _get(r, "at_least_once", "burst") or {}, _get(r, "debezium", "burst") or {}
    dd = _get(r, "debezium", "burst_insert_delete") or {}
    ratio = {m: _get(r, "cursor_layout", m) or {} for m in ("at_least_once", "sequenced")}

    def mb(b: dict[str, Any], *keys: str) -> Any:
        parts = [b.get(k) for k in keys] + [_get(b, "vacuum_after", "wal_bytes_per_100k")]
        return sum(parts) / 1e6 if all(isinstance(p, (int, float)) for p in parts) else None

    def both(key: str) -> str:
        return f"{_small(ratio['at_least_once'].get(key))}x / {_small(ratio['sequenced'].get(key))}x"

    relay, total = ("wal_relay_bytes_per_100k",), ("wal_write_bytes_per_100k", "wal_relay_bytes_per_100k")
    who = "cursor at-least-once / cursor sequenced"
    ckpt = " / ".join(_fmt(b.get("checkpoints")) for b in (*cur.values(), mark, dbz, dd))
    return [
        (
            f"Debezium side by side, outboxLayout cursor: WAL per 100k rows of a {size}-row burst, relay side "
            f"(relaying + the VACUUM after), {who} / mark at-least-once / Debezium keeping rows / Debezium "
            "insert-then-delete (MB)",
            " / ".join(_fmt(mb(b, *relay)) for b in (*cur.values(), mark, dbz, dd)),
            f"cursor / mark {both('relay_wal_to_mark')}; checkpoints begun during each burst: {ckpt}",
            "≤ 0.5x the mark layout's",
        ),
        (
            "Debezium side by side, outboxLayout cursor: total WAL per 100k rows (writers + relay side), "
            f"{who} / mark at-least-once / Debezium keeping rows / Debezium insert-then-delete (MB)",
            " / ".join(_fmt(mb(b, *total)) for b in (*cur.values(), mark, dbz, dd)),
            f"cursor {both('total_wal_to_debezium_insert_delete')} Debezium insert-then-delete, "
            f"{both('total_wal_to_debezium_keep_rows')} keeping rows, {both('total_wal_to_mark')} the mark layout",
            "≤ Debezium insert-then-delete",
        ),
        (
            f"Debezium side by side, outboxLayout cursor: Postgres CPU s per 100k relayed rows, {who} / Debezium",
            " / ".join(_fmt(b.get("postgres_cpu_s_per_100k")) for b in (*cur.values(), dbz)),
            f"cursor {both('postgres_cpu_to_debezium')} Debezium keeping rows; with the VACUUM after "
            f"{both('postgres_cpu_with_vacuum_to_debezium_insert_delete')} Debezium insert-then-delete; "
            f"{both('postgres_cpu_to_mark')} the mark layout; writing + relaying + VACUUM (Debezium's walsender "
            f"decodes while the rows are written) {both('postgres_cpu_write_and_relay_to_debezium')} Debezium keeping "
            f"rows, {both('postgres_cpu_write_and_relay_to_debezium_insert_delete')} insert-then-delete; drain "
            + " / ".join(_fmt(b.get("rows_per_s")) for b in cur.values())
            + " rows/s",
            "≤ Debezium's",
        ),
    ]


def _reader_memory_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """bench_reader_memory.py: each reader's peak RSS per process at the smallest and largest topic; one run
    per size (its growth ratios have no range: bench/spread.py's pairing does not apply to a single run)."""
    return [(a, b, f"{c} (single run, range pending)", d) for a, b, c, d in _reader_memory_single_rows(r)]


def _reader_memory_single_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    sizes = r.get("sizes") or {}
    if len(sizes) < 2:
        return []
    keys = sorted(sizes, key=int)
    small, big = sizes[keys[0]], sizes[keys[-1]]
    label = f"{_records(int(keys[0]))} / {_records(int(keys[-1]))}"
    growth = r.get("growth") or {}
    target = "growth ≈ 1 (bounded by the batch, not the topic)"
    out: list[tuple[str, str, str, str]] = []
    at_small, at_big = _get(small, "iter", "reader"), _get(big, "iter", "reader")
    if at_small and at_big:
        out.append(
            (
                f"ReadCommittedIter.poll_batch process peak RSS, {label}-record topic (MB)",
                f"{_fmt(at_small.get('peak_rss_mb'))} / {_fmt(at_big.get('peak_rss_mb'))}",
                f"growth {_fmt(growth.get('iter/reader'))} over {_fmt(r.get('size_ratio'))}x the records; a plain "
                f"consumer {_fmt(_get(small, 'iter', 'raw', 'peak_rss_mb'))} / "
                f"{_fmt(_get(big, 'iter', 'raw', 'peak_rss_mb'))} (growth {_fmt(growth.get('iter/raw'))}), with the "
                f"reader's prefetch bound {_fmt(_get(small, 'iter', 'raw_bounded', 'peak_rss_mb'))} / "
                f"{_fmt(_get(big, 'iter', 'raw_bounded', 'peak_rss_mb'))}",
                target,
            )
        )
    for variant, what in (("count", "readCommitted + count"), ("stream", "readCommittedStream(state_location=...)")):
        for kind in ("python_worker", "executor_jvm"):
            a = _get(small, "spark", "harvest", variant, "peaks", kind, "peak_rss_mb")
            b = _get(big, "spark", "harvest", variant, "peaks", kind, "peak_rss_mb")
            if a is None or b is None:
                continue
            raw_a = _get(small, "spark", "raw", variant, "peaks", kind, "peak_rss_mb")
            raw_b = _get(big, "spark", "raw", variant, "peaks", kind, "peak_rss_mb")
            base = f"; Spark's Kafka source {_fmt(raw_a)} / {_fmt(raw_b)}" if raw_a is not None else ""
            out.append(
                (
                    f"Spark {what}, {kind.replace('_', ' ')} peak RSS, {label}-record topic on {r.get('master')} (MB)",
                    f"{_fmt(a)} / {_fmt(b)}",
                    f"growth {_fmt(growth.get(f'spark/harvest/{variant}/{kind}'))}{base}",
                    target,
                )
            )
    return out


def _records(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n // 1000}k"


def _latency_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """bench_latency.py: commit -> receipt with the relay as its own process, per rate and configuration."""
    out: list[tuple[str, str, str, str]] = []
    seconds = _get(r, "setup", "seconds")

    def four(d: dict[str, Any]) -> str:
        return " / ".join(_fmt(d.get(k)) for k in ("p50_ms", "p99_ms", "p99_9_ms", "max_ms"))

    for rate, runs in (r.get("rates") or {}).items():
        kafka = runs.get("kafka") or {}
        out.append(
            (
                f"Kafka alone, produce -> receipt at {rate} rows/s, own processes, p50 / p99 / p99.9 / max (ms)",
                four(kafka),
                f"the relay's producer settings, no database; {_fmt(seconds)} s window",
                "",
            )
        )
        for config, run in runs.items():
            if config == "kafka":
                continue
            if config == "debezium":
                who = f"Debezium (Connect worker, poll.interval.ms {_fmt(_get(r, 'setup', 'debezium_poll_ms'))})"
            else:
                layout, mode, shards = config.split("/")
                who = f"harvest process, {layout}, {mode.replace('_', '-')}, shards {shards}"
            for kind in ("plain", "read_committed"):
                d = run.get(kind)
                if not d:
                    continue
                ratio = d.get("to_kafka_alone") or {}
                via = ", ReadCommittedIter" if kind == "read_committed" else ""
                name = f"{rate}/{config}/{kind}"
                extra = ""
                if kind == "plain" and _figure(r, f"{name}/p99_to_bound"):
                    extra += f"; p99 / issue #51's bound (2x Kafka alone's + 5 or 10 ms): {_ratio(r, f'{name}/p99_to_bound')}"
                if kind == "plain" and _figure(r, f"{name}/p50_to_debezium"):
                    extra += "; over Debezium's p50 / p99 / p99.9 / max: " + " / ".join(
                        _ratio(r, f"{name}/{p}_to_debezium") for p in ("p50", "p99", "p99_9", "max")
                    )
                names = [f"{name}/p99_to_bound", *(f"{name}/{p}_to_debezium" for p in ("p50", "p99", "p99_9", "max"))]
                out.append(
                    (
                        f"{who}{via}: commit -> receipt at {rate} rows/s, p50 / p99 / p99.9 / max (ms)",
                        four(d),
                        f"{_fmt(ratio.get('p50'))}x / {_fmt(ratio.get('p99'))}x / {_fmt(ratio.get('p99_9'))}x / "
                        f"{_fmt(ratio.get('max'))}x Kafka alone (p99 over Kafka alone's: "
                        f"{_ratio(r, f'{name}/p99') if _figure(r, f'{name}/p99') else 'single run, range pending'}); above p99, "
                        f"{_fmt(_get(d, 'above_p99', 'commit_to_produce_share'))} of the time before produce; "
                        f"lost {_fmt(d.get('lost'))}{extra}",
                        _target(r, "p99 within the bound, every percentile below Debezium's", *names)
                        if kind == "plain" and config != "debezium" and rate == "500"
                        else "",
                    )
                )
    return out


# name -> rows of (what, median, baseline / ratio, target)
ROWS: dict[str, Callable[[dict[str, Any]], list[tuple[str, str, str, str]]]] = {
    "sequencer": lambda r: [
        (
            f"Sequencer queue+step ({r.get('sequencer_implementation', 'python')}), 16 producers, txns of 100, "
            "ring 8192 (msg/s)",
            _fmt(r.get("msgs_per_s_median")),
            f"ratio to envelope-construction loop {_ratio(r, 'baseline', r.get('ratio_sequencer_to_baseline'))}; "
            f"ratio to the pure-Python one ({_fmt(r.get('pure_python_msgs_per_s_median'))}) "
            f"{_ratio(r, 'pure_python', r.get('ratio_to_pure_python'))}",
            "≥ 300,000 msg/s",
        ),
        (
            "Sequencer memory per tracked producer (bytes)",
            f"{_fmt(_get(r, 'memory', 'bytes_per_producer'))}"
            + (
                f" (pure Python: {_fmt(_get(r, 'pure_python_memory', 'bytes_per_producer'))})"
                if "pure_python_memory" in r
                else ""
            ),
            "",
            "",
        ),
    ],
    "relay": lambda r: _relay_rows(r),
    "shards": lambda r: _shard_rows(r),
    "spans": lambda r: _span_rows(r),
    "registry": lambda r: _registry_rows(r),
    "pipeline": lambda r: _pipeline_rows(r),
    "wal": lambda r: _wal_rows(r),
    "cursor_relay": lambda r: _cursor_relay_rows(r),
    "relay_limit": lambda r: _relay_limit_rows(r),
    "outboxes": lambda r: _outboxes_rows(r),
    "debezium": lambda r: _debezium_rows(r),
    "reader_memory": lambda r: _reader_memory_rows(r),
    "latency": lambda r: _latency_rows(r),
    "consumer": lambda r: [
        (
            f"ReadCommittedIter.poll_batch, {_fmt(r.get('records_committed'))} records, txns of {r.get('txn_size')} (msg/s)",
            _fmt(r.get("committed_median_per_s")),
            f"ratio to plain confluent consumer {_ratio(r, 'poll_batch', r.get('ratio'))} "
            f"(per Python CPU second: {_ratio(r, 'poll_batch_cpu', r.get('cpu_ratio'))}); reader peak RSS "
            f"{_fmt((r.get('reader_peak_rss_mb_by_quarter') or [None])[-1])} MB "
            f"({_fmt(r.get('reader_peak_rss_vs_raw'))} of the plain consumer's), Python heap peak "
            f"{_fmt((r.get('reader_heap_peak_mb_by_quarter') or [None])[-1])} MB",
            _target(r, "ratio ≥ 0.95", "poll_batch"),
        ),
        (
            "ReadCommittedIter, one poll() per record (msg/s)",
            _fmt(r.get("committed_poll_median_per_s")),
            f"ratio {_ratio(r, 'poll', r.get('ratio_poll'))} (per Python CPU second: "
            f"{_ratio(r, 'poll_cpu', r.get('cpu_ratio_poll'))})",
            "",
        ),
    ],
    "spark": lambda r: [
        (
            f"Spark readCommitted batch, {_fmt(r.get('records'))} records (rows/s)",
            _fmt(r.get("readCommitted_median_rows_per_s")),
            f"ratio to raw Spark Kafka read + count {_ratio(r, 'readCommitted', r.get('ratio_median'))}; written to "
            f"the noop sink, to a raw read written there {_ratio(r, 'readCommitted_noop', r.get('ratio_noop_median'))}; "
            f"through source='spark' {_ratio(r, 'spark_source', r.get('ratio_spark_source_median'))}",
            _target(r, "ratio ≥ 0.9; noop ≥ 1", "readCommitted", "readCommitted_noop"),
        )
    ],
    "spark_stream": lambda r: (
        (
            [
                (
                    f"Spark readCommittedStream(state_location=...), availableNow, {_fmt(r.get('records'))} records in "
                    f"{_fmt(_get(r, 'last_run_batch_durations_ms', 'readCommittedStream_state_location', 'micro_batches'))} "
                    "micro-batches (rows/s)",
                    _fmt(r.get("state_location_median_rows_per_s")),
                    "ratio to Spark's raw Kafka stream, same sink "
                    f"{_ratio(r, 'state_location', r.get('state_location_ratio_median'))}; state files "
                    f"left: {_fmt(_get(r, 'state_location_files_after_last_run', 'files'))} "
                    f"({_fmt(_get(r, 'state_location_files_after_last_run', 'bytes'))} bytes)",
                    _target(r, "ratio ≥ 0.9", "state_location"),
                )
            ]
            if r.get("state_location_median_rows_per_s")
            else []
        )
        + [
            (
                f"Spark readCommittedStream (state store), availableNow, {_fmt(r.get('records'))} records in "
                f"{_fmt(_get(r, 'last_run_batch_durations_ms', 'readCommittedStream', 'micro_batches'))} micro-batches (rows/s)",
                _fmt(r.get("readCommittedStream_median_rows_per_s")),
                f"ratio to Spark's raw Kafka stream, same sink {_ratio(r, 'state_store', r.get('ratio_median'))}"
                + (
                    " (raw stream through a pass-through mapInArrow: "
                    f"{_ratio(r, 'passthrough', r.get('passthrough_ratio_median'))})"
                    if r.get("passthrough_ratio_median") is not None
                    else ""
                ),
                "",
            ),
            (
                "readCommittedStream (state store) state per open producer (bytes)",
                _fmt(_get(r, "state", "state_bytes_per_open_producer_median")),
                f"open spans of {_fmt(_get(r, 'state', 'open_span_records_per_open_producer_median'))} records",
                "",
            ),
        ]
    ),
    "stasher": lambda r: [
        (
            f"Stasher stash_many (COPY), {_fmt(r.get('rows_per_transaction'))} rows per transaction (rows/s)",
            _fmt(r.get("stash_many_median_rows_per_s")),
            f"ratio to one INSERT per record ({_fmt(r.get('single_median_rows_per_s'))} rows/s) "
            f"{_ratio(r, 'stash_many', r.get('speedup_median'))}",
            "much faster than one INSERT each",
        )
    ],
}


def bench_args(name: str, size: str) -> list[str]:
    """The script's arguments at ``size``: "full", "quick" or "check"."""
    _script, full, small = BENCHES[name]
    if size == "check":
        return [*small, *CHECK[name]]
    return small if size == "quick" else full


def run(name: str, size: str) -> dict[str, Any]:
    script = BENCHES[name][0]
    args = bench_args(name, size)
    # As a module of the bench package, from the root: its imports are ``bench.<module>``, no path set-up.
    cmd = [sys.executable, "-m", f"bench.{Path(script).stem}", *args]
    print(f"[bench] {name}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"[bench] {name} failed with exit code {proc.returncode}")
    match = re.search(r"^\{.*\}\s*\Z", proc.stdout, re.S | re.M)
    if not match:
        raise SystemExit(f"[bench] {name} printed no JSON object at the end of its output")
    result = json.loads(match.group(0))
    result["run"] = {"date": time.strftime("%Y-%m-%d"), "size": size, "args": args}
    print(f"[bench] {name}: done in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
    return result


def machine() -> dict[str, Any]:
    mem = ""
    try:
        mem = next(line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemTotal"))
        mem = f"{int(mem) // 1024 // 1024} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "memory": mem,
        "python": platform.python_version(),
        "os": platform.platform(),
        "date": time.strftime("%Y-%m-%d"),
    }


def effective_args(args: list[str]) -> list[str]:
    """A command line as the script sees it: an option given twice (the check size appends to the quick
    workload) keeps its last value, in the place it first appeared."""
    out: dict[str, str | None] = {}
    i = 0
    while i < len(args):
        has_value = i + 1 < len(args) and not args[i + 1].startswith("--")
        out[args[i]] = args[i + 1] if has_value else None
        i += 2 if has_value else 1
    return [x for k, v in out.items() for x in ((k, v) if v is not None else (k,))]


def _runs_table(results: dict[str, dict[str, Any]]) -> list[str]:
    """One row per benchmark whose result records its spread: when, on what, how loaded, how repeated."""
    rows = []
    for name, r in results.items():
        sp = r.get("spread")
        if not isinstance(sp, dict):
            continue
        m = sp.get("machine") or {}
        load = "–".join(f"{(x or [None])[0]}" for x in (m.get("load_average_start"), m.get("load_average_end")))
        run_ = r.get("run") or {}
        rows.append(
            f"| {name} | {run_.get('date', 'n/a')} | {run_.get('size', 'n/a')}: "
            f"`{' '.join(effective_args(run_.get('args') or [])) or '(defaults)'}` "
            f"| {m.get('cores')} × {m.get('cpu_model')} | {load} | {sp.get('repeats')} | {sp.get('warmup')} |"
        )
    if not rows:
        return []
    return [
        "",
        "Runs behind the ranges (load: the 1-minute load average at the benchmark's start and end; a load above "
        "the core count means the runs shared the CPUs):",
        "",
        "| benchmark | date | size: arguments | cores × CPU | load start–end | repeats | warm-up |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]


def table(results: dict[str, dict[str, Any]], mach: dict[str, Any]) -> str:
    lines = [
        f"Table written {mach['date']} on {mach['cpus']} cores ({mach['cpu_model'] or 'unknown CPU'}), "
        f"{mach['memory']}, Python {mach['python']}; embedded Postgres and Kafka on the same machine. Rates are "
        "medians; each ratio is the median of one ratio per repeat pair (contestant and baseline run in "
        "alternation), with the pairs' min–max; a ratio marked *range pending* comes from a run made before "
        "ranges were recorded (a median of one to three runs) and has none yet. The runs behind the ranges "
        "(date, size, machine, load) are listed below the table; a benchmark not listed there is from an "
        "earlier run, without its load recorded. Full figures in `bench/results.json`.",
        "",
        "| benchmark | median | compared with (same run): ratio median (min–max, pairs) | target |",
        "|---|---|---|---|",
    ]
    for name, result in results.items():
        for row in ROWS[name](result):
            lines.append("| " + " | ".join(row) + " |")
    lines += _runs_table(results)
    return "\n".join(lines)


def references_table(refs: dict[str, dict[str, Any]]) -> list[str]:
    """The check references (``./dev bench --check --publish`` / ``--reference``): every figure's range at
    check size, what ``--check`` compares a re-run with."""
    rows = []
    for name, ref in refs.items():
        sp, run_ = ref.get("spread") or {}, ref.get("run") or {}
        m = sp.get("machine") or {}
        load = "–".join(f"{(x or [None])[0]}" for x in (m.get("load_average_start"), m.get("load_average_end")))
        for fig, f in (sp.get("figures") or {}).items():
            verdict = f"{f['target']}: {f['verdict']}" if f.get("target") else ""
            rows.append(
                f"| {name}.{fig} | {f.get('what', '')} | {_num(f['median'])} ({_num(f['min'])}–{_num(f['max'])}, "
                f"{f['pairs']} pairs) | {verdict} | {run_.get('date', 'n/a')}, "
                f"`{' '.join(effective_args(run_.get('args') or []))}`, load {load} |"
            )
    if not rows:
        return []
    return [
        "",
        "",
        "Check references: each figure's range at check size, what `./dev bench --check` compares a re-run with "
        "([Re-running the benchmarks](#re-running-the-benchmarks)):",
        "",
        "| figure | ratio | median (min–max, pairs) | target: verdict | run: date, arguments, load |",
        "|---|---|---|---|---|",
        *rows,
    ]


def check_against(stored: dict[str, Any]) -> dict[str, Any]:
    """What ``--check`` compares with, per benchmark: its check reference (same size as today's run) when
    there is one, else the table's result (maybe of another size: the check says so)."""
    return {**stored.get("results", {}), **stored.get("check_references", {})}


def published_figures(results: dict[str, Any], name: str) -> dict[str, dict[str, Any]]:
    figs = _get(results, name, "spread", "figures")
    return figs if isinstance(figs, dict) else {}


def check_report(name: str, today: dict[str, Any], published: dict[str, Any]) -> list[Check]:
    """Per figure of ``name``: today's against the published one (both sides' figures, sorted)."""
    now, pub = published_figures({name: today}, name), published_figures(published, name)
    out = [check(f"{name}.{fig}", now.get(fig), pub.get(fig)) for fig in sorted(now.keys() | pub.keys())]
    was, is_ = (effective_args(_get(r, "run", "args") or []) for r in (published.get(name), today))
    if pub and was != is_:
        # a ratio can move with the workload (fixed costs weigh more in a small one): say so, per line
        note = f" [published from {_get(published, name, 'run', 'size') or 'a'} run, arguments {was}]"
        out = [Check(c.figure, c.inside, c.reason + note) if c.inside is not None else c for c in out]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", choices=[*BENCHES, []], help="benchmarks to run (default: all)")
    parser.add_argument(
        "--quick", action="store_true", help="small workloads; does not update docs/benchmarks.md or results"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="re-run quickly (quick workloads, 5 repeats) and compare each ratio with its published range; "
        "exit 1 if one falls outside",
    )
    parser.add_argument(
        "--publish",
        action="store_true",
        help="with --check: also publish today's figures (the table's results and the check reference)",
    )
    parser.add_argument(
        "--reference",
        action="store_true",
        help="with --check: store today's figures as the check reference only (the table keeps its results)",
    )
    parser.add_argument(
        "--table-only", action="store_true", help="run nothing: rewrite docs/benchmarks.md's table from results.json"
    )
    args = parser.parse_args(argv)
    if args.table_only:
        stored = json.loads(RESULTS.read_text())
        write_table(stored["results"], stored["machine"], stored.get("check_references", {}))
        return 0
    if (args.publish or args.reference) and not args.check:
        parser.error("--publish and --reference go with --check (a full-size run publishes by itself)")
    if args.publish and args.reference:
        parser.error("--publish already stores the check reference; give one of --publish, --reference")
    if args.check and args.quick:
        parser.error("--check runs its own size (quick workloads, 5 repeats); drop --quick")
    if args.check:
        unchecked = [n for n in args.names if n not in CHECK]
        if unchecked:
            parser.error(f"{', '.join(unchecked)}: no paired ratios to check; checkable: {', '.join(CHECK)}")
    names = args.names or list(CHECK if args.check else BENCHES)
    size = "check" if args.check else "quick" if args.quick else "full"
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results = {name: run(name, size) for name in names}
    mach = machine()
    md = table(results, mach)
    print(md)
    if args.quick:
        print(
            f"[bench] --quick: 2 repeat pairs per figure (the default is {DEFAULT_REPEATS}); a smoke run, its "
            "ranges are not comparable with the published ones, nothing written",
            file=sys.stderr,
        )
        return 0
    failed = 0
    if args.check:
        print(f"\nRe-run check ({mach['cpus']} cores, {mach['cpu_model'] or 'unknown CPU'}, load {load_average()}):")
        for name in names:
            for c in check_report(name, results[name], check_against(previous)):
                mark = {True: "inside ", False: "OUTSIDE", None: "-      "}[c.inside]
                print(f"  {mark} {c.figure}: {c.reason}")
                failed += c.inside is False
        print(
            f"{failed} figure(s) outside their published range"
            if failed
            else "every figure with a published range is inside it"
        )
        if not (args.publish or args.reference):
            return 1 if failed else 0
    merged = {**previous.get("results", {}), **({} if args.reference else results)}
    refs = dict(previous.get("check_references", {}))
    if args.check:
        refs.update({n: {"run": r.get("run"), "spread": r.get("spread")} for n, r in results.items()})
    RESULTS.write_text(
        json.dumps({"machine": mach, "results": merged, "check_references": refs}, indent=2, ensure_ascii=False) + "\n"
    )
    write_table(merged, mach, refs)
    return 1 if failed else 0


def write_table(merged: dict[str, Any], mach: dict[str, Any], refs: dict[str, Any]) -> None:
    text = TABLE_PAGE.read_text()
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        md = table({k: merged[k] for k in BENCHES if k in merged}, mach)
        md += "\n".join(references_table({k: refs[k] for k in BENCHES if k in refs}))
        TABLE_PAGE.write_text(f"{head}{BEGIN}\n{md}\n{END}{tail}")
        print(f"[bench] docs/benchmarks.md and {RESULTS.relative_to(ROOT)} updated", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
