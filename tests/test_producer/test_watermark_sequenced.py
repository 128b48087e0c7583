"""The mark-less relay under the real ``--uuid-sequencing`` mode: test_protocol_model.py's schedules
(the real :class:`~producer.sequencing.SequencedMode`, the model topic, crashes, zombies, lost replies,
failed deliveries, the project's Sequencer reading the log) on a database whose
:class:`~producer.seq_store.SequencedStore` reads with producer/watermark.py's cursor instead of
marking rows, and whose fenced commit moves the cursor instead of deleting them
(docs/primary-cost.md "The mark-less relay": "the commit protocol, both modes").

- a view's reads start from the committed cursor as it was when ``start_view_with_floor`` raised the
  epoch (one transaction), and go on batch by batch (snapshot intervals) from there;
- ``commit_txns`` checks the epoch, then that the transactions' rows (delivered and dead-lettered)
  are exactly the view's next unread-to-committed rows in read order -- the only thing a cursor can
  represent -- and moves the cursor past the last one (to its page's end, and past empty pages read
  right behind it, when it ends a page); the rest (ACK intents, dead letters, attempt counts, the
  clock) is the mark relay's model's, unchanged. That bookkeeping is the relay's own:
  producer/cursor_views.py's ``ViewRead``, which producer/db_cursor.py's ``CursorDatabase`` runs on Postgres;
- writers are MVCC transactions: an xid first, then ids (A1), the rows invisible until commit; some
  roll back, some commit late (lower ids than rows already relayed); delivered id-range partitions are
  truncated under the committed cursor.

The checks are test_protocol_model.py's own (every committed row committed exactly once to
read-committed readers or dead-lettered, per-key order, no reader anomaly), plus the cursor model's
(no row committed below the cursor's ``low``, no partition truncated with an undelivered row). haltKey
is not covered here yet: its held rows (producer/cursor_held.py) are tested on Postgres and Kafka by
test_cursor_held.py and test_halt_key.py, not yet through these schedules.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from model_db import ModelDB
from model_mvcc import MVCC
from test_protocol_model import (  # noqa: F401 (quiet_relay: the fixture)
    ANOMALIES,
    TOPIC,
    UNSURE_ROLLBACKS,
    WRITERS,
    World,
    check,
    quiet_relay,
)

from harvest_outbox.producer.cursor_views import NotNextRows, Segment, ViewRead
from harvest_outbox.producer.db import MarkedAttempts, MarkedRow, TxnCommit
from harvest_outbox.producer.errors import FenceError
from harvest_outbox.producer.watermark import Cursor, read_page, retirable, start_batch

SCHEDULES = int(os.environ.get("MODEL_SCHEDULES", "1000"))
FIRST_SEED = int(os.environ.get("MODEL_SEED", "0"))


@dataclass
class CursorModelDB(ModelDB):
    """ModelDB whose mark is a cursor read and whose fenced commit moves the cursor (module doc).
    ``rows`` keeps ModelDB's meaning for the checks: committed rows no fenced commit passed yet."""

    mvcc: MVCC = field(default_factory=MVCC)
    cursor: Cursor = field(default_factory=Cursor)
    views: dict[uuid.UUID, ViewRead] = field(default_factory=dict)
    mark_limit_hits: int = 0

    def start_view_with_floor(
        self, leader_id: uuid.UUID, name: str
    ) -> tuple[int, list[tuple[int, bytes, int, str, int]], int]:
        out = super().start_view_with_floor(leader_id, name)
        # the same transaction: the cursor as of this epoch; the relay's own bookkeeping (producer/cursor_views.py)
        self.views[leader_id] = ViewRead(leader_id, out[0], self.cursor)
        return out

    def mark_with_attempts(self, leader_id: uuid.UUID, limit: int) -> tuple[list[MarkedRow], MarkedAttempts]:
        view = self.views[leader_id]
        db = self.mvcc
        if view.cursor.hi is None:
            snap = db.snapshot()
            xid = db.assign_xid()
            head = db.head(snap)
            db.end(xid, commit=True)
            view.cursor = start_batch(view.cursor, snap, xid, head)
        batch = view.cursor
        page = read_page(batch, [(i, x, (i, r)) for i, x, r in db.visible(db.snapshot(), batch.scan_from())], limit)
        rows: list[MarkedRow] = []
        for i, r in page.rows:
            n, error = self.attempts.get(i, (None, None))
            rows.append((i, TOPIC, r.key.encode(), r.value.encode(), None, None, None, n, error, None, 0.0))
        view.add(Segment(batch, [i for i, _r in page.rows], page.after))
        return rows, {r[0]: (r[7], r[8]) for r in rows if r[7] is not None}  # type: ignore[misc]

    def commit_txns(self, epoch: int, leader_id: uuid.UUID, txns: Sequence[TxnCommit]) -> None:
        if epoch != self.epoch:
            self.refused += 1
            raise FenceError(f"commit refused by the fence: epoch is {self.epoch}, this view's is {epoch}")
        view = self.views[leader_id]
        passed = [i for t in txns for i in t.ids] + [i for t in txns for i, _e, _a in t.dead]
        try:
            cursor, finished, done = view.plan_exact(passed)
        except NotNextRows as exc:  # recorded: the relay may catch what it raises
            self.mvcc.violations.append(f"{exc}: a cursor cannot represent it")
            raise AssertionError(str(exc)) from None
        for i in passed:
            self.rows[i][3] = leader_id  # ModelDB's ownership check: the view's own rows
        super().commit_txns(epoch, leader_id, txns)
        view.apply(finished, done)  # only once the commit succeeded, as CursorDatabase does
        if cursor is not None:
            self.cursor = self.mvcc.cursor = cursor

    def retire(self) -> int:
        n = 0
        for start, end in retirable(self.mvcc.partitions(), self.cursor):
            n += self.mvcc.truncate(start, end, lambda i: i not in self.rows)
        return n


class CursorWorld(World):
    """test_protocol_model's World with MVCC writers (xid, then ids; visible at commit) and truncation."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.db = CursorModelDB(halt_keys=False, mvcc=MVCC(partition_ids=self.rng.choice([4, 16])))
        self.xids: list[int | None] = [None] * WRITERS
        self.retired = 0
        self.late = 0

    def write(self) -> None:
        w = self.rng.randrange(WRITERS)
        if self.writers[w] is None:
            db = self.db.mvcc
            self.xids[w] = xid = db.assign_xid()  # A1: the xid first
            rows = []
            for _ in range(self.rng.randint(1, 4)):
                rid = db.nextval()
                key = f"w{w}k{self.rng.randrange(3)}".encode()
                value = f"w{w}-{self.seq[w]}".encode()
                self.seq[w] += 1
                db.insert(rid, xid, key.decode(), value.decode())
                rows.append((rid, key, value))
            self.writers[w] = rows
            return
        if self.rng.random() < 0.15:
            self._end(w, commit=False)
        else:
            self.write_commit(w)

    def write_commit(self, w: int) -> None:
        self._end(w, commit=True)

    def _end(self, w: int, commit: bool) -> None:
        rows, self.writers[w] = self.writers[w], None
        xid, self.xids[w] = self.xids[w], None
        if xid is None:
            return
        db: CursorModelDB = self.db  # type: ignore[assignment]
        if commit and rows and min(r[0] for r in rows) < max(db.committed | set(db.rows), default=0):
            self.late += 1
        db.mvcc.end(xid, commit)
        if commit:
            for rid, key, value in rows or ():
                db.insert(rid, TOPIC, key, value)
                self.expected.setdefault(key, []).append(rid)
                self.value_id[value] = rid

    def step(self) -> None:
        if self.rng.random() < 0.03:
            self.retired += self.db.retire()  # type: ignore[attr-defined]
            return
        super().step()


@pytest.mark.usefixtures("quiet_relay")
def test_the_real_sequenced_mode_is_exactly_once_on_the_cursor_store() -> None:
    started = time.perf_counter()
    totals = dict.fromkeys(["rows", "late", "retired", "views", "fenced", "crashes", "lost_replies", "dead"], 0)
    for seed in range(FIRST_SEED, FIRST_SEED + SCHEDULES):
        UNSURE_ROLLBACKS.messages.clear()  # a schedule's own announcements explain its own anomalies
        ANOMALIES.messages.clear()
        world = CursorWorld(seed)
        world.start_relay()
        for _ in range(world.rng.randint(100, 400)):
            world.step()
        world.drain()
        check(world, final=True)
        db: CursorModelDB = world.db  # type: ignore[assignment]
        totals["retired"] += db.retire()  # everything is delivered: every partition below low goes
        assert not db.mvcc.violations, f"seed {seed}: {db.mvcc.violations[:3]}"
        assert not db.rows, f"seed {seed}: rows {sorted(db.rows)} never passed by a fenced commit"
        totals["rows"] += len(db.committed) + len(db.dead)
        totals["late"] += world.late
        totals["retired"] += world.retired
        totals["views"] += sum(r.mode.views_started for r in world.relays)
        totals["fenced"] += db.refused
        totals["dead"] += len(db.dead)
        for k in ("crashes", "lost_replies"):
            totals[k] += world.stats[k]
    took = time.perf_counter() - started
    print(f"\n{SCHEDULES} schedules in {took:.1f}s: {totals}")
    if SCHEDULES >= 100:
        quiet = [k for k, v in totals.items() if not v]
        assert not quiet, f"no schedule had any {quiet}: {totals}"
