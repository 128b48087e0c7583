"""The soak's report: a verdict, a table per run and a timeline plot, from the runs' recorded histories.

    python -m harvest_outbox.harvest_local.soak_report DIR     (or: python scripts/soak.py --report DIR)

``DIR`` is a soak folder (``.work/soak/<started>/``): one sub-folder per run holding its logs and its
``history.jsonl`` (harvest_local/history.py), and ``soak.json`` (the command). Writes ``report.md`` and
``timeline.png`` there and prints the verdict line; exits 0 when the verdict is OK, 1 otherwise.

The verdict is OK only when every run finished and every reader's verdict in every run is clean (0 lost,
duplicated, reordered or rolled-back rows); FAIL when any run found a violation or raised; INCOMPLETE when
none did but a run was cut short (the soak was stopped mid-run: that run has no verdict).

The timeline: x is wall time over the whole soak, cut into stacked panels of :data:`PANEL_SECONDS` each.
Each panel has a lag axis (per reader, rows committed by the writers and not yet in the reader's table; and
the rows waiting in the outbox, the relays' lag), the runs as shaded bands (red: a violation or an error),
and under it a fault strip: every fault a bar from its start to its end, named (kind and target), packed
into lanes (harvest_local/_lanes.py) so that no two labels overlap. The legend sits below the panels, outside
every axis.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harvest_outbox.harvest_local._lanes import char_seconds, place_labels
from harvest_outbox.harvest_local.history import FILE_NAME, RunHistory, read

#: Seconds of wall time per panel of the timeline (a shorter soak gets one panel of its own length).
PANEL_SECONDS = 300.0
_WIDTH_IN = 14.0
_FONT = 7.0
_VIOLATIONS = ("lost", "duplicates", "order_violations", "phantoms")


@dataclass(frozen=True)
class SoakVerdict:
    status: str  # OK, FAIL, INCOMPLETE
    runs: int
    clean: int
    failed: int
    unfinished: int
    committed: int
    rolled_back: int
    reader_verdicts: int
    violations: int

    @property
    def ok(self) -> bool:
        return self.status == "OK"

    def line(self) -> str:
        parts = [
            f"{self.runs} runs ({self.clean} clean"
            + (f", {self.failed} failed" if self.failed else "")
            + (f", {self.unfinished} cut short" if self.unfinished else "")
            + ")",
            f"{self.committed:,} rows committed (+{self.rolled_back:,} rolled back)",
            f"{self.reader_verdicts} reader verdicts",
            f"{self.violations} violations (lost + order + phantoms, + duplicates where exactly once)",
        ]
        return f"{self.status}: " + ", ".join(parts)


def load(folder: Path) -> list[RunHistory]:
    """Every run recorded under ``folder``, in the order they started."""
    if not folder.is_dir():
        raise ValueError(f"soak folder {str(folder)!r} does not exist (the soak prints its folder when it starts)")
    paths = sorted(folder.glob(f"*/{FILE_NAME}"))
    if not paths:
        raise ValueError(
            f"soak folder {str(folder)!r} holds no */{FILE_NAME}: not a soak folder, or a soak from before "
            "histories were kept (run ./dev soak again)"
        )
    return sorted((read(p) for p in paths), key=lambda r: r.started)


def reader_violations(rv: dict[str, Any]) -> int:
    """One reader verdict's violations (harvest_local/verify.py): an at-least-once reader's
    (``exactly_once`` false) duplicates are counted but are no violation."""
    kinds = _VIOLATIONS if rv.get("exactly_once", True) else tuple(k for k in _VIOLATIONS if k != "duplicates")
    return sum(int(rv.get(k, 0)) for k in kinds)


def violations(run: RunHistory) -> int:
    if run.end is None:
        return 0
    return sum(reader_violations(v) for v in run.end.get("verdicts", []))


def run_status(run: RunHistory) -> str:
    if run.end is None:
        return "CUT SHORT"
    if run.end.get("error"):
        return "ERROR"
    return "OK" if run.end.get("ok") and not violations(run) else "FAIL"


def verdict(runs: Sequence[RunHistory]) -> SoakVerdict:
    statuses = [run_status(r) for r in runs]
    ended = [r.end for r in runs if r.end is not None]
    failed = sum(s in ("FAIL", "ERROR") for s in statuses)
    unfinished = statuses.count("CUT SHORT")
    status = "FAIL" if failed else "INCOMPLETE" if unfinished or not runs else "OK"
    return SoakVerdict(
        status=status,
        runs=len(runs),
        clean=statuses.count("OK"),
        failed=failed,
        unfinished=unfinished,
        committed=sum(int(e.get("committed", 0)) for e in ended),
        rolled_back=sum(int(e.get("rolled_back", 0)) for e in ended),
        reader_verdicts=sum(len(e.get("verdicts", [])) for e in ended),
        violations=sum(violations(r) for r in runs),
    )


def max_lag(run: RunHistory) -> dict[str, int]:
    """Per reader, the most rows it was ever behind the writers in this run."""
    return {reader: max((n for _, n in run.lag(reader)), default=0) for reader in run.readers}


def _fault_label(kind: str, target: str) -> str:
    return f"{kind} {target}".strip()


def _duration(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m}m {s:02d}s" if m else f"{s}s"


def render(runs: Sequence[RunHistory], meta: dict[str, Any] | None = None, plot: str | None = None) -> str:
    """The report as Markdown: the verdict line, the soak's facts, the plot, a table per run, the violations."""
    import time

    v = verdict(runs)
    t0 = runs[0].started if runs else 0.0
    wall = (max(r.finished for r in runs) - t0) if runs else 0.0
    injected: Counter[str] = Counter()
    for r in runs:
        injected.update((r.end or {}).get("injected", {}))
    worst: dict[str, tuple[int, int]] = {}
    for r in runs:
        for reader, n in max_lag(r).items():
            if n >= worst.get(reader, (-1, 0))[0]:
                worst[reader] = (n, r.run)
    lines = [
        "# Soak report",
        "",
        f"**{v.line()}**",
        "",
    ]
    if meta and meta.get("command"):
        lines.append(f"- command: `{meta['command']}`")
    lines += [
        f"- started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(t0))}, wall time {_duration(wall)}",
        "- faults injected: " + (", ".join(f"{k} {n}" for k, n in sorted(injected.items())) or "none"),
    ]
    for reader, (n, seed) in worst.items():
        lines.append(f"- largest lag of {reader}: {n:,} rows behind the writers (run {seed})")
    if plot:
        lines += ["", f"![timeline: faults and per-reader lag]({plot})"]
    lines += [
        "",
        "## Runs",
        "",
        "| run (seed) | layout | Kafka nodes | relays | partitions | faults (at seconds into the run) | "
        "produce/delivery errors | rows | rolled back | readers verified | max lag | verdict | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        p, e = r.plan, r.end or {}
        faults = ", ".join(f"{_fault_label(f.kind, f.target)} ({f.start - r.started:.0f}s)" for f in r.faults)
        skipped = [n for n in e.get("notes", []) if n.startswith("skipped")]
        faults = "; ".join(x for x in (faults, *skipped) if x) or "none"
        errors = p.get("produce_error_rate", 0) or p.get("delivery_error_rate", 0)
        lag = ", ".join(f"{n:,}" for n in max_lag(r).values()) or "n/a"
        readers = ", ".join(str(rv.get("reader")) for rv in e.get("verdicts", [])) or "none"
        status = run_status(r)
        if status == "ERROR":
            status += f": {str(e['error'])[:120]}"
        seconds = f"{float(e['seconds']):.0f}" if "seconds" in e else f"{r.finished - r.started:.0f}"
        lines.append(
            f"| {r.run} | {p.get('layout', '?')} | {p.get('brokers', '?')} | {p.get('relays', '?')} | "
            f"{p.get('partitions', '?')} | {faults} | {f'{errors:.0%}' if errors else 'none'} | "
            f"{int(e.get('committed', 0)):,} | {int(e.get('rolled_back', 0)):,} | {readers} | {lag} | {status} | "
            f"{seconds} |"
        )
    bad = [r for r in runs if run_status(r) not in ("OK",)]
    lines += ["", "## Violations and errors", ""]
    if not bad:
        lines.append(
            "None: every reader of every run got every committed row, in per-key order, nothing rolled back: exactly "
            "once, or at least once in the at-least-once runs."
        )
    for r in bad:
        e = r.end or {}
        lines.append(f"- run {r.run}: {run_status(r)} (logs in `{r.run}/`)")
        if e.get("error"):
            lines.append(f"  - error: `{e['error']}`")
        for rv in e.get("verdicts", []):
            if reader_violations(rv):
                repeats = "" if rv.get("exactly_once", True) else " (at least once: repeats allowed)"
                lines.append(
                    f"  - {rv['reader']}: lost {rv['lost']}, duplicates {rv['duplicates']}{repeats}, "
                    f"order {rv['order_violations']}, phantoms {rv['phantoms']} (of {rv['expected']} expected)"
                )
        for note in e.get("notes", []):
            lines.append(f"  - {note}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class _Bar:
    start: float  # seconds since the soak started
    width: float  # drawn width (a kill lasts a moment: drawn at least a minimal width)
    label: str
    kind: str
    lane: int = 0
    after: bool = True  # the label after the bar (False: before it, at the panel's right edge)


def _bars(runs: Sequence[RunHistory], t0: float, lo: float, hi: float) -> list[_Bar]:
    """The faults starting in ``[lo, hi)``, each in a lane where its bar and its label overlap nothing."""
    span = hi - lo
    char = char_seconds(span, _WIDTH_IN * 0.86, _FONT)
    faults = sorted((f for r in runs for f in r.faults if lo <= f.start - t0 < hi), key=lambda f: f.start)
    bars = [
        _Bar(f.start - t0, max(f.end - f.start, span / 400), _fault_label(f.kind, f.target), f.kind) for f in faults
    ]
    placed = place_labels([(b.start, b.width, b.label) for b in bars], char, hi)
    return [
        _Bar(b.start, b.width, b.label, b.kind, lane, after) for b, (lane, after, _) in zip(bars, placed, strict=True)
    ]


_FAULT_COLORS = (
    "#e53e3e",
    "#dd6b20",
    "#805ad5",
    "#d53f8c",
    "#975a16",
    "#319795",
    "#b7791f",
    "#4a5568",
    "#9f7aea",
    "#c05621",
    "#2c7a7b",
    "#822727",
)
_READER_COLORS = ("#2b6cb0", "#2f855a", "#1a202c", "#6b46c1")


def plot(runs: Sequence[RunHistory], path: Path, title: str = "") -> Path:
    """Draw the timeline to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    t0 = runs[0].started
    total = max(r.finished for r in runs) - t0
    window = PANEL_SECONDS if total > PANEL_SECONDS * 1.2 else max(total * 1.02, 10.0)
    panels = max(1, math.ceil(total / window))
    kinds = sorted({f.kind for r in runs for f in r.faults})
    color = {k: _FAULT_COLORS[i % len(_FAULT_COLORS)] for i, k in enumerate(kinds)}
    readers = list(dict.fromkeys(name for r in runs for name in r.readers))
    reader_color = {name: _READER_COLORS[i % len(_READER_COLORS)] for i, name in enumerate(readers)}
    bars = [_bars(runs, t0, i * window, (i + 1) * window) for i in range(panels)]
    lanes = [max((b.lane for b in bs), default=-1) + 1 for bs in bars]
    heights: list[float] = []
    for n in lanes:
        heights += [2.2, 0.3 + 0.22 * max(n, 1)]
    fig = plt.figure(figsize=(_WIDTH_IN, sum(heights) + 0.5 * panels + 1.4), dpi=100, layout="constrained")
    grid = fig.add_gridspec(len(heights), 1, height_ratios=heights)
    mmss = FuncFormatter(lambda x, _: f"{int(x // 60)}:{int(x % 60):02d}")
    band = {"OK": ("#edf2f7", "#f7fafc"), "FAIL": ("#fed7d7",) * 2, "ERROR": ("#fed7d7",) * 2}
    for i in range(panels):
        lo, hi = i * window, (i + 1) * window
        ax = fig.add_subplot(grid[2 * i])
        strip = fig.add_subplot(grid[2 * i + 1], sharex=ax)
        for j, r in enumerate(runs):
            status = run_status(r)
            shade = band.get(status, ("#fefcbf",) * 2)[j % 2]
            a, b = r.started - t0, r.finished - t0
            for axis in (ax, strip):
                axis.axvspan(a, b, color=shade, zorder=0, linewidth=0)
            label = f"{r.run}" if status == "OK" else f"{r.run} {status}"
            if b > lo and a < hi and (b - a) > len(label) * char_seconds(window, _WIDTH_IN * 0.86, _FONT):
                ax.text(
                    max(a, lo),
                    1.01,
                    label,
                    transform=ax.get_xaxis_transform(),
                    fontsize=_FONT,
                    color="#2d3748" if status == "OK" else "#c53030",
                    va="bottom",
                )
            for name in r.readers:
                pts = r.lag(name)
                ax.plot(
                    [t - t0 for t, _ in pts], [n for _, n in pts], color=reader_color[name], linewidth=1.4, zorder=3
                )
            backlog = [(s.t - t0, s.backlog) for s in r.samples if s.backlog is not None]
            ax.plot(
                [t for t, _ in backlog],
                [n for _, n in backlog],
                color="#718096",
                linewidth=1.0,
                linestyle="--",
                zorder=2,
            )
            for f in r.faults:
                fa, fb = f.start - t0, f.end - t0
                if fb - fa >= window / 400:
                    ax.axvspan(fa, fb, color=color[f.kind], alpha=0.18, zorder=1, linewidth=0)
                else:
                    ax.axvline(fa, color=color[f.kind], alpha=0.7, linewidth=1.0, zorder=1)
        for bar in bars[i]:
            strip.barh(bar.lane, bar.width, left=bar.start, height=0.6, color=color[bar.kind], zorder=2)
            strip.text(
                bar.start + bar.width + window / 300 if bar.after else bar.start - window / 300,
                bar.lane,
                bar.label,
                fontsize=_FONT,
                va="center",
                ha="left" if bar.after else "right",
                color=color[bar.kind],
                zorder=3,
            )
        ax.set_xlim(lo, hi)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("rows behind", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelbottom=False, labelsize=7)
        strip.set_ylim(max(lanes[i], 1) - 0.4, -0.6)
        strip.set_yticks([])
        strip.tick_params(labelsize=7)
        strip.xaxis.set_major_formatter(mmss)
        strip.set_ylabel("faults", fontsize=8, rotation=0, ha="right", va="center")
    strip.set_xlabel("wall time since the soak started (m:ss)", fontsize=8)
    handles: list[Any] = [
        Line2D([], [], color=reader_color[n], linewidth=1.4, label=f"lag of {n} (committed - in its table)")
        for n in readers
    ]
    handles.append(Line2D([], [], color="#718096", linestyle="--", label="rows waiting in the outbox (relays' lag)"))
    handles += [Patch(color=color[k], alpha=0.8, label=k) for k in kinds]
    handles += [
        Patch(color="#edf2f7", label="a run (its seed above)"),
        Patch(color="#fed7d7", label="a run that failed"),
    ]
    if any(r.end is None for r in runs):
        handles.append(Patch(color="#fefcbf", label="a run cut short"))
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=_FONT + 0.5, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.savefig(path)
    plt.close(fig)
    return path


def write(folder: Path) -> tuple[SoakVerdict, Path, Path]:
    """Write ``report.md`` and ``timeline.png`` into ``folder``; return the verdict and both paths."""
    runs = load(folder)
    meta_path = folder / "soak.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else None
    v = verdict(runs)
    png = plot(runs, folder / "timeline.png", title=f"soak {folder.name}: {v.line()}")
    md = folder / "report.md"
    md.write_text(render(runs, meta, png.name))
    return v, md, png


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harvest_outbox.harvest_local.soak_report", description=__doc__.splitlines()[0]
    )
    parser.add_argument("folder", type=Path, help="a soak folder (.work/soak/<started>/)")
    args = parser.parse_args(argv)
    try:
        v, md, png = write(args.folder)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{v.line()}\nreport: {md}\ntimeline: {png}")
    return 0 if v.ok else 1


if __name__ == "__main__":
    sys.exit(main())
