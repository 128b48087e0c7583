"""The relay against real Postgres + Kafka: ordering, completeness, faults, poison rows, metrics."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
import urllib.request
from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql
from relaylib import assert_per_key_order, consume_all, covers, relay_config, wait_drained

from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.kafka import FaultInjector
from harvest_outbox.producer.ops._deadletters import list_dead_letters, requeue
from harvest_outbox.producer.relay.events import LeaderAcquired, LeaderRefreshed, MeterRead
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

pytestmark = pytest.mark.integration


def test_concurrent_writers_rollbacks_and_out_of_order_commits(
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic = topic_factory(partitions=4)
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    st = Stasher(table)
    expected: dict[str, list[bytes | None]] = {}
    headers_of: dict[bytes | None, list[tuple[str, bytes]]] = {}
    lock = threading.Lock()
    events: list[object] = []
    relay = Harvest(relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")), events.append).start()
    try:
        # A transaction that inserts first (lower id) and commits last.
        late = psycopg.connect(pg_dsn)
        late_value = "late-value"
        st.stash(late, OutboxRecord(topic, "late-key", late_value, [("origin", "late")]))

        def writer(w: int) -> None:
            rnd = random.Random(w)
            seq = 0
            with psycopg.connect(pg_dsn) as conn:
                for _tx in range(30):
                    batch = []
                    for _ in range(rnd.randint(1, 8)):
                        key = f"w{w}-k{rnd.randint(0, 9)}"
                        value = None if rnd.random() < 0.1 else f"w{w}-{seq}"
                        hdrs = [("seq", str(seq)), ("writer", str(w))]
                        batch.append(OutboxRecord(topic, key, value, hdrs))
                        seq += 1
                    rollback = rnd.random() < 0.25
                    try:
                        with conn.transaction():
                            if rnd.random() < 0.5:
                                st.stash_many(conn, batch)
                            else:
                                for r in batch:
                                    st.stash(conn, r)
                            time.sleep(rnd.random() * 0.01)  # hold the tx open: commits interleave
                            if rollback:
                                raise KeyError("rollback")
                    except KeyError:
                        continue
                    with lock:
                        for r in batch:
                            v = r.value.encode() if isinstance(r.value, str) else r.value
                            expected.setdefault(r.key, []).append(v)
                            if v is not None:
                                headers_of[v] = [(k, x.encode()) for k, x in r.headers]  # type: ignore[union-attr]

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # everything else is delivered while the early transaction is still open
        total_others = sum(len(v) for v in expected.values())
        got = consume_all(kafka_bootstrap, topic, lambda g: len(g) >= total_others, 60)
        assert len(got) == total_others
        late.commit()
        late.close()
        expected["late-key"] = [late_value.encode()]
        headers_of[late_value.encode()] = [("origin", b"late")]
        got = consume_all(kafka_bootstrap, topic, lambda g: len(g) >= total_others + 1, 30)
        wait_drained(pg_dsn, table, 10)
    finally:
        relay.stop()
        relay.wait(30)
    assert_per_key_order(got, expected, allow_dups=False)
    for g in got:
        if g.value is not None:
            assert g.headers == headers_of[g.value]
    assert sum(1 for g in got if g.value is None) == sum(v.count(None) for v in expected.values())
    # one key -> one partition, murmur2 placement keeps keys together
    assert all(len({g.partition for g in got if g.key == k}) == 1 for k in expected)
    assert any(isinstance(e, LeaderAcquired) for e in events)


def test_injected_produce_and_delivery_failures_lose_nothing(
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic = topic_factory(partitions=3)
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    expected: dict[str, list[bytes | None]] = {}
    records = []
    for i in range(1500):
        key = f"k{i % 40}"
        records.append(OutboxRecord(topic, key, f"v{i}", [("i", str(i))]))
        expected.setdefault(key, []).append(f"v{i}".encode())
    with psycopg.connect(pg_dsn) as conn:
        Stasher(table).stash_many(conn, records)
    faults = FaultInjector(produce_failure_rate=0.01, delivery_failure_rate=0.01, seed=7)
    events: list[object] = []
    cfg = relay_config(
        pg_dsn, kafka_bootstrap, table, unique_name("g"), max_delivery_attempts=1000, mark_query_records=500
    )
    relay = Harvest(cfg, events.append, producer_factory=faults).start()
    try:
        took = wait_drained(pg_dsn, table, 120)
    finally:
        relay.stop()
        relay.wait(30)
    got = consume_all(kafka_bootstrap, topic, covers(expected), 30)
    print(
        f"faults injected: {faults.counters}; remarks {relay.metrics.remarks}; drained in {took:.1f}s; "
        f"{len(got) - 1500} duplicates"
    )
    assert faults.counters["produce"] > 0 and faults.counters["delivery"] > 0
    assert relay.metrics.remarks > 0 and any(isinstance(e, LeaderRefreshed) for e in events)
    assert_per_key_order(got, expected, allow_dups=True)


def test_poison_rows_go_to_dead_letters_while_other_keys_flow(
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic = topic_factory(partitions=2)
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table)
    st = Stasher(table)
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN kafka_topic DROP NOT NULL").format(names.outbox))
        st.stash(conn, OutboxRecord(topic, "good", "g0"))
        big = st.stash(conn, OutboxRecord(topic, "poison", "x" * 50_000))  # > client message.max.bytes
        st.stash(conn, OutboxRecord(topic, "poison", "after-big"))  # same key still flows after it
        unknown = st.stash(conn, OutboxRecord("no-such-topic-" + topic, "lost", "u"))
        ins = sql.SQL(
            "INSERT INTO {} (kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values) "
            "VALUES (%s, %s, %s, %s, %s) RETURNING id"
        ).format(names.outbox)
        mismatched = conn.execute(ins, (topic, "bad-headers", "b", ["a", "b"], ["1"])).fetchone()[0]
        null_topic = conn.execute(ins, (None, "no-topic", "n", [], [])).fetchone()[0]
        st.stash_many(conn, [OutboxRecord(topic, f"good{i % 5}", f"g{i}") for i in range(1, 200)])
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g"))
    cfg = cfg.replace(producer_kafka_config={**cfg.producer_kafka_config, "message.max.bytes": 10_000})
    relay = Harvest(cfg).start()
    try:
        took = wait_drained(pg_dsn, table, 60)
    finally:
        relay.stop()
        relay.wait(30)
    got = consume_all(kafka_bootstrap, topic, lambda g: len(g) >= 201, 30)
    assert sorted(g.value for g in got if g.key.startswith("good")) == sorted(f"g{i}".encode() for i in range(200))
    assert [g.value for g in got if g.key == "poison"] == [b"after-big"]
    with psycopg.connect(pg_dsn) as conn:
        dead = {d.id: d for d in list_dead_letters(conn, table)}
    assert set(dead) == {big, unknown, mismatched, null_topic}, dead
    assert "exceeds what its topic accepts" in dead[big].error  # refused before producing
    assert "does not exist" in dead[unknown].error
    assert "header arrays differ in length: 2 key(s)" in dead[mismatched].error
    assert "kafka_topic is NULL" in dead[null_topic].error
    assert relay.metrics.dead_lettered == 4
    print(f"poison: drained in {took:.1f}s; errors: {[d.error for d in dead.values()]}")
    # requeue: rows still bad fail as a whole (NOT NULL on the outbox would reject NULL topic if restored)
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(sql.SQL("UPDATE {} SET kafka_value = 'small' WHERE id = %s").format(names.dead_letters), (big,))
        assert requeue(conn, table, [big]) == 1
        assert [d.id for d in list_dead_letters(conn, table)] != [] and big not in {
            d.id for d in list_dead_letters(conn, table)
        }
    relay = Harvest(cfg).start()
    try:
        wait_drained(pg_dsn, table, 30)
    finally:
        relay.stop()
        relay.wait(30)
    got = consume_all(
        kafka_bootstrap, topic, lambda g: [x.value for x in g if x.key == "poison"] == [b"after-big", b"small"], 20
    )
    assert [g.value for g in got if g.key == "poison"] == [b"after-big", b"small"]


def test_idle_wakeup_by_notify_and_metrics(
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic = topic_factory()
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    st = Stasher(table)
    events: list[object] = []
    # fallback poll 5 s (the shorter of idlePollInterval and minPollInterval): a wake-up well under that
    # proves NOTIFY works. Postgres leader election: NELI's election pulses every minPollInterval, which
    # made the start (~5 s to lead) and the stop (~3.5 s) slow and is no part of the wake-up.
    cfg = relay_config(
        pg_dsn,
        kafka_bootstrap,
        table,
        unique_name("g"),
        idle_poll_interval=10.0,
        min_poll_interval=5.0,
        max_poll_interval=5.0,
        heartbeat_timeout=10.0,
    ).replace(prometheus_port=0, leader_election="postgres")
    relay = Harvest(cfg, events.append).start()
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": unique_name("c"), "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    try:
        deadline = time.monotonic() + 30
        while not relay.is_leader and time.monotonic() < deadline:
            time.sleep(0.05)
        assert relay.is_leader and relay.leader_id is not None
        time.sleep(1.0)  # idle now
        latencies = []
        for i in range(5):
            t0 = time.monotonic()
            with psycopg.connect(pg_dsn) as conn:
                st.stash(conn, OutboxRecord(topic, "k", f"v{i}"))
            while True:
                m = c.poll(0.01)
                if m is not None and not m.error():
                    break
                # Well under the 5 s fallback poll (begun ~0.3 s before the stash): only NOTIFY can wake
                # it this early. (The latency itself is measured by bench/bench_relay.py, not asserted here.)
                assert time.monotonic() - t0 < 4.0, "not woken by NOTIFY"
            latencies.append(time.monotonic() - t0)
            time.sleep(0.3)
        print(f"idle-to-delivery latency: {[round(x * 1000, 1) for x in latencies]} ms")
        time.sleep(1.2)
        body = urllib.request.urlopen(f"http://127.0.0.1:{relay.prometheus_port}/metrics", timeout=5).read().decode()
        assert "harvest_delivered_records_total" in body and "harvest_is_leader" in body
    finally:
        c.close()
        relay.stop()
        relay.wait(30)
    reads = [e.stats for e in events if isinstance(e, MeterRead)]
    assert reads and reads[-1].delivered_total == 5 and reads[-1].backlog_rows == 0


def test_missing_heartbeats_fence_the_leader_and_returning_ones_restore_it(
    pg_dsn: str, kafka_bootstrap: str, pg_schema: str, unique_name: Callable[[str], str]
) -> None:
    from harvest_outbox.producer.relay.events import LeaderFenced

    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    events: list[object] = []
    relay = Harvest(
        relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g"), heartbeat_timeout=2.0), events.append
    ).start()
    election = relay._election
    try:
        deadline = time.monotonic() + 30
        while not relay.is_leader and time.monotonic() < deadline:
            time.sleep(0.05)
        first = relay.leader_id
        assert first is not None
        real = election._producer  # type: ignore[attr-defined]

        class Blackhole:  # heartbeats vanish, as in a partition between relay and broker
            def produce(self, *a: object, **k: object) -> None:
                pass

            def poll(self, *a: object) -> int:
                return 0

            def flush(self, *a: object) -> int:
                return 0

        t0 = time.monotonic()
        election._producer = Blackhole()  # type: ignore[attr-defined]
        while not any(isinstance(e, LeaderFenced) for e in events) and time.monotonic() - t0 < 10:
            time.sleep(0.05)
        fenced_after = time.monotonic() - t0
        assert any(isinstance(e, LeaderFenced) for e in events) and not relay.is_leader
        election._producer = real  # type: ignore[attr-defined]
        while not relay.is_leader and time.monotonic() - t0 < 20:
            time.sleep(0.05)
        assert relay.is_leader and relay.leader_id != first
        print(f"fenced {fenced_after:.2f}s after heartbeats stopped (timeout 2s); resumed with a new leader id")
    finally:
        relay.stop()
        relay.wait(30)
    kinds = [type(e).__name__ for e in events if not isinstance(e, MeterRead)]
    assert kinds[:3] == ["LeaderAcquired", "LeaderFenced", "LeaderAcquired"], kinds


#: the backlog the late row sits below: the late row commits once 10,000 are delivered (two full marks of
#: 5,000), and must go out while the rest still waits (~20,000 rows did, sequenced, with the marks queued
#: ahead; was 200,000, then 100,000 with 20,000 delivered first: the rows above only made the stash, the
#: drain and the final read longer)
BACKLOG = 50_000
#: delivered before the late row commits
LATE_AFTER = 10_000


@pytest.mark.integration
@pytest.mark.parametrize("uuid_sequencing", [False, True], ids=["at-least-once", "sequenced"])
def test_a_row_committed_late_below_a_draining_backlog_goes_out_before_its_keys_next_row(
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
    uuid_sequencing: bool,
) -> None:
    # A long transaction inserts a row before a backlog (lower id) and commits mid-drain; the next
    # row of its key commits after it (the application serialises a key's writes). Every mark
    # scans from the start of the outbox, so the late row goes out before that next row and before
    # the backlog is drained. (A mark that resumed above the last full mark's highest id sent the
    # next row first: order violations in the outage suite's pg_latency run.)
    topic = topic_factory(partitions=4)
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    st = Stasher(table)
    late = psycopg.connect(pg_dsn)
    late_id = st.stash(late, OutboxRecord(topic, "late-key", "v1"))
    with psycopg.connect(pg_dsn) as conn:
        st.stash_many(conn, [OutboxRecord(topic, f"k{i % 100}", f"v{i}") for i in range(BACKLOG)])
    config = dataclasses.replace(
        relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")), uuid_sequencing=uuid_sequencing
    )
    find = sql.SQL("SELECT 1 FROM {} WHERE id = %s").format(sql.Identifier(pg_schema, "outbox"))
    relay = Harvest(config).start()
    try:
        deadline = time.monotonic() + 60
        while relay.metrics.delivered < LATE_AFTER:  # well past the late row's id
            assert time.monotonic() < deadline, f"only {relay.metrics.delivered} delivered in 60 s"
            time.sleep(0.01)
        late.commit()
        late.close()
        with psycopg.connect(pg_dsn) as conn:
            st.stash(conn, OutboxRecord(topic, "late-key", "v2"))
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            while conn.execute(find, (late_id,)).fetchone() is not None:
                assert time.monotonic() < deadline, "the late row was never sent"
                time.sleep(0.01)
            left = conn.execute(
                sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(pg_schema, "outbox"))
            ).fetchone()[0]  # type: ignore[index]
        wait_drained(pg_dsn, table, 60)
    finally:
        relay.stop()
        relay.wait(30)
    assert left > 0, "the late row waited for the whole backlog"
    got = consume_all(kafka_bootstrap, topic, lambda g: len(g) >= BACKLOG + 2, 60)
    assert [g.value for g in got if g.key == "late-key"] == [b"v1", b"v2"]
