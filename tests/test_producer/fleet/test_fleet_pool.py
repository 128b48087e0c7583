"""A fleet's led outboxes share one pool of statement connections per database (producer/db/statement_pool.py):
a fleet of 8 outboxes on one database (one of them in the cursor layout) relays every committed row, in both
modes (exactly once with ``uuidSequencing``), while Postgres never shows the fleet holding more backends than
``fleet.statementConnections`` plus its three shared sessions (election, layout, LISTEN), against 16
statement connections without the pool; every pooled connection is killed (``pg_terminate_backend``) while
writers commit and roll back, and the pool replaces them with nothing lost or doubled."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from seqcheck import Expected, check_exactly_once, read_intents, wait_for
from sequenced_log import read_raw

from harvest_outbox.producer.db import shared_listener
from harvest_outbox.producer.fleet.spec import fleet_from_document
from harvest_outbox.producer.fleet.supervisor import Fleet
from harvest_outbox.producer.layouts.choice import layout_for
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

pytestmark = pytest.mark.integration

OUTBOXES = 8
POOL = 3
PARTITIONS = 2


def _layout(i: int) -> str:
    return "cursor" if i == 0 else "mark"


@pytest.mark.parametrize("sequenced", [False, True], ids=["at-least-once", "sequenced"])
def test_a_fleet_relays_every_row_on_a_bounded_pool_whose_killed_connections_are_replaced(
    sequenced: bool,
    pg_dsn: str,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shared_listener, "LINGER", 0.5)  # still over the fleet's start; the stop's wait shorter
    topic = topic_factory(partitions=PARTITIONS)
    prefix, name = unique_name("fp"), unique_name("pool")
    app = f"own-{name}"[:63]  # the dataSource's application_name: any connection of the relays' own shows it
    shared = [f"harvest-{role}:{name}" for role in ("election", "layout", "listen")]
    pooled = f"harvest-statements:{name}"
    tables = [f"{prefix}_{i}.outbox" for i in range(OUTBOXES)]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for t in tables:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(t.split(".")[0])))
    for i, t in enumerate(tables):
        init_db(pg_dsn, t, layout=_layout(i))
    doc: dict[str, Any] = {
        "harvest": {
            "baseKafkaConfig": {"bootstrap.servers": kafka_bootstrap},
            "producerKafkaConfig": {"linger.ms": 5},
            "dataSource": make_conninfo(pg_dsn, application_name=app),
            "name": name,
            "uuidSequencing": sequenced,
            "leaderElection": "postgres",
            "leaderLockCheckInterval": "300ms",
            "limits": {
                "minPollInterval": "100ms",
                "idlePollInterval": "300ms",
                "ioErrorBackoff": "100ms",
                "markQueryRecords": 100,
                **({"txnMaxRecords": 50, "txnMaxDuration": "20ms"} if sequenced else {}),
            },
        },
        "outboxes": [{"id": f"o{i}", "outboxTable": t, "outboxLayout": _layout(i)} for i, t in enumerate(tables)],
        "fleet": {"statementConnections": POOL, "restartBackoff": "200ms"},
    }
    fleet = Fleet(fleet_from_document(doc, {}, None, {}, {}))

    def backends() -> dict[str, list[int]]:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT application_name, pid FROM pg_stat_activity WHERE application_name = ANY(%s)",
                ([app, pooled, *shared],),
            ).fetchall()
        out: dict[str, list[int]] = {}
        for a, pid in rows:
            out.setdefault(a, []).append(pid)
        return out

    most: dict[str, Any] = {"all": 0, "pooled": 0, "seen": {}}
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            seen = backends()
            if sum(len(v) for v in seen.values()) > most["all"]:
                most["all"] = sum(len(v) for v in seen.values())
                most["seen"] = {a.split(":")[0]: len(v) for a, v in seen.items()}
            most["pooled"] = max(most["pooled"], len(seen.get(pooled, [])))
            sampling.wait(0.05)

    exp = Expected()
    stop_writing = threading.Event()

    def writer() -> None:
        rnd, seq = random.Random(7), 0
        with psycopg.connect(pg_dsn) as conn:
            while not stop_writing.is_set():
                for t in tables:
                    batch = []
                    for _ in range(rnd.randint(1, 6)):
                        batch.append(OutboxRecord(topic, f"{t}-k{rnd.randrange(3)}", f"{t}-{seq}", []))
                        seq += 1
                    rollback = rnd.random() < 0.2
                    try:
                        with conn.transaction():
                            Stasher(t).stash_many(conn, batch)
                            if rollback:
                                raise KeyError("rollback")
                    except KeyError:
                        exp.rolled_back.update(str(r.value).encode() for r in batch)
                        continue
                    for r in batch:
                        exp.by_key.setdefault(str(r.key), []).append(str(r.value).encode())
                time.sleep(0.01)

    def led() -> bool:
        return all(s.relay is not None and getattr(s.relay, "is_leader", False) for s in fleet.statuses())

    def drained() -> bool:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            backlog = sum(layout_for(_layout(i)).backlog(conn, OutboxNames.parse(t)) for i, t in enumerate(tables))
        return backlog == 0 and not any(read_intents(pg_dsn, t) for t in tables)

    sampler = threading.Thread(target=sample)
    writing = threading.Thread(target=writer)
    try:
        sampler.start()
        fleet.start()
        took = {"led": wait_for(led, 60, f"all {OUTBOXES} outboxes led")}
        writing.start()
        time.sleep(1.5)
        # every statement connection of the fleet killed mid-run (an idle one is found dead before it is
        # lent; a busy one fails its statement: the relay's ordinary error path, back-off and re-mark)
        killed = backends().get(pooled, [])
        assert killed, "no pooled connection to kill: the outboxes do not use the pool"
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (killed,))
        time.sleep(1.5)
        stop_writing.set()
        writing.join()
        took["drain"] = wait_for(drained, 60, "every outbox drained")
        after = backends().get(pooled, [])
        assert after and not set(after) & set(killed), (killed, after)  # replaced
        pool = fleet.statement_pools.for_dsn(doc["harvest"]["dataSource"])
        assert pool is not None
        stats = pool.stats()
        assert stats.opened > len(killed) and stats.open <= POOL, stats
    finally:
        stop_writing.set()
        if writing.is_alive():
            writing.join()
        fleet.stop()
        fleet.wait(60)
        sampling.set()
        sampler.join()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for t in tables:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(t.split(".")[0])))
    # the pool's bound plus the three shared sessions, never a connection of an outbox's own
    assert most["pooled"] <= POOL and most["all"] <= POOL + len(shared), most
    assert most["pooled"] >= 2, most  # the workers did borrow more than one at a time
    wait_for(lambda: not backends(), 10, "the stopped fleet's connections closed (LISTEN's after its linger)")
    if sequenced:
        res = check_exactly_once(kafka_bootstrap, topic, PARTITIONS, exp)
        assert res.acks > 0
    else:  # at least once: every committed row, nothing rolled back
        got = {r.value for r in read_raw(kafka_bootstrap, topic, PARTITIONS)}
        committed = {v for vs in exp.by_key.values() for v in vs}
        assert committed <= got, f"lost {len(committed - got)} row(s), e.g. {sorted(committed - got)[:3]}"
        assert not got & exp.rolled_back
    print(
        f"\npool: {exp.total} rows over {OUTBOXES} outboxes, at most {most['pooled']} pooled and {most['seen']} "
        f"{most['all']} backends in all; {stats}; " + ", ".join(f"{k}: {v:.1f}s" for k, v in took.items())
    )
