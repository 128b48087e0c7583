"""``limits.rowTimeout`` bounds how long one row holds up the others, on the real broker.

The stuck row is one the broker never acknowledges: :class:`~producer.kafka.FaultInjector`'s
``stall_keys`` keeps it from the real broker and reports it timed out after the producer's
``message.timeout.ms`` — what librdkafka does for a partition that keeps refusing a record with a
retriable error (e.g. NOT_ENOUGH_REPLICAS; the test broker caps ``min.insync.replicas`` at the
replication factor, so it cannot be made to refuse for real). Every other record goes to the real
broker. Writers keep committing good rows (other keys) the whole time. Measured: the
largest age any good row reaches in the outbox (= how long it was held up: in ``--uuid-sequencing``
mode a row leaves the outbox when its transaction commits) must stay within rowTimeout plus a
margin for the view change; the stuck row is dead-lettered — in ``--uuid-sequencing`` mode after its
first wait (it held every key up for rowTimeout while the broker took the others), in
at-least-once mode after ``maxDeliveryAttempts`` waits (it only ever held its own key).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql
from relaylib import consume_all, relay_config
from seqcheck import Expected, check_exactly_once, count_rows

from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.kafka import FaultInjector
from harvest_outbox.producer.ops._deadletters import list_dead_letters
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

pytestmark = pytest.mark.integration

ROW_TIMEOUT = 4.0
MARGIN = 6.0  # view change + a loaded CI machine


@pytest.mark.parametrize("sequenced", [False, True], ids=["at-least-once", "uuid-sequencing"])
def test_a_row_the_broker_keeps_refusing_holds_others_up_at_most_row_timeout(
    sequenced: bool,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    good_topic = topic_factory(partitions=2)
    table = f"{pg_schema}.outbox"
    names = OutboxNames.parse(table)
    init_db(pg_dsn, table)
    st = Stasher(table)
    exp = Expected()
    stop = threading.Event()

    def stash_good(conn: psycopg.Connection, start: int, n: int) -> None:
        recs = [OutboxRecord(good_topic, f"k{i % 4}", f"g{i}") for i in range(start, start + n)]
        with conn.transaction():
            st.stash_many(conn, recs)
        for r in recs:
            exp.by_key.setdefault(r.key, []).append(r.value.encode())  # type: ignore[union-attr]
            exp.headers[r.value.encode()] = []  # type: ignore[union-attr]

    with psycopg.connect(pg_dsn) as conn:
        stash_good(conn, 0, 20)
        with conn.transaction():
            stuck_id = st.stash(conn, OutboxRecord(good_topic, "stuck", "refused"))
        stash_good(conn, 20, 20)

    def writer() -> None:
        n = 40
        with psycopg.connect(pg_dsn) as conn:
            while not stop.is_set():
                stash_good(conn, n, 5)
                n += 5
                time.sleep(0.1)

    oldest_sql = sql.SQL(
        "SELECT coalesce(extract(epoch FROM now() - min(create_time)), 0) FROM {} WHERE kafka_key <> 'stuck'"
    ).format(names.outbox)
    cfg = relay_config(
        pg_dsn,
        kafka_bootstrap,
        table,
        unique_name("g"),
        row_timeout=ROW_TIMEOUT,
        # sequenced: 5 attempts (the default) would hold every key up 5 x rowTimeout
        # if a waited-out row were merely counted; it must be parked at once
        max_delivery_attempts=5 if sequenced else 2,
    ).replace(uuid_sequencing=sequenced)
    relay = Harvest(cfg, producer_factory=FaultInjector(stall_keys=frozenset({b"stuck"}))).start()
    w = threading.Thread(target=writer)
    w.start()
    held = 0.0
    parked_after: float | None = None
    start = time.monotonic()
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            while time.monotonic() - start < 3 * ROW_TIMEOUT + MARGIN:
                held = max(held, float(conn.execute(oldest_sql).fetchone()[0]))  # type: ignore[index]
                if parked_after is None and stuck_id in {d.id for d in list_dead_letters(conn, table)}:
                    parked_after = time.monotonic() - start
                if parked_after is not None and time.monotonic() - start > parked_after + 2:
                    break
                time.sleep(0.1)
        stop.set()
        w.join()
        deadline = time.monotonic() + 30
        while count_rows(pg_dsn, table) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert count_rows(pg_dsn, table) == 0
        assert relay.state.value == "running"
        with psycopg.connect(pg_dsn) as conn:
            dead = {d.id: (d.error, d.attempts) for d in list_dead_letters(conn, table)}
        assert set(dead) == {stuck_id}, dead
        assert parked_after is not None
        if sequenced:
            assert "held up other rows for limits.rowTimeout" in dead[stuck_id][0], dead
            assert parked_after < ROW_TIMEOUT + MARGIN, f"parked after {parked_after:.1f}s"
            check_exactly_once(kafka_bootstrap, good_topic, 2, exp)
        else:
            assert dead[stuck_id][1] == 2, dead
            assert parked_after < 2 * ROW_TIMEOUT + MARGIN, f"parked after {parked_after:.1f}s"
            want = {v for vs in exp.by_key.values() for v in vs}
            got = consume_all(kafka_bootstrap, good_topic, lambda g: {x.value for x in g} >= want, 30)
            assert {x.value for x in got} >= want
        # the bound: no good row waited longer than rowTimeout (+ the view change) in the outbox
        assert held < ROW_TIMEOUT + MARGIN, f"a good row was held up {held:.1f}s (rowTimeout {ROW_TIMEOUT:g}s)"
        print(
            f"\n{'sequenced' if sequenced else 'at-least-once'}: good rows held up at most {held:.2f}s; "
            f"stuck row parked after {parked_after:.2f}s (rowTimeout {ROW_TIMEOUT:g}s)"
        )
    finally:
        stop.set()
        w.join()
        relay.stop()
        relay.wait(30)
