"""Labels on a time axis, packed into lanes so that no two overlap (the demo's and the soak's plots).

A label is a span of the x axis: its bar (a fault from start to end) and the text after it, whose width in
seconds follows from the axis' scale (:func:`char_seconds`). :func:`pack_lanes` puts each span in the
lowest lane whose last span has ended, so spans sharing a lane never overlap and no more lanes are used
than spans overlap at one moment.
"""

from __future__ import annotations

from collections.abc import Sequence


def pack_lanes(spans: Sequence[tuple[float, float]]) -> list[int]:
    """A lane per ``(start, end)`` span (greedy, by start): the lowest lane free at the span's start."""
    ends: list[float] = []
    lanes = [0] * len(spans)
    for i in sorted(range(len(spans)), key=lambda i: spans[i][0]):
        start, end = spans[i]
        for lane, last in enumerate(ends):
            if last <= start:
                lanes[i], ends[lane] = lane, end
                break
        else:
            lanes[i] = len(ends)
            ends.append(end)
    return lanes


def char_seconds(window: float, axes_inches: float, font_points: float) -> float:
    """Seconds of an axis ``window`` seconds wide drawn ``axes_inches`` wide that one character of a
    ``font_points`` font covers (measured: an average label glyph is about 0.53 em wide in DejaVu Sans; 0.56
    leaves a margin)."""
    return window * font_points * 0.56 / (axes_inches * 72)


def place_labels(
    items: Sequence[tuple[float, float, str]], char: float, right_edge: float
) -> list[tuple[int, bool, tuple[float, float]]]:
    """Lanes for ``(start, width, label)`` items drawn as a bar from ``start`` with its label after it, or
    before it when the label would run past ``right_edge`` (the axis' end): ``(lane, label after the bar,
    the x span the bar and its label take)`` per item, in the items' order. ``char``: :func:`char_seconds`."""
    spans: list[tuple[float, float]] = []
    after: list[bool] = []
    for start, width, label in items:
        text = char * (len(label) + 2)
        fits = start + width + text <= right_edge
        after.append(fits)
        spans.append((start, start + width + text) if fits else (start - text, start + width))
    return [(lane, a, span) for lane, a, span in zip(pack_lanes(spans), after, spans, strict=True)]
