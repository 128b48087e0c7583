"""Switching a live outbox from Debezium to harvest and back, as docs/debezium.md says (issue #31 item 4).

A writer commits events all along, one per transaction, first deleting each row in the transaction
that inserted it (the pattern Debezium users often have), later keeping them. Both tools route into
the same topic (the same router options). The switch to harvest: ``init-db`` while the connector runs,
the writer stops deleting, harvest starts, and once the connector's slot has confirmed an LSN taken
after the writer stopped deleting, the connector and its slot go. The switch back: the connector
starts (a new slot), harvest drains the rows written before the slot existed and stops, the writer
deletes again. The union of both tools' records holds every committed event, and after dedupe by the
``id`` header each one exactly once; no rolled-back event appears.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql

from harvest_outbox.harvest_local.debezium import DebeziumOutbox, OutboxConnector
from harvest_outbox.harvest_local.kafka import create_topic, read_to_end
from harvest_outbox.producer.config import HarvestConfig, Limits
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.mapping.table import table_mapping
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db

pytestmark = pytest.mark.integration


class Writer(threading.Thread):
    """One event per transaction; ``delete_after`` deletes the row in the transaction that inserted it;
    every 10th transaction rolls back."""

    def __init__(self, dsn: str, table: sql.Composable, aggregate: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.table, self.aggregate = dsn, table, aggregate
        self.delete_after = True
        self.committed: list[str] = []
        self.rolled_back: list[str] = []
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn) as conn:
                i = 0
                while not self.stop_event.is_set():
                    eid = uuid.uuid4()
                    rollback = i % 10 == 9
                    with conn.transaction() as tx:
                        conn.execute(
                            sql.SQL(
                                "INSERT INTO {} (id, aggregatetype, aggregateid, type, payload) "
                                "VALUES (%s, %s, %s, 'Happened', %s)"
                            ).format(self.table),
                            (eid, self.aggregate, f"a-{i % 5}", f'{{"i": {i}}}'),
                        )
                        if self.delete_after:
                            conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(self.table), (eid,))
                        if rollback:
                            raise psycopg.Rollback(tx)
                    (self.rolled_back if rollback else self.committed).append(str(eid))
                    i += 1
                    time.sleep(0.004)
        except BaseException as exc:  # reported by the test
            self.error = exc


def _slot_confirmed(dsn: str, slot: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
    return int(row[0]) if row and row[0] is not None else -1


def _lsn(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def _wait(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _ids(bootstrap: str, topic: str) -> list[str]:
    """The ``id`` header of every record of ``topic``."""
    return [eid.decode() for r in read_to_end(bootstrap, [topic]) if (eid := dict(r.headers).get("id")) is not None]


def test_switching_from_debezium_to_harvest_and_back_loses_no_event(
    logical_pg_dsn: str, kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    schema, aggregate = unique_name("mig"), unique_name("Evt")
    options = {"route.topic.replacement": "mig.${routedByValue}"}
    topic = f"mig.{aggregate}"
    create_topic(kafka_bootstrap, topic, 2)
    table = f"{schema}.outbox"
    mapping = table_mapping("debezium", options)
    names = OutboxNames.parse(table, mapping)
    with psycopg.connect(logical_pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, "
                "aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb)"
            ).format(names.outbox)
        )
    first = OutboxConnector(f"{schema}_a", table, options)
    worker = DebeziumOutbox(logical_pg_dsn, kafka_bootstrap, connectors=[first]).start()
    writer = Writer(logical_pg_dsn, names.outbox, aggregate)
    relay: Harvest | None = None
    cfg = HarvestConfig(
        data_source=logical_pg_dsn,
        outbox_table=table,
        table_mapping=mapping,
        base_kafka_config={"bootstrap.servers": kafka_bootstrap},
        leader_election="postgres",
        leader_lock_check_interval=0.2,
        name=f"{schema}-relay",
        limits=Limits(min_metrics_interval=0.5, idle_poll_interval=0.5),
    )
    try:
        writer.start()
        _wait("Debezium's first events", lambda: len(writer.committed) > 50)
        # Debezium -> harvest
        init_db(logical_pg_dsn, table, mapping=mapping)  # 1. the relay's columns, connector running
        time.sleep(0.3)
        writer.delete_after = False  # 2. the writers keep their rows
        time.sleep(0.3)
        stopped_deleting = _lsn(logical_pg_dsn)
        marks: dict[str, int] = {}
        relay = Harvest(cfg).start()  # 3. harvest publishes too
        marks["harvest"] = len(writer.committed)
        _wait(
            "the slot to confirm past the last delete",
            lambda: _slot_confirmed(logical_pg_dsn, first.slot_name) >= stopped_deleting,
        )  # 4. then the connector and its slot go
        worker.remove(first.name, drop_replication=True)
        during = marks["gone"] = len(writer.committed)
        _wait("harvest alone for a while", lambda: len(writer.committed) > during + 100)
        # harvest -> Debezium
        second = OutboxConnector(f"{schema}_b", table, options)
        worker.add(second)  # its slot exists from here on
        marks["second"] = len(writer.committed)
        slot_made = _lsn(logical_pg_dsn)
        time.sleep(0.3)
        writer.delete_after = True  # the writers delete again
        marks["delete"] = len(writer.committed)
        time.sleep(0.3)

        def drained() -> bool:
            with psycopg.connect(logical_pg_dsn) as conn:
                row = conn.execute(
                    sql.SQL("SELECT count(*) FROM {} WHERE harvest_seq IS NOT NULL").format(names.outbox)
                ).fetchone()
            return row is not None and row[0] == 0

        _wait("harvest to drain the rows older than the slot", drained)
        relay.stop()
        relay = None
        after = marks["stopped"] = len(writer.committed)
        _wait("Debezium alone for a while", lambda: len(writer.committed) > after + 100)
        writer.stop_event.set()
        writer.join(10)
        assert writer.error is None, writer.error
        assert slot_made > stopped_deleting
        committed = set(writer.committed)
        # (A slot confirms no LSN past its last change without heartbeats: wait for the records.)
        try:
            _wait("Debezium to publish the last events", lambda: committed <= set(_ids(kafka_bootstrap, topic)), 60)
        except AssertionError:
            seen = set(_ids(kafka_bootstrap, topic))
            lost = [i for i, e in enumerate(writer.committed) if e not in seen]
            raise AssertionError(
                f"lost events at positions {lost[:10]}… ({len(lost)}); phases: harvest started "
                f"~{marks['harvest']}, connector gone {marks['gone']}, second connector "
                f"{marks['second']}, deleting again {marks['delete']}, harvest stopped "
                f"{marks['stopped']}, end {len(writer.committed)}"
            ) from None
    finally:
        writer.stop_event.set()
        if relay is not None:
            relay.stop()
        worker.destroy()
    got = _ids(kafka_bootstrap, topic)
    assert len(committed) > 300
    assert not set(got) & set(writer.rolled_back), "a rolled-back event was published"
    assert set(got) - committed == set(), "an event nobody committed"
    assert committed - set(got) == set(), f"{len(committed - set(got))} committed event(s) lost"
    duplicates = len(got) - len(set(got))
    print(f"\n{len(committed)} events, {len(got)} records, {duplicates} duplicates removed by id")
    with psycopg.connect(logical_pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
