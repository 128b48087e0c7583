"""The fleet benchmark's pure logic (issue #48): its /proc parsing, the per-outbox slopes, whether a fleet's
connections fit, which outboxes a fleet's log says it leads, the trickle's latencies per window, and its rows
of the benchmark table.

The benchmark itself (``python -m bench outboxes``: services, relay processes, minutes long) is not part of
the suite.
"""

from __future__ import annotations

import pytest

from bench.__main__ import _outboxes_rows
from bench.bench_outboxes import (
    busy_share,
    cpu_times,
    fits,
    latency_summary,
    led_ids,
    pss_kb,
    slope,
    stat_cpu_ticks,
    status_fields,
    window_latencies_ms,
)

# /proc/<pid>/stat of a process whose name holds a space and a parenthesis: utime 1234, stime 56
STAT = "4242 (harvest (x) y) S 1 4242 4242 0 -1 4194560 5000 0 0 0 1234 56 0 0 20 0 15 0 100 300000000 18000"


def test_cpu_ticks_are_counted_after_the_command_names_last_parenthesis() -> None:
    assert stat_cpu_ticks(STAT) == (1234, 56)


def test_status_gives_rss_and_threads_and_refuses_a_text_without_them() -> None:
    text = "Name:\tpython\nVmPeak:\t  900000 kB\nVmRSS:\t   73544 kB\nThreads:\t123\n"
    assert status_fields(text) == {"rss_kb": 73544, "threads": 123}
    with pytest.raises(ValueError, match="VmRSS and Threads"):
        status_fields("Name:\tpython\nVmRSS:\t1 kB\n")


def test_pss_is_read_from_smaps_rollup() -> None:
    text = "55d0-7ffd ---p 00000000 00:00 0  [rollup]\nRss:  73544 kB\nPss:  50712 kB\nPss_Anon: 40000 kB\n"
    assert pss_kb(text) == 50712
    with pytest.raises(ValueError, match="Pss"):
        pss_kb("Rss: 1 kB\n")


def test_machine_busy_share_leaves_idle_and_iowait_out() -> None:
    # user nice system idle iowait irq softirq steal
    before = cpu_times("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\n")
    after = cpu_times("cpu  250 0 100 850 100 0 0 0 0 0\ncpu0 1 1 1 1 1 0 0 0 0 0\n")
    assert before == (150, 1000) and after == (350, 1300)
    assert busy_share(before, after) == pytest.approx(200 / 300, abs=1e-3)
    assert busy_share(after, after) is None


def test_slope_is_the_least_squares_line() -> None:
    b, a = slope([1, 10, 50], [61.7, 71.5, 115.1])
    assert b == pytest.approx(1.0898, abs=1e-3) and a == pytest.approx(60.6, abs=0.1)
    assert slope([1, 2], [3, 5]) == pytest.approx((2.0, 1.0))
    with pytest.raises(ValueError, match="two distinct xs"):
        slope([10, 10], [1, 2])


@pytest.mark.parametrize(
    ("size", "open_now", "expected"),
    [(50, 6, True), (76, 6, True), (77, 6, False), (76, 10, False), (100, 6, False)],
    ids=["50", "76", "77", "76-more-open", "100"],
)
def test_a_fleet_fits_when_its_connections_leave_the_reserved_slots_and_the_margin(
    size: int, open_now: int, expected: bool
) -> None:
    # 400 slots, 3 reserved, 6 open, 8 kept for the bench: 383 left, 5 per outbox -> 76.6 outboxes
    assert fits(size, 5.0, 400, 3, open_now, 8) is expected


def test_led_ids_are_the_fleets_own_elections() -> None:
    log = "\n".join(
        [
            "2026-11-29 19:04:32,790 INFO harvest_outbox.producer.harvest: f10/t007: elected leader, leader id x",
            "2026-11-29 19:04:32,791 INFO harvest_outbox.producer.harvest: f10/t001: elected leader, leader id x",
            "2026-11-29 19:04:32,792 INFO harvest_outbox.producer.harvest: f1/t002: elected leader, leader id x",
            "2026-11-29 19:04:32,793 INFO harvest_outbox.producer.election.postgres: f10/t003: holding the lock",
        ]
    )
    assert led_ids(log, "f10") == {"t007", "t001"}
    assert led_ids(log, "f1") == {"t002"}
    # a fleet run by worker processes: their relays are <name>-w<k>/<id>, their lines start with [w<k>]
    workers = "\n".join(
        [
            "2026-11-30 16:25:14,014 INFO [w1] harvest_outbox.producer.harvest: f1-w1/t004: elected leader, leader id x",
            "2026-11-30 16:25:14,015 INFO [w0] harvest_outbox.producer.harvest: f1-w0/t000: elected leader, leader id x",
            "2026-11-30 16:25:14,016 INFO [w0] harvest_outbox.producer.harvest: f10-w0/t009: elected leader, leader id x",
        ]
    )
    assert led_ids(workers, "f1") == {"t004", "t000"}


def test_window_latencies_take_the_rows_committed_in_the_window_and_count_the_lost() -> None:
    ms = 1_000_000
    commit = {0: 0, 1: 100 * ms, 2: 200 * ms, 3: 300 * ms}
    receipt = {0: 5 * ms, 1: 110 * ms, 3: 340 * ms}
    lat, lost = window_latencies_ms(commit, receipt, 100 * ms, 400 * ms)
    assert lat == [10.0, 40.0] and lost == 1  # row 0 before the window, row 2 never received
    assert latency_summary(lat) == {"p50_ms": 25.0, "p99_ms": 39.7, "max_ms": 40.0}
    assert latency_summary([]) == {"p50_ms": None, "p99_ms": None, "max_ms": None}


def _fig(median: float, lo: float, hi: float, target: str | None = None, verdict: str = "no target") -> dict:
    return {"median": median, "min": lo, "max": hi, "pairs": 2, "target": target, "verdict": verdict}


def test_table_rows_name_each_part_and_its_verdict() -> None:
    result = {
        "setup": {"rows": 20000, "burst": 100000},
        "idle": {
            "sizes": {"1": {}, "10": {}, "50": {}},
            "skipped": {"100": "100 outboxes x 5 connections = 500 > 383 slots"},
            "per_outbox": {
                "rss_mb": {"slope": 1.09},
                "threads": {"slope": 12.0},
                "connections": {"slope": 5.0},
                "idle_cpu_share": {"slope": 0.0091},
            },
        },
        "cpu": {"fleet": {"cpu_us_per_row": {"median": 28.5}}, "single": {"cpu_us_per_row": {"median": 9.5}}},
        "fairness": {"trickle_rate": 50.0, "burst": [{"p99_ms": 138.3}, {"p99_ms": 98.5}]},
        "standby": {"outboxes": 10, "connections": 40, "threads": 113, "idle_cpu_share": 0.0239, "rss_mb": 70.4},
        "processes_vs_fleet": {
            "fleet": {"pss_mb": 50.7},
            "processes": {"pss_mb": 340.5},
            "fleet_over_processes": {"pss_mb": 0.149, "rss_mb": 0.118, "threads": 0.95, "connections": 1.0},
        },
        "spread": {
            "figures": {
                "cpu_per_row": _fig(3.1, 1.95, 4.29, "≤ 1.2", "not met"),
                "cpu_per_row_one_busy": _fig(1.7, 1.6, 1.8),
                "trickle_p99_burst": _fig(1.5, 1.2, 1.8, "≤ 2", "met"),
                "trickle_p50_burst": _fig(1.9, 1.7, 2.2),
            }
        },
    }
    rows = _outboxes_rows(result)
    assert [r[0].split(",")[0] for r in rows] == [
        "Fleet idle cost per outbox",
        "Fleet CPU per relayed row",
        "Fleet fairness: a 50 rows/s trickle's commit->receipt p99 while another outbox drains a 100",
        "A second fleet process on the same 10 outboxes",
        "10 outboxes in one fleet process / in 10 one-outbox processes (PSS MB)",
    ]
    assert rows[3][1] == "40, 113, 2.4%"
    assert "100 not started" in rows[0][2]
    assert rows[1][3] == "≤ 1.2: not met (1.95–4.29)"
    assert rows[2][1] == "138" and rows[2][3] == "≤ 2: met"
    assert "0.15" in rows[4][2]
    assert _outboxes_rows({}) == []
