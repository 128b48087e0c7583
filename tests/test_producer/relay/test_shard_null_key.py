"""Every row belongs to a shard, a NULL ``kafka_key`` too (issue #38, item 3).

With ``shards`` > 1 and the outbox's NOT NULL constraint dropped (docs/reliability.md, malformed rows), the shard
expression was NULL for a NULL key: no shard's mark read the row, the backlog gauges left it out and
`harvest shards` died on it. The row now hashes as the empty key does (every other key keeps its
shard), so its shard's leader marks it and dead-letters it, as ``shards: 1`` does. An outbox whose
shard index an older harvest built (the old expression) is refused until `harvest init-db` replaces it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from relaylib import consume_all, relay_config, wait_drained

from harvest_outbox.harvest_local.relays import wait_for, write_config
from harvest_outbox.producer.errors import SchemaError
from harvest_outbox.producer.layouts.mark.database import MarkDatabase
from harvest_outbox.producer.ops._deadletters import list_dead_letters
from harvest_outbox.producer.ops.cli import main
from harvest_outbox.producer.relay.sharded import ShardedHarvest
from harvest_outbox.producer.relay.shards import shard_of
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db

NULL_KEY_REASON = "kafka_key is NULL"


def _outbox_with_a_null_key(dsn: str, table: str, topic: str, shards: int) -> tuple[OutboxNames, list[int], int]:
    """An outbox for ``shards`` with 20 good rows of 5 keys, a NULL-key row among them; (names, good ids,
    the NULL row's id)."""
    names = init_db(dsn, table, shards=shards)
    ins = sql.SQL(
        "INSERT INTO {} (kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values) "
        "VALUES (%s, %s, %s, '{{}}', '{{}}') RETURNING id"
    ).format(names.outbox)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN kafka_key DROP NOT NULL").format(names.outbox))
        ids = [
            conn.execute(ins, (topic, None if i == 10 else f"k{i % 5}", f"v{i}")).fetchone()[0]  # type: ignore[index]
            for i in range(21)
        ]
    return names, ids[:10] + ids[11:], ids[10]


def test_a_null_key_hashes_as_the_empty_key() -> None:
    assert [shard_of(None, s) for s in (2, 4, 8, 256)] == [shard_of("", s) for s in (2, 4, 8, 256)]


@pytest.mark.integration
@pytest.mark.parametrize("shards", [2, 4])
def test_every_row_is_in_exactly_one_shard_a_null_key_too(pg_dsn: str, pg_schema: str, shards: int) -> None:
    names, good, null_id = _outbox_with_a_null_key(pg_dsn, f"{pg_schema}.outbox", "t", shards)
    seen: dict[int, int] = {}
    for k in range(shards):
        db = MarkDatabase(pg_dsn, names, shards)
        db.set_shards(frozenset({k}))
        try:
            for row in db.mark(uuid.uuid4(), 100):
                assert row[0] not in seen, f"row {row[0]} in shards {seen[row[0]]} and {k}"
                seen[row[0]] = k
                if row[0] == null_id:
                    assert row[6] is not None and row[6].startswith(NULL_KEY_REASON), row
        finally:
            db.close()
    assert sorted(seen) == sorted([*good, null_id])
    assert seen[null_id] == shard_of("", shards)


@pytest.mark.integration
def test_backlog_gauges_and_the_shards_command_count_a_null_key_row(
    pg_dsn: str, kafka_bootstrap: str, pg_schema: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = f"{pg_schema}.outbox"
    names, good, _null_id = _outbox_with_a_null_key(pg_dsn, table, "t", 4)
    db = MarkDatabase(pg_dsn, names, 4)
    db.set_shards(frozenset(range(4)))
    try:
        assert db.stats()[0] == len(good) + 1
        assert sum(c for c, _age in db.shard_stats.values()) == len(good) + 1
    finally:
        db.close()
    cfg = write_config(
        tmp_path / "h.yaml",
        dsn=pg_dsn,
        bootstrap=kafka_bootstrap,
        outbox_table=table,
        leader_election="postgres",
        shards=4,
    )
    assert main(["shards", "-f", str(cfg)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"4 shards, 0 led by 0 relay(s), {len(good) + 1} rows waiting" in out, out


@pytest.mark.integration
@pytest.mark.parametrize("sequenced", [False, True], ids=["at-least-once", "uuid-sequencing"])
def test_a_sharded_relay_dead_letters_a_null_key_row_and_delivers_the_rest(
    sequenced: bool,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic = topic_factory(partitions=2)
    table = f"{pg_schema}.outbox"
    _names, good, null_id = _outbox_with_a_null_key(pg_dsn, table, topic, 2)
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(
        shards=2, leader_election="postgres", uuid_sequencing=sequenced, name="nullkey"
    )
    with ShardedHarvest(cfg) as relay:
        wait_for(lambda: relay.led_shards == frozenset({0, 1}), 30, "both shards led")
        wait_drained(pg_dsn, table, 60)
        with psycopg.connect(pg_dsn) as conn:
            dead = {d.id: d.error for d in list_dead_letters(conn, table)}
        assert list(dead) == [null_id] and NULL_KEY_REASON in dead[null_id], dead
        got = consume_all(kafka_bootstrap, topic, lambda g: len({x.value for x in g if x.value}) >= len(good), 60)
        assert {g.value for g in got if g.value} == {f"v{i}".encode() for i in range(21) if i != 10}  # (ACKs are empty)


@pytest.mark.integration
def test_an_outbox_with_the_old_shard_index_is_refused_until_init_db_replaces_it(pg_dsn: str, pg_schema: str) -> None:
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, shards=4)
    old = "outbox_shard4_idx"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        # what an older harvest's init-db left: its index, on the expression without coalesce()
        for idx in conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = %s AND indexname LIKE 'outbox_shard%%'", (pg_schema,)
        ).fetchall():
            conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(pg_schema, idx[0])))
        conn.execute(
            sql.SQL(
                "CREATE INDEX {} ON {} (mod(('x' || substr(md5(kafka_key), 1, 8))::bit(32)::bigint, 4), id)"
            ).format(sql.Identifier(old), names.outbox)
        )
    db = MarkDatabase(pg_dsn, names, 4)
    try:
        with pytest.raises(
            SchemaError,
            match=re.escape(old) + r".*older harvest.*NULL kafka_key.*"
            r"Fix: run `harvest init-db` with shards: 4",
        ):
            _ = db.conn
    finally:
        db.close()
    init_db(pg_dsn, table, shards=4)
    with psycopg.connect(pg_dsn) as conn:
        indexes = {
            r[0]
            for r in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = %s", (pg_schema,)).fetchall()
        }
    assert names.shard_index_name(4) in indexes and old not in indexes, indexes
    db = MarkDatabase(pg_dsn, names, 4)
    try:
        _ = db.conn
    finally:
        db.close()
