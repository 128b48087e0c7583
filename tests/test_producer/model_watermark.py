"""The cursor layout's model world for test_watermark_model.py: writers (MVCC transactions on
model_mvcc.py's outbox), relay leaders driving producer/layouts/cursor/_watermark.py's decisions in either mode, faults,
takeovers, truncation, and the checks (see test_watermark_model.py's module doc)."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from model_mvcc import MVCC, Crash, CursorStore, Row

from harvest_outbox.producer.errors import DatabaseError, FenceError
from harvest_outbox.producer.layouts.cursor._watermark import Cursor, read_page, retirable, start_batch

WRITERS = 4
KEYS = 6


@dataclass
class Writer:
    xid: int | None = None
    keys: set[str] = field(default_factory=set)
    drawn: list[tuple[int, str, str]] = field(default_factory=list)  # lazy_xid: ids drawn, not yet inserted
    rows: list[int] = field(default_factory=list)
    hold: int = 0  # a long transaction: how many more of its turns it stays open
    long: bool = False


@dataclass
class PageOut:
    no: int
    rows: tuple[tuple[int, Row], ...]
    dead: tuple[int, ...]
    after: Cursor
    delivered: int = 0


class Relay:
    """A leader: one view (epoch) at a time, a local read cursor ahead of the committed one, pages in flight."""

    def __init__(self, world: World, n: int) -> None:
        self.world, self.n = world, n
        self.alive = True
        self.store = CursorStore(world.db, self._chaos)
        self.view = 0
        self.epoch = 0
        self.cursor = Cursor()
        self.pages: deque[PageOut] = deque()
        self.inflight: deque[tuple[int, Row, PageOut]] = deque()
        self.page_no = 0
        self.batch_published: set[int] = set()
        self.refresh()

    def _chaos(self, op: str) -> str:
        return self.world.db_fate(self)

    def refresh(self) -> None:
        """A new view: raise the fence, restart from the committed cursor."""
        self.inflight.clear()
        self.pages.clear()
        self.batch_published = set()
        self.world.views += 1
        self.view = self.world.views
        self.epoch, self.cursor = self.store.new_view()
        self.resumed = self.cursor.pos if self.cursor.hi is not None else -1  # rows <= it: earlier views'

    def tick(self) -> None:
        if len(self.pages) >= 3:
            return
        if self.cursor.hi is None:
            now, xid, head = self.store.begin_read(probe=self.world.rng.random() < self.world.probe_rate)
            self.cursor = start_batch(self.cursor, now, xid, head)
            self.batch_published = set()
            self.resumed = -1
            self.world.note_batch(self.cursor, head)
        visible = self.store.read(self.cursor.scan_from())
        self.world.scanned.append(len(visible))
        page = read_page(self.cursor, [(i, x, (i, r)) for i, x, r in visible], self.world.limit)
        self.page_no += 1
        dead = tuple(i for i, r in page.rows if r.value.startswith("poison"))
        out = PageOut(self.page_no, tuple((i, r) for i, r in page.rows if i not in dead), dead, page.after)
        self.batch_published.update(i for i, _r in page.rows)
        if page.complete:
            self.world.check_no_stall(self.cursor, self.batch_published, self.resumed)
        self.cursor = page.after
        self.pages.append(out)
        for i, r in out.rows:
            self.inflight.append((i, r, out))

    def deliver(self) -> None:
        """The broker decides the oldest record in flight (one ordered, gap-less producer)."""
        i, r, page = self.inflight.popleft()
        w = self.world
        if not w.calm and w.rng.random() < w.fault:
            w.stats["failed_deliveries"] += 1
            if w.rng.random() < 0.5:
                w.published(i, r.key, self.view, page.no)  # timed out after the broker wrote it
            raise DatabaseError("delivery failed")  # the relay's reaction is the same: a new view
        w.published(i, r.key, self.view, page.no)
        page.delivered += 1

    def commit(self) -> None:
        page = self.pages[0]
        if page.delivered < len(page.rows):
            return
        self.store.commit(self.epoch, page.after, self.view, page.no, tuple(i for i, _r in page.rows), page.dead)
        self.pages.popleft()

    def crash(self) -> None:
        """Records in flight: a prefix may reach the log; nothing else survives."""
        self.alive = False
        self.world.stats["crashes"] += 1
        for i, r, page in list(self.inflight):
            if self.world.rng.random() < 0.5:
                break
            self.world.published(i, r.key, self.view, page.no)


class World:
    def __init__(self, seed: int, sequenced: bool, lazy_xid: bool = False) -> None:
        self.seed, self.sequenced, self.lazy_xid = seed, sequenced, lazy_xid
        self.rng = rng = random.Random(seed)
        self.db = MVCC(partition_ids=rng.choice([4, 8, 16]))
        self.limit = rng.choice([1, 3, 10, 100])
        self.fault = rng.choice([0.0, 0.02, 0.05, 0.1])
        self.crashes = rng.choice([0.0, 0.005, 0.02])
        self.long_txns = rng.random() < 0.5
        self.probe_rate = rng.choice([1.0, 0.3])  # a relay need not pay an xid per batch
        self.calm = False
        self.writers = [Writer() for _ in range(WRITERS)]
        self.key_owner: dict[str, int] = {}
        self.expected: dict[str, list[int]] = {}  # key -> committed ids in commit order
        self.committed_ids: set[int] = set()
        self.aborted_ids: set[int] = set()
        self.poison: set[int] = set()
        self.log: list[tuple[int, str, int, int]] = []  # (id, key, view, page)
        self.relays: list[Relay] = []
        self.views = 0
        self.steps = 0
        self.scanned: list[int] = []
        #: a long transaction open or not -> head - low + 1 at each batch start: what it costs
        self.width: dict[bool, list[int]] = {True: [], False: []}
        self.retired = 0
        self.committed_at: dict[int, tuple[int, bool]] = {}  # id -> (step, a long transaction was open)
        self.delay: dict[bool, list[int]] = {True: [], False: []}  # steps from commit to first publish
        self.stats = {"crashes": 0, "failed_deliveries": 0, "lost_replies": 0, "takeovers": 0, "late_commits": 0}

    # ------------------------------------------------------------------ faults
    def db_fate(self, relay: Relay) -> str:
        if self.calm or not relay.alive:
            return "ok"
        r = self.rng.random()
        if r < self.crashes:
            raise Crash(f"relay {relay.n}")
        if r < self.crashes + self.fault:
            return "fail"
        if r < self.crashes + 2 * self.fault:
            self.stats["lost_replies"] += 1
            return "lost_reply"
        if r > 1 - self.crashes:
            return "crash_after"
        return "ok"

    # ------------------------------------------------------------------ writers
    def write(self, w: int) -> None:
        wr = self.writers[w]
        rng = self.rng
        if wr.drawn and rng.random() < 0.5:  # lazy_xid: the INSERT reaches the heap, taking an xid only now
            rid, key, value = wr.drawn.pop(0)
            if wr.xid is None:
                wr.xid = self.db.assign_xid()
            self.db.insert(rid, wr.xid, key, value)
            wr.rows.append(rid)
            return
        if wr.rows or wr.drawn:
            if wr.hold > 0:
                wr.hold -= 1
                return  # a long transaction stays open
            if not wr.drawn and rng.random() < 0.4:
                self.end(w, commit=rng.random() > 0.15)
                return
        if len(wr.rows) + len(wr.drawn) >= 4:
            return
        free = [k for k in (f"k{i}" for i in range(KEYS)) if self.key_owner.get(k, w) == w]
        if not free:
            return
        key = rng.choice(free)
        self.key_owner[key] = w
        wr.keys.add(key)
        if not wr.rows and not wr.drawn:
            wr.hold = rng.randint(5, 60) if self.long_txns and rng.random() < 0.15 else 0
            wr.long = wr.hold > 0
        value = "poison" if rng.random() < 0.03 else "v"
        if self.lazy_xid:
            wr.drawn.append((self.db.nextval(), key, value))
            return
        if wr.xid is None:
            wr.xid = self.db.assign_xid()  # A1: harvest_next_id() takes the xid before nextval
        rid = self.db.nextval()
        self.db.insert(rid, wr.xid, key, value)
        wr.rows.append(rid)
        if value == "poison":
            self.poison.add(rid)

    def end(self, w: int, commit: bool) -> None:
        wr = self.writers[w]
        for rid, key, value in wr.drawn:  # lazy_xid at the end: the remaining INSERTs
            if wr.xid is None:
                wr.xid = self.db.assign_xid()
            self.db.insert(rid, wr.xid, key, value)
            wr.rows.append(rid)
        for rid in wr.rows:
            if self.db.rows[rid].value == "poison":
                self.poison.add(rid)
        if wr.xid is not None:
            if commit and any(rid < max(self.committed_ids, default=0) for rid in wr.rows):
                self.stats["late_commits"] += 1
            self.db.end(wr.xid, commit)
            ids = self.committed_ids if commit else self.aborted_ids
            ids.update(wr.rows)
            if commit:
                other_long = any(o.long for o in self.writers if o is not wr)
                for rid in wr.rows:
                    self.expected.setdefault(self.db.rows[rid].key, []).append(rid)
                    self.committed_at[rid] = (self.steps, other_long)
        for k in wr.keys:
            del self.key_owner[k]
        self.writers[w] = Writer()

    # ------------------------------------------------------------------ relays
    def start_relay(self) -> None:
        n = len(self.relays)
        try:
            self.relays.append(Relay(self, n))
        except (Crash, DatabaseError):
            pass

    def act(self, relay: Relay, what: str) -> None:
        try:
            getattr(relay, what)()
        except Crash:
            relay.crash()
        except FenceError:
            relay.alive = False  # a zombie learns it lost leadership: it stops
        except DatabaseError:
            try:
                relay.refresh()
            except Crash:
                relay.crash()
            except DatabaseError:
                relay.alive = False  # gives up leadership; a takeover follows

    def retire(self) -> None:
        for start, end in retirable(self.db.partitions(), self.db.cursor):
            if start // self.db.partition_ids in self.db.truncated:
                continue
            if self.db.truncate(start, end, self.delivered):
                self.retired += 1

    def delivered(self, rid: int) -> bool:
        if rid in self.poison:
            return rid in self.db.dead
        if self.sequenced:
            return any(rid in ids for ids in self.db.committed_pages.values())
        return any(i == rid for i, *_ in self.log)

    def note_batch(self, cursor: Cursor, head: int | None) -> None:
        if head is not None:
            self.width[any(o.long for o in self.writers)].append(head - cursor.low + 1)

    def published(self, rid: int, key: str, view: int, page: int) -> None:
        self.log.append((rid, key, view, page))
        at = self.committed_at.pop(rid, None)
        if at is not None and not self.calm:
            self.delay[at[1]].append(self.steps - at[0])

    def check_no_stall(self, batch: Cursor, published: set[int], resumed: int) -> None:
        """I3: a completed batch published every row its hi saw and its lo did not."""
        assert batch.hi is not None
        missed = [
            i
            for i, r in self.db.rows.items()
            if r.xid in self.db.committed
            and batch.hi.sees(r.xid)
            and not batch.lo.sees(r.xid)
            and i not in published
            and i > resumed
        ]
        if missed:
            self.db.violations.append(f"batch up to xmax {batch.hi.xmax} left rows {missed} it saw")

    def step(self) -> None:
        self.steps += 1
        rng = self.rng
        live = [r for r in self.relays if r.alive]
        roll = rng.random()
        if roll < 0.35:
            self.write(rng.randrange(WRITERS))
        elif not live:
            self.start_relay()
        elif roll < 0.55:
            r = rng.choice(live)
            self.act(r, "tick")
        elif roll < 0.8:
            busy = [r for r in live if r.inflight]
            if busy:
                r = rng.choice(busy)
                self.act(r, "deliver")
        elif roll < 0.9:
            ready = [r for r in live if r.pages]
            if ready:
                r = rng.choice(ready)
                self.act(r, "commit")
        elif roll < 0.94:
            self.retire()
        elif roll < 0.95 and self.crashes:
            rng.choice(live).crash()
        elif roll < 0.96:
            self.stats["takeovers"] += 1
            self.start_relay()  # the old leader runs on as a zombie until its commit is fenced

    def drain(self) -> None:
        self.calm = True
        for w in range(WRITERS):
            if self.writers[w].rows or self.writers[w].drawn:
                self.end(w, commit=self.rng.random() > 0.15)
        for r in self.relays:
            if r.alive:
                r.crash()
        self.start_relay()
        relay = self.relays[-1]
        for _ in range(100_000):
            db = self.db
            if (
                relay.cursor.hi is None
                and not relay.pages
                and all(db.cursor.lo.sees(r.xid) for r in db.rows.values() if r.xid in db.committed)
            ):
                break
            relay.tick()
            while relay.inflight:
                relay.deliver()
            while relay.pages:
                relay.commit()
        else:
            raise AssertionError(f"seed {self.seed}: the relay did not drain")
        for _ in range(3):  # twice more: low advances a batch behind the probe
            for _ in range(2):
                relay.tick()
                while relay.inflight:
                    relay.deliver()
                while relay.pages:
                    relay.commit()
        self.retire()


def check(world: World) -> None:
    where = f"seed {world.seed} ({'sequenced' if world.sequenced else 'at-least-once'})"
    assert not world.db.violations, f"{where}: {world.db.violations[:3]}"
    published = world.log
    if world.sequenced:
        published = [e for e in world.log if (e[2], e[3]) in world.db.committed_pages]
    ids = [i for i, *_ in published]
    bad = set(ids) & world.aborted_ids
    assert not bad, f"{where}: aborted rows {sorted(bad)} published"
    assert not set(ids) & world.poison, f"{where}: poison rows published"
    assert all(world.db.dead.get(i) == 1 for i in world.poison & world.committed_ids), f"{where}: dead letters"
    want = world.committed_ids - world.poison
    missing = want - set(ids)
    assert not missing, f"{where}: committed rows {sorted(missing)} never published"
    if world.sequenced:
        dup = sorted({i for i in ids if ids.count(i) > 1})
        assert not dup, f"{where}: rows {dup} committed more than once"
    for key, order in world.expected.items():
        order = [i for i in order if i not in world.poison]
        got = [i for i, k, *_ in published if k == key]
        seen: set[int] = set()
        for i in got:  # every row's predecessors of its key are out before its first copy
            if i not in seen:
                before = order[: order.index(i)]
                assert seen >= set(before), f"{where}: key {key}: {i} before {sorted(set(before) - seen)}"
                seen.add(i)
    assert not world.db.rows or min(world.db.rows) >= 0


def run(seed: int, sequenced: bool, lazy_xid: bool = False) -> World:
    world = World(seed, sequenced, lazy_xid)
    world.start_relay()
    for _ in range(world.rng.randint(150, 600)):
        world.step()
    world.drain()
    check(world)
    return world
