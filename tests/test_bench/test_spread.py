"""bench/spread.py and bench/targets.py: paired ratios, the verdict against a target, the order repeats run
in, the re-run check, and the target registry. Pure: no services, no benchmark run."""

from __future__ import annotations

import pytest

from bench import targets
from bench.__main__ import BENCHES
from bench.spread import (
    DEFAULT_REPEATS,
    Recorder,
    Spread,
    Target,
    alternate,
    check,
    machine_facts,
    ratio_spread,
    verdict,
)


def test_ratios_are_per_repeat_pair_not_a_ratio_of_medians() -> None:
    # drift: the second pair ran on a loaded machine, both sides at half speed
    s = ratio_spread([90.0, 45.0, 95.0], [100.0, 50.0, 100.0])
    assert s.ratios == pytest.approx((0.9, 0.9, 0.95))
    assert (s.median, s.min, s.max, s.n) == pytest.approx((0.9, 0.9, 0.95, 3))
    # the ratio of medians would be 90/100 here too, but with the drift on one side only it differs:
    assert ratio_spread([45.0], [100.0]).median == pytest.approx(0.45)


@pytest.mark.parametrize(
    ("contestant", "baseline", "fix"),
    [([1.0, 2.0], [1.0], "alternate()"), ([], [], "at least one"), ([1.0], [0.0], "≤ 0")],
    ids=["unpaired", "empty", "zero-baseline"],
)
def test_unpaired_or_empty_values_are_refused(contestant: list[float], baseline: list[float], fix: str) -> None:
    with pytest.raises(ValueError, match=fix):
        ratio_spread(contestant, baseline)


@pytest.mark.parametrize(
    ("ratios", "target", "outcome", "words"),
    [
        ((0.91, 0.95, 0.99), "≥ 0.9", "met", "every pair"),
        ((0.64, 0.9, 0.95), "≥ 0.9", "not met", "straddles"),
        ((0.6, 0.7, 0.8), "≥ 0.9", "not met", "entirely outside"),
        ((0.9, 0.9), ">= 0.9", "met", "every pair"),  # the bound itself meets it
        ((0.3, 0.45), "≤ 0.5", "met", "every pair"),
        ((0.3, 0.55), "<= 0.5", "not met", "straddles"),
        ((0.6,), "≤ 0.5", "not met", "entirely outside"),
    ],
    ids=["above", "straddles", "below", "on-the-bound", "le-met", "le-straddles", "le-outside"],
)
def test_verdict_is_met_only_when_the_whole_range_is(
    ratios: tuple[float, ...], target: str, outcome: str, words: str
) -> None:
    got, reason = verdict(Spread(ratios), Target.parse(target))
    assert got == outcome and words in reason, reason


def test_no_target_is_never_met() -> None:
    assert verdict(Spread((2.0,)), None)[0] == "no target"


@pytest.mark.parametrize("text", ["0.9", "> 0.9", "≥ x", "≥ 0", ""], ids=["bare", "strict", "word", "zero", "empty"])
def test_a_malformed_target_is_refused_with_the_fix(text: str) -> None:
    with pytest.raises(ValueError, match=r"≥ 0\.9|positive ratio"):
        Target.parse(text)


def test_alternate_discards_warmups_interleaves_and_swaps_the_order() -> None:
    calls: list[str] = []

    def side(name: str, values: list[float]) -> object:
        def run() -> float:
            calls.append(name)
            return values.pop(0)

        return run

    a, b = alternate(side("A", [0.0, 1.0, 2.0, 3.0]), side("B", [0.0, 10.0, 20.0, 30.0]), repeats=3, warmup=1)  # type: ignore[arg-type]
    assert calls == ["B", "A", "B", "A", "A", "B", "B", "A"]
    assert (a, b) == ([1.0, 2.0, 3.0], [10.0, 20.0, 30.0])  # the warm-up pair's values are gone
    with pytest.raises(ValueError, match="at least 1"):
        alternate(lambda: 1.0, lambda: 1.0, repeats=0)


@pytest.mark.parametrize(
    ("median", "inside", "words"),
    [(0.88, True, "inside"), (0.85, True, "inside"), (0.64, False, "below"), (1.2, False, "above")],
    ids=["within", "on-the-edge", "below", "above"],
)
def test_check_finds_todays_median_inside_or_outside_the_published_range(
    median: float, inside: bool, words: str
) -> None:
    today = {"median": median, "min": median - 0.05, "max": median + 0.05, "pairs": 3}
    got = check("spark_stream.state_location", today, {"min": 0.85, "max": 0.95, "pairs": 5})
    assert got.inside is inside and words in got.reason and "0.85–0.95" in got.reason, got.reason


def test_check_without_a_side_says_which() -> None:
    today = {"median": 0.9, "min": 0.8, "max": 1.0, "pairs": 5}
    assert check("x", None, today).inside is None and "not measured" in check("x", None, today).reason
    legacy = check("x", today, {"median": 0.9})  # an old single figure: no min/max stored
    assert legacy.inside is None and "range pending" in legacy.reason


def test_recorder_reports_machine_load_repeats_warmup_and_verdicts() -> None:
    rec = Recorder(repeats=3, warmup="one untimed pass", targets={"a": Target.parse("≥ 0.9")})
    rec.figure("a", [0.8, 0.95, 0.92], [1.0, 1.0, 1.0], what="reader / plain consumer")
    rec.figure("b", [2.0], [1.0])
    out = rec.report()
    assert out["figures"]["a"]["verdict"] == "not met" and out["figures"]["a"]["target"] == "≥ 0.9"
    assert out["figures"]["b"]["verdict"] == "no target"
    assert out["figures"]["a"]["min"] == 0.8 and out["figures"]["a"]["max"] == 0.95
    m = out["machine"]
    assert m["cores"] and m["cpu_model"] and len(m["load_average_start"]) == len(m["load_average_end"]) == 3
    assert out["warmup"] == "one untimed pass" and f"default {DEFAULT_REPEATS}" in out["note"]
    assert Recorder(repeats=DEFAULT_REPEATS, warmup="").report()["note"] == ""
    assert machine_facts()["cpu_model"] != ""


def test_every_registered_target_names_a_benchmark() -> None:
    assert targets.TARGETS
    unknown = sorted({k.split(".")[0] for k in targets.TARGETS} - set(BENCHES))
    assert not unknown, f"targets for benchmarks not in BENCHES: {unknown}"
    assert targets.for_bench("spark_stream") == {"state_location": Target(">=", 0.9)}
