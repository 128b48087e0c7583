"""The cursor layout's ``haltKey`` state in memory (producer/layouts/cursor/held.py's table and statements), for
test_watermark_sequenced.py's model database: the dead-letter table (which halts a key), ``<outbox>_held``
and what the admin commands do to them.

What each statement does here is what its SQL does on Postgres (test_cursor_held.py checks the SQL):

- :meth:`HeldState.waits`: a (topic, key) waits while it has a dead letter or held rows (``_waits``);
- :meth:`HeldState.hold`: copy rows to ``_held`` in the given order, a row already held left as it is
  (``ON CONFLICT (id) DO NOTHING``), ``held_seq`` from one sequence;
- :meth:`HeldState.released`: held rows of keys without a dead letter, in ``(held_seq, id)`` order, but
  those the view serves, and only those whose outbox row the committed cursor passed (``released_sql``);
- :meth:`HeldState.requeue`: dead letters of a key back into ``_held`` ahead of the key's held rows, in id
  order, with no outbox row to wait for (``requeue_into_held_sql``); :meth:`HeldState.discard` drops them.
  Both are refused while the committed cursor has not passed one's outbox row (``require_passed``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

Key = tuple[str, bytes]


@dataclass
class HeldRow:
    seq: int
    key: Key
    xid: int | None  # the outbox row's transaction; None: a requeued dead letter


@dataclass
class HeldState:
    rows: dict[int, HeldRow] = field(default_factory=dict)
    dead_letters: dict[int, Key] = field(default_factory=dict)  # the table: it halts the key
    next_seq: int = 1
    held_total: int = 0  # rows ever copied to _held (the run's statistics)

    def halted(self) -> set[Key]:
        return set(self.dead_letters.values())

    def waits(self, key: Key) -> bool:
        return key in self.halted() or any(h.key == key for h in self.rows.values())

    def hold(self, rows: Iterable[tuple[int, Key, int | None]]) -> None:
        for rid, key, xid in rows:
            if rid not in self.rows:
                self.rows[rid] = HeldRow(self.next_seq, key, xid)
                self.next_seq += 1
                self.held_total += 1

    def released(self, serving: set[int], n: int, passed: Callable[[int, int], bool]) -> list[int]:
        halted = self.halted()
        free = [
            (h.seq, rid)
            for rid, h in self.rows.items()
            if rid not in serving and h.key not in halted and (h.xid is None or passed(rid, h.xid))
        ]
        return [rid for _s, rid in sorted(free)[:n]]

    def dead_letter(self, rid: int, key: Key) -> None:
        """A row (from the outbox or served from ``_held``) dead-lettered: it leaves ``_held``, its key halts."""
        self.rows.pop(rid, None)
        self.dead_letters[rid] = key

    def requeue(self, key: Key) -> list[int]:
        """The key's dead letters back into ``_held`` ahead of its held rows, in id order; their ids."""
        ids = sorted(i for i, k in self.dead_letters.items() if k == key)
        first = min((h.seq for h in self.rows.values() if h.key == key), default=0)
        for back, rid in enumerate(reversed(ids), start=1):
            del self.dead_letters[rid]
            self.rows[rid] = HeldRow(first - back, key, None)
        return ids

    def discard(self, key: Key) -> list[int]:
        ids = sorted(i for i, k in self.dead_letters.items() if k == key)
        for rid in ids:
            del self.dead_letters[rid]
        return ids
