"""The mark statement on the real database (producer/db/__init__.py), and the outbox shape it runs fastest on
(producer/schema/__init__.py: half-empty pages, so a mark updates its rows in page)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

import psycopg
import pytest
from fake_admin import FakeAdmin
from fake_producer import FakeProducer
from psycopg import sql
from psycopg.conninfo import make_conninfo

from harvest_outbox.producer.config import HarvestConfig
from harvest_outbox.producer.election.neli import StaticElection
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.layouts.mark.database import MarkDatabase
from harvest_outbox.producer.ops.preflight import TopicGuard
from harvest_outbox.producer.schema import OUTBOX_FILLFACTOR, OutboxNames, outbox_fillfactor
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher


@pytest.mark.integration
def test_mark_stays_fast_on_statistics_of_an_empty_outbox(pg_dsn: str, pg_schema: str) -> None:
    # Found by the demo's backlog phase: statistics gathered while the outbox was nearly empty,
    # then a bulk commit. goharvest's `id IN (SELECT id … LIMIT n)` then planned a nested-loop
    # semi-join that re-ran the subquery per outbox row: one 5,000-row mark took 334 s. The relay's
    # mark (ctid = ANY(ARRAY(SELECT ctid …))) evaluates its subquery once, whatever the statistics.
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table)
    st = Stasher(table)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        with conn.transaction():
            st.stash_many(conn, [OutboxRecord("t", f"k{i % 100}", "x") for i in range(20_000)])
        conn.execute(sql.SQL("DELETE FROM {}").format(names.outbox))
        conn.execute(sql.SQL("ANALYZE {}").format(names.outbox))
        with conn.transaction():
            st.stash_many(conn, [OutboxRecord("t", f"k{i % 100}", f"v{i}") for i in range(100_000)])
    db = MarkDatabase(pg_dsn, names)
    try:
        db.conn.execute("SET statement_timeout = '20s'")  # the old plan runs for minutes: fail, not hang
        leader = uuid.uuid4()
        rows = db.mark(leader, 5000)
        assert len(rows) == 5000 and [r[0] for r in rows] == sorted(r[0] for r in rows)
        assert rows[0][:9] == (rows[0][0], "t", b"k0", b"v0", None, None, None, None, None)  # no headers: None
        again = db.mark(leader, 5000)  # rows this view owns are not marked twice
        assert len(again) == 5000 and {r[0] for r in again}.isdisjoint(r[0] for r in rows)
    finally:
        db.close()


@pytest.mark.integration
@pytest.mark.parametrize("shards", [1, 8])
def test_an_idle_relays_marks_never_run_on_a_generic_plan(pg_dsn: str, pg_schema: str, shards: int) -> None:
    # Found by the sharded-relays benchmark: an idle relay marks an empty outbox over and over;
    # psycopg prepares the statement after 5 runs and Postgres then settled on a generic plan made for
    # an empty table, which sorted the whole outbox on every mark once a burst of 200k rows arrived
    # (2,600 rows/s instead of ~60,000). The relay's connections force custom plans: its prepared
    # mark is planned anew for every run.
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, shards=shards)

    def generic_plans(db: MarkDatabase) -> list[tuple[int, int]]:
        return db.conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '%%UPDATE%%leader_id%%RETURNING%%'"
        ).fetchall()

    dbs = [MarkDatabase(pg_dsn, names, shards) for _ in range(2)]
    if shards > 1:
        for d in dbs:
            d.set_shards(frozenset(range(shards)))
    db, hazard = dbs
    try:
        hazard.conn.execute("RESET plan_cache_mode")  # builds its mark statement; Postgres' default plan cache
        leader = uuid.uuid4()
        for _ in range(12):  # idle: empty marks, past psycopg's prepare threshold and Postgres' 5 custom plans
            assert db.mark(leader, 100) == []
            # what the relay avoids: the same statement, prepared on a connection with Postgres' default plan cache
            params = {"leader": leader, "n": 100, "t0": 0.0}
            assert hazard._run("mark", hazard._mark_sql, params).fetchall() == []  # type: ignore[arg-type]
        assert any(generic > 0 for generic, _custom in generic_plans(hazard))
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            with conn.transaction():
                Stasher(table).stash_many(conn, [OutboxRecord("t", f"k{i % 100}", "x") for i in range(2000)])
        assert len(db.mark(leader, 1000)) == 1000
        plans = generic_plans(db)
        assert plans and all(generic == 0 and custom > 0 for generic, custom in plans), plans  # prepared, never generic
    finally:
        for d in dbs:
            d.close()


# (topic, key, header keys, header values) of a row as another writer than the stasher could insert
# it, and the start of the reason the mark gives (None: a good row).
_ROWS = [
    pytest.param("t", "k", [], [], None, id="good-no-headers"),
    pytest.param("t", "k", ["h", "h"], ["1", None], None, id="good-repeated-header-null-value"),
    pytest.param(None, "k", [], [], "kafka_topic is NULL or empty", id="null-topic"),
    pytest.param("", "k", [], [], "kafka_topic is NULL or empty", id="empty-topic"),
    pytest.param("t", None, [], [], "kafka_key is NULL", id="null-key"),
    pytest.param("t", "k", None, [], "kafka_header_keys/kafka_header_values is NULL", id="null-header-keys"),
    pytest.param("t", "k", [], None, "kafka_header_keys/kafka_header_values is NULL", id="null-header-values"),
    pytest.param(
        "t", "k", ["a", "b"], ["1"], "header arrays differ in length: 2 key(s) {a,b} but 1 value(s)", id="mismatched"
    ),
    pytest.param(
        "t", "k", [], ["1"], "header arrays differ in length: 0 key(s) {} but 1 value(s)", id="values-without-keys"
    ),
    pytest.param("t", "k", ["a", None], ["1", "2"], "kafka_header_keys contains NULL", id="null-header-name"),
    pytest.param("t", "k", [["a"], ["b"]], [["1"], ["2"]], "header arrays are multi-dimensional", id="two-dimensional"),
]


@pytest.mark.integration
@pytest.mark.parametrize(("topic", "key", "hkeys", "hvals", "reason"), _ROWS)
def test_the_mark_names_what_makes_a_row_unsendable(
    pg_dsn: str,
    pg_schema: str,
    topic: str | None,
    key: str | None,
    hkeys: list | None,
    hvals: list | None,
    reason: str | None,
) -> None:
    """Bad rows are found by the mark statement itself (one CASE per row, on the database), and a bad
    row never fails the mark: the rows around it are marked as usual."""
    names = init_db(pg_dsn, f"{pg_schema}.outbox")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "ALTER TABLE {} ALTER COLUMN kafka_topic DROP NOT NULL, ALTER COLUMN kafka_key DROP NOT NULL, "
                "ALTER COLUMN kafka_header_keys DROP NOT NULL, ALTER COLUMN kafka_header_values DROP NOT NULL"
            ).format(names.outbox)
        )
        ins = sql.SQL(
            "INSERT INTO {} (kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values) "
            "VALUES (%s, %s, 'v', %s, %s)"
        ).format(names.outbox)
        conn.execute(ins, ("t", "before", [], []))
        conn.execute(ins, (topic, key, hkeys, hvals))
        conn.execute(ins, ("t", "after", ["h"], ["1"]))
    db = MarkDatabase(pg_dsn, names)
    try:
        before, row, after = db.mark(uuid.uuid4(), 10)
    finally:
        db.close()
    assert before[6] is None and after[4:7] == (("h",), ("1",), None)
    if reason is None:
        assert row[6] is None
        assert (row[4], row[5]) == ((None, None) if not hkeys else (tuple(hkeys), tuple(hvals)))  # type: ignore[arg-type]
    else:
        assert row[6] is not None and row[6].startswith(reason), row[6]


_TEXT = [
    ("ascii", "t", "k", "v"),
    ("latin-1 letters", "tópico", "clé", "valeur é"),
    ("beyond latin-1", "topic", "日本語キー", "€ 42"),
]


@pytest.mark.integration
@pytest.mark.parametrize("encoding", ["UTF8", "LATIN1"])
def test_the_mark_returns_key_and_value_as_their_utf8_bytes(
    pg_dsn: str, unique_name: Callable[[str], str], encoding: str
) -> None:
    """Key and value leave the database as bytes (no convert_to() per row): the UTF-8 of the text,
    whatever the database's encoding and whatever client encoding the DSN asks for, as goharvest's
    schema means them. Topic and header names stay text."""
    rows = [r for r in _TEXT if encoding == "UTF8" or r[0] != "beyond latin-1"]
    dbname = unique_name("enc").lower()
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} ENCODING {} TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'").format(
                sql.Identifier(dbname), sql.Literal(encoding)
            )
        )
    dsn = make_conninfo(pg_dsn, dbname=dbname, client_encoding="LATIN1" if encoding == "UTF8" else "UTF8")
    try:
        names = init_db(dsn, "outbox")
        with psycopg.connect(dsn, autocommit=True, client_encoding="UTF8") as conn:
            ins = sql.SQL(
                "INSERT INTO {} (kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values) "
                "VALUES (%s, %s, %s, %s, %s)"
            ).format(names.outbox)
            for _name, topic, key, value in rows:
                conn.execute(ins, (topic, key, value, [f"h-{key}"], [value]))
        db = MarkDatabase(dsn, names)
        try:
            marked = db.mark(uuid.uuid4(), 10)
        finally:
            db.close()
        assert [(r[1], r[2], r[3], r[4], r[5], r[6]) for r in marked] == [
            (topic, key.encode(), value.encode(), (f"h-{key}",), (value,), None) for _n, topic, key, value in rows
        ]
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))


def _hot_share_of_one_mark(pg_dsn: str, names: OutboxNames, rows: int) -> float:
    """Stash ``rows`` rows, mark them all in one transaction (rolled back) and return the share of
    the mark's row updates Postgres made in-page (HOT)."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn, conn.transaction():
        Stasher(names.display).stash_many(conn, [OutboxRecord("t", f"k{i % 100}", "v" * 100) for i in range(rows)])
    db = MarkDatabase(pg_dsn, names)
    try:
        db.conn.execute("BEGIN")
        assert len(db.mark(uuid.uuid4(), rows)) == rows
        updated, hot = db.conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relid = to_regclass(%s)",
            (names.outbox.as_string(db.conn),),
        ).fetchone()
        db.conn.execute("ROLLBACK")
    finally:
        db.close()
    assert updated == rows
    return hot / updated


@pytest.mark.integration
def test_marks_update_rows_in_page_on_an_outbox_init_db_created(pg_dsn: str, pg_schema: str) -> None:
    names = init_db(pg_dsn, f"{pg_schema}.outbox")
    with psycopg.connect(pg_dsn) as conn:
        assert outbox_fillfactor(conn, names) == OUTBOX_FILLFACTOR == 50
    assert _hot_share_of_one_mark(pg_dsn, names, 5000) >= 0.9  # a new version is 16 bytes longer (leader_id)


@pytest.mark.integration
def test_a_packed_outbox_is_named_at_relay_start_with_the_fix(
    pg_dsn: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    # An outbox created with goharvest's own DDL has Postgres' default fillfactor: the marks move
    # their rows to new pages (the share measured here is why the relay says so at start).
    names = init_db(pg_dsn, f"{pg_schema}.outbox")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER TABLE {} RESET (fillfactor)").format(names.outbox))
        assert outbox_fillfactor(conn, names) == 100
        table = names.outbox.as_string(conn)
    assert _hot_share_of_one_mark(pg_dsn, names, 5000) < 0.5
    cfg = HarvestConfig(
        data_source=pg_dsn, outbox_table=names.display, base_kafka_config={"bootstrap.servers": "127.0.0.1:1"}
    )
    guard = TopicGuard({}, cfg.producer_config(), admin_factory=lambda conf: FakeAdmin())
    relay = Harvest(
        cfg, producer_factory=lambda conf, cb: FakeProducer(cb, conf), election=StaticElection(), topic_guard=guard
    )
    with caplog.at_level(logging.INFO, logger="harvest_outbox.producer.relay.core"):
        relay.core.open()
    relay.core.close()
    hint = [r.getMessage() for r in caplog.records if "fillfactor" in r.getMessage()]
    assert len(hint) == 1 and "has fillfactor 100" in hint[0], hint
    assert f"ALTER TABLE {table} SET (fillfactor = 50)" in hint[0]


@pytest.mark.integration
def test_a_standby_has_its_mark_prepared_and_claims_nothing(pg_dsn: str, pg_schema: str) -> None:
    # A cold backend's first mark loads the outbox's catalog entries and parses the statement (~12 ms
    # of an election's first mark): a relay does that while still a standby, without claiming a row.
    names = init_db(pg_dsn, f"{pg_schema}.outbox")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        Stasher(names.display).stash_many(conn, [OutboxRecord("t", f"k{i}", "v") for i in range(5)])
    cfg = HarvestConfig(
        data_source=pg_dsn, outbox_table=names.display, base_kafka_config={"bootstrap.servers": "127.0.0.1:1"}
    )
    guard = TopicGuard({}, cfg.producer_config(), admin_factory=lambda conf: FakeAdmin())
    relay = Harvest(
        cfg, producer_factory=lambda conf, cb: FakeProducer(cb, conf), election=StaticElection(), topic_guard=guard
    )
    relay.core.open()
    try:
        assert relay.core.mark_db is not None
        prepared = relay.core.mark_db.conn.execute("SELECT statement FROM pg_prepared_statements").fetchall()
        assert len(prepared) == 1 and "UPDATE" in prepared[0][0] and "RETURNING" in prepared[0][0], prepared
        with psycopg.connect(pg_dsn) as conn:
            owned = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE leader_id IS NOT NULL").format(names.outbox))
            assert owned.fetchone() == (0,)
    finally:
        relay.core.close()
