"""Discovery on a real Postgres: schemas by glob, other databases of the server by glob, names quoted
as ``outboxTable`` takes them, only what the role may use, and a server that does not answer reported
as a :class:`DiscoveryError` naming the entry without its password (producer/fleet/discovery.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
import yaml
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from harvest_outbox.producer.fleet.discovery import DiscoveryError, discover, quoted
from harvest_outbox.producer.fleet.spec import Discovery

pytestmark = pytest.mark.integration


def _entry(dsn: str, schemas: str, databases: tuple[str, ...] = ()) -> Discovery:
    return Discovery("discover[0]", dsn, schemas, "outbox", databases, {})


@pytest.mark.parametrize(
    ("name", "as_table"), [("tenant_a", "tenant_a"), ("Tenant A", '"Tenant A"'), ('x"y', '"x""y"')]
)
def test_quoted_names_are_what_outbox_table_takes(name: str, as_table: str) -> None:
    assert quoted(name) == as_table


def test_discovery_finds_matching_schemas_in_every_matching_database(
    pg_dsn: str, unique_name: Callable[[str], str]
) -> None:
    prefix, db2 = unique_name("d"), unique_name("discdb")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db2)))
    dsn2 = make_conninfo(pg_dsn, dbname=db2)
    role = unique_name("r")
    try:
        for dsn, schemas in ((pg_dsn, [f"{prefix}_a", f"{prefix}_B c", f"{prefix}_noout"]), (dsn2, [f"{prefix}_z"])):
            with psycopg.connect(dsn, autocommit=True) as conn:
                for schema in schemas:
                    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
                    if not schema.endswith("noout"):
                        conn.execute(sql.SQL("CREATE TABLE {}.outbox (id bigint)").format(sql.Identifier(schema)))
        db1 = conninfo_to_dict(pg_dsn)["dbname"]
        assert discover(_entry(pg_dsn, f"{prefix}_*")) == [
            (pg_dsn, f'"{prefix}_B c".outbox'),
            (pg_dsn, f"{prefix}_a.outbox"),
        ]
        both = discover(_entry(pg_dsn, f"{prefix}_*", (str(db1), "discdb*")))
        assert [(conninfo_to_dict(dsn)["dbname"], table) for dsn, table in both] == sorted(
            [(db1, f'"{prefix}_B c".outbox'), (db1, f"{prefix}_a.outbox"), (db2, f"{prefix}_z.outbox")]
        )
        # a role without USAGE on a schema does not find it
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'pw'").format(sql.Identifier(role)))
            conn.execute(
                sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(f"{prefix}_a"), sql.Identifier(role))
            )
        as_role = make_conninfo(pg_dsn, user=role, password="pw")
        assert [t for _d, t in discover(_entry(as_role, f"{prefix}_*"))] == [f"{prefix}_a.outbox"]
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db2)))
            for schema in (f"{prefix}_a", f"{prefix}_B c", f"{prefix}_noout"):
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def test_a_server_that_does_not_answer_is_a_discovery_error_without_the_password(pg_dsn: str) -> None:
    dead = make_conninfo(pg_dsn, port="1", password="s3cret")
    with pytest.raises(DiscoveryError) as err:
        discover(_entry(dead, "*"))
    text = str(err.value)
    assert text.startswith("discover[0]: cannot look for outboxes on") and "keep running" in text
    assert "s3cret" not in text


def test_harvest_check_on_a_fleet_file_checks_every_outbox_listed_and_found(
    pg_dsn: str, pg_schema: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harvest_outbox.producer.ops.cli import main
    from harvest_outbox.producer.schema.ddl import init_db

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for schema in (f"{pg_schema}_t1", f"{pg_schema}_t2"):
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        init_db(pg_dsn, f"{pg_schema}_t1.outbox")
        init_db(pg_dsn, f"{pg_schema}.outbox")
        with psycopg.connect(pg_dsn, autocommit=True) as conn:  # found by discovery, but harvest's tables are missing
            conn.execute(sql.SQL("CREATE TABLE {}.outbox (id bigint)").format(sql.Identifier(f"{pg_schema}_t2")))
        path = tmp_path / "fleet.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "harvest": {"dataSource": pg_dsn},
                    "outboxes": [{"id": "listed", "outboxTable": f"{pg_schema}.outbox"}],
                    "discover": [{"schemas": f"{pg_schema}_t*"}],
                }
            )
        )
        code = main(["check", "-f", str(path)])
        out = capsys.readouterr().out
        db = conninfo_to_dict(pg_dsn)["dbname"]
        assert {line.split(": ", 1)[0] for line in out.splitlines()[:-1]} == {
            "listed",
            f"{db}/{pg_schema}_t1.outbox",
            f"{db}/{pg_schema}_t2.outbox",
        }
        assert out.splitlines()[-1].startswith("3 outbox(es): ")
        assert code == 1 and f"{db}/{pg_schema}_t2.outbox: FAIL" in out
        assert not any(
            line.startswith(("listed: FAIL", f"{db}/{pg_schema}_t1.outbox: FAIL")) for line in out.splitlines()
        )
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for schema in (f"{pg_schema}_t1", f"{pg_schema}_t2"):
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
