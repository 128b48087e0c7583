"""producer/layouts/cursor/_watermark.py's decisions, scenario by scenario: a late commit, the probe, pages, retirement,
bad input; and the bound a long transaction puts on the scan and on retention, measured on the in-memory
MVCC outbox (model_mvcc.py). The random schedules are test_watermark_model.py's."""

from __future__ import annotations

import pytest
from model_mvcc import MVCC

from harvest_outbox.producer.layouts.cursor._watermark import (
    ORIGIN,
    Cursor,
    Probe,
    Snapshot,
    needs_xid,
    page_end,
    read_page,
    retirable,
    start_batch,
)


# ---------------------------------------------------------------------------- the bound, measured
@pytest.mark.parametrize("where", ["outbox", "elsewhere"])
@pytest.mark.parametrize("hold", [0, 50, 400])
def test_a_long_transaction_delays_only_its_own_rows(hold: int, where: str) -> None:
    """One writer commits a row per step and the relay runs a batch per step, while one transaction
    stays open ``hold`` steps: with a row in the outbox (a late commit) or only an xid (any write
    anywhere in the cluster: xids are cluster-wide). Every other row goes out in the batch after its
    commit; the open transaction costs the scan its width (rows written while it is open: low cannot
    pass it) and keeps their partitions, and both recover three batches after it ends (the probe lags: steady state, 2-4 rows of width per row a batch)."""
    db = MVCC(partition_ids=16)
    cursor = Cursor()
    long_xid = db.assign_xid()
    long_id = None
    if where == "outbox":
        long_id = db.nextval()
        db.insert(long_id, long_xid, "long", "v")
    committed_at: dict[int, int] = {}
    delays: dict[int, int] = {}
    widths: list[int] = []
    kept: list[int] = []
    for step in range(hold + 100):
        x = db.assign_xid()
        rid = db.nextval()
        db.insert(rid, x, f"k{step % 5}", "v")
        db.end(x, commit=True)
        committed_at[rid] = step
        if step == hold:
            db.end(long_xid, commit=True)
            if long_id is not None:
                committed_at[long_id] = step
        snap = db.snapshot()
        rx = db.assign_xid()  # the relay's read: snapshot, xid, head
        head = db.head(snap)
        db.end(rx, commit=True)
        cursor = start_batch(cursor, snap, rx, head)
        assert head is not None
        widths.append(head - cursor.scan_from() + 1)
        page = read_page(cursor, [(i, xid, i) for i, xid, _r in db.visible(db.snapshot(), cursor.scan_from())], 10**6)
        assert page.complete
        for i in page.rows:
            assert i not in delays, f"row {i} published twice"
            delays[i] = step - committed_at[i]
        cursor = db.cursor = page.after
        for start, end in retirable(db.partitions(), cursor):
            assert db.truncate(start, end, lambda i: i in delays)
        kept.append(len(db.partitions()))
    assert not db.violations, db.violations
    assert set(delays) == set(committed_at), "a committed row was not published"
    assert max(delays.values()) == 0, "a row waited for another transaction"
    assert max(widths) <= hold + 4, (
        f"the scan widened beyond the rows written while the transaction was open: {max(widths)}"
    )
    assert widths[-1] <= 4 and kept[-1] <= 2, "the bound did not recover after the transaction ended"
    assert max(kept) <= (hold + 4) // 16 + 2
    print(
        f"\nhold {hold} ({where}): max scan width {max(widths)} rows, max partitions kept {max(kept)}, after: {widths[-1]}"
    )


# ---------------------------------------------------------------------------- the module's unit scenarios
def test_a_late_commit_is_published_in_the_batch_after_its_commit() -> None:
    # xid 10 drew id 1 and runs on; xid 11 inserted id 2 and committed
    now = Snapshot(10, 12, frozenset({10}))
    c = start_batch(Cursor(), now, xid=12, head=2)
    page = read_page(c, [(2, 11, "b")], limit=10)
    assert page.rows == ("b",) and page.complete
    later = Snapshot(13, 13)  # 10 committed
    c2 = start_batch(page.after, later, xid=13, head=2)
    assert c2.scan_from() <= 1, "the id bound must not pass the open transaction's id"
    page2 = read_page(c2, [(1, 10, "a"), (2, 11, "b")], limit=10)
    assert page2.rows == ("a",)


def test_the_probe_advances_low_only_once_lo_saw_its_xid_end() -> None:
    c = start_batch(Cursor(), Snapshot(5, 5), xid=5, head=40)
    assert c.low == 0 and c.probe == Probe(40, 5)
    c = read_page(c, [], 10).after
    c = start_batch(c, Snapshot(6, 6), xid=6, head=41)  # lo is Snapshot(5,5): xid 5 not yet ended in it
    assert c.low == 0
    c = read_page(c, [], 10).after
    c = start_batch(c, Snapshot(7, 7), xid=7, head=41)  # lo = Snapshot(6,6) saw xid 5 end
    assert c.low == 41 and c.probe == Probe(41, 7)


def test_a_batch_without_an_xid_takes_no_probe() -> None:
    c = start_batch(Cursor(), Snapshot(5, 5), xid=None, head=40)
    assert c.probe is None and c.low == 0


def test_a_full_page_leaves_the_batch_open_at_its_last_id() -> None:
    c = start_batch(Cursor(), Snapshot(9, 9), xid=9, head=3)
    page = read_page(c, [(1, 4, "a"), (2, 5, "b"), (3, 6, "c")], limit=2)
    assert page.rows == ("a", "b") and not page.complete and page.after.pos == 2
    rest = read_page(page.after, [(3, 6, "c")], limit=2)
    assert rest.rows == ("c",) and rest.complete and rest.after.lo == Snapshot(9, 9)


def test_retirable_partitions_end_at_or_below_low() -> None:
    c = Cursor(low=16)
    assert retirable([(0, 8), (8, 16), (16, 24)], c) == [(0, 8), (8, 16)]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: Snapshot(5, 4), "not a snapshot"),
        (lambda: Snapshot(5, 9, frozenset({9})), "not a snapshot"),
        (lambda: start_batch(Cursor(hi=Snapshot(5, 5)), Snapshot(6, 6), 6, None), "is not complete"),
        (lambda: start_batch(Cursor(lo=Snapshot(9, 9)), Snapshot(5, 5), 5, None), "older than the cursor"),
        (lambda: read_page(Cursor(), [], 5), "no batch in progress"),
        (lambda: read_page(Cursor(hi=Snapshot(5, 5)), [], 0), "limit must be at least 1"),
        (lambda: read_page(Cursor(lo=ORIGIN, hi=Snapshot(9, 9)), [(2, 4, 0), (1, 4, 0)], 5), "not in id order"),
    ],
)
def test_bad_input_is_refused_with_what_was_wrong(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()  # type: ignore[operator]


# ---------------------------------------------------------------------------- page_end: read_page without per-row work
def test_page_end_agrees_with_read_page_on_random_pages() -> None:
    """The relay's reader trusts the statement's WHERE (test_watermark_pg.py compares it with
    ``Cursor.pending``) and decides the page from its count and last id: the same cursor and
    completeness as :func:`read_page` on the same rows, for full, short and empty pages."""
    import random

    rng = random.Random(7)
    for _ in range(2000):
        lo = Snapshot(10, 20, frozenset(x for x in range(10, 20) if rng.random() < 0.3))
        hi = Snapshot(20, 30, frozenset(x for x in range(20, 30) if rng.random() < 0.3))
        cursor = start_batch(Cursor(lo=lo, low=rng.randrange(5)), hi, 31, 100)
        rows = [(i, rng.randrange(5, 30), i) for i in range(cursor.pos + 1, 60) if rng.random() < 0.5]
        limit = rng.randint(1, 12)
        page = read_page(cursor, rows, limit)
        pending = [r for r in rows if cursor.pending(r[0], r[1])][:limit]
        after, complete = page_end(cursor, len(pending), pending[-1][0] if pending else None, limit)
        assert (after, complete) == (page.after, page.complete)


def test_page_end_refuses_what_is_not_a_page() -> None:
    cursor = start_batch(Cursor(), Snapshot(5, 5), None, None)
    for count, last, limit in [(2, 7, 1), (1, None, 3), (0, 4, 3), (1, 1, 0)]:
        with pytest.raises(ValueError):
            page_end(cursor, count, last, limit)
    with pytest.raises(ValueError, match="no batch in progress"):
        page_end(Cursor(), 0, None, 1)


def test_needs_xid_only_without_a_probe_or_when_it_resolves() -> None:
    assert needs_xid(Cursor())
    assert not needs_xid(Cursor(lo=Snapshot(10, 10), probe=Probe(5, 10)))
    assert needs_xid(Cursor(lo=Snapshot(11, 11), probe=Probe(5, 10)))
