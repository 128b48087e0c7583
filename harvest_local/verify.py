"""The verdict on a run: did each reader deliver every committed message exactly once, in order?

Ground truth comes from the database (:func:`harvest_local.workload.committed_versions`: per key,
the committed versions 1..N). A reader's output is the sequence of ``(key, version)`` it delivered,
in delivery order. Per key, the delivered versions must be exactly 1..N in that order:

- lost: a committed version never delivered;
- duplicates: deliveries beyond the first of a version;
- order violations: keys whose first deliveries are not in increasing version order;
- phantoms: versions above N (from rolled-back transactions) — must be zero.

An at-least-once reader (``exactly_once=False``: the relay runs without ``uuidSequencing``) may repeat
versions; its verdict is 0 lost, 0 phantoms and first arrivals in order per key, and its duplicates are
counted but are no violation.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    reader: str
    expected: int
    delivered: int
    lost: int
    duplicates: int
    order_violations: int
    phantoms: int
    #: False: an at-least-once reader, whose duplicates are allowed (module doc).
    exactly_once: bool = True

    @property
    def violations(self) -> int:
        """Lost, phantom and out-of-order deliveries, and duplicates where exactly once is the promise."""
        return self.lost + self.order_violations + self.phantoms + (self.duplicates if self.exactly_once else 0)

    @property
    def ok(self) -> bool:
        return self.violations == 0


def verify(
    reader: str, truth: dict[str, int], delivered: Iterable[tuple[str, int]], exactly_once: bool = True
) -> Verdict:
    seen: dict[str, list[int]] = defaultdict(list)
    total = 0
    for key, version in delivered:
        seen[key].append(version)
        total += 1
    lost = duplicates = order = phantoms = 0
    for key in set(truth) | set(seen):
        n = truth.get(key, 0)
        versions = seen.get(key, [])
        distinct = set(versions)
        phantoms += sum(1 for v in distinct if v > n or v < 1)
        lost += sum(1 for v in range(1, n + 1) if v not in distinct)
        duplicates += len(versions) - len(distinct)
        first_seen: list[int] = []
        marked: set[int] = set()
        for v in versions:
            if v not in marked:
                marked.add(v)
                first_seen.append(v)
        if first_seen != sorted(first_seen):
            order += 1
    return Verdict(reader, sum(truth.values()), total, lost, duplicates, order, phantoms, exactly_once)


def render(verdicts: list[Verdict]) -> str:
    head = ("reader", "expected", "delivered", "lost", "dups", "order", "phantoms", "verdict")
    rows = [head] + [
        (
            v.reader,
            str(v.expected),
            str(v.delivered),
            str(v.lost),
            str(v.duplicates),
            str(v.order_violations),
            str(v.phantoms),
            ("OK" if v.ok else "FAIL") + ("" if v.exactly_once else " (at least once)"),
        )
        for v in verdicts
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
