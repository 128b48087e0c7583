"""PostgresCheckpointStore against a real Postgres (the invariants in
``consumer/pg_store.py``): save/load run in the caller's transaction and never
commit; a rollback discards a save; consumer names are isolated; rows are per
journal, so saves of some journals leave the others alone and ``load`` can
select journals; identifiers always go through ``sql.Identifier``; failures
raise ``CheckpointStoreError`` naming what failed."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from harvest_outbox.consumer import CheckpointStoreError, ConfigError, PostgresCheckpointStore
from harvest_outbox.sequencer import ProducerState, decode_checkpoint, encode_checkpoint

pytestmark = pytest.mark.integration

PID = bytes.fromhex("0102030405ff")
CP = encode_checkpoint({"t/0": 10, "t/1": 5}, [ProducerState("t/0", PID, 160, 3), ProducerState("t/1", PID, 320, -1)])


def test_save_is_in_the_callers_transaction(pg_dsn: str, pg_schema: str) -> None:
    store = PostgresCheckpointStore("billing", schema=pg_schema)
    with psycopg.connect(pg_dsn) as conn, psycopg.connect(pg_dsn, autocommit=True) as spy:
        store.create_table(conn)
        conn.commit()
        store.save(conn, CP)
        # Visible inside the transaction, invisible outside until the caller commits.
        assert decode_checkpoint(store.load(conn)) == decode_checkpoint(CP)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert store.load(spy) is None
        conn.commit()
        assert decode_checkpoint(store.load(spy)) == decode_checkpoint(CP)


def test_rollback_discards_the_save(pg_dsn: str, pg_schema: str) -> None:
    store = PostgresCheckpointStore("billing", schema=pg_schema)
    newer = encode_checkpoint({"t/0": 99}, [ProducerState("t/0", PID, 999, -1)])
    with psycopg.connect(pg_dsn) as conn:
        store.create_table(conn)
        store.save(conn, CP)
        conn.commit()
        with conn.transaction(force_rollback=True):
            store.save(conn, newer)
            assert decode_checkpoint(store.load(conn))[0]["t/0"] == 99
        assert decode_checkpoint(store.load(conn)) == decode_checkpoint(CP)
        conn.rollback()
        store.save(conn, newer)
        conn.rollback()
        assert decode_checkpoint(store.load(conn)) == decode_checkpoint(CP)


def test_consumer_names_are_isolated(pg_dsn: str, pg_schema: str) -> None:
    a = PostgresCheckpointStore("a", schema=pg_schema)
    b = PostgresCheckpointStore("b", schema=pg_schema)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        a.create_table(conn)
        a.save(conn, CP)
        assert b.load(conn) is None
        b.save(conn, encode_checkpoint({"t/0": 1}, []))
        assert decode_checkpoint(a.load(conn)) == decode_checkpoint(CP)
        b.delete(conn)
        assert b.load(conn) is None
        assert decode_checkpoint(a.load(conn)) == decode_checkpoint(CP)


def test_per_journal_rows_and_selection(pg_dsn: str, pg_schema: str) -> None:
    store = PostgresCheckpointStore("g", schema=pg_schema)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        store.create_table(conn)
        store.save(conn, CP)
        # A group member saving only t/1 leaves t/0's row alone.
        store.save(conn, encode_checkpoint({"t/1": 9}, []))
        offsets, states = decode_checkpoint(store.load(conn))
        assert offsets == {"t/0": 10, "t/1": 9} and states == [ProducerState("t/0", PID, 160, 3)]
        assert decode_checkpoint(store.load(conn, ["t/0"])) == ({"t/0": 10}, [ProducerState("t/0", PID, 160, 3)])
        assert decode_checkpoint(store.load(conn, ["t/1", "t/7"])) == ({"t/1": 9}, [])
        assert store.load(conn, ["t/7"]) is None
        assert store.load(conn, []) is None
        store.save(conn, encode_checkpoint({}, []))  # nothing to save: no rows touched
        assert decode_checkpoint(store.load(conn))[0] == {"t/0": 10, "t/1": 9}


@pytest.mark.parametrize("table", ['odd "name"; DROP TABLE victim; --', "MixedCase", "with space"])
def test_table_names_are_identifiers(pg_dsn: str, pg_schema: str, table: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (x int)").format(sql.Identifier(pg_schema, "victim")))
        store = PostgresCheckpointStore("n", table=table, schema=pg_schema)
        store.create_table(conn)
        store.save(conn, CP)
        assert decode_checkpoint(store.load(conn)) == decode_checkpoint(CP)
        names = {
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (pg_schema,)
            )
        }
        assert names == {"victim", table}  # the name is taken literally; nothing was injected


def test_errors_are_clear(pg_dsn: str, pg_schema: str) -> None:
    with pytest.raises(ConfigError, match="name"):
        PostgresCheckpointStore("")
    with pytest.raises(ConfigError, match="table"):
        PostgresCheckpointStore("x", table="")
    store = PostgresCheckpointStore("billing", schema=pg_schema)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        # No table yet: the error names the operation and the reader.
        with pytest.raises(CheckpointStoreError, match=r"cannot load the checkpoint \('billing'\).*UndefinedTable"):
            store.load(conn)
        with pytest.raises(CheckpointStoreError, match="cannot save the checkpoint"):
            store.save(conn, CP)
        store.create_table(conn)
        with pytest.raises(CheckpointStoreError, match="refusing to save an invalid checkpoint"):
            store.save(conn, b"not msgpack")
        conn.execute(
            sql.SQL("INSERT INTO {} (name, journal, checkpoint) VALUES ('billing', 't/0', 'junk')").format(
                sql.Identifier(pg_schema, "harvest_consumer_checkpoints")
            )
        )
        with pytest.raises(CheckpointStoreError, match="journal 't/0' is corrupt"):
            store.load(conn)
