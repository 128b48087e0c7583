"""An in-memory MVCC outbox for the cursor layout's model test (test_watermark_model.py): transaction
ids, snapshots and visibility as Postgres has them, an id sequence, range partitions that can be
truncated, and the relay's fenced cursor row.

- xids are assigned in increasing order (``assign_xid``); a transaction ends by commit or abort, and
  ``latest_completed`` is the largest xid that ended. A snapshot is taken as GetSnapshotData takes it:
  ``xmax = latest_completed + 1``, ``xip`` = xids still running below it, ``xmin`` = the least of them
  (or ``xmax``). A running xid ``>= xmax`` is not in ``xip``: it is invisible as "not yet started".
- The sequence (``nextval``) is not transactional and never goes back (``CACHE 1``).
- Rows are physically present from their insert (the transaction running), visible to a snapshot once
  their transaction committed before it; an aborted transaction's rows never are.
- ``truncate`` empties one id-range partition; the partition stays (a late insert into its range
  succeeds), as ``TRUNCATE`` leaves it. It is refused (as ``lock_timeout`` would) while a running
  transaction holds a row there, and refused by the re-check if a row there is not seen by the
  committed cursor's ``lo``.
- The cursor row: ``commit_cursor`` is the relay's fenced commit (``UPDATE … WHERE epoch = $epoch``);
  ``new_view`` raises the epoch (``UPDATE … SET epoch = epoch + 1 RETURNING`` the cursor).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import itemgetter

from harvest_outbox.producer.errors import DatabaseError, FenceError
from harvest_outbox.producer.layouts.cursor._watermark import Cursor, Snapshot

_first = itemgetter(0)

Chaos = Callable[[str], str]


class Crash(BaseException):
    """The relay process dies here."""


@dataclass
class Row:
    xid: int
    key: str
    value: str


@dataclass
class MVCC:
    partition_ids: int = 8  # ids per partition
    next_xid: int = 3
    latest_completed: int = 2
    running: set[int] = field(default_factory=set)
    committed: set[int] = field(default_factory=set)
    aborted: set[int] = field(default_factory=set)
    last_id: int = 0
    rows: dict[int, Row] = field(default_factory=dict)
    truncated: set[int] = field(default_factory=set)  # partition numbers
    epoch: int = 0
    cursor: Cursor = field(default_factory=Cursor)
    #: (view, page) -> ids the fenced commit took past (sequenced mode: those records are committed)
    committed_pages: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)
    dead: dict[int, int] = field(default_factory=dict)  # id -> times dead-lettered
    violations: list[str] = field(default_factory=list)
    refused_fence: int = 0
    refused_lock: int = 0
    refused_recheck: int = 0

    # ------------------------------------------------------------------ transactions
    def assign_xid(self) -> int:
        x = self.next_xid
        self.next_xid += 1
        self.running.add(x)
        return x

    def end(self, xid: int, commit: bool) -> None:
        self.running.remove(xid)
        (self.committed if commit else self.aborted).add(xid)
        self.latest_completed = max(self.latest_completed, xid)
        if commit:
            # I1 at the moment a row can first become visible: the committed cursor's lo did not see
            # this transaction (it was running), so its rows must not lie below the cursor's low
            below = [i for i, r in self.rows.items() if r.xid == xid and i < self.cursor.low]
            if below:
                self.violations.append(f"xid {xid} committed rows {below} below the cursor's low {self.cursor.low}")

    def snapshot(self) -> Snapshot:
        xmax = self.latest_completed + 1
        xip = frozenset(x for x in self.running if x < xmax)
        return Snapshot(min(xip, default=xmax), xmax, xip)

    def nextval(self) -> int:
        self.last_id += 1
        return self.last_id

    def insert(self, rid: int, xid: int, key: str, value: str) -> None:
        self.rows[rid] = Row(xid, key, value)

    # ------------------------------------------------------------------ reads
    def visible(self, snap: Snapshot, from_id: int) -> list[tuple[int, int, Row]]:
        """Rows a statement with snapshot ``snap`` sees, ``id >= from_id``, in id order."""
        seen = [
            (i, r.xid, r) for i, r in self.rows.items() if i >= from_id and r.xid in self.committed and snap.sees(r.xid)
        ]
        seen.sort(key=_first)  # what the statement sees, not the whole table (ids are unique)
        return seen

    def head(self, snap: Snapshot) -> int | None:
        """``SELECT max(id)`` with snapshot ``snap``."""
        return max((i for i, r in self.rows.items() if r.xid in self.committed and snap.sees(r.xid)), default=None)

    # ------------------------------------------------------------------ the cursor row
    def new_view(self) -> tuple[int, Cursor]:
        self.epoch += 1
        return self.epoch, self.cursor

    def commit_cursor(
        self, epoch: int, after: Cursor, view: int, page: int, ids: tuple[int, ...], dead: Iterable[int]
    ) -> None:
        if epoch != self.epoch:
            self.refused_fence += 1
            raise FenceError(f"cursor commit refused: epoch is {self.epoch}, this view's is {epoch}")
        self.cursor = after
        self.committed_pages[(view, page)] = ids
        for i in dead:
            self.dead[i] = self.dead.get(i, 0) + 1

    # ------------------------------------------------------------------ partitions
    def partitions(self) -> list[tuple[int, int]]:
        """Partitions holding or having held ids so far, not yet truncated."""
        n = self.last_id // self.partition_ids + 1
        return [(p * self.partition_ids, (p + 1) * self.partition_ids) for p in range(n) if p not in self.truncated]

    def truncate(self, start: int, end: int, delivered: Callable[[int], bool]) -> bool:
        """``LOCK … NOWAIT``, re-check, ``TRUNCATE`` of partition ``[start, end)`` (module doc)."""
        inside = [i for i in self.rows if start <= i < end]
        if any(self.rows[i].xid in self.running for i in inside):
            self.refused_lock += 1
            return False
        lo = self.cursor.lo
        if any(self.rows[i].xid in self.committed and not lo.sees(self.rows[i].xid) for i in inside):
            self.refused_recheck += 1
            return False
        lost = [i for i in inside if self.rows[i].xid in self.committed and not delivered(i)]
        if lost:
            self.violations.append(f"partition [{start}, {end}) truncated with undelivered rows {lost}")
        for i in inside:
            del self.rows[i]
        self.truncated.add(start // self.partition_ids)
        return True


class CursorStore:
    """One relay's connection to an :class:`MVCC`: every call first asks ``chaos(op)`` -- ``"ok"``,
    ``"fail"`` (nothing changed), ``"lost_reply"`` (changed, then an error) or ``"crash_after"``."""

    def __init__(self, db: MVCC, chaos: Chaos) -> None:
        self.db, self.chaos = db, chaos

    def _fate(self, op: str) -> str:
        fate = self.chaos(op)
        if fate == "fail":
            raise DatabaseError(f"{op} failed: server closed the connection unexpectedly")
        return fate

    def _after(self, op: str, fate: str) -> None:
        if fate == "lost_reply":
            raise DatabaseError(f"{op} failed: server closed the connection unexpectedly")
        if fate == "crash_after":
            raise Crash(op)

    def new_view(self) -> tuple[int, Cursor]:
        fate = self._fate("view")
        out = self.db.new_view()
        self._after("view", fate)
        return out

    def begin_read(self, probe: bool) -> tuple[Snapshot, int | None, int | None]:
        """``SELECT pg_current_snapshot(), (SELECT max(id) FROM outbox)`` and, when ``probe``, then
        ``pg_current_xact_id()``: the relay's short read transaction (its xid ends with it)."""
        fate = self._fate("snapshot")
        snap = self.db.snapshot()
        xid = self.db.assign_xid() if probe else None
        head = self.db.head(snap)
        if xid is not None:
            self.db.end(xid, commit=True)
        self._after("snapshot", fate)
        return snap, xid, head

    def read(self, from_id: int) -> list[tuple[int, int, Row]]:
        fate = self._fate("read")
        rows = self.db.visible(self.db.snapshot(), from_id)
        self._after("read", fate)
        return rows

    def commit(
        self, epoch: int, after: Cursor, view: int, page: int, ids: tuple[int, ...], dead: tuple[int, ...]
    ) -> None:
        fate = self._fate("commit")
        self.db.commit_cursor(epoch, after, view, page, ids, dead)
        self._after("commit", fate)
