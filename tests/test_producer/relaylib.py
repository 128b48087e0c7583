"""Helpers shared by the producer tests: config builders, consuming a topic, waiting for drains."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition
from psycopg import sql

from harvest_outbox.producer.config import HarvestConfig, Limits
from harvest_outbox.producer.fleet.spec import FleetFile, fleet_from_document
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

# Short timings so failover tests finish quickly; 2 s heartbeat -> 6 s session timeout (broker minimum).
FAST_LIMITS = dict(
    heartbeat_timeout=2.0,
    min_poll_interval=0.1,
    min_metrics_interval=0.5,
    queue_timeout=5.0,
    io_error_backoff=0.1,
    idle_poll_interval=0.5,
)


def relay_config(pg_dsn: str, bootstrap: str, table: str, group: str, **limits: object) -> HarvestConfig:
    return HarvestConfig(
        data_source=pg_dsn,
        outbox_table=table,
        base_kafka_config={"bootstrap.servers": bootstrap},
        producer_kafka_config={"linger.ms": 5, "topic.metadata.propagation.max.ms": 2000},
        leader_group_id=group,
        limits=Limits(**{**FAST_LIMITS, **limits}),
    )  # type: ignore[arg-type]


def fault_config(
    pg_dsn: str, bootstrap: str, table: str, group: str, sequenced: bool, layout: str = "mark"
) -> HarvestConfig:
    """A relay for the fault tests: small marks and harvest transactions (many commits to interrupt),
    Postgres leader election checked every 0.2 s, ``sequenced`` (``--uuid-sequencing``) or not."""
    limits = dict(mark_query_records=200, txn_max_records=100, txn_max_duration=0.02, producer_ring=4)
    return (
        relay_config(pg_dsn, bootstrap, table, group, **limits)
        .replace(uuid_sequencing=sequenced, leader_election="postgres", leader_lock_check_interval=0.2)
        .replace(outbox_layout=layout)
    )


def outbox_backlog(dsn: str, names: OutboxNames, layout: str) -> int:
    """Committed rows the relay has not passed yet: the cursor layout's (its cursor's), the mark layout's
    (rows left in the outbox)."""
    from harvest_outbox.producer.layouts.cursor.database import cursor_backlog

    with psycopg.connect(dsn, autocommit=True) as conn:
        if layout == "cursor":
            return cursor_backlog(conn, names)
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(names.outbox)).fetchone()
        return int(row[0]) if row else 0


@dataclass(frozen=True)
class Got:
    key: str
    value: bytes | None
    headers: list[tuple[str, bytes]]
    partition: int
    offset: int


def consume_all(bootstrap: str, topic: str, until: Callable[[list[Got]], bool], timeout: float = 60.0) -> list[Got]:
    """Read ``topic`` from the beginning until ``until(records)`` holds or ``timeout`` passes."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    md = c.list_topics(topic, timeout=10)
    c.assign([TopicPartition(topic, p, 0) for p in md.topics[topic].partitions])
    out: list[Got] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not until(out):
            for m in c.consume(1000, 0.2):
                if m.error():
                    continue
                out.append(Got(m.key().decode(), m.value(), list(m.headers() or []), m.partition(), m.offset()))
    finally:
        c.close()
    return out


def covers(expected: Mapping[str, Sequence[bytes | None]]) -> Callable[[list[Got]], bool]:
    """``consume_all``'s stop rule for an at-least-once read: every expected (key, value) has arrived.
    Counting records would stop early: a re-sent prefix counts twice, so ``len(got) >= total`` can hold
    while the last values are still on their way."""
    want = {(k, v) for k, vs in expected.items() for v in vs}
    return lambda got: want <= {(g.key, g.value) for g in got}


def outbox_count(pg_dsn: str, table: str) -> int:
    schema, name = table.split(".")
    with psycopg.connect(pg_dsn) as conn:
        return conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, name))).fetchone()[0]


def wait_drained(pg_dsn: str, table: str, timeout: float = 60.0) -> float:
    start = time.monotonic()
    while outbox_count(pg_dsn, table) > 0:
        if time.monotonic() - start > timeout:
            raise AssertionError(f"outbox {table} not drained in {timeout}s ({outbox_count(pg_dsn, table)} left)")
        time.sleep(0.1)
    return time.monotonic() - start


def assert_per_key_order(got: list[Got], expected: dict[str, list[bytes | None]], allow_dups: bool) -> None:
    """Every expected value arrived; per key, first arrivals are in stash order; no strangers."""
    by_key: dict[str, list[bytes | None]] = {}
    for g in sorted(got, key=lambda g: (g.partition, g.offset)):
        by_key.setdefault(g.key, []).append(g.value)
    assert set(by_key) == set(expected), (
        f"keys differ: missing {set(expected) - set(by_key)}, unexpected {sorted(set(by_key) - set(expected))[:5]}"
    )
    for key, want in expected.items():
        seen = by_key[key]
        if not allow_dups:
            assert seen == want, f"key {key}: {seen[:5]} != {want[:5]}"
            continue
        # With duplicates, the log must still reach each value only after all earlier ones:
        # a re-sent record restarts from its position, so a prefix may repeat.
        pos = 0
        for v in seen:
            if pos < len(want) and v == want[pos]:
                pos += 1
            else:
                assert v in want[:pos], f"key {key}: {v!r} arrived out of order (at position {pos})"
        assert pos == len(want), f"key {key}: only {pos}/{len(want)} values arrived in order"


class BackgroundWriter:
    """Stashes transactions of 10 rows (keys k0..k19 in turn) into ``table`` every 20 ms until
    stopped; ``expected`` holds each key's values in commit order (the per-key order to check)."""

    def __init__(self, pg_dsn: str, table: str, topic: str) -> None:
        self.pg_dsn, self.table, self.topic = pg_dsn, table, topic
        self.expected: dict[str, list[bytes | None]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="background-writer")

    def _run(self) -> None:
        st, seq = Stasher(self.table), 0
        with psycopg.connect(self.pg_dsn) as conn:
            while not self._stop.is_set():
                batch = [OutboxRecord(self.topic, f"k{(seq + i) % 20}", f"v{seq + i}") for i in range(10)]
                with conn.transaction():
                    st.stash_many(conn, batch)
                for r in batch:
                    self.expected.setdefault(r.key, []).append(r.value.encode())  # type: ignore[union-attr]
                seq += 10
                time.sleep(0.02)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.expected.values())


def postgres_fleet(
    pg_dsn: str, bootstrap: str, name: str, outboxes: list[dict[str, Any]], options: dict[str, Any] | None = None
) -> FleetFile:
    """A fleet file of ``outboxes`` (entries of its ``outboxes:`` list) on one database and Kafka, elected by
    Postgres locks, with the ``fleet:`` section ``options`` and nothing else set."""
    document: dict[str, Any] = {
        "harvest": {
            "dataSource": pg_dsn,
            "name": name,
            "leaderElection": "postgres",
            "baseKafkaConfig": {"bootstrap.servers": bootstrap},
        },
        "outboxes": outboxes,
        **({"fleet": options} if options else {}),
    }
    return fleet_from_document(document, {}, None, {}, {})
