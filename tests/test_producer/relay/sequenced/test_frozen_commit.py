"""A relay frozen in the middle of its fenced commit (``--uuid-sequencing``) must not lock out the
next leader for longer than ``IDLE_IN_TRANSACTION_TIMEOUT``.

A whole process can stop at any instruction (SIGSTOP, a VM or container pause, a long swap storm);
its kernel keeps its TCP connections open, so Postgres keeps its sessions. The fence row lock taken
by the commit's first statement is what a new leader's view start needs. Found by the zombie test
(``test_sequencing_crash.py::test_zombie_commit_refused_by_fence[postgres]``, 1 run in ~20): the
commit used to go out as a pipeline, statement by statement; a zombie frozen after the fence UPDATE
had been sent, but before the rest, left its session *running* (Postgres waited for the rest of the
pipeline) with the fence row locked and no timeout covering it, and the new leader could not start a
view until the zombie woke up.

The server's view of a client frozen half way through writing is reproduced exactly with a proxy
that lets the client's first bytes through and holds the rest (``NetFault.stall_client_after``).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, NamedTuple

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from harvest_outbox.harvest_local.netfault import NetFault
from harvest_outbox.producer.db import IDLE_IN_TRANSACTION_TIMEOUT, TxnCommit
from harvest_outbox.producer.errors import DatabaseError
from harvest_outbox.producer.layouts.mark.database import MarkDatabase
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

pytestmark = pytest.mark.integration

ROWS = 20_000  # a commit naming this many ids is a request of ~150 kB: a freeze can cut it anywhere


def _locked(pg_dsn: str, names: OutboxNames, ids: list[int]) -> list[str]:
    """What of the fence row and the committed rows another session cannot lock right now."""
    held = []
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for what, q, params in (
            ("fence row", sql.SQL("SELECT epoch FROM {} FOR UPDATE NOWAIT").format(names.state), ()),
            (
                "outbox rows",
                sql.SQL("SELECT id FROM {} WHERE id = ANY(%s) FOR UPDATE NOWAIT").format(names.outbox),
                (ids,),
            ),
        ):
            try:
                with conn.transaction():
                    conn.execute(q, params)
            except psycopg.errors.LockNotAvailable:
                held.append(what)
    return held


class _View(NamedTuple):
    names: OutboxNames
    proxy: NetFault
    db: MarkDatabase  # connected through the proxy
    leader: uuid.UUID
    epoch: int
    ids: list[int]  # marked by this view, not committed


@pytest.fixture
def view(pg_dsn: str, pg_schema: str) -> Iterator[_View]:
    """A view of a fresh outbox (``ROWS`` rows, all marked) whose connection runs through a proxy."""
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table)
    with psycopg.connect(pg_dsn) as conn:
        Stasher(table).stash_many(conn, [OutboxRecord("t", f"k{i % 100}", "v") for i in range(ROWS)])
    params = conninfo_to_dict(pg_dsn)
    proxy = NetFault((str(params.get("host", "127.0.0.1")), int(params.get("port", 5432))), name="pg").start()
    db = MarkDatabase(make_conninfo(pg_dsn, host="127.0.0.1", port=str(proxy.port)), names)
    try:
        leader = uuid.uuid4()
        epoch, _intents = db.start_view(leader, "zombie")
        ids = [r[0] for r in db.mark(leader, ROWS)]
        assert len(ids) == ROWS
        yield _View(names, proxy, db, leader, epoch, ids)
    finally:
        db.close()
        proxy.stop()


def _commit_in_background(
    db: MarkDatabase, epoch: int, leader: uuid.UUID, ids: list[int]
) -> tuple[threading.Thread, list[BaseException | None]]:
    """Commit ``ids`` as one harvest transaction on a thread; the list gets None or the error."""
    done: list[BaseException | None] = []

    def commit() -> None:
        try:
            db.commit_txns(epoch, leader, [TxnCommit(ids, [], b"P1", 7, [("t", 0)])])
            done.append(None)
        except BaseException as exc:
            done.append(exc)

    t = threading.Thread(target=commit, daemon=True)
    t.start()
    return t, done


def _remaining(pg_dsn: str, names: OutboxNames) -> int:
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(names.outbox)).fetchone()
    return int(row[0]) if row else -1


def test_a_commit_frozen_half_sent_holds_no_lock(pg_dsn: str, view: _View) -> None:
    # Every other row: a range with thousands of holes, so the commit names its 10,000 ids one by one
    # (a request of ~75 kB; a range's request is a few hundred bytes).
    ids = view.ids[::2]
    view.proxy.stall_client_after(8_000)  # the commit's first 8 kB reach Postgres, then the relay "freezes"
    t, done = _commit_in_background(view.db, view.epoch, view.leader, ids)
    time.sleep(1.0)
    assert not done, "the commit should be stuck behind the frozen bytes"
    assert _locked(pg_dsn, view.names, ids) == []  # a new leader's view could start and mark right now
    view.proxy.heal()  # the zombie wakes: its commit goes through whole (its epoch is still current here)
    t.join(30)
    assert done == [None]
    assert _remaining(pg_dsn, view.names) == ROWS - len(ids)


def test_a_commit_frozen_before_its_commit_is_ended_by_the_server(
    pg_dsn: str, view: _View, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Frozen after the request ran (fence row and rows locked) but before COMMIT: the session is
    idle in transaction, which Postgres ends after ``IDLE_IN_TRANSACTION_TIMEOUT``; nothing commits."""
    conn = view.db.conn
    real_execute = conn.execute
    frozen = threading.Event()

    def freeze_before_commit(query: Any, *args: Any, **kwargs: Any) -> Any:
        if query == "COMMIT":
            view.proxy.stall_client_after(0)
            frozen.set()
        return real_execute(query, *args, **kwargs)

    monkeypatch.setattr(conn, "execute", freeze_before_commit)
    t, done = _commit_in_background(view.db, view.epoch, view.leader, view.ids)
    assert frozen.wait(30)
    assert _locked(pg_dsn, view.names, view.ids[:10]) == ["fence row", "outbox rows"]
    timeout = float(IDLE_IN_TRANSACTION_TIMEOUT.rstrip("s"))
    started = time.monotonic()
    while _locked(pg_dsn, view.names, view.ids[:10]):
        assert time.monotonic() - started < timeout + 10, "the frozen session still holds its locks"
        time.sleep(0.2)
    view.proxy.heal()  # the zombie wakes: its COMMIT meets a closed session
    t.join(30)
    assert len(done) == 1 and isinstance(done[0], DatabaseError), done
    assert _remaining(pg_dsn, view.names) == ROWS  # rolled back: every row is still there for the next view
