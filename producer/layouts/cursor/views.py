"""What a cursor-layout relay view has read and how far its commits have passed (``outboxLayout: cursor``).

The relay reads on one connection and commits on another (producer/relay/core.py), so both
:class:`~producer.layouts.cursor.database.CursorDatabase` objects share one :class:`CursorViews`. A view's reads are
*segments*, one per page: the batch cursor the page was read with, the ids it returned (id order) and
the cursor once they are all delivered (producer/layouts/cursor/_watermark.py's ``page_end``). A commit passes the next
``n`` read rows; the cursor it commits is the one after the last of them:

- the page's ``after`` when it ends a page (and then the ``after`` of the empty pages read right
  behind it: they hold no row, so passing them costs nothing and lets ``lo`` and ``low`` move on);
- else the page's batch cursor with ``pos`` = that row's id.

Invariants (tests/test_producer/test_cursor_views.py; the model is test_watermark_sequenced.py's
``CursorModelDB``):
- a commit passes rows in read order only: :meth:`ViewRead.plan` of the sequenced mode refuses a set of
  rows that is not exactly the view's next ones (a cursor cannot skip a row and come back to it);
- the at-least-once mode passes the longest prefix of read rows that are all delivered or dead-lettered;
- nothing moves until the database commit succeeded (:meth:`ViewRead.apply`); a view that fails is
  dropped and the next one reads from the committed cursor;
- memory is bounded by the rows read and not yet committed, plus one trailing empty page per shard;
- sharded (``shards: S``), a :class:`View` holds one :class:`ViewRead` per led shard: each shard's rows pass
  on its own cursor, in that shard's read order (a key is in one shard: per-key order is a shard's);
- an idle view (every read row committed, only empty pages since) commits the cursor after them
  (:meth:`ViewRead.idle_cursor`): they pass no row, so the claim "rows ``lo`` sees are delivered" holds; when
  only ``lo`` / ``hi`` would move (:meth:`ViewRead.only_snapshots_moved`) it passes them without writing;
- ``haltKey`` (producer/layouts/cursor/held.py): rows the read *held* (copied to ``_held`` in the read, or dead
  letters read again) are :attr:`ViewRead.skipped`: they pass with the rows around them without the mode, and
  an idle view whose pending rows are all skipped commits past them (they are durable elsewhere); held rows the
  view *serves* are tracked apart (:attr:`View.serving`): the cursor never moves for them.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field, replace

from harvest_outbox.producer.errors import HarvestError
from harvest_outbox.producer.layouts.cursor._watermark import Cursor


@dataclass(frozen=True)
class Segment:
    """One page of a view's reads."""

    start: Cursor  # the batch cursor it was read with (``hi`` set)
    ids: list[int]  # the rows it returned, id order
    after: Cursor  # once they are all delivered


class NotNextRows(HarvestError):
    """A commit names rows that are not the view's next read rows."""


@dataclass
class ViewRead:
    """One view: its fence epoch, where its next read starts, and its uncommitted reads."""

    leader_id: uuid.UUID
    epoch: int
    cursor: Cursor  # where the next read starts
    segments: deque[Segment] = field(default_factory=deque)
    done: int = 0  # rows of segments[0] already committed
    delivered: set[int] = field(default_factory=set)  # at-least-once: delivered, not yet committed
    head: int | None = None  # the largest id the last batch start saw (a probe is worth an xid only past it)
    committed: Cursor | None = None  # the last cursor this view committed
    probe_at: float = field(default_factory=time.monotonic)  # when the cursor's probe was taken (or the view began)
    skipped: set[int] = field(default_factory=set)  # haltKey: read rows held by the read (pass without the mode)
    batch_width: int = 0  # the scan gauge: ids from the batch's low to the head at its start
    batch_rows: int = 0  # rows its pages returned so far

    def add(self, seg: Segment) -> None:
        """A page read: append it (an empty page behind an empty page replaces it: it passes no row)."""
        if not seg.ids and self.segments and not self.segments[-1].ids:
            self.segments[-1] = seg
        else:
            self.segments.append(seg)
        self.cursor = seg.after

    def plan(self, n: int) -> tuple[list[int], Cursor | None, int, int]:
        """Passing the next ``n`` read rows: (their ids, the cursor after them or None when nothing
        moves, segments finished, rows of the next segment passed). Changes nothing."""
        ids: list[int] = []
        cur: Cursor | None = None
        i, done, segs = 0, self.done, self.segments
        while n > 0:
            if i >= len(segs):
                raise NotNextRows(f"{len(ids) + n} row(s) to pass, only {len(ids)} read and not yet committed")
            seg = segs[i]
            k = min(n, len(seg.ids) - done)
            ids.extend(seg.ids[done : done + k])
            done += k
            n -= k
            if done == len(seg.ids):
                cur, i, done = seg.after, i + 1, 0
            else:
                cur = replace(seg.start, pos=seg.ids[done - 1])
        if cur is not None and done == 0:
            while i < len(segs) and not segs[i].ids:  # empty pages right behind: passed too
                cur, i = segs[i].after, i + 1
        return ids, cur, i, done

    def apply(self, finished: int, done: int, cursor: Cursor | None = None) -> None:
        """The commit of a :meth:`plan` (of ``cursor``) succeeded: forget what it passed."""
        if cursor is not None:
            self.committed = cursor
        for _ in range(finished):
            seg = self.segments.popleft()
            self.delivered.difference_update(seg.ids)
            if self.skipped:
                self.skipped.difference_update(seg.ids)
        self.done = done

    def plan_exact(self, passed: list[int]) -> tuple[Cursor | None, int, int]:
        """The sequenced mode's commit: ``passed`` (delivered and dead-lettered rows of its harvest
        transactions) must be exactly the next ``len(passed)`` read rows."""
        if self.skipped:
            return self._plan_exact_skipping(passed)
        ids, cur, finished, done = self.plan(len(passed))
        if sorted(ids) != sorted(passed):
            shown = sorted(passed)[:10]
            raise NotNextRows(f"the commit passes ids {shown}..., not the view's next read rows {ids[:10]}...")
        return cur, finished, done

    def _plan_exact_skipping(self, passed: list[int]) -> tuple[Cursor | None, int, int]:
        """:meth:`plan_exact` when held rows are among the reads: ``passed`` and skipped rows, in any mix,
        must make up the next read rows (the skipped ones right behind pass too)."""
        want, n = set(passed), 0
        for rid in self._pending_ids():
            if rid in want:
                want.discard(rid)
            elif rid not in self.skipped:
                break
            n += 1
        if want:
            shown = sorted(want)[:10]
            raise NotNextRows(f"the commit passes ids {shown}... that are not among the view's next read rows")
        _ids, cur, finished, done = self.plan(n)
        return cur, finished, done

    def _pending_ids(self) -> list[int]:
        out: list[int] = []
        done = self.done
        for seg in self.segments:
            out.extend(seg.ids[done:])
            done = 0
        return out

    def plan_delivered(self, ids: list[int]) -> tuple[Cursor | None, int, int]:
        """At-least-once: ``ids`` are delivered (or dead-lettered); the longest delivered prefix."""
        self.delivered.update(ids)
        n, done = 0, self.done
        for seg in self.segments:
            for rid in seg.ids[done:]:
                if rid not in self.delivered and rid not in self.skipped:
                    _ids, cur, finished, left = self.plan(n)
                    return cur, finished, left
                n += 1
            done = 0
        _ids, cur, finished, left = self.plan(n)
        return cur, finished, left

    def idle_cursor(self) -> Cursor | None:
        """Every read row is committed and only empty pages follow: the cursor after them, if it moved
        since this view's last commit (committing it lets ``lo`` and ``low`` follow an idle outbox, so
        its delivered partitions retire without waiting for the next rows)."""
        if not self.segments or (self.pending_rows() and not self._only_skipped_pending()):
            return None
        cur = self.segments[-1].after
        return None if cur == self.committed else cur

    def only_snapshots_moved(self, cur: Cursor) -> bool:
        """``cur`` (an :meth:`idle_cursor`) differs from the committed cursor in ``lo`` / ``hi`` alone: it passed
        empty batches only. Each idle commit takes an xid, so the next snapshot always differs; such a
        cursor need not be written (nothing retires, and an older committed cursor only means a restart reads
        those empty batches again), and an idle outbox writes no WAL once its ``low`` has settled."""
        done = self.committed
        return (
            done is not None
            and done.hi is None
            and cur.hi is None
            and (cur.pos, cur.low, cur.probe) == (done.pos, done.low, done.probe)
        )

    def _only_skipped_pending(self) -> bool:
        return bool(self.skipped) and all(rid in self.skipped for rid in self._pending_ids())

    def idle_committed(self, cur: Cursor, written: bool = True) -> None:
        """The :meth:`idle_cursor` commit succeeded (``written``), or was not needed (:meth:`only_snapshots_moved`):
        either way the empty pages behind it are passed."""
        if (
            self.segments
            and self.segments[-1].after == cur
            and (not self.pending_rows() or self._only_skipped_pending())
        ):
            self.segments.clear()
            self.skipped.clear()
            self.done = 0
        if written:
            self.committed = cur

    def pending_rows(self) -> int:
        return sum(len(s.ids) for s in self.segments) - self.done


@dataclass
class View:
    """One leader view over the shards it leads (``shards: S``; one shard, 0, unsharded): a
    :class:`ViewRead` per shard, each over its own committed cursor, and the held rows it serves. A read
    reads one shard's page (:attr:`turn` rotates, so a shard with a backlog starves none); a commit
    passes each shard's rows on that shard's cursor (:meth:`by_shard`), which read them."""

    leader_id: uuid.UUID
    epoch: int
    reads: dict[int, ViewRead]
    serving: set[int] = field(default_factory=set)  # haltKey: held rows served, not yet delivered or dead
    turn: int = 0  # index (in shard order) of the shard the next read starts with
    _shard_of: dict[int, int] = field(default_factory=dict)  # read, uncommitted row id -> its shard

    def order(self) -> list[int]:
        """The led shards, starting with the one whose turn it is (the caller moves :attr:`turn` on)."""
        keys = sorted(self.reads)
        if not keys:  # a standby's view: no shard to read
            return []
        k = self.turn % len(keys)
        return keys[k:] + keys[:k]

    def add(self, shard: int, seg: Segment) -> None:
        self.reads[shard].add(seg)
        for rid in seg.ids:
            self._shard_of[rid] = shard

    def by_shard(self, ids: list[int]) -> tuple[dict[int, list[int]], list[int]]:
        """``ids`` grouped by the shard that read them (in the given order), and those no shard read."""
        out: dict[int, list[int]] = {}
        unknown: list[int] = []
        for rid in ids:
            k = self._shard_of.get(rid)
            if k is None:
                unknown.append(rid)
            else:
                out.setdefault(k, []).append(rid)
        return out, unknown

    def apply(self, shard: int, finished: int, done: int, cursor: Cursor | None = None) -> None:
        """:meth:`ViewRead.apply` of ``shard``, forgetting the shards of the rows it passed for good."""
        r = self.reads[shard]
        for seg in itertools.islice(r.segments, finished):
            for rid in seg.ids:
                self._shard_of.pop(rid, None)
        r.apply(finished, done, cursor)

    def idle_committed(self, shard: int, cur: Cursor, written: bool = True) -> None:
        r = self.reads[shard]
        before = [rid for seg in r.segments for rid in seg.ids]
        r.idle_committed(cur, written)
        if not r.segments:
            for rid in before:
                self._shard_of.pop(rid, None)

    def pending_rows(self) -> int:
        return sum(r.pending_rows() for r in self.reads.values())


class CursorViews:
    """The current view of one relay, shared by its read and write connections (under :attr:`lock`).
    ``sequenced``: views start with the fenced mode's view start; else with the first read."""

    def __init__(self, sequenced: bool) -> None:
        self.sequenced = sequenced
        self.lock = threading.Lock()
        self.view: View | None = None

    def current(self, leader_id: uuid.UUID) -> View | None:
        view = self.view
        return view if view is not None and view.leader_id == leader_id else None

    def begin(self, leader_id: uuid.UUID, epoch: int, cursors: dict[int, Cursor]) -> View:
        """A new view reads each shard from ``cursors`` (the committed ones); the previous view is forgotten."""
        with self.lock:
            self.view = View(leader_id, epoch, {k: ViewRead(leader_id, epoch, c) for k, c in sorted(cursors.items())})
            return self.view
