"""``outboxLayout: cursor`` with ``shards: 4`` on real Postgres and Kafka: several sharded relays (Postgres
shard locks) publish one partitioned outbox, each shard read by its own cursor (a cursor row per shard,
its own ``lo``/``hi``/``pos``/``low`` and probe, fenced by that shard's epoch). Every committed row goes out
exactly once (``--uuid-sequencing``) or at least once, in per-key order, with a late commit in one shard;
a partition is retired only once every shard's committed cursor is past it (its re-check made against the
cursor of each row's shard); ``init-db`` gives a one-shard cursor table a cursor per shard (copies of the
one), a relay refuses a cursor table of another shard count naming the fix, and a shard's read is served
by the ``(shard, id)`` expression index of the partitioned outbox.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from relaylib import assert_per_key_order, consume_all, covers, relay_config
from seqcheck import Expected, check_exactly_once, read_intents, wait_for, write_traffic

from harvest_outbox.producer.config import HarvestConfig
from harvest_outbox.producer.errors import SchemaError
from harvest_outbox.producer.layouts.cursor import partitions as cursor_partitions
from harvest_outbox.producer.layouts.cursor.database import CursorDatabase, cursor_backlog, read_sql
from harvest_outbox.producer.layouts.cursor.partitions import PartitionKeeper
from harvest_outbox.producer.layouts.cursor.schema import ORIGIN_TEXT, range_partitions
from harvest_outbox.producer.layouts.cursor.views import CursorViews
from harvest_outbox.producer.relay.sharded import relay_for
from harvest_outbox.producer.relay.shards import shard_of
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

pytestmark = pytest.mark.integration

S = 4
PARTITION_IDS = 100


def _cfg(pg_dsn: str, bootstrap: str, table: str, group: str, sequenced: bool) -> HarvestConfig:
    base = dict(mark_query_records=300, txn_max_records=100, txn_max_duration=0.02, producer_ring=4)
    return (
        relay_config(pg_dsn, bootstrap, table, group, **base)  # type: ignore[arg-type]
        .replace(uuid_sequencing=sequenced, leader_election="postgres", leader_lock_check_interval=0.2)
        .replace(outbox_layout="cursor", shards=S)
    )


def _key_in(shard: int, prefix: str) -> str:
    return next(f"{prefix}{i}" for i in range(1000) if shard_of(f"{prefix}{i}", S) == shard)


def test_config_accepts_shards_on_the_cursor_layout() -> None:
    assert HarvestConfig(outbox_layout="cursor", shards=S).shards == S


@pytest.mark.parametrize("sequenced", [True, False], ids=["sequenced", "at-least-once"])
def test_sharded_relays_every_row_late_commit_in_a_shard(
    sequenced: bool,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cursor_partitions, "MAINTENANCE_INTERVAL", 0.2)
    topic = topic_factory(partitions=4)
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, layout="cursor", partition_ids=PARTITION_IDS, shards=S)
    init_db(pg_dsn, table, layout="cursor", partition_ids=PARTITION_IDS, shards=S)  # idempotent
    cfg = _cfg(pg_dsn, kafka_bootstrap, table, unique_name("g"), sequenced)
    relays = [relay_for(cfg.replace(name=f"r{i}"), lambda e: None) for i in range(3)]
    exp = Expected()
    late_key = _key_in(2, "late-")
    late = psycopg.connect(pg_dsn)
    for r in relays:
        r.start()
    try:
        # the late writer draws low ids in shard 2 and holds them open while everything else is relayed
        Stasher(table).stash_many(late, [OutboxRecord(topic, late_key, f"late-{i}") for i in range(3)])
        failed: list[BaseException] = []

        def write(w: int) -> None:
            try:
                write_traffic(pg_dsn, table, topic, exp, w, 25, pause=0.005)
            except BaseException as exc:  # a writer's failure fails the test
                failed.append(exc)

        writers = [threading.Thread(target=write, args=(w,)) for w in range(3)]
        for t in writers:
            t.start()
        for t in writers:
            t.join()
        assert not failed, f"a writer failed: {failed[0]!r}"
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            wait_for(lambda: cursor_backlog(conn, names, shards=S) == 0, 60, "the others' rows relayed")
            assert range_partitions(conn, names)[0][0] == 0  # the open writer holds every shard's low
            leaders = conn.execute(
                "SELECT count(DISTINCT pid) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            ).fetchone()
            assert leaders is not None and int(leaders[0]) >= 2, "the shards are spread over several relays"
        late.commit()  # committed after hundreds of higher ids went out, in every shard
        exp.by_key[late_key] = [f"late-{i}".encode() for i in range(3)]
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            wait_for(lambda: cursor_backlog(conn, names, shards=S) == 0, 60, "the late commit relayed")
            if sequenced:
                wait_for(lambda: not read_intents(pg_dsn, table), 60, "ACK intents confirmed")
            for i in range(4):  # rows in every shard move each shard's probe past the late ids
                with conn.transaction():
                    for k in range(S):
                        key = _key_in(k, "after-")
                        Stasher(table).stash(conn, OutboxRecord(topic, key, f"after-{i}-{k}"))  # values unique
                        exp.by_key.setdefault(key, []).append(f"after-{i}-{k}".encode())
                time.sleep(0.3)
            wait_for(lambda: cursor_backlog(conn, names, shards=S) == 0, 60, "the last rows relayed")
            wait_for(lambda: range_partitions(conn, names)[0][0] > 0, 30, "a delivered partition retired")
    finally:
        late.close()
        for r in relays:
            r.stop()
        for r in relays:
            r.wait(30)
    total = sum(len(v) for v in exp.by_key.values())
    assert len(exp.rolled_back) > 0 and total > 300
    if sequenced:
        res = check_exactly_once(kafka_bootstrap, topic, 4, exp)
        assert res.committed == total and res.continues == total
    else:
        got = consume_all(kafka_bootstrap, topic, covers(exp.by_key))
        assert not {g.value for g in got} & exp.rolled_back
        assert_per_key_order(got, dict(exp.by_key), allow_dups=True)  # type: ignore[arg-type]


def _stash(pg_dsn: str, table: str, keys: list[str]) -> None:
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        Stasher(table).stash_many(conn, [OutboxRecord("t", k, "v") for k in keys])


def _set_cursor(conn: psycopg.Connection[Any], names: OutboxNames, shard: int, lo: str, low: int) -> None:
    conn.execute(
        sql.SQL("UPDATE {} SET lo = %s::pg_snapshot, hi = NULL, pos = 0, low = %s WHERE shard = %s").format(
            names.cursor
        ),
        (lo, low, shard),
    )


def test_a_partition_retires_only_once_every_shard_passed_it(pg_dsn: str, pg_schema: str) -> None:
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, layout="cursor", partition_ids=PARTITION_IDS, shards=S)
    _stash(pg_dsn, table, [f"k{i}" for i in range(150)])  # ids 1..150: partition [0, 100) full, all shards
    keeper = PartitionKeeper(names, interval=0, shard_count=S)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        now = conn.execute("SELECT pg_current_snapshot()::text").fetchone()[0]  # type: ignore[index]
        for k in range(S):
            _set_cursor(conn, names, k, now, 151)
        _set_cursor(conn, names, 1, ORIGIN_TEXT, 0)  # shard 1 has passed nothing
        assert keeper.run(conn).truncated == []
        # shard 1's low claims the partition while its lo has not seen the rows: the re-check (against each
        # row's own shard's cursor) keeps it
        _set_cursor(conn, names, 1, ORIGIN_TEXT, 151)
        done = keeper.run(conn)
        assert done.truncated == [] and done.kept == [names.partition_name(0)], done
        _set_cursor(conn, names, 1, now, 151)
        done = keeper.run(conn)
        assert done.truncated == [names.partition_name(0)], done


def test_init_db_gives_a_one_shard_cursor_table_a_cursor_per_shard(pg_dsn: str, pg_schema: str) -> None:
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, layout="cursor", partition_ids=PARTITION_IDS)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        _set_cursor(conn, names, 0, "10:12:10", 5)
    db = CursorDatabase(pg_dsn, names, CursorViews(False), shard_count=S)
    try:
        with pytest.raises(SchemaError, match=rf"harvest init-db` with shards: {S}"):
            db.conn  # noqa: B018
    finally:
        db.close()
    init_db(pg_dsn, table, layout="cursor", partition_ids=PARTITION_IDS, shards=S)
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(sql.SQL("SELECT shard, lo::text, low FROM {} ORDER BY shard").format(names.cursor))
        assert rows.fetchall() == [(k, "10:12:10", 5) for k in range(S)]
    for count in (1, 2):  # another shard count: refused, naming the count the outbox has
        with pytest.raises(SchemaError, match=rf"shards: {S}\), and the config has shards: {count}.*set shards: {S}"):
            init_db(pg_dsn, table, layout="cursor", partition_ids=PARTITION_IDS, shards=count)
    db = CursorDatabase(pg_dsn, names, CursorViews(False))  # a relay of shards: 1
    try:
        with pytest.raises(SchemaError, match=rf"and the config has shards: 1.*set shards: {S}"):
            db.conn  # noqa: B018
    finally:
        db.close()


def test_a_shards_read_uses_the_shard_index(pg_dsn: str, pg_schema: str) -> None:
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, layout="cursor", partition_ids=1_000_000, shards=S)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values) "
                "SELECT 't', 'k' || i, 'v', '{{}}', '{{}}' FROM generate_series(1, 20000) AS i"
            ).format(names.outbox)
        )
        conn.execute(sql.SQL("ANALYZE {}").format(names.outbox))
        conn.execute("SET random_page_cost = 1.1")  # as the relay's connections (producer/db/_session.py)
        hi = conn.execute("SELECT pg_current_snapshot()::text").fetchone()[0]  # type: ignore[index]
        params = {"from": 0, "hi": hi, "lo": ORIGIN_TEXT, "n": 300, "t0": 0.0, "shard": 2}
        q = read_sql(names, "varchar", S)
        plan = "\n".join(r[0] for r in conn.execute(sql.SQL("EXPLAIN {}").format(q), params).fetchall())
        # the (shard, id) expression index of each partition (named after the partitioned one's columns)
        assert plan.count("Index Scan using outbox_p0_mod_id_idx") == 1 and "Seq Scan" not in plan, plan
        assert "Index Cond: ((mod(" in plan and "Sort" not in plan.replace("Sort Key: o.id", ""), plan
        got = conn.execute(q, params).fetchall()
        assert len(got) == 300 and all(shard_of(r[2], S) == 2 for r in got)
        assert [r[0] for r in got] == sorted(r[0] for r in got)


def test_harvest_check_reads_each_shards_cursor(pg_dsn: str, pg_schema: str) -> None:
    """``harvest check`` and ``harvest shards`` on a sharded cursor outbox: the shard index, and the backlog of
    each shard's cursor; a config with another shard count is a FAIL naming the count the outbox has."""
    from harvest_outbox.producer.observe.shard_status import shard_status
    from harvest_outbox.producer.ops._check import check_outbox

    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, layout="cursor", partition_ids=PARTITION_IDS, shards=S)
    keys = [_key_in(0, "a"), _key_in(0, "b"), _key_in(3, "c")]
    _stash(pg_dsn, table, keys)
    cfg = HarvestConfig(data_source=pg_dsn, outbox_table=table, outbox_layout="cursor", shards=S)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        now = conn.execute("SELECT pg_current_snapshot()::text").fetchone()[0]  # type: ignore[index]
        _set_cursor(conn, names, 3, now, 0)  # shard 3's cursor passed its row
        found = {f.subject: f for f in check_outbox(conn, cfg)}
        assert all(f.level == "OK" for f in found.values()), found
        assert found["backlog"].message.startswith("2 row(s) the committed cursor has not passed"), found
        assert "(shard 0: 2, shard 1: 0, shard 2: 0, shard 3: 0)" in found["backlog"].message, found
        assert names.shard_index_name(S) in found["index"].message
        # `harvest shards`: what each shard's cursor has not passed, not the rows kept until retirement
        status = shard_status(cfg.replace(leader_election="postgres"))  # nobody leads: no Kafka needed
        assert [(st.index, st.backlog_rows, st.leader) for st in status] == [(0, 2, None)] + [
            (k, 0, None) for k in (1, 2, 3)
        ]
        wrong = [f for f in check_outbox(conn, cfg.replace(shards=2)) if f.level == "FAIL"]
        assert [f.subject for f in wrong] == ["cursor"] and f"set shards: {S}" in wrong[0].message, wrong


def test_the_scan_gauge_shows_a_long_transaction_widening_the_reads(pg_dsn: str, pg_schema: str) -> None:
    """``harvest_cursor_scan_ids``: while a transaction with an xid stays open, each batch of a shard walks the
    ids from its held ``low`` to the head again (most delivered already), returning few rows; once it ends,
    the probe moves ``low`` up and the span shrinks back to the batch's new rows."""
    from harvest_outbox.producer.observe.metrics import Metrics, RelayCollector

    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, layout="cursor", partition_ids=1_000_000, shards=S)
    db = CursorDatabase(pg_dsn, names, CursorViews(False), shard_count=S)
    db.set_shards(frozenset(range(S)))
    holder = psycopg.connect(pg_dsn)
    lid = uuid.uuid4()

    def relay_rounds(rounds: int) -> tuple[int, int]:
        for _ in range(rounds):
            for _page in range(2 * S):  # every shard's batch completes (a short page), then a new one starts
                got = [r[0] for r in db.mark_with_attempts(lid, 1000)[0]]
                if got:
                    db.purge(got)
            _stash(pg_dsn, table, [f"k{i}" for i in range(8)])
            time.sleep(0.05)
        db.stats()
        assert db.scan is not None
        return db.scan

    try:
        holder.execute("SELECT pg_current_xact_id()")  # an xid: the probe cannot resolve while it is open
        _stash(pg_dsn, table, [f"k{i}" for i in range(200)])
        width, rows = relay_rounds(6)
        assert width >= 200 and rows < 20, (width, rows)  # the delivered 200 walked again for a few new rows
        m = Metrics()
        m.is_leader, m.cursor_scan = True, db.scan
        exported = {
            f.name: f.samples[0].value for f in RelayCollector(m, "r").collect() if f.name.startswith("harvest_c")
        }
        assert exported == {"harvest_cursor_scan_ids": float(width), "harvest_cursor_scan_rows": float(rows)}
        holder.rollback()
        width, rows = relay_rounds(6)
        assert width < 40, (width, rows)  # back to about a batch's own rows
    finally:
        holder.close()
        db.close()


def test_migrate_with_shards_gives_each_shard_a_cursor_over_its_copied_rows(pg_dsn: str, pg_schema: str) -> None:
    """``init-db --migrate`` of a sharded goharvest table: the new table has the shard index and a cursor row
    per shard at the origin, and a view of all shards reads every copied row once, each key's in order."""
    from harvest_outbox.producer.layouts.cursor.migrate import migrate_to_cursor

    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, shards=S)
    keys = [f"k{i % 8}" for i in range(40)]
    _stash(pg_dsn, table, keys)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        migrate_to_cursor(conn, table, partition_ids=PARTITION_IDS, shards=S)
        cursors = conn.execute(sql.SQL("SELECT shard, lo::text, low FROM {} ORDER BY shard").format(names.cursor))
        assert cursors.fetchall() == [(k, ORIGIN_TEXT, 0) for k in range(S)]
    db = CursorDatabase(pg_dsn, names, CursorViews(False), shard_count=S)  # refuses an outbox missing any of it
    db.set_shards(frozenset(range(S)))
    try:
        lid, got = uuid.uuid4(), []
        for _ in range(3 * S):
            got += db.mark_with_attempts(lid, 7)[0]
        assert len(got) == 40 and len({r[0] for r in got}) == 40  # every copied row, none read twice
        by_key: dict[str, list[int]] = {}
        for r in got:
            by_key.setdefault(r[2].decode() if isinstance(r[2], bytes) else r[2], []).append(r[0])
        assert all(ids == sorted(ids) for ids in by_key.values()) and len(by_key) == 8
    finally:
        db.close()
