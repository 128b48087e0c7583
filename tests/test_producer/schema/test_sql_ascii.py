"""An outbox in a SQL_ASCII database is refused at every entry point, with the fix (issue #38, item 1).

The relay reads with client_encoding UTF8 (producer/db/__init__.py ``connect``), and Postgres checks a
SQL_ASCII database's text against UTF-8 on the way out: one row with a byte that is not UTF-8 failed
every mark, so no row was delivered, not even the ones committed before it. The scenario the issue
reports: 10 good rows, then one with a ``\\377`` byte in its key. Every command that touches the outbox
refuses the database, names it, its encoding and the fix, and deletes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from relaylib import relay_config

from harvest_outbox.harvest_local.relays import write_config
from harvest_outbox.producer.election.postgres import election_connection, resolve_table
from harvest_outbox.producer.errors import SchemaError
from harvest_outbox.producer.ops.cli import main
from harvest_outbox.producer.relay.sharded import relay_for
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db, outbox_ddl, shard_ddl

REFUSAL = r"database '{db}' has encoding SQL_ASCII.*ENCODING 'UTF8' TEMPLATE template0"


@pytest.fixture
def sql_ascii_dsn(pg_dsn: str, unique_name: Callable[[str], str]) -> Iterator[tuple[str, str]]:
    """A SQL_ASCII database whose outbox (initialised for shards 1 and 2, as an older harvest would
    have) holds 10 good rows, then one with a ``\\377`` byte in its key; (dsn, database name)."""
    dbname = unique_name("ascii").lower()
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0").format(
                sql.Identifier(dbname)
            )
        )
    dsn = make_conninfo(pg_dsn, dbname=dbname)
    try:
        names = OutboxNames.parse("outbox")
        with psycopg.connect(dsn, autocommit=True) as conn:
            for stmt in outbox_ddl(names) + shard_ddl(names, 2):
                conn.execute(stmt)
            ins = sql.SQL(
                "INSERT INTO {} (kafka_topic, kafka_key, kafka_value, kafka_header_keys, "
                "kafka_header_values) VALUES ('t', {}, 'v', '{{}}', '{{}}')"
            ).format
            for i in range(10):
                conn.execute(ins(names.outbox, sql.Literal(f"k{i}")))
            conn.execute(ins(names.outbox, sql.SQL(r"E'bad\377key'")))
        yield dsn, dbname
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))


def _rows(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return int(conn.execute("SELECT count(*) FROM outbox").fetchone()[0])  # type: ignore[index]


@pytest.mark.integration
@pytest.mark.parametrize(
    "shards, sequenced, election", [(1, False, "neli"), (1, True, "postgres"), (2, False, "postgres")]
)
def test_a_relay_refuses_to_start_on_a_sql_ascii_database(
    sql_ascii_dsn: tuple[str, str],
    kafka_bootstrap: str,
    unique_name: Callable[[str], str],
    shards: int,
    sequenced: bool,
    election: str,
) -> None:
    dsn, dbname = sql_ascii_dsn
    cfg = relay_config(dsn, kafka_bootstrap, "outbox", unique_name("g")).replace(
        shards=shards, uuid_sequencing=sequenced, leader_election=election
    )
    relay = relay_for(cfg)
    try:
        with pytest.raises(SchemaError, match=REFUSAL.format(db=dbname)):
            relay.start()
    finally:
        relay.stop()
        relay.wait(30)
    assert _rows(dsn) == 11  # nothing delivered, nothing dead-lettered


@pytest.mark.integration
@pytest.mark.parametrize(
    "command", [["init-db"], ["dead-letters", "list"], ["dead-letters", "requeue", "--all"], ["shards"]], ids=" ".join
)
def test_every_command_refuses_a_sql_ascii_database(
    sql_ascii_dsn: tuple[str, str],
    kafka_bootstrap: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
) -> None:
    dsn, dbname = sql_ascii_dsn
    cfg = write_config(
        tmp_path / "h.yaml",
        dsn=dsn,
        bootstrap=kafka_bootstrap,
        outbox_table="outbox",
        leader_election="postgres",
        shards=2,
    )
    assert main([*command, "-f", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("harvest: error: "), err
    assert len(err.strip().splitlines()) == 1, err
    assert re.search(REFUSAL.format(db=dbname), err), err
    assert _rows(dsn) == 11


@pytest.mark.integration
def test_init_db_refuses_a_sql_ascii_database(sql_ascii_dsn: tuple[str, str]) -> None:
    dsn, dbname = sql_ascii_dsn
    with pytest.raises(SchemaError, match=REFUSAL.format(db=dbname)):
        init_db(dsn, "outbox")
    with psycopg.connect(dsn) as conn, pytest.raises(SchemaError, match=REFUSAL.format(db=dbname)):
        init_db(conn, "other")


@pytest.mark.integration
@pytest.mark.parametrize("encoding", ["UTF8", "LATIN1"])
def test_other_encodings_are_accepted(pg_dsn: str, unique_name: Callable[[str], str], encoding: str) -> None:
    """LATIN1 and the like convert to UTF-8 cleanly: only SQL_ASCII is refused."""
    dbname = unique_name("enc").lower()
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} ENCODING {} LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0").format(
                sql.Identifier(dbname), sql.Literal(encoding)
            )
        )
    try:
        assert init_db(make_conninfo(pg_dsn, dbname=dbname), "outbox").display == "outbox"
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))


@pytest.mark.integration
def test_the_election_names_the_outbox_as_text_in_a_sql_ascii_database(sql_ascii_dsn: tuple[str, str]) -> None:
    """The election connection read the schema name as bytes there (its client encoding was the
    database's): logs said ``b'public'.outbox`` and the lock keys differed from `harvest shards`'."""
    dsn, _ = sql_ascii_dsn
    conn = election_connection(dsn, "n", 1.0, 3.0, 5.0, 5.0)
    try:
        assert resolve_table(conn, "outbox") == "public.outbox"
    finally:
        conn.close()
