"""Where the relay's next mark starts: above the last full mark, or at the start of the outbox.

goharvest's mark takes the lowest ids not owned by the view, so while a backlog drains each mark
walks the primary key past every row the view already owns (up to three marks' worth: queued, in
flight, not yet purged) and past the purged rows' index entries: ~4 ms of a 5,000-row mark, on
the relay's critical path. After a full mark, :class:`MarkResume` bounds the next one to ids above
that mark's highest. goharvest's mark (from the start of the outbox) still runs whenever a mark
comes back short (the backlog is taken), for a new view, and at least every
:data:`MARK_RESCAN_INTERVAL` while a backlog drains, so a row committed late with an id below the
resume point (a long transaction's) waits at most that long.

Invariants (tests/test_producer/test_relay_modes.py, test_relay.py):
- a bound is given only after a full mark of the same view;
- never longer than :data:`MARK_RESCAN_INTERVAL` after the view's last mark from the start.
"""

from __future__ import annotations

from collections.abc import Hashable

#: Seconds between marks from the start of the outbox while a backlog drains.
MARK_RESCAN_INTERVAL = 1.0


class MarkResume:
    __slots__ = ("_after", "_rescan_at", "_view")

    def __init__(self) -> None:
        self._view: Hashable | None = None  # the view whose last mark was full
        self._after = 0  # that mark's highest id
        self._rescan_at = 0.0

    def bound(self, view: Hashable, now: float) -> int | None:
        """The lower id bound of ``view``'s next mark at ``now`` (None: from the start)."""
        return self._after if self._view == view and now < self._rescan_at else None

    def returned(self, view: Hashable, bound: int | None, asked: int, got: int, last_id: int | None,
                 now: float) -> None:
        """``view``'s mark with ``bound`` asked for ``asked`` rows and returned ``got``, the highest
        id ``last_id``."""
        if got >= asked and last_id is not None:  # full: more rows wait above
            if bound is None:
                self._rescan_at = now + MARK_RESCAN_INTERVAL
            self._view, self._after = view, last_id
        else:
            self._view = None
