"""The cursor layout under the real ``--uuid-sequencing`` mode: test_protocol_model.py's schedules
(the real :class:`~producer.relay.sequenced.mode.SequencedMode`, the model topic, crashes, zombies, lost replies,
failed deliveries, the project's Sequencer reading the log) on a database whose
:class:`~producer.relay.sequenced._store.SequencedStore` reads with producer/layouts/cursor/_watermark.py's cursor instead of
marking rows, and whose fenced commit moves the cursor instead of deleting them
(docs/design.md §11: "The commit protocol, both modes").

- a view's reads start from the committed cursor as it was when ``start_view_with_floor`` raised the
  epoch (one transaction), and go on batch by batch (snapshot intervals) from there;
- ``commit_txns`` checks the epoch, then that the transactions' rows (delivered and dead-lettered)
  are exactly the view's next unread-to-committed rows in read order -- the only thing a cursor can
  represent -- and moves the cursor past the last one (to its page's end, and past empty pages read
  right behind it, when it ends a page); the rest (ACK intents, dead letters, attempt counts, the
  clock) is the mark relay's model's, unchanged. That bookkeeping is the relay's own:
  producer/layouts/cursor/views.py's ``ViewRead``, which producer/layouts/cursor/database.py's ``CursorDatabase`` runs on Postgres;
- writers are MVCC transactions: an xid first, then ids (A1), the rows invisible until commit; some
  roll back, some commit late (lower ids than rows already relayed); delivered id-range partitions are
  truncated under the committed cursor.

The checks are test_protocol_model.py's own (every committed row committed exactly once to
read-committed readers or dead-lettered, per-key order, no reader anomaly), plus the cursor model's
(no row committed below the cursor's ``low``, no partition truncated with an undelivered row).

Odd seeds run ``deadLetterPolicy: haltKey`` with the cursor layout's held rows (producer/layouts/cursor/held.py's
statements in memory: model_held.py), as ``CursorDatabase`` runs them: each read first serves the held rows
of released keys (held order, only once the committed cursor passed their outbox row, not those the view
serves already), then copies the page's rows of halted or held keys to ``_held`` -- fenced: a read by a view
whose epoch was raised copies nothing and ends the view -- and gives the mode the others; the copied ones
pass with the cursor (``ViewRead.skipped``); an empty page commits an idle view's cursor past them; the
fenced commit copies the rows the mode dropped for a key it halted (``TxnCommit.held``), deletes delivered
served rows from ``_held`` and moves dead-lettered ones to the dead letters. The schedules also *release*
halted keys (requeue their dead letters into ``_held`` ahead of the key's held rows, or discard them; both
refused while the cursor has not passed a dead letter's outbox row), between crashes, takeovers and zombies;
the drain releases every key left halted and drains again. Checks on top of the others:

- no row of a key is committed by a harvest transaction while the key is halted (from the transaction
  that dead-lettered a row of it to its release);
- every committed row is committed exactly once in the end (requeued dead letters too), but discarded
  dead letters, in per-key id order across the halt;
- no partition is truncated while it holds a row neither delivered nor copied to ``_held``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from model_db import ModelDB
from model_held import HeldState, Key
from model_mvcc import MVCC
from model_relay import Relay
from test_protocol_model import (  # noqa: F401 (quiet_relay: the fixture)
    ANOMALIES,
    TOPIC,
    UNSURE_ROLLBACKS,
    WRITERS,
    World,
    check,
    quiet_relay,
)

from harvest_outbox.producer.db import MarkedAttempts, MarkedRow, TxnCommit
from harvest_outbox.producer.errors import DatabaseError, FenceError
from harvest_outbox.producer.layouts.cursor._watermark import Cursor, read_page, retirable, start_batch
from harvest_outbox.producer.layouts.cursor.views import NotNextRows, Segment, ViewRead

#: 500 (was 1,000: docs/tests.md): mutants of the view's bookkeeping (producer/layouts/cursor/views.py: a
#: partly committed page passed whole, the idle cursor past pending rows, held rows skipping unheld ones)
#: fail by seed 13; test_protocol_model runs the same SequencedMode over 1,000 schedules
SCHEDULES = int(os.environ.get("MODEL_SCHEDULES", "500"))
FIRST_SEED = int(os.environ.get("MODEL_SEED", "0"))


@dataclass
class CursorModelDB(ModelDB):
    """ModelDB whose mark is a cursor read and whose fenced commit moves the cursor (module doc).
    ``rows`` keeps ModelDB's meaning for the checks: committed rows no fenced commit passed yet."""

    mvcc: MVCC = field(default_factory=MVCC)
    cursor: Cursor = field(default_factory=Cursor)
    views: dict[uuid.UUID, ViewRead] = field(default_factory=dict)
    mark_limit_hits: int = 0
    #: haltKey: the dead letters and _held (model_held.py); the held rows each view serves (``View.serving``)
    held: HeldState = field(default_factory=HeldState)
    serving: dict[uuid.UUID, set[int]] = field(default_factory=dict)
    info: dict[int, tuple[str, bytes, bytes, int]] = field(default_factory=dict)  # id -> topic, key, value, xid
    idle_commits: int = 0
    idle_skips: int = 0  # idle cursors that moved lo / hi alone: not written
    served: int = 0
    poison: set[int] = field(default_factory=set)  # rows the mode dead-letters on sight (a bad row)

    def insert(self, rid: int, topic: str, key: bytes, value: bytes) -> None:
        super().insert(rid, topic, key, value)
        self.info[rid] = (topic, key, value, self.mvcc.rows[rid].xid)

    def key_of(self, rid: int) -> Key:
        return self.info[rid][0], self.info[rid][1]

    def passed(self, rid: int, xid: int) -> bool:
        """The committed cursor has passed outbox row ``(rid, xid)`` (cursor_held's ``_passed``)."""
        c = self.cursor
        return c.lo.sees(xid) or (c.hi is not None and c.hi.sees(xid) and rid <= c.pos)

    def start_view_with_floor(
        self, leader_id: uuid.UUID, name: str
    ) -> tuple[int, list[tuple[int, bytes, int, str, int]], int]:
        out = super().start_view_with_floor(leader_id, name)
        # the same transaction: the cursor as of this epoch; the relay's own bookkeeping (producer/layouts/cursor/views.py)
        self.views[leader_id] = ViewRead(leader_id, out[0], self.cursor)
        self.serving[leader_id] = set()
        return out

    def _row(self, i: int, topic: str, key: bytes, value: bytes) -> MarkedRow:
        n, error = self.attempts.get(i, (None, None))
        return (i, topic, key, value, None, None, "poison" if i in self.poison else None, n, error, None, 0.0)

    def _serve_released(self, leader_id: uuid.UUID, limit: int) -> list[MarkedRow]:
        """CursorDatabase._serve_released: held rows of released keys, held order, not served already."""
        serving = self.serving[leader_id]
        ids = self.held.released(serving, limit, self.passed)
        serving.update(ids)
        self.served += len(ids)
        return [self._row(i, *self.info[i][:3]) for i in ids]

    def mark_with_attempts(self, leader_id: uuid.UUID, limit: int) -> tuple[list[MarkedRow], MarkedAttempts]:
        view = self.views[leader_id]
        db = self.mvcc
        served: list[MarkedRow] = []
        if self.halt_keys:
            served = self._serve_released(leader_id, limit)
            limit -= len(served)
            if limit < 1:
                return served, {r[0]: (r[7], r[8]) for r in served if r[7] is not None}  # type: ignore[misc]
        if view.cursor.hi is None:
            snap = db.snapshot()
            xid = db.assign_xid()
            head = db.head(snap)
            db.end(xid, commit=True)
            view.cursor = start_batch(view.cursor, snap, xid, head)
        batch = view.cursor
        page = read_page(batch, [(i, x, (i, r)) for i, x, r in db.visible(db.snapshot(), batch.scan_from())], limit)
        waiting: set[int] = set()
        if self.halt_keys and page.rows:
            # held_read_sql: one statement, fenced by the cursor row's epoch (a zombie copies nothing and ends)
            if view.epoch != self.epoch:
                raise DatabaseError(f"another view raised the cursor's epoch (was {view.epoch}); this view ends")
            waiting = {i for i, r in page.rows if self.held.waits((TOPIC, r.key.encode()))}
            self.held.hold(
                (i, (TOPIC, r.key.encode()), r.xid)
                for i, r in page.rows
                if i in waiting and i not in self.held.dead_letters
            )
        rows: list[MarkedRow] = [
            self._row(i, TOPIC, r.key.encode(), r.value.encode()) for i, r in page.rows if i not in waiting
        ]
        view.add(Segment(batch, [i for i, _r in page.rows], page.after))
        view.skipped.update(waiting)
        if not page.rows:
            self._idle_commit(view)
        rows = served + rows
        return rows, {r[0]: (r[7], r[8]) for r in rows if r[7] is not None}  # type: ignore[misc]

    def _idle_commit(self, view: ViewRead) -> None:
        """CursorDatabase._idle_commit: an idle view's cursor (past held rows only, too), fenced by its epoch."""
        cur = view.idle_cursor()
        if cur is None:
            return
        if view.only_snapshots_moved(cur):  # nothing written: the empty pages pass, the committed cursor stays
            view.idle_committed(cur, written=False)
            self.idle_skips += 1
            return
        if view.epoch != self.epoch:
            return
        view.idle_committed(cur)
        self.cursor = self.mvcc.cursor = cur
        self.idle_commits += 1

    def commit_txns(self, epoch: int, leader_id: uuid.UUID, txns: Sequence[TxnCommit]) -> None:
        if epoch != self.epoch:
            self.refused += 1
            raise FenceError(f"commit refused by the fence: epoch is {self.epoch}, this view's is {epoch}")
        view = self.views[leader_id]
        serving = self.serving[leader_id]
        sent = [i for t in txns for i in t.ids] + [i for t in txns for i, _e, _a in t.dead]
        # haltKey: rows read and dropped unsent for a key the view halted (a served held row stays where it is)
        dropped = [i for t in txns for i in t.held if i not in serving]
        passed = [i for i in sent if i not in serving] + dropped  # the view's outbox rows, in any order
        try:
            cursor, finished, done = view.plan_exact(passed)
        except NotNextRows as exc:  # recorded: the relay may catch what it raises
            self.mvcc.violations.append(f"{exc}: a cursor cannot represent it")
            raise AssertionError(str(exc)) from None
        for i in sent:
            self.rows[i][3] = leader_id  # ModelDB's ownership check: the view's own rows
        super().commit_txns(epoch, leader_id, txns)
        if self.halt_keys:  # the same transaction
            self.held.hold((i, self.key_of(i), self.info[i][3]) for i in dropped)
            for t in txns:
                for i in t.ids:
                    self.held.rows.pop(i, None)  # delivered: a served row leaves _held
                for i, _e, _a in t.dead:
                    self.held.dead_letter(i, self.key_of(i))
            serving.difference_update(sent)
        view.apply(finished, done)  # only once the commit succeeded, as CursorDatabase does
        if cursor is not None:
            self.cursor = self.mvcc.cursor = cursor

    def release(self, key: Key, requeue: bool) -> list[int] | None:
        """``harvest deadletter requeue`` / ``discard`` of a key's dead letters: None when refused (the
        committed cursor has not passed one's outbox row yet: require_passed)."""
        ids = [i for i, k in self.held.dead_letters.items() if k == key]
        if not all(self.passed(i, self.info[i][3]) for i in ids):
            return None
        if requeue:
            for i in self.held.requeue(key):
                del self.dead[i]  # it will be committed once more, as a record
                self.rows[i] = [key[0], key[1], self.info[i][2], None]
            return ids
        return self.held.discard(key)

    def retire(self) -> int:
        n = 0
        for start, end in retirable(self.mvcc.partitions(), self.cursor):
            # a row copied to _held is safe there (served from it); any other not passed by a commit is not
            n += self.mvcc.truncate(start, end, lambda i: i not in self.rows or i in self.held.rows)
        return n


class CursorWorld(World):
    """test_protocol_model's World with MVCC writers (xid, then ids; visible at commit) and truncation."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.db = CursorModelDB(halt_keys=seed % 2 == 1, mvcc=MVCC(partition_ids=self.rng.choice([4, 16])))
        self.xids: list[int | None] = [None] * WRITERS
        self.retired = 0
        self.late = 0
        #: haltKey: key -> (the commit step that halted it, the last commit step before its release)
        self.halts: dict[Key, list[tuple[int, int]]] = {}
        self.released = {"requeued": 0, "discarded": 0, "refused": 0}

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
                if self.rng.random() < 0.03:
                    self.db.poison.add(rid)  # type: ignore[attr-defined]
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
        if self.db.halt_keys and self.db.dead_keys and self.rng.random() < 0.1:
            self.release(self.rng.choice(sorted(self.db.dead_keys)), requeue=self.rng.random() < 0.6)
            return
        super().step()

    def release(self, key: Key, requeue: bool) -> bool:
        """The operator requeues or discards a halted key's dead letters (the key is released)."""
        db: CursorModelDB = self.db  # type: ignore[assignment]
        if db.release(key, requeue) is None:
            self.released["refused"] += 1
            return False
        self.halts.setdefault(key, []).append((db.dead_keys.pop(key), db.steps))
        self.released["requeued" if requeue else "discarded"] += 1
        return True

    def _drain(self) -> Relay:
        try:
            return super().drain()
        except AssertionError as exc:  # a stall: say what the model recorded before it
            raise AssertionError(f"{exc}; recorded: {self.db.mvcc.violations[:3]}") from None  # type: ignore[attr-defined]

    def drain(self) -> Relay:
        """test_protocol_model's drain, then (haltKey) every key left halted released, and drained again."""
        relay = self._drain()
        for _ in range(20):
            if not (self.db.halt_keys and self.db.dead_keys):
                return relay
            db: CursorModelDB = self.db  # type: ignore[assignment]
            for key in sorted(db.dead_keys):  # a poison row requeued would halt its key again
                poisoned = any(k == key and i in db.poison for i, k in db.held.dead_letters.items())
                self.release(key, requeue=not poisoned and self.rng.random() < 0.6)
            relay = self._drain()  # a fresh relay (the last one crashes): served held rows in between
        raise AssertionError(f"seed {self.seed}: keys {sorted(self.db.dead_keys)} still halted after the drains")


def check_halts(world: CursorWorld) -> None:
    """haltKey (module doc): nothing of a key committed while it was halted; after the releases every
    committed row committed once, requeued dead letters too, in per-key id order (check() compares the
    log with the expected rows); nothing left in ``_held`` or in the dead letters but discarded rows."""
    db: CursorModelDB = world.db  # type: ignore[assignment]
    where = f"seed {world.seed}"
    for key, spans in world.halts.items():
        for start, end in spans:
            during = [i for i, at in db.committed_at.items() if start < at <= end and db.key_of(i) == key]
            assert not during, f"{where}: key {key!r}: rows {during} committed while it was halted ({start}..{end}]"
    assert not db.held.rows, f"{where}: rows {sorted(db.held.rows)} left in _held"
    assert not db.held.dead_letters, f"{where}: dead letters {sorted(db.held.dead_letters)} left after the releases"


@pytest.mark.usefixtures("quiet_relay")
def test_the_real_sequenced_mode_is_exactly_once_on_the_cursor_store() -> None:
    started = time.perf_counter()
    totals = dict.fromkeys(["rows", "late", "retired", "views", "fenced", "crashes", "lost_replies", "dead"], 0)
    halts = dict.fromkeys(
        ["halted", "held", "served", "requeued", "discarded", "refused", "idle_commits", "idle_skips"], 0
    )
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
        check_halts(world)
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
        halts["halted"] += sum(len(spans) for spans in world.halts.values())
        halts["held"] += db.held.held_total
        halts["served"] += db.served
        halts["idle_commits"] += db.idle_commits
        halts["idle_skips"] += db.idle_skips
        for k, n in world.released.items():
            halts[k] += n
    took = time.perf_counter() - started
    print(f"\n{SCHEDULES} schedules in {took:.1f}s: {totals}\n  haltKey (odd seeds): {halts}")
    if SCHEDULES >= 100:
        # "refused" stays 0 here: the fenced commit that dead-letters a row passes it (require_passed is for
        # the at-least-once mode, whose dead letter and cursor commit are two statements)
        quiet = [k for k, v in {**totals, **halts}.items() if not v and k != "refused"]
        assert not quiet, f"no schedule had any {quiet}: {totals} {halts}"
