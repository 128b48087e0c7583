"""Sharded relays (``shards: S``), in one process: the shard hash (Python == SQL), config and schema
errors, the per-shard mark, and relays sharing one outbox in both election modes — balance, graceful
hand-over, exactly-once over the whole topic with ``--uuid-sequencing``. Process-level faults
(kill -9, SIGSTOP) are in ``test_sharded_failover.py``."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from relaylib import assert_per_key_order, consume_all, covers, relay_config, wait_drained

from harvest_outbox.harvest_local.relays import wait_for
from harvest_outbox.producer.config import HarvestConfig, from_mapping
from harvest_outbox.producer.election.sharded_neli import ShardSetSeat, fair_share
from harvest_outbox.producer.election.sharded_postgres import PostgresShardElection
from harvest_outbox.producer.errors import ConfigError, ElectionError, SchemaError
from harvest_outbox.producer.layouts.mark.database import MarkDatabase
from harvest_outbox.producer.relay.sharded import ShardedHarvest, relay_for
from harvest_outbox.producer.relay.shards import shard_expression, shard_of
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

S = 8


# ---------------------------------------------------------------------------------------------- pure logic
@pytest.mark.parametrize(
    "shards, relays, share", [(8, 1, 8), (8, 2, 4), (8, 3, 3), (8, 8, 1), (8, 9, 1), (1, 3, 1), (8, 0, 8)]
)
def test_fair_share(shards: int, relays: int, share: int) -> None:
    assert fair_share(shards, relays) == share


@pytest.mark.parametrize("value", [0, -1, 257, "8", 2.0, True])
def test_shards_config_errors_name_the_field(value: object) -> None:
    with pytest.raises(ConfigError, match=r"harvest\.shards: .* must be a whole number of shards 1-256"):
        from_mapping({"harvest": {"shards": value}})


def test_shards_config_defaults_and_leader_topic() -> None:
    assert HarvestConfig().shards == 1
    assert HarvestConfig().leader_topic == "harvest.neli"
    sharded = from_mapping({"harvest": {"shards": 8, "leaderGroupID": "orders"}}).harvest
    assert sharded.shards == 8
    assert sharded.leader_topic == "orders.neli.shards8"  # never the unsharded relays' one-partition topic
    assert "shards=8" in repr(sharded)
    assert isinstance(relay_for(sharded.replace(leader_election="postgres")), ShardedHarvest)


def test_seat_makes_every_change_of_the_led_set_a_new_view() -> None:
    """Scenario: the loop's view follows the offered set on the loop's own pulse: a change revokes
    the old view (the loop drains it) before the new set is applied and acquired."""
    events: list[tuple[str, frozenset[int]]] = []
    seat = ShardSetSeat(8)

    class L:
        def on_acquired(self) -> None:
            events.append(("acquired", seat.applied))

        def on_revoked(self) -> None:
            events.append(("revoked", seat.applied))

        def on_fenced(self) -> None:
            events.append(("fenced", seat.applied))

    seat.start(L())
    assert not seat.pulse() and events == []
    seat.offer(frozenset({1, 5}))
    assert not seat.wait_released(frozenset({1}), 0.01) or 1 not in seat.applied
    assert seat.pulse() and seat.pulse() and events == [("acquired", frozenset({1, 5}))]
    seat.offer(frozenset({5}))
    assert not seat.wait_released(frozenset({1}), 0.01)  # still in the loop's view until its next pulse
    assert seat.pulse()
    assert seat.wait_released(frozenset({1}), 0.01)
    assert events[1:] == [("revoked", frozenset({1, 5})), ("acquired", frozenset({5}))]
    seat.offer(frozenset())
    assert not seat.pulse() and events[3:] == [("revoked", frozenset({5}))]
    seat.offer(frozenset({2}))
    seat.pulse()
    seat.close()
    assert events[4:] == [("acquired", frozenset({2})), ("revoked", frozenset({2}))]
    assert seat.wait_released(frozenset({2}), 0) and not seat.is_leader


# ---------------------------------------------------------------------------------------------- database
@pytest.mark.integration
def test_shard_hash_is_the_same_in_python_and_sql(pg_dsn: str) -> None:
    rnd = random.Random(7)
    keys = [f"k{i}" for i in range(300)] + ["", "é", "日本語キー", "a" * 500, "order-42", " spaced key "]
    keys += ["".join(chr(rnd.randrange(32, 0x3000)) for _ in range(rnd.randrange(1, 20))) for _ in range(200)]
    with psycopg.connect(pg_dsn) as conn:
        for count in (2, 3, 8, 13, 256):
            expr = shard_expression(count)
            rows = conn.execute(
                sql.SQL("SELECT k, {} FROM unnest(%s::text[]) AS t(k)").format(
                    sql.SQL(expr.as_string(conn).replace("kafka_key", "k"))
                ),
                (keys,),
            ).fetchall()
            assert {k: int(s) for k, s in rows} == {k: shard_of(k, count) for k in keys}, count
    counts = [0] * S
    for k in keys[:300]:
        counts[shard_of(k, S)] += 1
    assert min(counts) > 300 / S / 2  # spread, not lumped


@pytest.mark.integration
def test_sharded_relay_refuses_an_outbox_not_initialised_for_its_shards(
    pg_dsn: str, pg_schema: str, kafka_bootstrap: str
) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)  # shards: 1 only
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, "g").replace(shards=S, leader_election="postgres")
    with pytest.raises(
        SchemaError, match=r"not initialised for shards: 8 .* Fix: run `harvest init-db` with shards: 8"
    ):
        ShardedHarvest(cfg).start()
    init_db(pg_dsn, table, shards=4)  # another count does not do either
    with pytest.raises(SchemaError, match="shards: 8"):
        ShardedHarvest(cfg).start()


@pytest.mark.integration
def test_a_shard_mark_reads_its_index_range_on_a_large_outbox(pg_dsn: str, pg_schema: str) -> None:
    # With half-empty outbox pages and Postgres' default random_page_cost, a 5,000-row mark of one
    # shard of a 100k-row outbox was planned as a primary-key scan hashing every row's key.
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table, shards=S)
    with psycopg.connect(pg_dsn) as conn:
        Stasher(table).stash_many(conn, [OutboxRecord("t", f"key-{i % 1000}", "v" * 100) for i in range(100_000)])
        conn.commit()
        conn.execute(sql.SQL("ANALYZE {}").format(names.outbox))
    import uuid

    db = MarkDatabase(pg_dsn, names, S)
    db.set_shards(frozenset({3}))
    try:
        _ = db.conn
        plan = "\n".join(
            r[0]
            for r in db.conn.execute(
                sql.SQL("EXPLAIN ") + db._mark_sql,  # type: ignore[operator]
                {"leader": uuid.uuid4(), "n": 5000, "t0": 0.0},
            ).fetchall()
        )
    finally:
        db.close()
    assert names.shard_index_name(S) in plan and "outbox_pkey" not in plan, plan


@pytest.mark.integration
def test_shard_mark_takes_only_its_rows_in_id_order_from_the_index(pg_dsn: str, pg_schema: str) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table, shards=S)
    keys = [f"key-{i}" for i in range(64)]
    with psycopg.connect(pg_dsn) as conn:
        Stasher(table).stash_many(conn, [OutboxRecord("t", keys[i % 64], f"v{i}") for i in range(2000)])
        conn.commit()
        conn.execute("ANALYZE " + OutboxNames.parse(table).outbox.as_string(conn))
    import uuid

    seen: list[int] = []
    for k in range(S):
        db = MarkDatabase(pg_dsn, OutboxNames.parse(table), S)
        db.set_shards(frozenset({k}))
        try:
            rows = db.mark(uuid.uuid4(), 5000)
            assert rows == sorted(rows)
            assert all(shard_of(r[2], S) == k for r in rows)  # type: ignore[arg-type]
            seen += [r[0] for r in rows]
            plan = "\n".join(
                r[0]
                for r in db.conn.execute(
                    sql.SQL("EXPLAIN ") + db._mark_sql,  # type: ignore[operator]
                    {"leader": uuid.uuid4(), "n": 100, "t0": 0.0},
                ).fetchall()
            )
            assert OutboxNames.parse(table).shard_index_name(S) in plan, plan
        finally:
            db.close()
    assert sorted(seen) == list(range(min(seen), min(seen) + 2000))  # every row in exactly one shard
    db = MarkDatabase(pg_dsn, OutboxNames.parse(table), S)
    db.set_shards(frozenset({1, 3}))
    try:
        import uuid as _uuid

        with psycopg.connect(pg_dsn) as conn:  # a new view re-marks rows of other views: all of 1 and 3
            want = [
                i
                for i, k in conn.execute(
                    sql.SQL("SELECT id, kafka_key FROM {} ORDER BY id").format(OutboxNames.parse(table).outbox)
                ).fetchall()
                if shard_of(k, S) in (1, 3)
            ]
        assert [r[0] for r in db.mark(_uuid.uuid4(), 5000)] == want
        plan = "\n".join(
            r[0]
            for r in db.conn.execute(
                sql.SQL("EXPLAIN ") + db._mark_sql,  # type: ignore[operator]
                {"leader": _uuid.uuid4(), "n": 100, "t0": 0.0},
            ).fetchall()
        )
        assert "Merge Append" in plan and plan.count(OutboxNames.parse(table).shard_index_name(S)) == 2, plan
        assert db.stats()[0] == len(want) and sum(c for c, _ in db.shard_stats.values()) == len(want)
        assert sorted(db.shard_stats) == [1, 3]
        with pytest.raises(ValueError, match=r"outside 0\.\.7"):
            db.set_shards(frozenset({8}))
    finally:
        db.close()


def _stash(dsn: str, table: str, topic: str, n: int, keys: int, start: int = 0) -> dict[str, list[bytes | None]]:
    expected: dict[str, list[bytes | None]] = {}
    records = []
    for i in range(start, start + n):
        key = f"key-{i % keys}"
        records.append(OutboxRecord(topic, key, f"v{i}"))
        expected.setdefault(key, []).append(f"v{i}".encode())
    with psycopg.connect(dsn) as conn:
        Stasher(table).stash_many(conn, records)
    return expected


@pytest.mark.integration
@pytest.mark.parametrize("election", ["postgres", "neli"])
def test_one_two_three_relays_spread_the_shards_and_hand_over_gracefully(
    election: str,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic = topic_factory(partitions=4)
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table, shards=S)
    base = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(
        shards=S, leader_election=election, leader_lock_check_interval=0.2
    )
    expected = _stash(pg_dsn, table, topic, 3000, 200)
    relays: list[ShardedHarvest] = []
    try:

        def led() -> list[frozenset[int]]:
            return [r.led_shards for r in relays]

        def balanced() -> bool:
            sets = led()
            return (
                sum(map(len, sets)) == S
                and len(frozenset().union(*sets)) == S
                and all(1 <= len(s) <= fair_share(S, len(relays)) + 1 for s in sets)
            )

        # 1, then 2, then 3 relays: the shards spread as relays join
        for i in range(3):
            relays.append(ShardedHarvest(base.replace(name=f"r{i}")).start())
            wait_for(balanced, 60, f"{S} shards spread over {len(relays)} relay(s)")
        wait_drained(pg_dsn, table, 60)

        def settled() -> bool:  # balanced() allows one shard over while a relay still sheds its surplus
            sets = led()
            return sum(map(len, sets)) == S and all(len(s) <= fair_share(S, len(relays)) for s in sets)

        # graceful stop of one relay, from a settled spread: only its shards move, to the two others
        # (a snapshot taken while a relay still let a surplus shard go saw that shard move too)
        wait_for(settled, 60, f"{S} shards settled at most {fair_share(S, len(relays))} per relay")
        before = led()
        relays[0].stop()
        relays[0].wait(60)
        wait_for(
            lambda: len(relays[1].led_shards | relays[2].led_shards) == S, 60, "hand-over of the stopped relay's shards"
        )
        assert before[1] <= relays[1].led_shards and before[2] <= relays[2].led_shards, (before, led())
        assert all(len(r.led_shards) <= fair_share(S, 2) + 1 for r in relays[1:])
        more = _stash(pg_dsn, table, topic, 2000, 200, start=3000)
        for k, vs in more.items():
            expected.setdefault(k, []).extend(vs)
        wait_drained(pg_dsn, table, 60)
        total = sum(map(len, expected.values()))
        got = consume_all(kafka_bootstrap, topic, covers(expected), 60)
        assert_per_key_order(got, expected, allow_dups=True)
        delivered = sum(r.metrics.delivered for r in relays)
        assert delivered >= total
    finally:
        for r in relays:
            r.stop()
        for r in relays:
            r.wait(60)


@pytest.mark.integration
def test_postgres_shard_election_refuses_relays_of_another_shard_count(
    pg_dsn: str, kafka_bootstrap: str, pg_schema: str
) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table, shards=S)
    init_db(pg_dsn, table, shards=4)
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, "g").replace(shards=S, leader_election="postgres")
    with ShardedHarvest(cfg.replace(name="eight")):
        # A relay is refused by its layout first (test_layout.py); the election refuses on its own too.
        with pytest.raises(
            ElectionError,
            match=r"another shard count .*1 relay\(s\) with shards: 8.*this one has shards: 4"
            r".*drain-then-change",
        ):
            PostgresShardElection(pg_dsn, table, "four", 4).start(_Shards())


class _Shards:
    """A ShardListener that keeps the led set."""

    def __init__(self) -> None:
        self.led: set[int] = set()

    def on_shards_acquired(self, indices: frozenset[int]) -> None:
        self.led |= indices

    def on_shards_lost(self, indices: frozenset[int], why: str) -> None:
        self.led -= indices


@pytest.mark.integration
def test_a_notify_read_with_a_check_reply_still_respreads_the_shards(pg_dsn: str, pg_schema: str) -> None:
    """A relay joins while the leading relay's check is in flight: libpq reads the NOTIFY with that
    check's reply, so the socket never turns readable for it. The leader must look again at once and
    let the joiner's share go, not after its check interval (60 s here)."""
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table, shards=2)
    election, shards = PostgresShardElection(pg_dsn, table, "a", 2, check_interval=60.0), _Shards()
    with psycopg.connect(pg_dsn, autocommit=True) as joiner:
        real_step, steps = election._step, []

        def check_in_flight_when_a_relay_joins() -> None:
            steps.append(time.monotonic())
            if len(steps) != 2:
                real_step()
                return
            joiner.execute("SELECT pg_notify(%s, 'b')", (election.channel,))
            time.sleep(0.2)  # the NOTIFY waits in the socket when the check goes out
            real_step()  # counts one member and keeps both shards; the NOTIFY comes behind its reply
            assert election.members == 1
            joiner.execute("SELECT pg_advisory_lock_shared(%s::int, 2)", (election.namespace,))

        election._step = check_in_flight_when_a_relay_joins  # type: ignore[method-assign]
        election.start(shards)
        try:
            deadline = time.monotonic() + 5
            while shards.led != {0, 1}:
                assert time.monotonic() < deadline, shards.led
                election.pulse()
                time.sleep(0.01)
            joiner.execute("SELECT pg_notify(%s, 'poke')", (election.channel,))  # the second check: raced
            deadline = time.monotonic() + 5
            while len(shards.led) != 1:
                assert time.monotonic() < deadline, (shards.led, election.members, len(steps))
                election.pulse()
                time.sleep(0.01)
            assert election.members == 2
        finally:
            election.close()


@pytest.mark.integration
def test_neli_shard_election_refuses_a_leader_topic_with_other_partitions(
    pg_dsn: str, kafka_bootstrap: str, pg_schema: str, topic_factory: Callable[..., str]
) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table, shards=S)
    leader_topic = topic_factory(partitions=1)  # e.g. the unsharded relays' topic
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, "g").replace(shards=S, leader_topic=leader_topic)
    with pytest.raises(
        ElectionError,
        match=rf"leaderTopic '{leader_topic}' has 1 partition\(s\) but shards: 8 needs one "
        r"per shard",
    ):
        ShardedHarvest(cfg).start()


@pytest.mark.integration
def test_shards_command_shows_leaders_and_backlog(
    pg_dsn: str, kafka_bootstrap: str, pg_schema: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harvest_outbox.harvest_local.relays import write_config
    from harvest_outbox.producer.ops.cli import main

    table = f"{pg_schema}.outbox"
    cfg_path = write_config(
        tmp_path / "h.yaml",
        dsn=pg_dsn,
        bootstrap=kafka_bootstrap,
        outbox_table=table,
        uuid_sequencing=False,
        leader_election="postgres",
        shards=4,
        outbox_layout="mark",  # the relay below holds rows of a missing topic (missingTopicPolicy: hold)
    )
    assert main(["init-db", "-f", str(cfg_path)]) == 0
    assert "4 shards" in capsys.readouterr().out
    _stash(pg_dsn, table, "no-such-topic-for-this-test", 100, 10)
    assert main(["shards", "-f", str(cfg_path)]) == 0
    out = capsys.readouterr().out
    assert "4 shards, 0 led by 0 relay(s), 100 rows waiting" in out, out
    cfg = from_mapping(
        {
            "harvest": {
                "dataSource": pg_dsn,
                "outboxTable": table,
                "shards": 4,
                "leaderElection": "postgres",
                "missingTopicPolicy": "hold",
                "baseKafkaConfig": {"bootstrap.servers": kafka_bootstrap},
            }
        }
    ).harvest
    with ShardedHarvest(cfg.replace(name="lister")) as relay:
        wait_for(lambda: len(relay.led_shards) == 4, 30, "all shards led")
        time.sleep(0.2)
        assert main(["shards", "-f", str(cfg_path)]) == 0
        out = capsys.readouterr().out
        assert "4 shards, 4 led by 1 relay(s), 100 rows waiting" in out, out
        assert out.count("lister") == 4


@pytest.mark.integration
def test_fence_epochs_and_ack_intents_are_per_shard(pg_dsn: str, pg_schema: str) -> None:
    """docs/design.md §5 per shard. Scenario: relay A's view leads shards {0, 1}, C's {2}. A commits;
    shard 1 moves to B, whose view fences A (one of A's shards has a newer epoch) but not C; B
    recovers A's intent (A can no longer commit), C's stays C's; a later view of shard 0 also takes
    over intents an earlier sharding left."""
    import uuid

    from harvest_outbox.producer.errors import FenceError

    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table, shards=S)
    names = OutboxNames.parse(table)
    keys = {k: next(f"key-{i}" for i in range(10_000) if shard_of(f"key-{i}", S) == k) for k in range(S)}
    with psycopg.connect(pg_dsn) as conn:
        Stasher(table).stash_many(conn, [OutboxRecord("t", keys[k], f"v{k}-{j}") for k in (0, 1, 2) for j in range(3)])

    def view(shards: set[int]) -> tuple[MarkDatabase, uuid.UUID, int, list[tuple[int, bytes, int, str, int]]]:
        db = MarkDatabase(pg_dsn, names, S)
        db.set_shards(frozenset(shards))
        leader = uuid.uuid4()
        epoch, intents = db.start_view(leader, f"relay-{sorted(shards)}")
        return db, leader, epoch, intents

    opened: list[MarkDatabase] = []
    try:
        a, a_leader, a_epoch, a_intents = view({0, 1})
        c, c_leader, c_epoch, _ = view({2})
        opened += [a, c]
        assert a_intents == [] and a_epoch == 1 and c_epoch == 1
        a_rows, c_rows = a.mark(a_leader, 100), c.mark(c_leader, 100)
        assert sorted(shard_of(r[2], S) for r in a_rows) == [0, 0, 0, 1, 1, 1]  # type: ignore[arg-type]
        shard0 = [r[0] for r in a_rows if shard_of(r[2], S) == 0]  # type: ignore[arg-type]
        a.commit_txn(a_epoch, a_leader, shard0, [], b"PA", 10, [("t", 0)])
        # shard 1 moves to B: A's next commit is refused, whatever shard its rows are in
        b, _b_leader, b_epoch, b_intents = view({1})
        opened.append(b)
        assert b_epoch == 2
        assert [(p, c_) for _e, p, c_, _t, _pt in b_intents] == [(b"PA", 10)]  # A's: A can no longer commit
        with pytest.raises(
            FenceError,
            match=r"commit refused by the fence of .* \(shards 0,1 of 8\): epoch is \[1, 2\], "
            r"this view's is 1",
        ):
            a.commit_txn(a_epoch, a_leader, [r[0] for r in a_rows if r[0] not in shard0], [], b"PA", 11, [("t", 0)])
        # C, untouched, commits and writes an intent of its view's shards
        c.commit_txn(c_epoch, c_leader, [r[0] for r in c_rows], [], b"PC", 22, [("t", 0), ("t", 1)])
        with psycopg.connect(pg_dsn) as conn:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (epoch, producer, clock, topic, kafka_partition, shard_count, shards) "
                    "VALUES (1, 'OLD', 5, 't', 0, 4, '{{3}}')"
                ).format(names.ack_intents)
            )
        d, _, d_epoch, d_intents = view({2, 3})
        opened.append(d)
        assert d_epoch == 2 and sorted((p, c_, pt) for _e, p, c_, _t, pt in d_intents) == [
            (b"PC", 22, 0),
            (b"PC", 22, 1),
        ]
        e, _, e_epoch, e_intents = view({0})
        opened.append(e)
        assert e_epoch == 2 and sorted(p for _e, p, _c, _t, _pt in e_intents) == [b"OLD", b"PA"]
        with psycopg.connect(pg_dsn) as conn:
            epochs = dict(
                conn.execute(
                    sql.SQL("SELECT shard, epoch FROM {} WHERE shard_count = %s").format(names.shard_state), (S,)
                ).fetchall()
            )
            remaining = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(names.outbox)).fetchone()[0]
        assert epochs == {0: 2, 1: 2, 2: 2, 3: 2, 4: 0, 5: 0, 6: 0, 7: 0}
        assert remaining == 3  # shard 0's and shard 2's rows committed; A's shard-1 commit rolled back
    finally:
        for db in opened:
            db.close()


@pytest.mark.integration
def test_postgres_elections_refuse_mixing_sharded_and_unsharded_relays(
    pg_dsn: str, kafka_bootstrap: str, pg_schema: str
) -> None:
    from harvest_outbox.producer.election.postgres import PostgresElection
    from harvest_outbox.producer.harvest import Harvest

    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table, shards=S)
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, "g").replace(leader_election="postgres")
    # Relays are refused by their layout first (test_layout.py); the elections refuse on their own too.
    with ShardedHarvest(cfg.replace(name="sharded", shards=S)):
        with pytest.raises(
            ElectionError, match=r"sharded relays run on .* \(1 with shards: 8\); this one has shards: 1"
        ):
            PostgresElection(pg_dsn, table, "plain").start(Harvest(cfg.replace(name="plain")))
    with Harvest(cfg.replace(name="plain")) as plain:
        wait_for(lambda: plain.is_leader, 30, "the unsharded relay leads")
        with pytest.raises(ElectionError, match=r"an unsharded relay \(shards: 1, backend pid \d+\) leads .*shards: 8"):
            PostgresShardElection(pg_dsn, table, "sharded", S).start(_Shards())


@pytest.mark.integration
def test_sharded_relay_exports_per_shard_metrics_and_health(pg_dsn: str, kafka_bootstrap: str, pg_schema: str) -> None:
    import json
    import urllib.request

    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table, shards=4)
    _stash(pg_dsn, table, "no-such-topic-metrics", 200, 50)  # held (missingTopicPolicy hold): a steady backlog
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, "g", min_metrics_interval=0.2).replace(
        shards=4, leader_election="postgres", prometheus_port=0, missing_topic_policy="hold", name="metered"
    )
    with ShardedHarvest(cfg) as relay:
        wait_for(lambda: relay.led_shards == frozenset(range(4)), 30, "all shards led")
        base = f"http://127.0.0.1:{relay.prometheus_port}"

        def scrape() -> str:
            return urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()

        def backlog() -> dict[int, float]:
            return {
                int(k): float(v)
                for k, v in re.findall(
                    r'^harvest_shard_backlog_rows\{relay="metered",shard="(\d)"\} (\S+)$', scrape(), re.M
                )
            }

        wait_for(lambda: len(backlog()) == 4 and all(v == v for v in backlog().values()), 30, "per-shard readings")
        text = scrape()
        by_shard = backlog()
        assert sorted(by_shard) == [0, 1, 2, 3] and sum(by_shard.values()) == 200, by_shard
        assert all(v > 0 for v in by_shard.values())
        assert text.count('harvest_shard_is_leader{relay="metered"') == 4
        assert re.search(r'^harvest_backlog_rows\{relay="metered"\} 200\.0$', text, re.M), text
        ready = json.loads(urllib.request.urlopen(f"{base}/readyz", timeout=5).read())
        assert ready["status"] == "ready" and ready["role"] == "leader"
