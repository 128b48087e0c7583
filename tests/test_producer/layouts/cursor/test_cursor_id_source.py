"""The cursor layout's id source under changes made while the relay runs (issue #44, defect 1).

The read's ``low`` rests on assumption A1 (producer/layouts/cursor/_watermark.py): ids come from the outbox's ``CACHE 1``
sequence, drawn after the writer's xid. An owner can break it at any moment -- ``ALTER SEQUENCE … CACHE 20``
(a common tuning), ``RESTART``, a new default -- and a relay that checked it once, at connect, then let its
probes move ``low`` past ids that sessions still held cached: committed rows skipped for good. Here the
relay runs (both modes, the whole pipeline in process) while such changes are made under four writers, and
every committed row must arrive; the decision table itself (:func:`~producer.layouts.cursor._ids.guard`) is tested
without services first.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace

import psycopg
import pytest
from psycopg import sql
from relaylib import assert_per_key_order, consume_all, covers, fault_config
from seqcheck import Expected, Gate, check_exactly_once, read_intents, wait_for, write_traffic

from harvest_outbox.producer.errors import DatabaseError
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.layouts.cursor._ids import IdSource, guard
from harvest_outbox.producer.layouts.cursor._watermark import Cursor, Probe, Snapshot
from harvest_outbox.producer.layouts.cursor.database import CursorDatabase, cursor_backlog
from harvest_outbox.producer.layouts.cursor.views import CursorViews
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db

PARTITION_IDS = 1000

# ---------------------------------------------------------------------------- the decision (no services)
GOOD = IdSource(
    default="CASE WHEN (pg_current_xact_id() IS NOT NULL) THEN nextval('s'::regclass) ELSE NULL::bigint END",
    default_key="16400:700",
    own_sequence=True,
    sequence_file=16390,
    cache=1,
    increment=1,
    cycle=False,
    last_value=500,
    txid_default="pg_current_xact_id()",
)
AT = Cursor(lo=Snapshot(100, 100), low=300, probe=Probe(400, 90))


def test_an_unchanged_valid_source_lets_the_probe_work() -> None:
    d = guard(AT, GOOD, GOOD, head=450)
    assert d.cursor == AT and d.may_probe and not d.rescan and d.fault is None


@pytest.mark.parametrize(
    ("change", "fault"),
    [
        ({"cache": 20}, "CACHE 20"),
        ({"increment": -1}, "INCREMENT -1"),
        ({"cycle": True}, "CYCLE"),
        ({"own_sequence": False}, "does not draw from"),
        ({"default": "nextval('s'::regclass)"}, "does not take the writer's transaction id before the id"),
        ({"default": None}, "has no default"),
        ({"last_value": None}, None),  # RESTART: no id drawn yet; no probe, but nothing wrong
    ],
    ids=["cache", "increment", "cycle", "other-sequence", "nextval-first", "no-default", "not-called"],
)
def test_a_broken_source_takes_no_probe(change: dict[str, object], fault: str | None) -> None:
    now = replace(GOOD, **change)  # type: ignore[arg-type]
    d = guard(replace(AT, probe=None), now, now, head=450)
    assert not d.may_probe
    assert (d.fault is None) if fault is None else (fault in (d.fault or ""))
    assert d.cursor.low == AT.low and not d.rescan  # unchanged since the last look: low held, not moved


@pytest.mark.parametrize(
    "change",
    [{"sequence_file": 16391}, {"default_key": "16401:710"}, {"cache": 20, "sequence_file": 16391}],
    ids=["alter-sequence", "new-default", "cache"],
)
def test_a_changed_source_drops_the_probe_and_rescans(change: dict[str, object]) -> None:
    """Any ALTER SEQUENCE gives the sequence a new file (and may have restarted it lower); a new default may
    draw from anywhere: rows may now have ids below ``low``. The batch starts from id 0 and no probe taken
    before the change resolves."""
    d = guard(AT, GOOD, replace(GOOD, **change), head=450)  # type: ignore[arg-type]
    assert d.rescan and d.cursor.low == 0 and d.cursor.probe is None


def test_a_sequence_behind_the_cursor_rescans() -> None:
    """setval() to below ``low`` (no catalog change): ids below the cursor are being drawn."""
    d = guard(AT, GOOD, replace(GOOD, last_value=100), head=450)
    assert d.rescan and d.cursor.low == 0 and d.cursor.probe is None and not d.may_probe


def test_a_sequence_behind_the_head_takes_no_probe() -> None:
    d = guard(replace(AT, probe=None), GOOD, replace(GOOD, last_value=420), head=450)
    assert not d.may_probe and not d.rescan


def test_a_pending_probe_above_the_sequence_is_dropped() -> None:
    d = guard(replace(AT, probe=Probe(480, 90)), GOOD, replace(GOOD, last_value=470), head=470)
    assert d.cursor.probe is None and d.rescan and d.cursor.low == 0


def test_a_first_look_trusts_a_valid_source() -> None:
    """At a relay's start the connect check has refused a broken source; nothing to compare with yet."""
    d = guard(AT, None, GOOD, head=450)
    assert d.cursor == AT and d.may_probe and not d.rescan


def test_the_txid_default_is_required() -> None:
    d = guard(AT, GOOD, replace(GOOD, txid_default="0"), head=450)
    assert d.stop is not None and "txid" in d.stop and "pg_current_xact_id()" in d.stop


# ---------------------------------------------------------------------------- on Postgres and Kafka


def _alter(pg_dsn: str, statement: sql.Composable) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(statement)


def _run_under_changes(
    pg_dsn: str,
    kafka_bootstrap: str,
    table: str,
    topic: str,
    group: str,
    sequenced: bool,
    changes: list[Callable[[], None] | tuple[Callable[[], None], str]],
) -> Expected:
    """Four writers, one-row transactions on their own sessions (where a sequence caches), while ``changes``
    run one after another; then every committed row must be relayed. A change given as ``(change,
    "drained")`` is made with the writers held between transactions and every row relayed: a sequence
    restarted lower under rows not yet relayed would give later commits lower ids, and the relay would
    publish them first (docs/limitations.md), which the per-key order checks would report."""
    names = OutboxNames.parse(table)
    exp = Expected()
    relay = Harvest(fault_config(pg_dsn, kafka_bootstrap, table, group, sequenced, "cursor"), lambda e: None)
    relay.start()
    gate = Gate(4)
    try:
        failed: list[BaseException] = []

        def write(w: int) -> None:
            try:
                write_traffic(pg_dsn, table, topic, exp, w, 200, max_batch=1, rollback_rate=0.1, pause=0.006, gate=gate)
            except BaseException as exc:
                failed.append(exc)
            finally:
                gate.done()

        writers = [threading.Thread(target=write, args=(w,)) for w in range(4)]
        for t in writers:
            t.start()
        for change in changes:
            time.sleep(0.3)
            if isinstance(change, tuple):
                gate.close()
                with psycopg.connect(pg_dsn, autocommit=True) as conn:
                    wait_for(lambda: cursor_backlog(conn, names) == 0, 60, "every row relayed before the change")
                change[0]()
                gate.open()
            else:
                change()
        for t in writers:
            t.join()
        assert not failed, f"a writer failed: {failed[0]!r}"
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            wait_for(lambda: cursor_backlog(conn, names) == 0, 90, "every committed row passed by the cursor")
        if sequenced:
            wait_for(lambda: not read_intents(pg_dsn, table), 60, "ACK intents confirmed")
    finally:
        relay.stop()
        relay.wait(30)
    return exp


def _check_all_delivered(kafka_bootstrap: str, topic: str, exp: Expected, sequenced: bool) -> None:
    total = exp.total
    assert total > 400
    if sequenced:
        res = check_exactly_once(kafka_bootstrap, topic, 4, exp)
        assert res.committed == total
    else:
        got = consume_all(kafka_bootstrap, topic, covers(exp.by_key), timeout=60)
        assert not {g.value for g in got} & exp.rolled_back
        assert_per_key_order(got, dict(exp.by_key), allow_dups=True)  # type: ignore[arg-type]


@pytest.mark.integration
@pytest.mark.parametrize("sequenced", [True, False], ids=["sequenced", "at-least-once"])
def test_every_row_arrives_when_the_sequence_cache_changes_under_the_relay(
    sequenced: bool,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The issue's reproduction: ``CACHE 20`` under four writers (before the fix, hundreds of rows were
    passed by the cursor and never published), then back to ``CACHE 1``; the relay says what holds it."""
    topic = topic_factory(partitions=4)
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, layout="cursor", partition_ids=PARTITION_IDS)
    seq = names.id_sequence
    with caplog.at_level(logging.WARNING, logger="harvest_outbox.producer.layouts.cursor.database"):
        exp = _run_under_changes(
            pg_dsn,
            kafka_bootstrap,
            table,
            topic,
            unique_name("g"),
            sequenced,
            [
                lambda: _alter(pg_dsn, sql.SQL("ALTER SEQUENCE {} CACHE 20").format(seq)),
                lambda: time.sleep(1.2),
                lambda: _alter(pg_dsn, sql.SQL("ALTER SEQUENCE {} CACHE 1").format(seq)),
            ],
        )
    _check_all_delivered(kafka_bootstrap, topic, exp, sequenced)
    said = [r.getMessage() for r in caplog.records]
    assert any("CACHE 20" in m and "low" in m for m in said), said


@pytest.mark.integration
def test_every_row_arrives_when_the_sequence_restarts_lower_or_the_default_changes(
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    """``RESTART WITH`` a value below the relayed ids, then a default that draws the id before the xid, then
    the right default again: rows with ids below the cursor's ``low`` are found (the batch rescans from id 0),
    none is passed unread. The lower restart is made with every row relayed (``"drained"``): rows straddling
    it would go out in id order, not commit order, as docs/limitations.md says."""
    topic = topic_factory(partitions=4)
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, layout="cursor", partition_ids=PARTITION_IDS)
    seq, col = names.id_sequence, sql.Identifier(names.mapping.id_column)
    with psycopg.connect(pg_dsn) as conn:
        seq_name = names.id_sequence.as_string(conn)
    exp = _run_under_changes(
        pg_dsn,
        kafka_bootstrap,
        table,
        topic,
        unique_name("g"),
        True,
        [
            # ids go on from 5,000,000 up, far above the relayed ones; then back down to 1
            lambda: _alter(pg_dsn, sql.SQL("ALTER SEQUENCE {} RESTART WITH 5000000").format(seq)),
            (lambda: _alter(pg_dsn, sql.SQL("ALTER SEQUENCE {} RESTART WITH 2000").format(seq)), "drained"),
            lambda: _alter(
                pg_dsn,
                sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET DEFAULT nextval({}::regclass)").format(
                    names.outbox, col, sql.Literal(seq_name)
                ),
            ),
            lambda: _alter(
                pg_dsn,
                sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET DEFAULT {}").format(
                    names.outbox,
                    col,
                    sql.SQL("CASE WHEN pg_current_xact_id() IS NOT NULL THEN nextval({}::regclass) END").format(
                        sql.Literal(seq_name)
                    ),
                ),
            ),
        ],
    )
    _check_all_delivered(kafka_bootstrap, topic, exp, True)


@pytest.mark.integration
def test_a_broken_txid_default_stops_the_read_before_the_cursor_moves(pg_dsn: str, pg_schema: str) -> None:
    """``txid`` is what the snapshots are compared with: a default that is not the writer's transaction
    makes rows invisible to the batches. The read refuses (naming the fix) and the cursor stays."""
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, layout="cursor", partition_ids=PARTITION_IDS)
    db = CursorDatabase(pg_dsn, names, CursorViews(False))
    lid = uuid.uuid4()
    try:
        db.mark_with_attempts(lid, 10)  # connected, a first (empty) batch
        _alter(pg_dsn, sql.SQL("ALTER TABLE {} ALTER COLUMN txid SET DEFAULT '5'::xid8").format(names.outbox))
        with pytest.raises(DatabaseError, match=r"txid.*pg_current_xact_id\(\)"):
            for _ in range(3):  # the batch in progress completes; the next one's start refuses
                db.mark_with_attempts(lid, 10)
    finally:
        db.close()
