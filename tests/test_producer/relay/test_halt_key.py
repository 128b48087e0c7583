"""``deadLetterPolicy``: a poison row in the middle of a key's sequence, on the real Postgres and Kafka.

Keys ``p`` and ``q`` each have a poison row in the middle (header arrays that differ in length: the
relay dead-letters it at once), among good keys. ``skip``: the key's later rows flow past it.
``haltKey``: they wait in the outbox, rows of the key committed while it is halted too (a late
commit must not overtake), while other keys flow; ``dead-letters keys`` lists both keys with the rows
waiting and ``harvest_halted_keys`` counts them; then the operator fixes and requeues ``p``'s dead
letter and discards ``q``'s, and each key's rows flow in id order -- read end to end with
``ReadCommittedIter`` under ``--uuid-sequencing``. Both modes, unsharded and sharded, and unsharded on
``outboxLayout: cursor``, where the waiting rows are held in ``<outbox>_held`` (producer/layouts/cursor/held.py)
and "the outbox drained" means the committed cursor passed every row and nothing is held.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql
from relaylib import assert_per_key_order, consume_all, covers, outbox_count, relay_config, wait_drained
from sequenced_log import read_committed_to_end

from harvest_outbox.producer.layouts.cursor.database import cursor_backlog
from harvest_outbox.producer.mapping.table import table_mapping
from harvest_outbox.producer.ops._deadletter_admin import Selection, discard, selected_ids, stuck_keys
from harvest_outbox.producer.ops._deadletters import list_dead_letters, requeue_what_can_be
from harvest_outbox.producer.relay.sharded import relay_for
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

MISMATCHED = "header arrays differ in length"


class Outbox:
    """Writes the scenario's rows and remembers, per key, the values a reader must see in order."""

    def __init__(self, dsn: str, table: str, topic: str, names: OutboxNames) -> None:
        self.dsn, self.table, self.topic = dsn, table, topic
        self.st = Stasher(table)
        self.expected: dict[str, list[bytes | None]] = {}
        self.ins = sql.SQL(
            "INSERT INTO {} (kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values) "
            "VALUES (%s, %s, %s, %s, %s) RETURNING id"
        ).format(names.outbox)

    def good(self, conn: psycopg.Connection, key: str, value: str) -> None:
        self.st.stash(conn, OutboxRecord(self.topic, key, value))
        self.expected.setdefault(key, []).append(value.encode())

    def poison(self, conn: psycopg.Connection, key: str, value: str) -> int:
        self.expected.setdefault(key, [])
        return conn.execute(self.ins, (self.topic, key, value, ["a", "b"], ["1"])).fetchone()[0]  # type: ignore[index]


def _write(box: Outbox) -> dict[str, int]:
    poison = {}
    with psycopg.connect(box.dsn, autocommit=True) as conn:
        for i in range(10):
            for key in ("a", "b", "c"):
                box.good(conn, key, f"{key}{i}")
            if i == 5:
                poison["p"] = box.poison(conn, "p", "p5")
            else:
                box.good(conn, "p", f"p{i}")
            if i == 2:
                poison["q"] = box.poison(conn, "q", "q2")
            elif i < 6:
                box.good(conn, "q", f"q{i}")
    return poison


def _read(
    kafka: str, topic: str, sequenced: bool, want: dict[str, list[bytes | None]]
) -> dict[str, list[bytes | None]]:
    """Each key's values in log order: committed records only (ReadCommittedIter) when sequenced."""
    if not sequenced:
        got = consume_all(kafka, topic, covers(want), 60)
        assert_per_key_order(got, want, allow_dups=True)  # at-least-once: a re-send may repeat a prefix
        return want
    seen: dict[str, list[bytes | None]] = {}
    for r in read_committed_to_end({"bootstrap.servers": kafka}, [topic]):
        seen.setdefault(r.key.decode(), []).append(r.value)
    return seen


def _waiting(dsn: str, table: str, layout: str) -> int:
    """Rows not relayed: the outbox's (mark); the held rows once the cursor passed every row, else -1 (cursor)."""
    if layout == "mark":
        return outbox_count(dsn, table)
    names = OutboxNames.parse(table)
    with psycopg.connect(dsn) as conn:
        if cursor_backlog(conn, names):
            return -1
        return int(conn.execute(sql.SQL("SELECT count(*) FROM {}").format(names.held)).fetchone()[0])  # type: ignore[index]


def _state(dsn: str, table: str) -> str:
    names = OutboxNames.parse(table)
    with psycopg.connect(dsn) as conn:
        q = "SELECT {} FROM {} ORDER BY 1"
        dead = conn.execute(sql.SQL(q).format(sql.SQL("id, kafka_key"), names.dead_letters)).fetchall()
        if not conn.execute("SELECT to_regclass(%s)", (names.held.as_string(conn),)).fetchone()[0]:  # type: ignore[index]
            return f"dead letters {dead}"
        held = conn.execute(sql.SQL(q).format(sql.SQL("held_seq, id, kafka_key, txid::text"), names.held)).fetchall()
        cur = conn.execute(sql.SQL("SELECT epoch, lo::text, hi::text, pos FROM {}").format(names.cursor)).fetchall()
    return f"dead letters {dead}, held {held}, cursor {cur}"


def _wait_outbox(dsn: str, table: str, rows: int, timeout: float = 60.0, layout: str = "mark") -> None:
    deadline = time.monotonic() + timeout
    while _waiting(dsn, table, layout) != rows:
        assert time.monotonic() < deadline, (
            f"{_waiting(dsn, table, layout)} rows wait, not {rows}: {_state(dsn, table)}"
        )
        time.sleep(0.1)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("sequenced", "shards", "layout"),
    [
        (False, 1, "mark"),
        (True, 1, "mark"),
        (False, 2, "mark"),
        (True, 2, "mark"),
        (False, 1, "cursor"),
        (True, 1, "cursor"),
    ],
    ids=[
        "at-least-once",
        "uuid-sequencing",
        "at-least-once-sharded",
        "uuid-sequencing-sharded",
        "at-least-once-cursor",
        "uuid-sequencing-cursor",
    ],
)
def test_halt_key_holds_the_keys_later_rows_until_requeue_or_discard(
    sequenced: bool,
    shards: int,
    layout: str,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic = topic_factory(partitions=2)
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, shards=shards, layout=layout)
    box = Outbox(pg_dsn, table, topic, names)
    poison = _write(box)
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(
        uuid_sequencing=sequenced,
        shards=shards,
        leader_election="postgres",
        dead_letter_policy="haltKey",
        outbox_layout=layout,
    )
    waiting_in = names.outbox if layout == "mark" else names.held
    order = sql.SQL("id" if layout == "mark" else "held_seq, id")
    relay = relay_for(cfg).start()
    try:
        # p6..p9 and q3..q5 wait; every other row goes
        _wait_outbox(pg_dsn, table, 7, layout=layout)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            # rows of halted keys committed now wait too (also behind a stasher's NOTIFY)
            box.good(conn, "p", "p10")
            box.good(conn, "q", "q6")
            box.good(conn, "a", "a10")
        _wait_outbox(pg_dsn, table, 9, layout=layout)
        time.sleep(1.0)  # a view ends after a halt: still nothing of p or q may leave
        assert _waiting(pg_dsn, table, layout) == 9
        with psycopg.connect(pg_dsn) as conn:
            stuck = {(k.topic, k.key): k for k in stuck_keys(conn, table)}
            waiting = conn.execute(
                sql.SQL("SELECT kafka_key, kafka_value FROM {} ORDER BY {}").format(waiting_in, order)
            ).fetchall()
        assert set(stuck) == {(topic, "p"), (topic, "q")}
        assert (stuck[(topic, "p")].waiting, stuck[(topic, "q")].waiting) == (5, 4)
        assert MISMATCHED in stuck[(topic, "p")].reason and stuck[(topic, "p")].dead_letters == 1
        assert [v for k, v in waiting if k == "p"] == ["p6", "p7", "p8", "p9", "p10"]
        deadline = time.monotonic() + 10
        while relay.metrics.halted_keys != 2:  # harvest_halted_keys, from the leader's stats query
            assert time.monotonic() < deadline, f"halted_keys = {relay.metrics.halted_keys}"
            time.sleep(0.2)
        # the fix, then requeue p's dead letter; q's is discarded
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("UPDATE {} SET kafka_header_values = '{{1,2}}' WHERE id = %s").format(names.dead_letters),
                (poison["p"],),
            )
            ids = selected_ids(conn, table, Selection(topic=topic, key="p"))
            assert ids == [poison["p"]]
            moved = requeue_what_can_be(conn, table, ids, None, keep_ids=True)
            assert (moved.moved, moved.left) == (1, 0)
            gone = discard(conn, table, Selection(key="q"), "test")
            assert [g[0] for g in gone] == [poison["q"]]
        box.expected["p"] = [f"p{i}".encode() for i in range(11)]  # p5 in its place
        if layout == "mark":
            wait_drained(pg_dsn, table, 60)
        else:
            _wait_outbox(pg_dsn, table, 0, layout=layout)
        with psycopg.connect(pg_dsn) as conn:
            assert list_dead_letters(conn, table) == []
    finally:
        relay.stop()
        relay.wait(30)
    seen = _read(kafka_bootstrap, topic, sequenced, box.expected)
    assert seen == box.expected


@pytest.mark.integration
@pytest.mark.parametrize("sequenced", [False, True], ids=["at-least-once", "uuid-sequencing"])
def test_skip_lets_the_keys_later_rows_flow(
    sequenced: bool,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic = topic_factory(partitions=2)
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table)
    box = Outbox(pg_dsn, table, topic, names)
    poison = _write(box)
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(
        uuid_sequencing=sequenced, leader_election="postgres"
    )
    assert cfg.dead_letter_policy == "skip"  # the default
    with relay_for(cfg):
        wait_drained(pg_dsn, table, 60)
    with psycopg.connect(pg_dsn) as conn:
        assert sorted(d.id for d in list_dead_letters(conn, table)) == sorted(poison.values())
        assert {(k.key, k.waiting) for k in stuck_keys(conn, table)} == {("p", 0), ("q", 0)}
    assert _read(kafka_bootstrap, topic, sequenced, box.expected) == box.expected


@pytest.mark.integration
@pytest.mark.parametrize("sequenced", [False, True], ids=["at-least-once", "uuid-sequencing"])
def test_halt_key_on_a_debezium_outbox(
    sequenced: bool,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    """The mapped record's topic and key (routed aggregatetype, aggregateid) halt; requeue restores the
    row as written, with its relay id, ahead of the aggregate's waiting events."""
    from test_table_mapping import _CREATE, _insert

    topic = topic_factory(partitions=2, config={"max.message.bytes": "20000"})
    mapping = table_mapping("debezium", {"route.topic.replacement": topic})
    table = f"{pg_schema}.outbox_event"
    names = OutboxNames.parse(table, mapping)
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(sql.SQL(_CREATE).format(t=names.outbox, payload=sql.SQL("TEXT")))
    init_db(pg_dsn, table, mapping=mapping)
    rows, want = [], {}
    for i in range(6):
        for agg_id in ("o-1", "o-2"):
            value = f"{agg_id}#{i}" if (agg_id, i) != ("o-1", 3) else "x" * 30_000  # too large for the topic
            rows.append((uuid.uuid4(), "Order", agg_id, "Created", value, None, None, None))
            want.setdefault(agg_id, []).append(f"{agg_id}#{i}".encode())
    with psycopg.connect(pg_dsn) as conn:
        _insert(conn, names.outbox, rows)
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(
        uuid_sequencing=sequenced, table_mapping=mapping, leader_election="postgres", dead_letter_policy="haltKey"
    )
    count = sql.SQL("SELECT count(*) FROM {}").format(names.outbox)
    with relay_for(cfg):
        deadline = time.monotonic() + 60
        while True:
            with psycopg.connect(pg_dsn) as conn:
                left = conn.execute(count).fetchone()[0]  # type: ignore[index]
            if left == 2:  # o-1#4 and o-1#5 wait
                break
            assert time.monotonic() < deadline, f"{left} rows in the outbox, not 2"
            time.sleep(0.1)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            [stuck] = stuck_keys(conn, table, mapping)
            assert (stuck.topic, stuck.key, stuck.waiting) == (topic, "o-1", 2)
            assert "exceeds what its topic accepts" in stuck.reason
            conn.execute(  # the fix: the event as it should have been written
                sql.SQL("UPDATE {} SET source_row = jsonb_set(source_row, '{{payload}}', '\"o-1#3\"')").format(
                    names.dead_letters
                )
            )
            assert requeue_what_can_be(conn, table, None, None, mapping, keep_ids=True).moved == 1
        deadline = time.monotonic() + 60
        while True:
            with psycopg.connect(pg_dsn) as conn:
                if conn.execute(count).fetchone()[0] == 0:  # type: ignore[index]
                    break
            assert time.monotonic() < deadline, "the requeued key did not drain"
            time.sleep(0.1)
    assert _read(kafka_bootstrap, topic, sequenced, want) == want
