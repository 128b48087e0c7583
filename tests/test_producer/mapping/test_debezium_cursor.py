"""``tableMapping: debezium`` on ``outboxLayout: cursor`` (docs/debezium.md, "The cursor layout").

Invariants, on real Postgres and Kafka:
- ``init-db`` makes Debezium's table partitioned by ``harvest_seq`` (the xid-first default, A1), so a
  Debezium writer's plain INSERT of its own columns works unchanged and takes the relay's columns from
  their defaults; ``harvest check`` reads it; a Debezium mark-layout table and ``--migrate`` are refused
  naming the steps by hand;
- both modes deliver every committed row (sequenced: exactly once) in per-aggregate order, with the
  event router's topic, key, value and headers, never a rolled-back row, a late commit included, and
  the relay never updates or deletes an outbox row;
- a dead letter keeps its source row; a requeue writes it again as a new row the cursor reads.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from relaylib import assert_per_key_order, consume_all, covers, relay_config
from seqcheck import Expected, check_exactly_once, read_intents, wait_for

from harvest_outbox.harvest_local.kafka import create_topic, read_to_end
from harvest_outbox.producer.config import HarvestConfig
from harvest_outbox.producer.errors import ConfigError, DatabaseError, SchemaError
from harvest_outbox.producer.layouts.cursor import partitions as cursor_partitions
from harvest_outbox.producer.layouts.cursor.database import _PLANNER, CursorDatabase, cursor_backlog
from harvest_outbox.producer.layouts.cursor.migrate import migrate_to_cursor
from harvest_outbox.producer.layouts.cursor.schema import ORIGIN_TEXT, range_partitions
from harvest_outbox.producer.layouts.cursor.views import CursorViews
from harvest_outbox.producer.mapping.table import table_mapping
from harvest_outbox.producer.ops._check import check_outbox
from harvest_outbox.producer.ops._deadletter_admin import Selection, discard
from harvest_outbox.producer.ops._deadletters import list_dead_letters, requeue
from harvest_outbox.producer.relay.sharded import relay_for
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db

PARTITION_IDS = 100  # a few hundred rows span several partitions
AGGREGATES = ("Order", "Customer")

#: Debezium's writer, as its teams write it: its own columns only.
_WRITE = "INSERT INTO {} (id, aggregatetype, aggregateid, type, payload) VALUES (%s, %s, %s, %s, %s)"


def _mapping(prefix: str) -> Any:
    return table_mapping(
        "debezium",
        {
            "route.topic.replacement": prefix + ".${routedByValue}",
            "table.fields.additional.placement": "type:header:eventType",
        },
    )


# ---------------------------------------------------------------------------- config (no services)
def test_the_cursor_layout_takes_a_debezium_table() -> None:
    cfg = HarvestConfig(outbox_layout="cursor", table_mapping=table_mapping("debezium"))
    assert cfg.table_mapping.kind == "debezium"
    with pytest.raises(ConfigError, match="does not support deadLetterPolicy: haltKey with tableMapping: debezium"):
        HarvestConfig(outbox_layout="cursor", table_mapping=table_mapping("debezium"), dead_letter_policy="haltKey")


# ---------------------------------------------------------------------------- init-db, check, migrate
@pytest.mark.integration
def test_init_db_makes_debeziums_table_partitioned_and_check_reads_it(pg_dsn: str, pg_schema: str) -> None:
    mapping = table_mapping("debezium")
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, mapping=mapping, layout="cursor", partition_ids=PARTITION_IDS)
    init_db(pg_dsn, table, mapping=mapping, layout="cursor", partition_ids=PARTITION_IDS)  # idempotent
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        with conn.transaction():
            for i in range(3):  # the writer's statement, unchanged
                conn.execute(
                    sql.SQL(_WRITE).format(names.outbox), (uuid.uuid4(), "Order", "o-1", "Made", f'{{"n": {i}}}')
                )
        rows = conn.execute(
            sql.SQL(
                "SELECT harvest_seq, harvest_leader, harvest_created IS NOT NULL AND txid IS NOT NULL, "
                "tableoid::regclass::text FROM {} ORDER BY harvest_seq"
            ).format(names.outbox)
        ).fetchall()
        assert [r[0] for r in rows] == [1, 2, 3] and all(r[1] is None and r[2] for r in rows)
        assert {r[3].split(".")[-1] for r in rows} == {"outbox_p0"}
        assert [(s, e) for s, e, _n in range_partitions(conn, names)] == [(0, 100), (100, 200)]
        cfg = HarvestConfig(data_source=pg_dsn, outbox_table=table, outbox_layout="cursor", table_mapping=mapping)
        found = {f.subject: f for f in check_outbox(conn, cfg)}
        assert "debezium table, cursor layout, 2 id-range partition(s), ids [0, 200)" in found["table"].message
        assert found["backlog"].message.startswith("3 row(s) the committed cursor has not passed")
        assert all(f.level == "OK" for f in found.values()), found
        # the ordering column's default must take the xid first (A1): check says so when it does not
        conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN harvest_seq SET DEFAULT 7").format(names.outbox))
        broken = check_outbox(conn, cfg)
        assert [(f.level, f.subject) for f in broken] == [("FAIL", "layout")]
        assert "the harvest_seq column's default is '7'" in broken[0].message


@pytest.mark.integration
def test_the_page_read_walks_the_index_of_a_partition_filled_after_its_statistics(pg_dsn: str, pg_schema: str) -> None:
    """A burst fills a partition whose statistics predate it: on a plain session the planner, expecting
    fewer rows than the page's LIMIT, scans the rest of the partition and sorts it for every page (the hazard,
    shown so this test can fail); the relay's session walks the index and stops at the LIMIT."""
    table = f"{pg_schema}.outbox_event"
    names = init_db(pg_dsn, table, mapping=_mapping("p"), layout="cursor", partition_ids=1_000_000)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (id, aggregatetype, aggregateid, type, payload) SELECT gen_random_uuid(), 'order', "
                "'k' || (i % 100), 'created', jsonb_build_object('n', i, 'pad', repeat('x', 80)) "
                "FROM generate_series(1, 60000) AS i"
            ).format(names.outbox)
        )
        hi = conn.execute("SELECT pg_current_snapshot()::text").fetchone()[0]  # type: ignore[index]
    db = CursorDatabase(pg_dsn, names, CursorViews(False))
    try:
        relay = db.conn
        q = db._read_sql
        assert q is not None
        params = {"from": 0, "hi": hi, "lo": ORIGIN_TEXT, "n": 5000, "t0": 0.0}
        with psycopg.connect(pg_dsn) as plain:
            hazard = "\n".join(r[0] for r in plain.execute(sql.SQL("EXPLAIN {}").format(q), params).fetchall())
        assert "Seq Scan" in hazard or "Bitmap" in hazard, hazard
        relay.execute(_PLANNER, ("off", "off"))  # as mark_with_attempts sets them around its reads
        plan = "\n".join(r[0] for r in relay.execute(sql.SQL("EXPLAIN {}").format(q), params).fetchall())
        assert "Index Scan using outbox_event_p0_pkey" in plan and "Seq Scan" not in plan and "Bitmap" not in plan, plan
        assert "Sort" not in plan.replace("Sort Key: o.harvest_seq", ""), plan
        got = relay.execute(q, params).fetchall()
        assert len(got) == 5000 and [r[0] for r in got] == sorted(r[0] for r in got)
        relay.execute(_PLANNER, db._planner)  # and restores after it: the session's other statements plan freely
        settings = "SELECT current_setting('enable_seqscan'), current_setting('enable_bitmapscan')"
        assert relay.execute(settings).fetchone() == ("on", "on")
        # the relay's own read (one pipeline: the settings, the page, their restoring) leaves them restored too
        rows, _ = db.mark_with_attempts(uuid.uuid4(), 5000)
        assert len(rows) == 5000 and [r[0] for r in rows] == sorted(r[0] for r in rows)
        assert db.conn.execute(settings).fetchone() == ("on", "on")
    finally:
        db.close()


@pytest.mark.integration
def test_init_db_migrate_moves_a_debezium_mark_table_keeping_its_columns_and_order(pg_dsn: str, pg_schema: str) -> None:
    mapping = table_mapping("debezium")
    table = f"{pg_schema}.outbox"
    names = OutboxNames.parse(table, mapping)
    write = "INSERT INTO {} (aggregatetype, aggregateid, type, payload, tenant) VALUES (%s, %s, %s, %s, %s)"
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id UUID PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype VARCHAR(255) NOT NULL, "
                "aggregateid VARCHAR(255) NOT NULL, type VARCHAR(255) NOT NULL, payload JSONB, tenant TEXT)"
            ).format(names.outbox)
        )
        conn.execute(sql.SQL(write).format(names.outbox), ("Order", "o-0", "Old", "{}", None))  # Debezium's row
    init_db(pg_dsn, table, mapping=mapping)  # the mark layout
    with pytest.raises(SchemaError, match="run `harvest init-db --migrate`"):
        init_db(pg_dsn, table, mapping=mapping, layout="cursor")
    rows = [("Order" if i % 2 else "Customer", f"k{i % 2}", "Made", f'{{"n": {i}}}', f"t{i}") for i in range(5)]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for r in rows:
            conn.execute(sql.SQL(write).format(names.outbox), r)
        old_seq = [
            int(r[0])
            for r in conn.execute(
                sql.SQL("SELECT harvest_seq FROM {} WHERE harvest_seq IS NOT NULL ORDER BY 1").format(names.outbox)
            ).fetchall()
        ]
        conn.execute(
            sql.SQL("INSERT INTO {} (id, attempts, last_error) VALUES (%s, 2, 'x')").format(names.delivery_attempts),
            (old_seq[1],),
        )
        conn.execute(
            sql.SQL("INSERT INTO {} (id, kafka_topic, error, attempts) VALUES (50, 't', 'e', 1)").format(
                names.dead_letters
            )
        )
        done = migrate_to_cursor(conn, table, partition_ids=PARTITION_IDS, mapping=mapping)
        assert (done.copied, done.old_table.split(".")[-1].strip('"'), done.first_id) == (5, "outbox_debezium", 51)
        moved = conn.execute(
            sql.SQL(
                "SELECT aggregatetype, aggregateid, type, payload::text, tenant, harvest_seq FROM {} ORDER BY 6"
            ).format(names.outbox)
        ).fetchall()
        assert [m[:5] for m in moved] == rows
        assert [m[5] for m in moved] == [51, 52, 53, 54, 55]
        attempts = conn.execute(sql.SQL("SELECT id, attempts FROM {}").format(names.delivery_attempts)).fetchall()
        assert attempts == [(52, 2)]
        left = conn.execute(sql.SQL("SELECT type FROM {}").format(names.qualified("outbox_debezium"))).fetchall()
        assert sorted(t for (t,) in left) == ["Made"] * 5 + ["Old"], "the old table is kept as it was"
        # the writers' INSERT, unchanged (the event id from its default), lands after the copied rows
        conn.execute(sql.SQL(write).format(names.outbox), ("Order", "k1", "Made", "{}", "t5"))
        assert conn.execute(sql.SQL("SELECT max(harvest_seq) FROM {}").format(names.outbox)).fetchone() == (56,)
        assert cursor_backlog(conn, names) == 6
        cfg = HarvestConfig(data_source=pg_dsn, outbox_table=table, outbox_layout="cursor", table_mapping=mapping)
        found = check_outbox(conn, cfg)
        assert all(f.level == "OK" for f in found), found
        with pytest.raises(SchemaError, match="already in the cursor layout"):
            migrate_to_cursor(conn, table, mapping=mapping)
        # dead letters are found in the outbox by harvest_seq: one whose row the cursor has not passed stays
        conn.execute(
            sql.SQL("INSERT INTO {} (id, kafka_topic, error, attempts) VALUES (53, 't', 'e', 1)").format(
                names.dead_letters
            )
        )
        with pytest.raises(DatabaseError, match=r"has not yet passed the outbox row\(s\) of dead letter\(s\) \[53\]"):
            discard(conn, table, Selection(ids=(53,)), "test", mapping=mapping)
        assert discard(conn, table, Selection(ids=(50,)), "test", mapping=mapping) == [(50, "t", None)]


# ---------------------------------------------------------------------------- both modes, end to end
def _write(
    pg_dsn: str, names: OutboxNames, exp: Expected, want: dict[bytes, tuple[str, str, str, str]], writer: int
) -> None:
    """Debezium's writer: transactions of its own aggregates' rows, every fourth rolled back."""
    with psycopg.connect(pg_dsn) as conn:
        for t in range(12):
            rows = []
            for i in range(5):
                agg = AGGREGATES[(t + i) % 2]
                eid = uuid.uuid4()
                payload = json.dumps({"i": i, "t": t, "w": writer})  # as jsonb prints it (keys sorted)
                rows.append((eid, agg, f"{agg[0]}-{writer}-{i % 3}", f"{agg}Changed", payload))
            with conn.cursor() as cur:
                cur.executemany(sql.SQL(_WRITE).format(names.outbox), rows)
            printed = [r[4].encode() for r in rows]
            if t % 4 == 3:
                conn.rollback()
                exp.rolled_back.update(printed)
                continue
            conn.commit()
            with exp.lock:
                for (eid, agg, key, typ, _p), value in zip(rows, printed, strict=True):
                    exp.by_key.setdefault(key, []).append(value)
                    want[value] = (agg, key, str(eid), typ)
            time.sleep(0.005)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("sequenced", "shards"),
    [(True, 1), (False, 1), (True, 2)],
    ids=["sequenced", "at-least-once", "sequenced-2-shards"],
)
def test_debeziums_writers_relayed_through_the_cursor_as_the_router_would(
    sequenced: bool,
    shards: int,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    unique_name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cursor_partitions, "MAINTENANCE_INTERVAL", 0.2)
    prefix = unique_name("dz")
    for agg in AGGREGATES:
        create_topic(kafka_bootstrap, f"{prefix}.{agg}", 2)
    mapping = _mapping(prefix)
    table = f"{pg_schema}.outbox_event"
    # sharded: each shard's cursor reads its rows by the shard of aggregateid (the router's key)
    names = init_db(pg_dsn, table, mapping=mapping, layout="cursor", partition_ids=PARTITION_IDS, shards=shards)
    exp = Expected()
    want: dict[bytes, tuple[str, str, str, str]] = {}
    cfg = (
        relay_config(
            pg_dsn,
            kafka_bootstrap,
            table,
            unique_name("g"),
            mark_query_records=100,
            txn_max_records=50,
            txn_max_duration=0.02,
        )
        .replace(uuid_sequencing=sequenced, leader_election="postgres", leader_lock_check_interval=0.2)
        .replace(outbox_layout="cursor", table_mapping=mapping, shards=shards)
    )
    relay = relay_for(cfg, lambda e: None).start()
    late = psycopg.connect(pg_dsn)
    poison = uuid.uuid4()
    try:
        # the late writer draws the lowest harvest_seq values and holds them open while the rest go out
        late_rows = [(uuid.uuid4(), "Order", "late-k", "Late", json.dumps({"late": i})) for i in range(3)]
        with late.cursor() as cur:
            cur.executemany(sql.SQL(_WRITE).format(names.outbox), late_rows)
        writers = [threading.Thread(target=_write, args=(pg_dsn, names, exp, want, w)) for w in range(3)]
        for w in writers:
            w.start()
        for w in writers:
            w.join()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            # a row the router cannot route: dead-lettered with its source row
            conn.execute(sql.SQL(_WRITE).format(names.outbox), (poison, "", "o-9", "Lost", '{"where": null}'))
            wait_for(lambda: cursor_backlog(conn, names, shards=shards) == 0, 60, "the others' rows relayed")
            late.commit()  # committed after hundreds of higher harvest_seq values went out
            for eid, agg, key, typ, payload in late_rows:
                value = payload.encode()
                exp.by_key.setdefault(key, []).append(value)
                want[value] = (agg, key, str(eid), typ)
            wait_for(lambda: cursor_backlog(conn, names, shards=shards) == 0, 60, "the late commit relayed")
            if sequenced:
                wait_for(lambda: not read_intents(pg_dsn, table), 60, "ACK intents confirmed")
    finally:
        late.close()
        relay.stop()
        relay.wait(30)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        dead = list_dead_letters(conn, table)
        assert [d.error for d in dead] == [
            "bad row: aggregatetype (route.by.field) is NULL or empty: the row has nowhere to go; fix "
            "aggregatetype and requeue"
        ]
        source = conn.execute(sql.SQL("SELECT source_row FROM {}").format(names.dead_letters)).fetchone()
        assert source is not None and source[0]["id"] == str(poison) and "txid" not in source[0]
        # the relay never updated or deleted an outbox row (partitions only, whole)
        touched = conn.execute(
            """SELECT coalesce(sum(n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables s
               JOIN pg_inherits i ON i.inhrelid = s.relid WHERE i.inhparent = to_regclass(%s)""",
            (names.outbox.as_string(conn),),
        ).fetchone()
        assert touched == (0,)
        # a requeue writes the row again (new harvest_seq, the requeue's txid): the cursor has it pending
        assert requeue(conn, table, None, mapping) == 1
        assert cursor_backlog(conn, names, shards=shards) == 1

    total = sum(len(v) for v in exp.by_key.values())
    assert total > 100 and exp.rolled_back
    for agg in AGGREGATES:
        topic = f"{prefix}.{agg}"
        mine = {v: w for v, w in want.items() if w[0] == agg}
        by_key = {k: [v for v in vs if v in mine] for k, vs in exp.by_key.items()}
        by_key = {k: vs for k, vs in by_key.items() if vs}
        if sequenced:
            part = Expected(by_key=by_key, rolled_back=exp.rolled_back)
            assert check_exactly_once(kafka_bootstrap, topic, 2, part).committed == len(mine)
            records = [r for r in read_to_end(kafka_bootstrap, [topic]) if r.value in mine]
            got = [
                (r.key.decode() if r.key else None, r.value, [h for h in r.headers if h[0] != "uuid"]) for r in records
            ]
        else:
            plain = consume_all(kafka_bootstrap, topic, covers(by_key))
            assert not {g.value for g in plain} & exp.rolled_back
            assert_per_key_order(plain, dict(by_key), allow_dups=True)  # type: ignore[arg-type]
            got = [(g.key, g.value, g.headers) for g in plain]
        for key, value, headers in got:
            _agg, want_key, eid, typ = mine[value]  # type: ignore[index]
            assert key == want_key
            assert headers == [("id", eid.encode()), ("eventType", typ.encode())]
