"""The spread of a benchmark figure: repeats run in alternation, the ratio of each repeat pair, its median
and range, the machine it ran on, and the verdict against the figure's registered target.

A benchmark that publishes a ratio (contestant against a baseline measured in the same run) reports it
through a :class:`Recorder`: ``figure()`` takes the contestant's and the baseline's per-repeat values and
stores the paired ratios; ``report()`` returns the ``"spread"`` object the benchmark puts in its JSON
(``bench/__main__.py`` renders it, ``./dev bench --check`` compares it with the published one).

Invariants (tests/test_bench/test_spread.py):

- a ratio is taken per repeat pair (contestant *i* / baseline *i*), never as a ratio of medians, so drift
  between repeats (another process on a shared machine) hits both sides of a pair alike;
- ``alternate()`` runs warm-ups first and discards them, then baseline and contestant interleaved, one
  of each per repeat, the order within a pair swapped each repeat (B A, A B, B A, ...): drift between
  repeats hits both sides, and neither side always runs first (a slow start or a warming cache would
  otherwise favour one);
- the two sides of a figure must have the same number of repeats (a pair per repeat), and at least one;
- a figure *meets* its target only if every paired ratio does (its min for "≥", its max for "≤"): a range
  that straddles the target is "not met", as is one wholly on the wrong side; no registered target is
  "no target", never "met";
- ``check()`` finds today's figure *inside* when its median ratio lies within the published min–max
  (inclusive), *outside* otherwise; a figure missing either side is neither (``None``), with the reason;
- fewer repeats than ``DEFAULT_REPEATS`` are reported as such in the spread's ``note``.

Pure apart from ``machine_facts()`` / ``load_average()`` (which read /proc) and ``alternate()`` (which runs
what it is given): no services.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_REPEATS",
    "Check",
    "Recorder",
    "Spread",
    "Target",
    "alternate",
    "check",
    "load_average",
    "machine_facts",
    "ratio_spread",
    "verdict",
]

DEFAULT_REPEATS = 5  # repeat pairs per figure by default; a median of 3 cannot carry a 0.9 target (issue #52)


@dataclass(frozen=True)
class Target:
    """A ratio target: ``op`` is ">=" (a rate ratio, higher is better) or "<=" (a cost or latency ratio)."""

    op: str
    value: float

    def __post_init__(self) -> None:
        if self.op not in (">=", "<="):
            raise ValueError(f"Target.op: {self.op!r} is not a comparison; use '>=' or '<='")
        if not self.value > 0:
            raise ValueError(f"Target.value: {self.value!r} is not a positive ratio; give e.g. 0.9")

    @classmethod
    def parse(cls, text: str) -> Target:
        """``"≥ 0.9"``, ``">= 0.9"``, ``"≤ 1.2"`` or ``"<= 1.2"``."""
        m = re.fullmatch(r"\s*(≥|>=|≤|<=)\s*([0-9]*\.?[0-9]+)\s*", text)
        if not m:
            raise ValueError(f"target {text!r} is not a comparison with a ratio; write e.g. '≥ 0.9' or '≤ 1.2'")
        return cls(">=" if m.group(1) in ("≥", ">=") else "<=", float(m.group(2)))

    def met_by(self, ratio: float) -> bool:
        return ratio >= self.value if self.op == ">=" else ratio <= self.value

    def __str__(self) -> str:
        return f"{'≥' if self.op == '>=' else '≤'} {self.value:g}"


@dataclass(frozen=True)
class Spread:
    """The paired ratios of one figure: ``ratios[i]`` = contestant[i] / baseline[i]."""

    ratios: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.ratios:
            raise ValueError("Spread.ratios: empty; a figure needs at least one repeat pair")

    @property
    def median(self) -> float:
        return float(statistics.median(self.ratios))

    @property
    def min(self) -> float:
        return min(self.ratios)

    @property
    def max(self) -> float:
        return max(self.ratios)

    @property
    def n(self) -> int:
        return len(self.ratios)

    def as_json(self) -> dict[str, Any]:
        return {
            "median": round(self.median, 3),
            "min": round(self.min, 3),
            "max": round(self.max, 3),
            "pairs": self.n,
            "ratios": [round(r, 3) for r in self.ratios],
        }


def ratio_spread(contestant: Sequence[float], baseline: Sequence[float]) -> Spread:
    """The ratio of each repeat pair. Both sides must hold one value per repeat, in the order they ran."""
    if len(contestant) != len(baseline):
        raise ValueError(
            f"ratio_spread: {len(contestant)} contestant values against {len(baseline)} baseline values; "
            "run both once per repeat (alternate()) so each repeat is a pair"
        )
    if any(b <= 0 for b in baseline):
        raise ValueError(f"ratio_spread: baseline values {list(baseline)} include one ≤ 0; no ratio to it")
    return Spread(tuple(c / b for c, b in zip(contestant, baseline, strict=True)))


def _r(v: float, digits: int = 2) -> str:
    """``digits`` decimals; as many significant digits below 0.1, where the decimals would read 0.00."""
    return f"{v:.{digits}f}" if abs(v) >= 0.1 else f"{v:.{digits}g}"


def verdict(spread: Spread, target: Target | None) -> tuple[str, str]:
    """("met" | "not met" | "no target", one-line reason)."""
    if target is None:
        return "no target", "no target registered for this figure"
    rng = f"{_r(spread.min, 3)}–{_r(spread.max, 3)}"
    worst = spread.min if target.op == ">=" else spread.max
    best = spread.max if target.op == ">=" else spread.min
    if target.met_by(worst):
        return "met", f"every pair's ratio ({rng}, {spread.n} pairs) is {target}"
    if target.met_by(best):
        return "not met", f"the ratio's range {rng} ({spread.n} pairs) straddles the target {target}"
    return "not met", f"the ratio's range {rng} ({spread.n} pairs) is entirely outside the target {target}"


def alternate(
    contestant: Callable[[], float], baseline: Callable[[], float], repeats: int, warmup: int = 0
) -> tuple[list[float], list[float]]:
    """Run ``warmup`` untimed pairs (results discarded), then ``repeats`` pairs in alternation: B A, A B,
    B A, ... (each call returns the repeat's value). Returns (contestant values, baseline values)."""
    if repeats < 1:
        raise ValueError(f"alternate: repeats={repeats}; give at least 1 (default {DEFAULT_REPEATS})")
    for _ in range(warmup):
        baseline()
        contestant()
    a: list[float] = []
    b: list[float] = []
    for i in range(repeats):
        if i % 2 == 0:
            b.append(baseline())
            a.append(contestant())
        else:
            a.append(contestant())
            b.append(baseline())
    return a, b


def load_average() -> list[float]:
    """The 1, 5 and 15-minute load averages (empty where /proc/loadavg is missing)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def machine_facts() -> dict[str, Any]:
    """CPU model (/proc/cpuinfo), core count and the load average now."""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpu_model": cpu or "unknown", "cores": os.cpu_count(), "load_average": load_average()}


class Recorder:
    """Collects a benchmark's figures and the facts around them (machine, load at start and end, repeats,
    warm-up). ``targets``: figure name -> Target (bench/targets.py's, for this benchmark)."""

    def __init__(self, repeats: int, warmup: str, targets: Mapping[str, Target] | None = None) -> None:
        if repeats < 1:
            raise ValueError(f"Recorder.repeats: {repeats}; give at least 1 (default {DEFAULT_REPEATS})")
        self.repeats = repeats
        self.warmup = warmup
        self.targets = dict(targets or {})
        self.machine = machine_facts()
        self.figures: dict[str, dict[str, Any]] = {}

    def figure(
        self,
        name: str,
        contestant: Sequence[float],
        baseline: Sequence[float],
        what: str = "",
        target_key: str | None = None,
    ) -> dict[str, Any]:
        """Record one figure from per-repeat values (same order they ran) and print its line to stderr.
        ``target_key``: the registered target's name when it is not ``name`` (one target for the figure
        at several workload sizes; "" for none)."""
        spread = ratio_spread(contestant, baseline)
        target = self.targets.get(name if target_key is None else target_key)
        outcome, reason = verdict(spread, target)
        fig = {
            **spread.as_json(),
            "what": what,
            "target": str(target) if target else None,
            "verdict": outcome,
            "reason": reason,
        }
        self.figures[name] = fig
        print(
            f"[spread] {name}: ratio {spread.median:.3f} ({spread.min:.3f}–{spread.max:.3f}, {spread.n} pairs); "
            f"{outcome}: {reason}",
            file=sys.stderr,
            flush=True,
        )
        return fig

    def report(self) -> dict[str, Any]:
        note = (
            f"{self.repeats} repeats, fewer than the default {DEFAULT_REPEATS}: the range is narrower than a "
            "default run's would be"
            if self.repeats < DEFAULT_REPEATS
            else ""
        )
        return {
            "machine": {
                "cpu_model": self.machine["cpu_model"],
                "cores": self.machine["cores"],
                "load_average_start": self.machine["load_average"],
                "load_average_end": load_average(),
            },
            "repeats": self.repeats,
            "warmup": self.warmup,
            "note": note,
            "figures": self.figures,
        }


@dataclass(frozen=True)
class Check:
    """One figure of ``./dev bench --check``: ``inside`` is None when either side is missing."""

    figure: str
    inside: bool | None
    reason: str


def check(figure: str, today: Mapping[str, Any] | None, published: Mapping[str, Any] | None) -> Check:
    """Is today's median ratio within the published range (min–max, inclusive)?"""
    if today is None:
        return Check(figure, None, "not measured today (the run did not produce this figure)")
    now = f"today {_r(today['median'])} ({_r(today['min'])}–{_r(today['max'])}, {today['pairs']} pairs)"
    if published is None or "min" not in published:
        return Check(figure, None, f"{now}; no published range yet (range pending)")
    lo, hi = published["min"], published["max"]
    pub = f"published {_r(lo)}–{_r(hi)} ({published.get('pairs', '?')} pairs)"
    med = today["median"]
    if lo <= med <= hi:
        return Check(figure, True, f"inside: {now}, {pub}")
    side = "below" if med < lo else "above"
    return Check(figure, False, f"outside: {now}, median {side} the {pub}")
