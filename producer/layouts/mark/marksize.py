"""How many rows the relay's next mark claims: sized by the backlog, not fixed.

goharvest marks a fixed ``markQueryRecords`` (100) rows per query, so a relay draining a backlog
pays one database round trip (and one prefetch wait) per 100 rows, and the drain runs at a fraction
of what the database can mark and purge. :class:`MarkSize` starts small and follows the backlog:

- a mark that comes back full means a backlog of unknown size: the next one asks for the ceiling
  (a mark that then finds fewer rows costs what a small one does: the scan stops where the rows do);
- a mark that comes back less than a quarter full means the backlog is gone: halve;
- anything in between keeps the size.

Why jump, not double: a relay starting on a backlog pipelines its marks (the next runs while this
one's rows are produced), so the drain rate is the big marks' rate, and every ramp step is a mark
that mostly waits. Doubling from 100 to 5,000 took seven marks and ~40 ms before the relay ran at
speed; one small mark, then the ceiling, takes one (bench/bench_relay.py: +2-3 % on a 100k drain).
The first mark of an idle relay stays small, so a trickle's row is not held behind a big mark.

Invariants (tests/test_producer/layouts/mark/test_marksize.py):
- ``floor <= value <= ceiling`` always; ``ceiling`` is the user's ``markQueryRecords`` when set, so a
  value a user configures is never exceeded;
- one full mark reaches the ceiling; a run of empty marks returns to the floor in
  ``log2(ceiling / floor)`` steps.
"""

from __future__ import annotations


class MarkSize:
    __slots__ = ("ceiling", "floor", "value")

    def __init__(self, floor: int, ceiling: int) -> None:
        if not 1 <= floor <= ceiling:
            raise ValueError(f"mark size bounds must satisfy 1 <= floor <= ceiling, got {floor}, {ceiling}")
        self.floor = floor
        self.ceiling = ceiling
        self.value = floor

    def observe(self, asked: int, got: int) -> int:
        """A mark that asked for ``asked`` rows returned ``got``: adapt, and return the new size."""
        if got >= asked:
            self.value = self.ceiling
        elif got * 4 < asked:
            self.value = max(self.floor, self.value // 2)
        return self.value

    def __repr__(self) -> str:
        return f"MarkSize({self.value} in [{self.floor}, {self.ceiling}])"
