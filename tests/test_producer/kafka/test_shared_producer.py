"""``producer/kafka/shared_producer.py``: one Kafka producer for a process's at-least-once relays. Each
invariant of the module is a test here on a scripted producer (pure logic: it reports what it was given when
polled); then three relays on a real Postgres and Kafka share one producer while failures are injected into
every lane, and a fleet gives its at-least-once outboxes one producer and its sequenced one its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from confluent_kafka import KafkaError, Producer
from relaylib import assert_per_key_order, consume_all, covers, postgres_fleet, relay_config, wait_drained

from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.producer.fleet.spec import fleet_from_document
from harvest_outbox.producer.fleet.supervisor import Fleet
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.kafka import FaultInjector
from harvest_outbox.producer.kafka.shared_producer import SHARED_QUEUE_MESSAGES, ProducerLane, SharedProducers
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

_DOC = {
    "harvest": {"dataSource": "postgres://relay@db1/app", "leaderElection": "postgres", "name": "relay"},
    "outboxes": [{"id": "a", "outboxTable": "a.outbox"}],
}


@pytest.mark.parametrize(("given", "shared"), [(None, False), (True, True), (False, False)])
def test_the_fleet_option(given: object, shared: bool) -> None:
    options = {} if given is None else {"sharedProducer": given}
    assert fleet_from_document({**_DOC, "fleet": options}).options.shared_producer is shared


@pytest.mark.parametrize("given", ["yes", "true", 1, 0, None, [True]])
def test_the_fleet_option_refused_with_the_fix(given: object) -> None:
    with pytest.raises(ConfigError) as info:
        fleet_from_document({**_DOC, "fleet": {"sharedProducer": given}})
    said = str(info.value)
    assert said.startswith("fleet.sharedProducer: ") and "must be true" in said and "or false" in said, said


class _Msg:
    def __init__(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        self._topic, self._key, self._value = topic, key, value

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value


class _Scripted:
    """A producer that holds each record until polled, then reports it delivered to its own callback."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.queued: list[tuple[_Msg, Callable[[KafkaError | None, Any], None]]] = []
        self.flushed: list[float] = []
        self.threads: set[str] = set()

    def produce(  # confluent-kafka's signature: the report's callback as `callback` or `on_delivery`
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        callback: Callable[[KafkaError | None, Any], None] | None = None,
        on_delivery: Callable[[KafkaError | None, Any], None] | None = None,
        **kw: Any,
    ) -> None:
        report = callback or on_delivery
        assert report is not None and not (callback and on_delivery)
        self.queued.append((_Msg(topic, key, value), report))

    def poll(self, timeout: float = 0) -> int:
        self.threads.add(threading.current_thread().name)
        served, self.queued = self.queued, []
        for msg, callback in served:
            callback(None, msg)
        return len(served)

    def flush(self, timeout: float = -1) -> int:
        self.flushed.append(timeout)
        return self.poll(0) and 0

    def __len__(self) -> int:
        return len(self.queued)


def _pool() -> tuple[SharedProducers, list[_Scripted]]:
    made: list[_Scripted] = []

    def make(config: dict[str, Any]) -> _Scripted:
        made.append(_Scripted(config))
        return made[-1]

    return SharedProducers("harvest-fleet", make), made


def _lane(pool: SharedProducers, got: list[tuple[str, bytes | None]], **config: Any) -> ProducerLane:
    def report(err: KafkaError | None, msg: Any) -> None:
        got.append((threading.current_thread().name, msg.value()))

    return pool.for_relay("x")({"bootstrap.servers": "k:9092", "client.id": "harvest-x", **config}, report)


def test_each_lane_sees_its_own_reports_on_its_own_thread_whoever_polled() -> None:
    pool, made = _pool()
    a_got: list[tuple[str, bytes | None]] = []
    b_got: list[tuple[str, bytes | None]] = []
    a, b = _lane(pool, a_got), _lane(pool, b_got)
    assert len(made) == 1
    a.produce("t", b"a1", b"k")
    b.produce("t", b"b1", b"k")  # the same key: the relays' in-flight maps must not meet
    a.produce("t", b"a2", b"j")
    # b's thread polls first: the shared producer serves both lanes' reports; b sees only its own
    thread = threading.Thread(target=lambda: b.poll(0), name="relay-b")
    thread.start()
    thread.join()
    assert b_got == [("relay-b", b"b1")] and a_got == [] and len(a) == 2 and len(b) == 0
    assert a.poll(0) == 2
    assert a_got == [("MainThread", b"a1"), ("MainThread", b"a2")] and len(a) == 0


def test_len_and_flush_count_the_lanes_own_records_only() -> None:
    pool, _made = _pool()
    got: list[tuple[str, bytes | None]] = []
    a, b = _lane(pool, got), _lane(pool, got)
    _on_thread("relay-b", lambda: b.poll(0))  # b's relay polls it on a thread of its own
    for i in range(3):
        a.produce("t", f"a{i}".encode(), b"k")
    b.produce("t", b"b", b"k")
    assert (len(a), len(b)) == (3, 1)
    assert a.flush(1.0) == 0 and len(a) == 0
    assert len(b) == 1  # served into b's queue, not yet to its relay
    _on_thread("relay-b", lambda: b.flush(0.5))
    assert len(b) == 0 and got == [
        ("MainThread", b"a0"),
        ("MainThread", b"a1"),
        ("MainThread", b"a2"),
        ("relay-b", b"b"),
    ]


def test_a_report_served_on_its_lanes_own_thread_goes_behind_those_queued_before_it() -> None:
    pool, _made = _pool()
    got: list[tuple[str, bytes | None]] = []
    a, b = _lane(pool, got), _lane(pool, [])
    a.produce("t", b"a1", b"k")
    _on_thread("relay-b", lambda: b.poll(0))  # serves a1 into a's queue
    a.produce("t", b"a2", b"j")
    assert a.poll(0) == 2 and [v for _t, v in got] == [b"a1", b"a2"] and len(a) == 0
    a.produce("t", b"a3", b"k")
    assert a.poll(0) == 1 and got[-1] == ("MainThread", b"a3") and not a._reports  # served at once


def _on_thread(name: str, work: Callable[[], object]) -> None:
    thread = threading.Thread(target=work, name=name)
    thread.start()
    thread.join()


def test_flush_returns_what_is_left_when_reports_do_not_come() -> None:
    pool, made = _pool()
    lane = _lane(pool, [])
    lane.produce("t", b"v", b"k")
    made[0].queued.clear()  # lost: never reported
    started = time.monotonic()
    assert lane.flush(0.05) == 1 and time.monotonic() - started < 1


def test_purge_takes_no_record_out_of_the_shared_producer() -> None:
    pool, made = _pool()
    got: list[tuple[str, bytes | None]] = []
    a, b = _lane(pool, []), _lane(pool, got)
    a.produce("t", b"a", b"k")
    b.produce("t", b"b", b"k")
    a.purge(in_queue=True, in_flight=False)
    assert len(made[0].queued) == 2
    b.poll(0)
    assert got == [("MainThread", b"b")]


def test_a_purged_lanes_late_reports_never_reach_its_relay_not_even_through_its_next_lane() -> None:
    """The relay abandons a drain: purge, then a new lane for its next view, polled on the same thread. The
    old records' reports (queued before the purge, or served after it on that thread) must not reach the
    relay: for its new view a late report of key k would free k, or purge a row, that was never delivered."""
    pool, _made = _pool()
    got: list[tuple[str, bytes | None]] = []
    old = _lane(pool, got)
    old.produce("t", b"old-1", b"k")
    _on_thread("another relay", lambda: _lane(pool, []).poll(0))  # queues old-1 in the old lane
    old.produce("t", b"old-2", b"k")
    old.purge(in_queue=True, in_flight=False)
    assert old.poll(0) == 0 and got == []  # what was queued is dropped, and old-2 served here reaches nobody
    old.produce("t", b"old-3", b"k")  # (a relay does not produce after a purge; were it to, still nobody)
    new = _lane(pool, got)
    new.produce("t", b"new-1", b"k")
    assert new.poll(0) == 1 and got == [("MainThread", b"new-1")] and len(new) == 0


def test_equal_settings_share_a_producer_and_others_get_their_own() -> None:
    pool, made = _pool()
    a = _lane(pool, [], **{"linger.ms": 1})
    relay_y = pool.for_relay("fleet/y")
    b = relay_y({"linger.ms": 1, "bootstrap.servers": "k:9092", "client.id": "harvest-fleet/y"}, lambda e, m: None)
    other_cluster = _lane(pool, [], **{"bootstrap.servers": "k2:9092"})
    other_setting = _lane(pool, [], **{"linger.ms": 5})
    assert a._real is b._real and len({id(a._real), id(other_cluster._real), id(other_setting._real)}) == 3
    assert len(pool) == 3 == len(made)
    assert {m.config["client.id"] for m in made} == {"harvest-fleet"}  # the process's, not a relay's
    assert {m.config["queue.buffering.max.messages"] for m in made} == {SHARED_QUEUE_MESSAGES}  # room for all
    own_queue = _lane(pool, [], **{"queue.buffering.max.messages": 5000})
    assert own_queue._real is made[-1] and made[-1].config["queue.buffering.max.messages"] == 5000  # yours wins
    # a client.id the user set (Kafka's quotas go by it) is the producer's: shared only with the same one
    quota = [
        pool.for_relay(n)({"bootstrap.servers": "k:9092", "client.id": "quota-a"}, lambda e, m: None) for n in "pq"
    ]
    assert quota[0]._real is quota[1]._real is made[-1] and made[-1].config["client.id"] == "quota-a"
    assert len(pool) == 5


@pytest.mark.parametrize("fatal", [True, False])
def test_a_fatal_error_reaches_every_lanes_relay_and_no_new_lane_uses_that_producer(fatal: bool) -> None:
    pool, made = _pool()
    told: list[str] = []
    lanes = [
        pool.factory({"bootstrap.servers": "k", "error_cb": lambda err, n=n: told.append(n)}, lambda e, m: None)
        for n in ("a", "b")
    ]
    err = KafkaError(KafkaError._FATAL, "broker refused a batch", fatal=fatal)
    made[0].config["error_cb"](err)
    later = pool.factory({"bootstrap.servers": "k"}, lambda e, m: None)
    if fatal:
        assert sorted(told) == ["a", "b"] and later._real is not lanes[0]._real and len(made) == 2
    else:
        assert told == [] and later._real is lanes[0]._real and len(made) == 1


def test_callbacks_by_position_are_refused_the_lane_routes_reports_itself() -> None:
    pool, _made = _pool()
    lane = _lane(pool, [])
    with pytest.raises(TypeError, match="by name"):
        lane.produce("t", b"v", b"k", -1, lambda e, m: None)
    lane.produce("t", b"v", b"k", 2, headers=[("h", b"1")])  # a partition by position is fine
    assert len(lane) == 1


def test_close_flushes_every_producer() -> None:
    pool, made = _pool()
    _lane(pool, [])
    _lane(pool, [], **{"bootstrap.servers": "other"})
    pool.close(2.0)
    assert [m.flushed for m in made] == [[2.0], [2.0]] and len(pool) == 0


def test_three_relays_share_one_producer_through_injected_failures_and_lose_nothing(
    pg_dsn: str,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    """The same keys in three outboxes, each relayed to a topic of its own through one producer, with
    produce and delivery failures injected into every lane (each a remark: a drain, a new lane): every row
    arrives, a key's first arrivals in id order, per outbox."""
    made: list[Any] = []

    def make(config: dict[str, Any]) -> Producer:
        made.append(Producer(config))
        return made[-1]

    pool = SharedProducers("harvest-test", make)
    relays, faults, plan = [], [], []
    for n in range(3):
        topic = topic_factory(partitions=3)
        table = f"{unique_name('shp')}.outbox"
        init_db(pg_dsn, table)
        expected: dict[str, list[bytes | None]] = {}
        records = []
        for i in range(600):
            key = f"k{i % 30}"
            records.append(OutboxRecord(topic, key, f"{n}-v{i}", []))
            expected.setdefault(key, []).append(f"{n}-v{i}".encode())
        with psycopg.connect(pg_dsn) as conn:
            Stasher(table).stash_many(conn, records)
        cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g"), max_delivery_attempts=1000)
        fault = FaultInjector(0.01, 0.01, seed=n, real_factory=pool.for_relay(cfg.name))
        faults.append(fault)
        plan.append((topic, table, expected))
        relays.append(Harvest(cfg, producer_factory=fault))
    for relay in relays:
        relay.start()
    try:
        for _topic, table, _expected in plan:
            wait_drained(pg_dsn, table, 120)
    finally:
        for relay in relays:
            relay.stop()
        for relay in relays:
            relay.wait(30)
        pool.close()
    for (topic, _table, expected), relay, fault in zip(plan, relays, faults, strict=True):
        got = consume_all(kafka_bootstrap, topic, covers(expected), 30)
        assert {g.value for g in got} == {v for vs in expected.values() for v in vs}
        assert_per_key_order(got, expected, allow_dups=True)
        assert fault.counters["produce"] + fault.counters["delivery"] > 0 and relay.metrics.remarks > 0
    assert len(made) == 1  # no fatal error: every lane of every view was on the one producer


def test_a_fleets_at_least_once_outboxes_share_a_producer_and_a_sequenced_one_keeps_its_own(
    pg_dsn: str, kafka_bootstrap: str, topic_factory: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    topic = topic_factory()
    schemas = [unique_name("shf") for _ in range(3)]
    for schema in schemas:
        init_db(pg_dsn, f"{schema}.outbox")
    outboxes: list[dict[str, Any]] = [{"id": s, "outboxTable": f"{s}.outbox"} for s in schemas]
    outboxes[2]["uuidSequencing"] = True
    file = postgres_fleet(pg_dsn, kafka_bootstrap, unique_name("fleet"), outboxes, {"sharedProducer": True})
    fleet = Fleet(file).start()
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for schema in schemas:
                Stasher(f"{schema}.outbox").stash_many(conn, [OutboxRecord(topic, schema, "v", [])])
        got = consume_all(kafka_bootstrap, topic, lambda got: set(schemas) <= {g.key for g in got})
        assert set(schemas) <= {g.key for g in got}  # (and the sequenced outbox's ACKs, keyed b"")
        producers = {s.id: s.relay.core.producer._real for s in fleet.statuses()}
        assert isinstance(producers[schemas[0]], ProducerLane) and isinstance(producers[schemas[1]], ProducerLane)
        assert producers[schemas[0]]._real is producers[schemas[1]]._real
        assert not isinstance(producers[schemas[2]], ProducerLane)  # sequenced: a producer of its own view
        assert len(fleet.producers) == 1
    finally:
        fleet.stop()
        assert fleet.wait(60)
    assert len(fleet.producers) == 0
