"""Exactly-once effects end to end: effects and checkpoint in one Postgres
transaction; the consumer is killed with SIGKILL at random points and
restarted; the table ends equal to applying every committed record once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from cons_testlib import Gen, produce, reference
from psycopg import sql

from harvest_outbox.consumer import CheckpointStoreError, PostgresCheckpointStore
from harvest_outbox.sequencer import ProducerState, decode_checkpoint, encode_checkpoint

pytestmark = pytest.mark.integration

WORKER = Path(__file__).with_name("eo_worker.py")


def test_store_round_trip_in_callers_transaction(pg_dsn: str, pg_schema: str) -> None:
    store = PostgresCheckpointStore("billing", schema=pg_schema)
    other = PostgresCheckpointStore("other", schema=pg_schema)
    pid = bytes.fromhex("0102030405ff")
    cp = encode_checkpoint(
        {"t/0": 10, "t/1": 5}, [ProducerState("t/0", pid, 160, 3), ProducerState("t/1", pid, 320, -1)]
    )
    with psycopg.connect(pg_dsn) as conn:
        store.create_table(conn)
        conn.commit()
        assert store.load(conn) is None
        # Rolled back with the caller's transaction.
        with conn.transaction():
            store.save(conn, cp)
            assert decode_checkpoint(store.load(conn)) == decode_checkpoint(cp)
        with conn.transaction(force_rollback=True):
            other.save(conn, cp)
        assert other.load(conn) is None
        assert decode_checkpoint(store.load(conn)) == decode_checkpoint(cp)
        # Per-journal rows: saving t/1 alone leaves t/0 alone; load can select journals.
        store.save(conn, encode_checkpoint({"t/1": 9}, []))
        offsets, states = decode_checkpoint(store.load(conn))
        assert offsets == {"t/0": 10, "t/1": 9} and states == [ProducerState("t/0", pid, 160, 3)]
        assert decode_checkpoint(store.load(conn, ["t/0"]))[0] == {"t/0": 10}
        with pytest.raises(CheckpointStoreError, match="invalid checkpoint"):
            store.save(conn, b"nope")
        store.delete(conn)
        assert store.load(conn) is None
    assert '"' in repr(store)


@pytest.mark.slow
def test_kill9_restart_applies_each_committed_record_once(pg_dsn, pg_schema, kafka_bootstrap, topic_factory) -> None:
    topic = topic_factory(partitions=2)
    recs = Gen(21, partitions=2).records(2500)
    offsets = produce(kafka_bootstrap, topic, recs)
    want = sorted(
        (f"{topic}/{p}", o, v) for p, o, v in reference(topic, recs, offsets, 16) if not v.startswith((b"ack", b"rb"))
    )
    name = "eo-" + pg_schema
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (journal text, kafka_offset bigint, value bytea)").format(
                sql.Identifier(pg_schema, "applied")
            )
        )
        PostgresCheckpointStore(name, schema=pg_schema).create_table(conn)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]),
    }
    args = [sys.executable, str(WORKER), pg_dsn, pg_schema, kafka_bootstrap, topic, name, str(len(want))]
    rnd = random.Random(7)
    count_q = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(pg_schema, "applied"))
    kills = 0
    progress = []
    with psycopg.connect(pg_dsn, autocommit=True) as watch:
        for i in range(5):
            # Kill once the table has grown by a random amount, plus a random few ms:
            # lands at random points of the apply/commit loop whatever the machine's speed.
            target = watch.execute(count_q).fetchone()[0] + rnd.randint(20, len(want) // 8)
            proc = subprocess.Popen([*args, str(i)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            deadline = time.monotonic() + 30
            while proc.poll() is None and time.monotonic() < deadline:
                if watch.execute(count_q).fetchone()[0] >= target:
                    break
                time.sleep(0.01)
            time.sleep(rnd.uniform(0, 0.05))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            proc.wait(30)
            progress.append(watch.execute(count_q).fetchone()[0])
    final = subprocess.run([*args, "99"], env=env, capture_output=True, timeout=120)
    assert final.returncode == 0, final.stderr.decode()[-3000:]
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT journal, kafka_offset, value FROM {}").format(sql.Identifier(pg_schema, "applied"))
        ).fetchall()
    got = sorted((j, o, bytes(v)) for j, o, v in rows)
    assert kills == 5, progress
    # The kills landed mid-stream: progress was made between them, and not all of it.
    mid = [n for n in progress if 0 < n < len(want)]
    assert len(set(mid)) >= 4, (progress, len(want))
    assert len(got) == len(set(got)), "a record was applied twice"
    assert got == want
