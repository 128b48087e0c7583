"""``harvest check``'s privileges finding (producer/ops/_privileges.py) on real Postgres, for roles set up as
docs/security.md says (tests/test_producer/schema/grantlib.py): the relay's own role is OK; a missing grant is a
FAIL naming the GRANT, which fixes it; TRUNCATE or CREATE on the schema beyond the relay's needs, the owner's
role and a superuser are WARNs, the REVOKE printed taking it back; the cursor layout's relay must own the
outbox's partitions; and the command itself, run as the relay's role, reads all it checks, or names what the
role lacks when refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest
from grantlib import Roles, granted_outbox, login_roles
from psycopg import sql

from harvest_outbox.producer.config import HarvestConfig
from harvest_outbox.producer.ops._privileges import check_outbox_and_role, check_privileges
from harvest_outbox.producer.ops.cli import main
from harvest_outbox.producer.schema.ddl import init_db

pytestmark = pytest.mark.integration


@pytest.fixture
def roles(pg_dsn: str, pg_schema: str, unique_name: Callable[[str], str]) -> Iterator[Roles]:
    with login_roles(pg_dsn, unique_name("r")) as made:
        yield made


def _privileges(dsn: str, table: str, layout: str) -> list[tuple[str, str, str]]:
    """``harvest check``'s privileges findings for the role of ``dsn``: (level, message, fix)."""
    config = HarvestConfig(data_source=dsn, outbox_table=table, outbox_layout=layout)
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [(f.level, f.message, f.fix) for f in check_privileges(conn, config)]


def _run(pg_dsn: str, statements: str) -> None:
    """The statements of a finding's fix (``; ``-separated, as printed), run as the superuser."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(statements.split(" (or `harvest")[0])


def test_check_fails_naming_the_missing_grant_and_warns_of_more_than_needed(
    pg_dsn: str, pg_schema: str, roles: Roles
) -> None:
    table = f"{pg_schema}.outbox"
    names = granted_outbox(pg_dsn, roles, table)
    relay, role = roles.dsn("relay"), roles.names.relay
    [(level, message, _)] = _privileges(relay, table, "mark")
    assert level == "OK" and message.startswith(f"role {role} has what the relay needs (mark layout"), message

    # less than it needs: a FAIL naming the GRANT, which fixes it
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("REVOKE DELETE, UPDATE ON {} FROM {}").format(names.dead_letters, sql.Identifier(role)))
    [(level, message, fix)] = _privileges(relay, table, "mark")
    dead = names.dead_letters.as_string(None)
    assert (level, message) == ("FAIL", f"role {role} lacks what the relay needs: UPDATE, DELETE on {dead}")
    assert fix.startswith(f'GRANT UPDATE, DELETE ON TABLE {dead} TO "{role}" (or `harvest init-db --print-grants`')
    _run(pg_dsn, fix)
    assert _privileges(relay, table, "mark")[0][0] == "OK"

    # more than it needs: a WARN naming each, with the REVOKE that takes it back
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("GRANT TRUNCATE ON {} TO {}").format(names.delivery_attempts, sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT CREATE ON SCHEMA {} TO {}").format(sql.Identifier(pg_schema), sql.Identifier(role)))
    [(level, message, fix)] = _privileges(relay, table, "mark")
    assert level == "WARN" and f'CREATE on schema "{pg_schema}"' in message and "TRUNCATE on " in message, message
    _run(pg_dsn, fix)
    assert _privileges(relay, table, "mark")[0][0] == "OK"

    # the owner owns what the relay only reads and writes; a superuser may do anything
    [(level, message, _)] = _privileges(roles.dsn("owner"), table, "mark")
    assert level == "WARN" and f"owns {names.outbox.as_string(None)} (it could DROP or ALTER it)" in message
    [(level, message, _)] = _privileges(pg_dsn, table, "mark")
    assert level == "WARN" and "a superuser" in message


def test_check_wants_the_cursor_layouts_relay_to_own_the_outbox(pg_dsn: str, pg_schema: str, roles: Roles) -> None:
    table = f"{pg_schema}.outbox"
    names = granted_outbox(pg_dsn, roles, table, layout="cursor", sequenced=True)
    relay = roles.dsn("relay")
    assert [f[0] for f in _privileges(relay, table, "cursor")] == ["OK"]
    config = HarvestConfig(data_source=relay, outbox_table=table, outbox_layout="cursor", uuid_sequencing=True)
    with psycopg.connect(relay, autocommit=True) as conn:  # the whole of `harvest check`, as the relay's role
        found = check_outbox_and_role(conn, config.replace(dead_letter_policy="haltKey"))
    assert [f.line() for f in found if f.level == "FAIL"] == [] and found[-1].subject == "privileges", found
    # the owner, a member of the relay's role, may run init-db again (an upgrade) on the outbox the relay owns
    init_db(roles.dsn("owner"), table, layout="cursor", partition_ids=100)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # a partition made by someone else
        conn.execute(
            sql.SQL("ALTER TABLE {} OWNER TO {}").format(
                names.qualified("outbox_p0"), sql.Identifier(roles.names.owner)
            )
        )
    [(level, message, fix)] = _privileges(relay, table, "cursor")
    assert level == "FAIL" and "the ownership of the partitions of " in message, message
    _run(pg_dsn, fix)
    assert [f[0] for f in _privileges(relay, table, "cursor")] == ["OK"]


def test_init_db_as_the_owner_and_check_as_the_relay_role_read_everything_and_name_what_it_lacks(
    pg_dsn: str, pg_schema: str, roles: Roles, capsys: pytest.CaptureFixture[str]
) -> None:
    table = f"{pg_schema}.outbox"
    names = granted_outbox(pg_dsn, roles, table)
    # `harvest init-db` as the owner, again (idempotent): the schema exists, so it needs no CREATE on the database
    assert main(["init-db", "--outbox-table", table, "--data-source", roles.dsn("owner")]) == 0
    assert "ready" in capsys.readouterr().out
    check = ["check", "--outbox-table", table, "--data-source", roles.dsn("relay")]
    assert main(check) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2].startswith("OK   privileges: role ") and lines[-1].endswith(" WARN, 0 FAIL"), lines
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("REVOKE SELECT ON {} FROM {}").format(names.dead_letters, sql.Identifier(roles.names.relay))
        )
    assert main(check) == 1
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert lines[0].startswith("FAIL table: reading the outbox") and "permission denied" in lines[0], lines
    assert lines[1].startswith(f"FAIL privileges: role {roles.names.relay} lacks what the relay needs: SELECT on "), (
        lines
    )
    assert f"fix: GRANT SELECT ON TABLE {names.dead_letters.as_string(None)} TO " in lines[1], lines
    assert roles.dsn("relay").split("password=")[1].split()[0] not in out.out + out.err
