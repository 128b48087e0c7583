"""``--uuid-sequencing`` crash points and a zombie, with real relay processes (the ``harvest`` CLI).

Each crash test: relay A (with ``HARVEST_TEST_CRASH_AT=<point>:3``) kills itself with SIGKILL at the
named point of its third harvest transaction; relay B (same leader group) takes over after the
session timeout and drains. The whole topic, sequenced read-uncommitted, must hold every committed
row exactly once in per-key order; and B's recovered ACK intents must precede B's own records in
every partition (recovery first).

The zombie test runs with both leader elections (``leaderElection: neli | postgres``): there the
election is part of what is tested — A's paused process keeps its Postgres session (and the lock),
so the test ends that session (``pg_terminate_backend``) while A is paused: B leads while A still
believes it does, and the fence epoch refuses A's commit when it resumes. The crash points run once
each, the elections alternating (two points each): what a crash point leaves (published or delivered
records, a committed transaction with its ACK intent, some ACKs sent) and B's recovery of it are read
from Postgres's fence and intent rows and the topic, whichever election made B the leader; that B
takes over from a kill -9 under either election is proven by ``test_failover.py``,
``test_election_postgres.py`` and ``test_sharded_failover.py``, and every crash point with every kind
of takeover by the model test (``test_protocol_model.py``). The full cross product ran 8 cases,
~4 x 11 s more."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from seqcheck import (
    Expected,
    SeqRelay,
    check_exactly_once,
    count_rows,
    read_intents,
    recovered_before_new_view,
    seq_yaml,
    wait_for,
    write_traffic,
)

from harvest_outbox.producer.election.postgres import lock_holder
from harvest_outbox.producer.schema.ddl import init_db

pytestmark = pytest.mark.integration

PARTITIONS = 4


def _preload(
    pg_dsn: str, table: str, topic: str, exp: Expected, writers: int = 3, txs: int = 40, seed: int = 0
) -> None:
    threads = [
        threading.Thread(target=write_traffic, args=(pg_dsn, table, topic, exp, w, txs), kwargs=dict(seed=seed))
        for w in range(writers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.mark.parametrize(
    ("election", "point"),
    [
        ("neli", "after_publish_before_delivery"),
        ("postgres", "after_delivery_before_commit"),
        ("neli", "after_commit_before_ack"),
        ("postgres", "after_some_acks"),
    ],
)
def test_crash_point(
    election: str,
    point: str,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    tmp_path: Path,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    cfg = seq_yaml(
        tmp_path / "harvest.yaml", pg_dsn, kafka_bootstrap, table, unique_name("g"), leader_election=election
    )
    exp = Expected()
    _preload(pg_dsn, table, topic, exp)
    a = SeqRelay(cfg, "a", tmp_path, crash_at=f"{point}:3")
    b: SeqRelay | None = None
    try:
        assert a.proc.wait(60) == -signal.SIGKILL, a.text()[-3000:]
        assert f"SIGKILL at {point} #3" in a.text()
        assert count_rows(pg_dsn, table) > 0  # the crash left work for B
        intents = read_intents(pg_dsn, table)
        if point in ("after_commit_before_ack", "after_some_acks"):
            assert intents, "the crash should leave committed, unacknowledged intents"
        # more traffic arrives while nobody leads
        more = threading.Thread(target=write_traffic, args=(pg_dsn, table, topic, exp, 7, 20))
        more.start()
        b = SeqRelay(cfg, "b", tmp_path)
        more.join()
        wait_for(lambda: count_rows(pg_dsn, table) == 0 and not read_intents(pg_dsn, table), 60, "B drains")
        assert b.stop() == 0
        views = b.views()
        assert views and views[0][2] == len(intents), (views, len(intents))
        res = check_exactly_once(kafka_bootstrap, topic, PARTITIONS, exp)
        assert recovered_before_new_view(res.raw, intents, b.producers()) == len(intents)
        print(
            f"\n{point}: {exp.total} rows exactly once; {len(intents)} intents recovered; "
            f"{res.continues - exp.total} abandoned CONTINUEs in the log"
        )
    finally:
        for r in (a, b):
            if r is not None:
                r.stop()


@pytest.mark.parametrize("election", ["neli", "postgres"])
def test_zombie_commit_refused_by_fence(
    election: str,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    tmp_path: Path,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    cfg = seq_yaml(
        tmp_path / "harvest.yaml", pg_dsn, kafka_bootstrap, table, unique_name("g"), leader_election=election
    )
    exp = Expected()
    _preload(pg_dsn, table, topic, exp, seed=1)
    # A stops itself (SIGSTOP) with harvest transaction 3 delivered but not committed.
    a = SeqRelay(cfg, "a", tmp_path, pause_at="after_delivery_before_commit:3")
    b: SeqRelay | None = None
    try:
        wait_for(lambda: "SIGSTOP at after_delivery_before_commit #3" in a.text(), 60, "A pauses")
        if election == "postgres":
            # A paused process keeps its session, hence the lock: end it (as a network partition seen
            # by the server, or a DBA, would) while A is still paused — the window the fence covers.
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                pid = lock_holder(conn, table)
                assert pid is not None
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        b = SeqRelay(cfg, "b", tmp_path)
        wait_for(lambda: bool(b.views()), 60, "B takes over")  # past A's session timeout
        more = threading.Thread(target=write_traffic, args=(pg_dsn, table, topic, exp, 7, 20))
        more.start()
        wait_for(lambda: count_rows(pg_dsn, table) == 0, 60, "B drains")
        a.proc.send_signal(signal.SIGCONT)  # the zombie wakes up and tries to commit transaction 3
        # The zombie cannot commit: either the fence refuses it, or (if it froze inside a commit
        # transaction, holding the fence row lock) Postgres already ended its idle-in-transaction
        # session, so the commit fails on the dead connection. Either way nothing of A's commits.
        wait_for(
            lambda: "commit refused by the fence" in a.text() or "not committed: commit on" in a.text(),
            30,
            "A's commit refused",
        )
        more.join()
        wait_for(lambda: count_rows(pg_dsn, table) == 0 and not read_intents(pg_dsn, table), 60, "drained")
        assert a.stop() == 0 and b.stop() == 0
        assert b.views()[0][0] > a.views()[0][0]
        check_exactly_once(kafka_bootstrap, topic, PARTITIONS, exp)  # asserts every row once, in order
        print(
            f"\nzombie: {exp.total} rows exactly once; A views {[v[0] for v in a.views()]}, "
            f"B views {[v[0] for v in b.views()]}"
        )
    finally:
        for r in (a, b):
            if r is not None:
                r.stop()
