"""The process-separated latency benchmark's pure logic (issue #51): its percentiles, the window after the
warm-up, lost rows, the split of each row's time at its produce stamp, the worst rows' timeline, the ratios to
Kafka alone, and its rows of the benchmark table.

The benchmark itself (``python -m bench latency``: services, a relay process, minutes long) is not part of
the suite.
"""

from __future__ import annotations

import statistics

import pytest

from bench.__main__ import _latency_rows
from bench.bench_latency import (
    ALL_CONFIGS,
    latency_figures,
    merge_writers,
    minimal_yaml,
    percentile,
    ratios,
    summary_ms,
)

MS = 1_000_000  # ns


def test_percentiles_interpolate_between_closest_ranks() -> None:
    xs = [float(x) for x in range(1, 101)]  # 1..100
    assert percentile(xs, 0) == 1
    assert percentile(xs, 100) == 100
    assert percentile(xs, 50) == pytest.approx(50.5)
    assert percentile(xs, 99) == pytest.approx(99.01)
    assert percentile(xs, 99.9) == pytest.approx(99.901)
    assert percentile([7.0], 99.9) == 7
    assert percentile([], 50) is None
    # the same as statistics' inclusive method
    assert percentile(xs, 90) == pytest.approx(statistics.quantiles(xs, n=10, method="inclusive")[-1])


def test_a_percentile_outside_0_to_100_is_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0, 2.0], 101)


def test_the_summary_is_in_ms_and_its_max_is_the_worst() -> None:
    s = summary_ms([i * MS for i in range(1, 1001)])  # 1..1000 ms
    assert s == {"p50_ms": 500.5, "p99_ms": 990.01, "p99_9_ms": 999.0, "max_ms": 1000.0}
    assert summary_ms([]) == {"p50_ms": None, "p99_ms": None, "p99_9_ms": None, "max_ms": None}


def _run(
    n: int, rate: float, latency_ms: dict[int, float], produce_ms: float = 1.0
) -> tuple[list[int], dict[int, tuple[int, int]]]:
    """Rows committed on schedule from t = 1000 s; row i received ``latency_ms[i]`` (default 2) after its
    commit, its record stamped ``produce_ms`` after it (whole ms, as Kafka's timestamps)."""
    t0 = 1_000 * 10**9
    commit = [t0 + int(i * 1e9 / rate) for i in range(n)]
    received = {
        i: ((c + int(produce_ms * MS)) // MS, c + int(latency_ms.get(i, 2.0) * MS)) for i, c in enumerate(commit)
    }
    return commit, received


def test_the_warmup_rows_are_left_out_and_lost_rows_counted() -> None:
    commit, received = _run(300, 100.0, {5: 900.0})  # row 5 (in the warm-up) is the slowest of all
    del received[250]
    f = latency_figures(commit, commit, received, warmup_s=1.0)
    assert f["rows"] == 200  # rows 100..299: committed 1 s or more after the first
    assert f["received"] == 199 and f["lost"] == 1
    assert f["max_ms"] == 2.0  # row 5 is not in the window
    assert all(w["row"] >= 100 for w in f["worst"])


def test_the_worst_rows_timeline_splits_at_the_produce_stamp() -> None:
    commit, received = _run(1000, 100.0, {500: 80.0, 700: 50.0})
    # 60 ms before produce, 20 after; the consumer saw it in partition 3 at offset 41
    received[500] = ((commit[500] + 60 * MS) // MS, commit[500] + 80 * MS, 3, 41)
    done = [c + MS // 2 for c in commit]  # COMMIT took 0.5 ms
    f = latency_figures(commit, done, received, warmup_s=0.0, worst=2)
    assert [w["row"] for w in f["worst"]] == [500, 700]
    w = f["worst"][0]
    assert w == {
        "row": 500,
        "at_s": 5.0,
        "commit_unix_s": commit[500] / 1e9,  # to find the row in the broker's request log
        "total_ms": 80.0,
        "commit_call_ms": 0.5,
        "commit_to_produce_ms": 60.0,
        "produce_to_receipt_ms": 20.0,
        "partition": 3,
        "offset": 41,
    }
    assert "offset" not in f["worst"][1]  # a consumer that did not record where the row was
    assert f["worst"][1]["commit_to_produce_ms"] == 1.0 and f["worst"][1]["produce_to_receipt_ms"] == 49.0
    assert f["commit_to_produce"]["max_ms"] == 60.0
    # above p99 (every other row took 2 ms): rows 500 and 700; before produce 60 + 1 of their 80 + 50 ms
    assert f["above_p99"] == {"rows": 2, "mean_ms": 65.0, "commit_to_produce_share": round(61 / 130, 3)}


def test_an_empty_run_has_no_figures() -> None:
    assert latency_figures([], [], {}, 1.0) == {"rows": 0}


def test_ratios_to_kafka_alone() -> None:
    run = {"p50_ms": 4.0, "p99_ms": 30.0, "p99_9_ms": None, "max_ms": 100.0}
    kafka = {"p50_ms": 2.0, "p99_ms": 10.0, "p99_9_ms": 20.0, "max_ms": 0.0}
    assert ratios(run, kafka) == {"p50": 2.0, "p99": 3.0, "p99_9": None, "max": None}


def test_the_configurations_cover_both_layouts_modes_and_sharding() -> None:
    assert len(ALL_CONFIGS) == 8
    assert {c.split("/")[0] for c in ALL_CONFIGS} == {"mark", "cursor"}
    assert {c.split("/")[1] for c in ALL_CONFIGS} == {"at_least_once", "sequenced"}
    assert {c.split("/")[2] for c in ALL_CONFIGS} == {"1", "2"}


def test_the_yaml_is_a_new_users(tmp_path: object) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    text = minimal_yaml(tmp_path / "h.yaml", "dbname=x", "k:9092", "s.outbox", "g", True, "cursor", 2).read_text()
    assert "limits" not in text and "producerKafkaConfig" not in text  # nothing tuned
    # the cursor layout is what init-db gives a new outbox with outboxLayout unset: a new user writes nothing
    assert "outboxLayout" not in text and "shards: 2" in text and "uuidSequencing: true" in text
    plain = minimal_yaml(tmp_path / "p.yaml", "dbname=x", "k:9092", "s.outbox", "g", False, "mark", 1).read_text()
    assert "outboxLayout: mark" in plain and "shards" not in plain


def test_the_table_rows_name_each_run_and_its_ratio() -> None:
    run = {"p50_ms": 3.0, "p99_ms": 20.0, "p99_9_ms": 40.0, "max_ms": 60.0, "lost": 0}
    result = {
        "setup": {"seconds": 60.0},
        "rates": {
            "500": {
                "kafka": {"p50_ms": 1.5, "p99_ms": 5.0, "p99_9_ms": 8.0, "max_ms": 12.0},
                "cursor/sequenced/2": {
                    "plain": {**run, "to_kafka_alone": {"p50": 2.0, "p99": 4.0, "p99_9": 5.0, "max": 5.0}},
                    "read_committed": {**run, "to_kafka_alone": {}},
                },
            }
        },
    }
    rows = _latency_rows(result)
    assert len(rows) == 3
    assert rows[0][1] == "1.50 / 5.00 / 8.00 / 12"
    assert "cursor, sequenced, shards 2:" in rows[1][0] and rows[1][1] == "3.00 / 20 / 40 / 60"
    assert rows[1][2].startswith("2.00x / 4.00x / 5.00x / 5.00x Kafka alone")
    assert "ReadCommittedIter" in rows[2][0]


def test_rows_no_writer_wrote_are_left_out_and_writers_merge() -> None:
    a = {"commit_ns": [10, 0, 30, 0], "done_ns": [11, 0, 31, 0], "written": 2, "elapsed_s": 2.0, "max_lag_ms": 1.5}
    b = {"commit_ns": [0, 20, 0, 0], "done_ns": [0, 21, 0, 0], "written": 1, "elapsed_s": 4.0, "max_lag_ms": 0.5}
    merged = merge_writers([a, b])
    assert merged == {
        "commit_ns": [10, 20, 30, 0],
        "done_ns": [11, 21, 31, 0],
        "achieved_rate": 0.8,  # 3 rows over the slower writer's 4 s
        "max_lag_ms": 1.5,
    }
    received = {0: (0, 10 + 2 * MS), 1: (0, 20 + 4 * MS), 2: (0, 30 + 6 * MS)}
    f = latency_figures(merged["commit_ns"], merged["done_ns"], received, warmup_s=0.0)
    assert f["rows"] == 3 and f["lost"] == 0  # row 3 was never written: neither in the window nor lost
    assert f["max_ms"] == 6.0
