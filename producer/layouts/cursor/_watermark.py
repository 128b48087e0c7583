"""The cursor layout's decisions (issue #37, docs/design.md §11, "The cursor layout"): which outbox
rows a leader publishes next, how far its fenced cursor may advance, and which id-range partitions of
the outbox may be truncated. Pure logic: no database, no Kafka; the SQL that feeds it is
docs/design.md §11's, and tests/test_producer/layouts/cursor/test_watermark_model.py proves it on an in-memory
MVCC outbox through thousands of schedules (late commits, aborts, long transactions, crashes, zombies,
truncation racing late commits).

The idea (pgq's "tick", plus an id bound): a row is *pending* for the batch ``(lo, hi]`` when its
inserting transaction is visible in snapshot ``hi`` but not in snapshot ``lo``. Every transaction that
commits becomes visible in exactly one such interval of consecutive snapshots, so walking batches
``(s0, s1], (s1, s2], …`` delivers every committed row exactly once, rows of an aborted transaction
never, and a transaction that commits late (low ids, commits after higher ids went out) in the batch
after its commit, whatever other transaction is still open. No row is ever written to: the cursor
row (one per outbox or shard) is the relay's only write per batch.

Ids only bound the scan: ``low`` is an id below which no row can still become pending. It advances by
a *probe* ``(head, xid)`` taken with a batch's snapshot: ``head`` the largest id visible then, ``xid``
a transaction id assigned after that snapshot. Once a later cursor's ``lo.xmin > xid``, every
transaction that assigned itself an id ``<= head`` has ended (it had its xid before it took the id:
assumption A1 below), so every committed id ``<= head`` is visible in ``lo``: ``low = head + 1``.

Assumptions (what the schema and Postgres must provide):

- A1: a writer's transaction has its xid before it draws an id (the id column's default is
  ``harvest_next_id()``, which calls ``pg_current_xact_id()`` before ``nextval``), and the sequence
  hands out increasing ids (``CACHE 1``, Postgres' default). Without A1 the probe can pass an id a
  transaction drew before it had an xid; the model test shows the loss (``lazy_xid``).
- A2: snapshots are Postgres' (``pg_current_snapshot()``): ``xid < xmin`` has ended, ``xid`` in ``xip``
  or ``>= xmax`` had not ended when it was taken; a later snapshot sees everything an earlier one did.
  ``xid`` is a row's *top-level* transaction id (a column defaulting to ``pg_current_xact_id()``), not
  its ``xmin``: a snapshot's ``xip`` holds top-level xids only, so a subtransaction's xid looks ended.

Invariants (each backed by tests/test_producer/test_watermark*.py):

- I1 (soundness of ``low``): every committed row not visible in ``cursor.lo`` has ``id >= cursor.low``.
- I2 (batch): rows visible in ``lo`` were delivered before the cursor committed ``lo``; rows pending for
  ``(lo, hi]`` with ``id <= pos`` were delivered before the cursor committed ``pos``.
- I3 (no stall): a batch publishes every row committed before its snapshot ``hi`` that ``lo`` did not
  see, in id order; an open transaction holds back only its own rows (and ``low``: scan width and
  truncation, never delivery).
- I4 (retirement): a partition ``[start, end)`` is truncated only when ``end <= low`` of the committed
  cursor: it holds no row that is pending now or can become pending later.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Generic, TypeVar


@dataclass(frozen=True)
class Snapshot:
    """``pg_current_snapshot()``: ``xmin``, ``xmax`` and the in-progress ``xip`` (all ``xmin <= x < xmax``)."""

    xmin: int
    xmax: int
    xip: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if not self.xmin <= self.xmax or any(not self.xmin <= x < self.xmax for x in self.xip):
            raise ValueError(f"not a snapshot: xmin={self.xmin} xmax={self.xmax} xip={sorted(self.xip)}")

    def sees(self, xid: int) -> bool:
        """``pg_visible_in_snapshot(xid, snapshot)``: the transaction had ended when it was taken (a row
        of it is visible if it committed)."""
        return xid < self.xmin or (xid < self.xmax and xid not in self.xip)


#: The snapshot before any transaction: sees nothing (xid 3 is Postgres' first normal xid).
ORIGIN = Snapshot(3, 3)


@dataclass(frozen=True)
class Probe:
    """``head``: the largest id visible with a batch's snapshot; ``xid``: assigned after that snapshot."""

    head: int
    xid: int


@dataclass(frozen=True)
class Cursor:
    """The relay's fenced position (one row per outbox or shard, updated in each commit).

    ``lo``: rows it sees are delivered. ``hi``: the batch in progress (``None``: between batches), of
    which rows with ``id <= pos`` are delivered. ``low``: I1. ``probe``: the next ``low``, once ``lo``
    has seen its transaction end."""

    lo: Snapshot = ORIGIN
    hi: Snapshot | None = None
    pos: int = 0
    low: int = 0
    probe: Probe | None = None

    def pending(self, rid: int, xid: int) -> bool:
        """Is the row ``(rid, xid)``, visible to the reading statement, still to be published in this
        batch? (The read query's WHERE: ``id >= low AND id > pos AND visible(txid, hi) AND NOT
        visible(txid, lo)``, ``txid`` the row's top-level xid.)"""
        hi = self.hi
        return hi is not None and rid >= self.low and rid > self.pos and hi.sees(xid) and not self.lo.sees(xid)

    def scan_from(self) -> int:
        """The first id the read query's index range starts at."""
        return max(self.low, self.pos + 1)


R = TypeVar("R")


@dataclass(frozen=True)
class Page(Generic[R]):
    """One read of a batch: the rows to publish (id order), the cursor once they are all delivered,
    and whether the batch is complete (then ``after`` is between batches)."""

    rows: tuple[R, ...]
    after: Cursor
    complete: bool


def start_batch(cursor: Cursor, now: Snapshot, xid: int | None, head: int | None) -> Cursor:
    """The next batch, read with snapshot ``now``; ``xid`` was assigned after ``now`` was taken (``None``:
    none was, this batch takes no probe -- a relay probes every few batches, not paying an xid and its
    commit record per batch) and ``head`` is the largest id ``now`` sees (``None``: an empty outbox).
    Only between batches: the batch in progress must complete first (its rows come before the next's)."""
    if cursor.hi is not None:
        raise ValueError(f"batch up to xmax {cursor.hi.xmax} is not complete (pos {cursor.pos})")
    if not _later(now, cursor.lo):
        raise ValueError(f"snapshot {now} is older than the cursor's {cursor.lo}")
    low, probe = cursor.low, cursor.probe
    if probe is not None and cursor.lo.xmin > probe.xid:
        # every transaction holding an id <= probe.head had ended when lo was taken (A1): I1 holds
        low, probe = max(low, probe.head + 1), None
    if probe is None and xid is not None and head is not None and head + 1 > low:
        probe = Probe(head, xid)
    return Cursor(lo=cursor.lo, hi=now, pos=low - 1, low=low, probe=probe)


def read_page(cursor: Cursor, visible: Sequence[tuple[int, int, R]], limit: int) -> Page[R]:
    """Decide a page of the batch in progress from ``visible``: rows ``(id, xid, row)`` the read
    statement returned in id order, up to ``limit`` pending ones (rows it returns that are not pending
    are skipped: the WHERE above run here too). Fewer than ``limit`` pending: the batch is complete."""
    if cursor.hi is None:
        raise ValueError("no batch in progress: start_batch first")
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    rows: list[R] = []
    last = cursor.pos
    for rid, xid, row in visible:
        if rid <= last:
            raise ValueError(f"rows not in id order after id {last}: {rid}")
        if not cursor.pending(rid, xid):
            continue
        rows.append(row)
        last = rid
        if len(rows) == limit:
            return Page(tuple(rows), replace(cursor, pos=last), complete=False)
    done = Cursor(lo=cursor.hi, hi=None, pos=0, low=cursor.low, probe=cursor.probe)
    return Page(tuple(rows), done, complete=True)


def page_end(cursor: Cursor, count: int, last: int | None, limit: int) -> tuple[Cursor, bool]:
    """:func:`read_page`'s ``(after, complete)`` when the read statement did the filtering itself (the
    relay's: its WHERE is :meth:`Cursor.pending`, test_watermark_pg.py compares them on every page):
    ``count`` pending rows came back, the last with id ``last``. No per-row work."""
    if cursor.hi is None:
        raise ValueError("no batch in progress: start_batch first")
    if limit < 1 or not 0 <= count <= limit or (count > 0) != (last is not None):
        raise ValueError(f"not a page: {count} row(s) up to id {last} of at most {limit}")
    if count == limit:
        assert last is not None
        if last <= cursor.pos or last < cursor.low:
            raise ValueError(f"a page ending at id {last} is not after the cursor (pos {cursor.pos}, low {cursor.low})")
        return replace(cursor, pos=last), False
    return Cursor(lo=cursor.hi, hi=None, pos=0, low=cursor.low, probe=cursor.probe), True


def needs_xid(cursor: Cursor) -> bool:
    """Would :func:`start_batch` use a new probe's xid? (None pending, or the pending one resolves now.)
    A relay takes an xid (a commit record) only then."""
    probe = cursor.probe
    return probe is None or cursor.lo.xmin > probe.xid


def retirable(partitions: Sequence[tuple[int, int]], committed: Cursor) -> list[tuple[int, int]]:
    """The id-range partitions ``[start, end)`` that may be truncated under the *committed* cursor (I4).
    The truncating transaction re-checks under its lock that none holds a row ``committed.lo`` does not
    see (docs/design.md §11), so a wrong ``committed`` fails closed."""
    return [(start, end) for start, end in partitions if end <= committed.low]


def _later(a: Snapshot, b: Snapshot) -> bool:
    """Could ``a`` have been taken no earlier than ``b``? (it sees everything ``b`` saw)."""
    # a transaction a still sees running below b.xmax was running when b was taken: O(len(xip))
    return a.xmin >= b.xmin and a.xmax >= b.xmax and all(x in b.xip for x in a.xip if x < b.xmax)
