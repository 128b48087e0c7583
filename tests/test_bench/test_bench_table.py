"""bench/__main__.py's table and re-run check, from hand-made results (no benchmark runs): a ratio with a
recorded spread shows its median and range, one from before ranges were recorded is marked "range pending"
(never given a range), a target's verdict reaches the target column, and ``--check`` compares today's median
with the published range, saying when the published run had other arguments."""

from __future__ import annotations

from typing import Any

from bench.__main__ import (
    BENCHES,
    CHECK,
    ROWS,
    bench_args,
    check_against,
    check_report,
    effective_args,
    references_table,
    table,
)

MACHINE = {"date": "2026-11-29", "cpus": 2, "cpu_model": "AMD EPYC", "memory": "23 GiB", "python": "3.11.7"}


def _stream(figure: dict[str, Any] | None, args: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {
        "records": 100_000,
        "state_location_median_rows_per_s": 90_000,
        "state_location_ratio_median": 0.9,
        "readCommittedStream_median_rows_per_s": 40_000,
        "ratio_median": 0.4,
        "run": {"date": "2026-11-29", "size": "check", "args": args},
    }
    if figure is not None:
        result["spread"] = {
            "machine": {
                "cpu_model": "AMD EPYC",
                "cores": 2,
                "load_average_start": [1.5, 1, 1],
                "load_average_end": [2.5, 1, 1],
            },
            "repeats": 5,
            "warmup": "1 untimed round",
            "note": "",
            "figures": {"state_location": figure},
        }
    return result


FIG = {"median": 0.7, "min": 0.64, "max": 0.95, "pairs": 5, "target": "≥ 0.9", "verdict": "not met"}


def test_a_ratio_with_a_spread_shows_its_range_and_verdict() -> None:
    row = ROWS["spark_stream"](_stream(FIG, []))[0]
    assert "0.70 (0.64–0.95, 5 pairs)" in row[2], row
    assert row[3] == "ratio ≥ 0.9: not met (0.64–0.95)"
    md = table({"spark_stream": _stream(FIG, ["--records", "100000"])}, MACHINE)
    assert (
        "| spark_stream | 2026-11-29 | check: `--records 100000` | 2 × AMD EPYC | 1.5–2.5 | 5 | 1 untimed round |" in md
    )


def test_an_old_single_figure_is_marked_pending_not_given_a_range() -> None:
    rows = ROWS["spark_stream"](_stream(None, []))
    assert "0.90 (median only, range pending)" in rows[0][2]
    assert "0.40 (median only, range pending)" in rows[1][2]
    assert rows[0][3] == "ratio ≥ 0.9"  # no verdict without a spread


def test_check_compares_todays_median_with_the_published_range() -> None:
    published = {"spark_stream": _stream(FIG, ["--records", "100000", "--repeat", "5"])}
    inside = _stream({**FIG, "median": 0.8}, ["--records", "100000", "--repeat", "5"])
    outside = _stream({**FIG, "median": 0.5, "min": 0.45}, ["--records", "100000", "--repeat", "5"])
    [c] = check_report("spark_stream", inside, published)
    assert c.inside is True and c.figure == "spark_stream.state_location" and "[published from" not in c.reason
    [c] = check_report("spark_stream", outside, published)
    assert c.inside is False and "below" in c.reason
    [c] = check_report("spark_stream", _stream({**FIG, "median": 0.8}, ["--repeat", "5"]), published)
    assert "[published from check run, arguments ['--records', '100000', '--repeat', '5']]" in c.reason
    # the same command line, one option given twice: the same arguments, nothing to note
    twice = _stream({**FIG, "median": 0.8}, ["--records", "100000", "--repeat", "2", "--repeat", "5"])
    [c] = check_report("spark_stream", twice, published)
    assert "[published from" not in c.reason
    [c] = check_report("spark_stream", inside, {})
    assert c.inside is None and "range pending" in c.reason


def test_check_size_is_the_quick_workload_amended_with_the_default_repeats() -> None:
    assert set(CHECK) <= set(BENCHES)
    for name in CHECK:
        args = bench_args(name, "check")
        assert args[: len(BENCHES[name][2])] == BENCHES[name][2] and args[-1] == "5", (name, args)


def test_an_option_given_twice_keeps_its_last_value() -> None:
    assert effective_args(["--rows", "2000", "--repeat", "2", "--quick", "--rows", "10000"]) == [
        "--rows",
        "10000",
        "--repeat",
        "2",
        "--quick",
    ]


def test_check_compares_with_the_reference_of_its_size_and_the_table_lists_references() -> None:
    full = _stream(None, [])  # the table's full-size result, from before ranges
    ref = _stream(FIG, ["--records", "100000"])
    stored = {"results": {"spark_stream": full, "consumer": {"x": 1}}, "check_references": {"spark_stream": ref}}
    against = check_against(stored)
    assert against["spark_stream"] is ref and against["consumer"] == {"x": 1}
    rows = references_table({"spark_stream": ref})
    line = next(r for r in rows if r.startswith("| spark_stream.state_location"))
    assert "0.70 (0.64–0.95, 5 pairs) | ≥ 0.9: not met | 2026-11-29, `--records 100000`, load 1.5–2.5 |" in line


def test_several_verdicts_name_their_targets_and_a_miss_shows_three_decimals() -> None:
    from bench.__main__ import _target

    figs = {
        "a": {"median": 0.04, "min": 0.036, "max": 0.041, "pairs": 5, "target": "≤ 0.5", "verdict": "met"},
        "b": {"median": 1.2, "min": 0.698, "max": 1.69, "pairs": 5, "target": "≥ 0.7", "verdict": "not met"},
    }
    r = {"spread": {"figures": figs}}
    assert (
        _target(r, "WAL ≤ 0.5x, drain ≥ 0.7x", "a", "b")
        == "WAL ≤ 0.5x, drain ≥ 0.7x: ≤ 0.5 met; ≥ 0.7 not met (0.698–1.69)"
    )
    assert _target(r, "", "a") == ""  # no target text in the table: no verdict either
