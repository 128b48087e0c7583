"""``--uuid-sequencing`` against real Postgres + Kafka, in process: exactly once and in per-key order
(checked by sequencing the whole topic read-uncommitted), user data untouched, injected faults,
no head-of-line blocking behind a stalled producer span."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Producer
from relaylib import relay_config
from seqcheck import Expected, check_exactly_once, count_rows, read_intents, wait_for, write_traffic

from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.kafka import FaultInjector
from harvest_outbox.producer.relay.events import LeaderRefreshed, ViewStarted
from harvest_outbox.producer.relay.sequenced.mode import SequencedMode
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.sequencer import Publisher

pytestmark = pytest.mark.integration


def _cfg(pg_dsn: str, bootstrap: str, table: str, group: str, **limits: object):  # type: ignore[no-untyped-def]
    base = dict(mark_query_records=300, txn_max_records=100, txn_max_duration=0.02, producer_ring=4)
    return relay_config(pg_dsn, bootstrap, table, group, **{**base, **limits}).replace(uuid_sequencing=True)


def _drain(relay: Harvest, pg_dsn: str, table: str, timeout: float = 60) -> None:
    wait_for(lambda: count_rows(pg_dsn, table) == 0, timeout, "outbox drained")
    wait_for(lambda: not read_intents(pg_dsn, table), timeout, "ACK intents confirmed")


def _all_exactly_once(bootstrap: str, topic: str, partitions: int, exp: Expected):  # type: ignore[no-untyped-def]
    """The topic holds every committed row exactly once, in per-key order, and nothing else."""
    res = check_exactly_once(bootstrap, topic, partitions, exp)
    assert res.committed == exp.total and res.continues == exp.total
    return res


def _consume_headers(bootstrap: str, topic: str, partitions: int) -> list[tuple[bytes, bytes, list]]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
    out = []
    try:
        for p in range(partitions):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if hi <= lo:
                continue
            c.assign([TopicPartition(topic, p, lo)])
            n = 0
            while n < hi - lo:
                for m in c.consume(1000, 1.0):
                    if not m.error():
                        out.append((m.key(), m.value(), list(m.headers() or [])))
                        n += 1
    finally:
        c.close()
    return out


@pytest.mark.parametrize("election", ["neli", "postgres"])
def test_happy_path_concurrent_writers(
    election: str,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic = topic_factory(partitions=4)
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    exp = Expected()
    events: list[object] = []
    cfg = _cfg(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(leader_election=election)
    relay = Harvest(cfg, events.append)
    assert isinstance(relay.mode, SequencedMode)
    relay.start()
    try:
        writers = [
            threading.Thread(target=write_traffic, args=(pg_dsn, table, topic, exp, w, 40), kwargs=dict(pause=0.005))
            for w in range(4)
        ]
        for t in writers:
            t.start()
        for t in writers:
            t.join()
        _drain(relay, pg_dsn, table)
    finally:
        relay.stop()
        relay.wait(30)
    res = _all_exactly_once(kafka_bootstrap, topic, 4, exp)
    assert res.acks > 0
    views = [e for e in events if isinstance(e, ViewStarted)]
    assert len(views) == 1 and views[0].epoch >= 1 and not any(isinstance(e, LeaderRefreshed) for e in events)
    # key, value and user headers untouched; the uuid header comes first
    got = _consume_headers(kafka_bootstrap, topic, 4)
    assert len(got) == res.continues + res.acks
    for key, value, headers in got:
        assert headers[0][0] == "uuid" and len(headers[0][1]) == 16
        if value == b"":  # an ACK_TXN
            assert key == b"" and len(headers) == 1
            continue
        assert key.decode().startswith(value.decode().split("-")[0] + "-k")
        assert headers[1:] == exp.headers[value], (key, value, headers)
    print(f"\n{exp.total} rows, {len(exp.rolled_back)} rolled back, {res.acks} ACKs")


def test_injected_produce_and_delivery_failures(
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic = topic_factory(partitions=4)
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    exp = Expected()
    faults = FaultInjector(produce_failure_rate=0.02, delivery_failure_rate=0.02, seed=7)
    events: list[object] = []
    cfg = _cfg(pg_dsn, kafka_bootstrap, table, unique_name("g"), txn_max_records=20, max_delivery_attempts=8)
    relay = Harvest(cfg, events.append, producer_factory=faults).start()
    try:
        writers = [
            threading.Thread(
                target=write_traffic, args=(pg_dsn, table, topic, exp, w, 25), kwargs=dict(seed=3, pause=0.01)
            )
            for w in range(3)
        ]
        for t in writers:
            t.start()
        for t in writers:
            t.join()
        _drain(relay, pg_dsn, table, 120)
    finally:
        relay.stop()
        relay.wait(30)
    res = check_exactly_once(kafka_bootstrap, topic, 4, exp)
    views = [e for e in events if isinstance(e, ViewStarted)]
    print(
        f"\n{exp.total} rows exactly once; injected {faults.counters}; {len(views)} views; "
        f"{res.continues - exp.total} abandoned CONTINUEs in the log"
    )
    assert faults.counters["produce"] > 0 and faults.counters["delivery"] > 0
    assert len(views) > 5 and relay.metrics.dead_lettered == 0


def test_no_head_of_line_blocking_behind_stalled_span(
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    """A producer span that is never acknowledged sits at the head of the partition; every committed
    relay message behind it is still readable (Kafka's last stable offset would block them)."""
    from sequenced_log import read_raw, reference_read

    topic = topic_factory(partitions=1)
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    stalled = Publisher()
    raw_producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for i in range(5):
        raw_producer.produce(
            topic,
            f"stalled-{i}".encode(),
            b"stalled",
            partition=0,
            headers=[("uuid", stalled.publish_uncommitted(f"{topic}/0").bytes)],
        )
    assert raw_producer.flush(10) == 0
    exp = Expected()
    relay = Harvest(_cfg(pg_dsn, kafka_bootstrap, table, unique_name("g"))).start()
    try:
        write_traffic(pg_dsn, table, topic, exp, 0, 20, rollback_rate=0.0)
        _drain(relay, pg_dsn, table)
        # a second stalled span in the middle of the relay's traffic
        for i in range(5, 8):
            raw_producer.produce(
                topic,
                f"stalled-{i}".encode(),
                b"stalled",
                partition=0,
                headers=[("uuid", stalled.publish_uncommitted(f"{topic}/0").bytes)],
            )
        assert raw_producer.flush(10) == 0
        write_traffic(pg_dsn, table, topic, exp, 1, 20, rollback_rate=0.0)
        _drain(relay, pg_dsn, table)
    finally:
        relay.stop()
        relay.wait(30)
    raw = read_raw(kafka_bootstrap, topic, 1)
    stalled_offsets = [r.offset for r in raw if r.key and r.key.startswith(b"stalled")]
    committed = reference_read(raw, topic)
    assert all(off not in stalled_offsets for _p, off, _a in committed)  # the stalled span never commits
    behind = [off for _p, off, _a in committed if off > min(stalled_offsets)]
    assert len(behind) == exp.total  # every relay message sits behind the open span, and is readable
    check_exactly_once(kafka_bootstrap, topic, 1, exp)


def test_trickle_through_a_full_ring_waits_and_commits_in_groups(
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows trickling in while every ring slot holds a transaction waiting for its commit: the relay
    waits for a commit (or a report) instead of spinning (it once busy-looped a core at 500 rows/s),
    and transactions delivered while a commit runs are committed together in the next one, exactly
    once, in order."""
    from harvest_outbox.producer.layouts.mark.database import MarkDatabase

    topic = topic_factory(partitions=4)
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    exp = Expected()
    batches: list[int] = []
    real_commit = MarkDatabase.commit_txns

    def slow_commit(self: MarkDatabase, epoch: int, leader_id: object, txns: list) -> None:
        batches.append(len(txns))
        time.sleep(0.03)  # a slow database: the ring fills while this commit runs
        real_commit(self, epoch, leader_id, txns)  # type: ignore[arg-type]

    monkeypatch.setattr(MarkDatabase, "commit_txns", slow_commit)
    # Three slots: a committing transaction keeps its slot until its commit returns, so with two
    # only one other transaction could be delivered while a commit runs, and a group commit then
    # needed two deliveries to land between two looks of the relay (CI once saw none in 150 rows).
    cfg = _cfg(pg_dsn, kafka_bootstrap, table, unique_name("g"), producer_ring=3, txn_max_duration=0.001)
    relay = Harvest(cfg)
    assert isinstance(relay.mode, SequencedMode)
    ring_full_ticks = {"n": 0, "waited": 0}
    mode = relay.mode
    tick, await_progress = mode.tick, relay.core.await_progress
    state = {"in_full_tick": False}

    def counting_tick() -> None:
        state["in_full_tick"] = mode._view is not None and bool(mode._ready) and mode._ring_full()
        ring_full_ticks["n"] += state["in_full_tick"]
        tick()

    awaited: list[tuple[bool, int]] = []

    def counting_wait(producer: object, reports_awaited: bool = True) -> None:
        ring_full_ticks["waited"] += state["in_full_tick"]
        awaited.append((reports_awaited, mode._in_flight_count()))
        await_progress(producer, reports_awaited)  # type: ignore[arg-type]

    mode.tick = counting_tick  # type: ignore[method-assign]
    relay.core.await_progress = counting_wait  # type: ignore[method-assign]
    relay.start()
    try:
        write_traffic(pg_dsn, table, topic, exp, 0, 150, pause=0.004)
        _drain(relay, pg_dsn, table)
    finally:
        relay.stop()
        relay.wait(30)
    _all_exactly_once(kafka_bootstrap, topic, 4, exp)
    assert max(batches) >= 2, batches  # delivered transactions waited for the running commit, then went together
    assert ring_full_ticks["n"] > 0  # the scenario happened...
    assert ring_full_ticks["waited"] >= 0.8 * ring_full_ticks["n"], ring_full_ticks  # ...and the relay waited in it
    # the waits hurry for reports (0.2 ms slices) exactly while a row's record awaits one; with only ACKs out
    # (their reports move no transaction) they take 1 ms slices
    assert all(hurry == (pending > 0) for hurry, pending in awaited), awaited[:20]
    assert any(not hurry for hurry, _ in awaited) and any(hurry for hurry, _ in awaited)
    print(
        f"\n{exp.total} rows in {len(batches)} commits (largest {max(batches)} transactions); "
        f"ring-full ticks {ring_full_ticks}"
    )


def test_a_trickle_makes_a_transaction_per_delivery_round_trip_not_per_row(
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    """Once the backlog is taken, the open transaction closes at its first delivery report: rows
    marked while its first records are on their way join it, later rows go to the next. Deliveries
    take >= 25 ms here (``linger.ms``) and a row arrives every ~4 ms, so transactions hold several
    rows each, yet none stays open until its age limit (1 s here) while rows keep coming; no
    transaction closes before a report of it unless a limit closed it; every row exactly once."""
    topic = topic_factory(partitions=4)
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    exp = Expected()
    cfg = _cfg(pg_dsn, kafka_bootstrap, table, unique_name("g"), txn_max_duration=1.0)
    cfg = cfg.replace(producer_kafka_config={**cfg.producer_kafka_config, "linger.ms": 25})
    relay = Harvest(cfg)
    mode = relay.mode
    assert isinstance(mode, SequencedMode)
    closes: list[tuple[int, float, int, int]] = []  # (records in flight, age, records, size limit)
    close = mode._close

    def recording_close(t) -> None:  # type: ignore[no-untyped-def]
        closes.append((t.pending, time.monotonic() - t.opened, len(t.ids), mode.txn_limit))
        close(t)

    mode._close = recording_close  # type: ignore[method-assign]
    relay.start()
    try:
        write_traffic(pg_dsn, table, topic, exp, 0, 150, max_batch=1, rollback_rate=0.0, pause=0.004)
        _drain(relay, pg_dsn, table)
    finally:
        relay.stop()
        relay.wait(30)
    _all_exactly_once(kafka_bootstrap, topic, 4, exp)
    rows_per_txn = [n for _, _, n, _ in closes if n]
    assert sum(rows_per_txn) == exp.total
    assert len(rows_per_txn) <= exp.total / 2, rows_per_txn  # a transaction per round trip, not per row
    assert all(age < 0.5 for _, age, _, _ in closes), closes
    assert all(pending < n or not pending for pending, _, n, _ in closes), closes
    print(f"\n{exp.total} rows in {len(rows_per_txn)} transactions (largest {max(rows_per_txn)})")
