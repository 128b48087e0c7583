"""The Debezium side-by-side benchmark's pure logic: event ids that name their row, the duplicate and
loss count every read-back relies on, and its README rows.

The benchmark itself (``python -m bench debezium``, services, Debezium, minutes long) is not part of
the suite.
"""

from __future__ import annotations

import uuid

import pytest

from bench.__main__ import _debezium_rows
from bench.bench_debezium import cursor_summary, event_id, row_of, summary, tally


@pytest.mark.parametrize("i", [0, 1, 999_999, 2**40 - 1])
def test_an_event_id_is_a_uuid_that_names_its_burst_and_row(i: int) -> None:
    eid = event_id("ab12", i)
    assert str(uuid.UUID(eid)) == eid  # Postgres prints it back as it was written
    assert row_of(eid.encode(), b"ab12") == i
    assert row_of(eid.encode(), b"ab13") is None


def test_event_ids_do_not_come_in_index_order() -> None:
    ids = [event_id("ab12", i) for i in range(100)]
    assert len(set(ids)) == 100
    assert ids != sorted(ids)  # scattered over the primary key, as random ids are


@pytest.mark.parametrize(
    "rows_seen, expected",
    [
        ([0, 1, 2], {"records": 3, "duplicates": 0, "losses": 0}),
        ([0, 1, 1, 2, 2, 2], {"records": 6, "duplicates": 3, "losses": 0}),
        ([0, 2], {"records": 2, "duplicates": 0, "losses": 1}),
        ([], {"records": 0, "duplicates": 0, "losses": 3}),
        ([1] * 300, {"records": 300, "duplicates": 299, "losses": 2}),
    ],
)
def test_tally_counts_duplicates_and_losses(rows_seen: list[int], expected: dict[str, int]) -> None:
    ids = [event_id("ab12", i).encode() for i in rows_seen]
    assert tally(ids, "ab12", 3) == expected


def test_tally_ignores_other_bursts_and_rows_beyond_the_burst() -> None:
    ids = [event_id("ab12", 0).encode(), event_id("ffff", 1).encode(), event_id("ab12", 5).encode(), b"not-an-id"]
    assert tally(ids, "ab12", 2) == {"records": 1, "duplicates": 0, "losses": 1}


def test_readme_rows_render_with_figures_missing() -> None:
    rows = _debezium_rows({"setup": {"rows": 1_000_000}, "at_least_once": {"burst": {"rows_per_s": 100_000}}})
    assert rows and all(len(row) == 4 for row in rows)
    assert rows[0][0].startswith("Debezium side by side: 1M-row burst")
    assert rows[0][1] == "100,000 / n/a / n/a"


def _burst(write: float, relay: float, vacuum: float, cpu: float, rate: int = 50_000) -> dict[str, object]:
    return {
        "rows_per_s": rate,
        "wal_write_bytes_per_100k": write,
        "wal_relay_bytes_per_100k": relay,
        "vacuum_after": {"wal_bytes_per_100k": vacuum, "postgres_cpu_s_per_100k": 0.01},
        "postgres_cpu_s_per_100k": cpu,
        "relay_cpu_s_per_100k": 0.5,
        "checkpoints": 1,
    }


def _report() -> dict[str, object]:
    trickle = {"p50_ms": 10.0, "p99_ms": 20.0}
    mark = {"burst": _burst(37e6, 50e6, 5e6, 0.6), "trickle": trickle}
    cursor = {"burst": _burst(36e6, 0.1e6, 0.2e6, 0.2), "trickle": trickle}
    return {
        "setup": {"rows": 1_000_000},
        "at_least_once": mark,
        "sequenced": mark,
        "cursor_at_least_once": cursor,
        "cursor_sequenced": {"burst": _burst(36e6, 0.1e6, 0.2e6, 0.3), "trickle": trickle},
        "debezium": {
            "burst": _burst(30e6, 0.0, 0.2e6, 0.25, 70_000),
            "burst_insert_delete": _burst(45e6, 0.0, 0.2e6, 0.35),
            "trickle": trickle,
        },
    }


def test_the_cursor_layouts_targets_are_judged_in_the_same_run() -> None:
    out = cursor_summary(_report())
    assert out["at_least_once"]["relay_wal_to_mark"] == round(0.3e6 / 55e6, 3)
    assert out["at_least_once"]["total_wal_to_debezium_insert_delete"] == round(36.3e6 / 45.2e6, 3)
    assert out["at_least_once"]["targets_met"] == {
        "relay_wal_to_mark <= 0.5": True,
        "total_wal_to_debezium_insert_delete <= 1": True,
        "postgres_cpu_to_debezium <= 1": True,
    }
    assert out["sequenced"]["targets_met"]["postgres_cpu_to_debezium <= 1"] is False  # 0.3 s against 0.25 s
    assert set(summary(_report())) == {"at_least_once", "sequenced", "cursor_at_least_once", "cursor_sequenced"}


def test_the_cursor_rows_render_and_are_left_out_when_the_run_had_no_cursor_contestant() -> None:
    report = _report()
    report["harvest_to_debezium"] = summary(report)
    report["cursor_layout"] = cursor_summary(report)
    rows = _debezium_rows(report)
    cursor_rows = [row for row in rows if "outboxLayout cursor" in row[0]]
    assert len(cursor_rows) == 3 and all(len(row) == 4 for row in cursor_rows)
    assert cursor_rows[0][1] == "0.30 / 0.30 / 55 / 0.20 / 0.20"  # relay side, MB per 100k rows
    assert "cursor / mark 0.005x / 0.005x" in cursor_rows[0][2]
    assert cursor_rows[2][1] == "0.20 / 0.30 / 0.25"
    for name in ("cursor_at_least_once", "cursor_sequenced", "cursor_layout"):
        del report[name]
    assert not [row for row in _debezium_rows(report) if "outboxLayout cursor" in row[0]]
