"""producer/schema/grants.py's decision, without a database: per layout, mode and shards, exactly which
privileges each component gets on which object, and how the statements quote what they name."""

from __future__ import annotations

from pathlib import Path

import pytest
from psycopg import sql

from harvest_outbox.consumer.pg_store import DEFAULT_TABLE
from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.producer.ops.cli import main
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.grants import (
    CHECKPOINT_TABLE,
    RoleNames,
    grant_statements,
    grants_script,
    needs,
)

CRUD = "SELECT, INSERT, UPDATE, DELETE"
MARK_OUTBOX = {"outbox": "SELECT, UPDATE, DELETE"}
COMMON = {
    "outbox_dead_letters": CRUD,
    "outbox_delivery_attempts": CRUD,
    "outbox_harvest_layout": "SELECT, INSERT, UPDATE",
}
SEQUENCED = {"outbox_harvest_state": "SELECT, UPDATE", "outbox_ack_intents": CRUD}
SHARDED = {"outbox_harvest_shards": "SELECT"}  # the relay checks its fence rows exist before it starts
SHARDED_SEQUENCED = {"outbox_harvest_shards": "SELECT, UPDATE", "outbox_ack_intents": CRUD}
CURSOR = {"outbox": "OWNER", "outbox_harvest_cursor": "SELECT, UPDATE", "outbox_held": "SELECT, INSERT, DELETE"}


def _relay(layout: str, sequenced: bool, shards: int) -> tuple[dict[str, str], str]:
    """The relay's table privileges (``OWNER``: it owns the table) and its schema privileges."""
    tables, schema = {}, ""
    for n in needs(OutboxNames.parse("app.outbox"), layout=layout, sequenced=sequenced, shards=shards):
        if n.component != "relay":
            continue
        if n.kind == "SCHEMA":
            schema = ", ".join(n.privileges)
        else:
            assert n.kind in ("TABLE", "OWNER") and n.target.as_string(None).startswith('"app".')
            tables[n.target.as_string(None).split(".")[1].strip('"')] = ", ".join(n.privileges) or "OWNER"
    return tables, schema


@pytest.mark.parametrize(
    ("layout", "sequenced", "shards", "tables", "schema"),
    [
        ("mark", False, 1, {**MARK_OUTBOX, **COMMON}, "USAGE"),
        ("mark", False, 4, {**MARK_OUTBOX, **COMMON, **SHARDED}, "USAGE"),
        ("mark", True, 1, {**MARK_OUTBOX, **COMMON, **SEQUENCED}, "USAGE"),
        ("mark", True, 4, {**MARK_OUTBOX, **COMMON, **SHARDED_SEQUENCED}, "USAGE"),
        ("cursor", False, 1, {**CURSOR, **COMMON}, "USAGE, CREATE"),
        ("cursor", True, 1, {**CURSOR, **COMMON, **SEQUENCED}, "USAGE, CREATE"),
        ("cursor", False, 2, {**CURSOR, **COMMON, **SHARDED}, "USAGE, CREATE"),
        ("cursor", True, 2, {**CURSOR, **COMMON, **SHARDED_SEQUENCED}, "USAGE, CREATE"),
    ],
)
def test_the_relay_gets_exactly_what_its_layout_mode_and_shards_use(
    layout: str, sequenced: bool, shards: int, tables: dict[str, str], schema: str
) -> None:
    assert _relay(layout, sequenced, shards) == (tables, schema)


@pytest.mark.parametrize("layout", ["mark", "cursor"])
def test_writers_insert_and_see_only_the_id_admins_move_dead_letters_readers_keep_checkpoints(layout: str) -> None:
    got = {
        (n.component, n.target.as_string(None), ", ".join(n.privileges), n.columns)
        for n in needs(OutboxNames.parse("outbox"), layout=layout)
        if n.component != "relay"
    }
    cursor = {
        ("owner", '"outbox"', "", ()),  # joins the relay's role: init-db, run again, alters the relay's outbox
        ("admin", '"outbox_harvest_cursor"', "SELECT", ()),
        ("admin", '"outbox_held"', "SELECT, INSERT", ()),
    }
    assert got == {
        ("owner", '"public"', "USAGE, CREATE", ()),
        ("writer", '"public"', "USAGE", ()),
        ("writer", '"outbox"', "INSERT", ()),
        ("writer", '"outbox"', "SELECT", ("id",)),
        ("writer", '"outbox_id_seq"', "USAGE", ()),
        ("admin", '"public"', "USAGE", ()),
        ("admin", '"outbox_dead_letters"', "SELECT, DELETE", ()),
        ("admin", '"outbox"', "SELECT, INSERT", ()),
        ("admin", '"outbox_id_seq"', "USAGE", ()),
        ("reader", '"public"', "USAGE", ()),
        ("reader", '"harvest_consumer_checkpoints"', CRUD, ()),
    } | (cursor if layout == "cursor" else set())


def test_the_statements_quote_every_name_and_the_hand_over_reads_them_as_literals() -> None:
    roles = RoleNames(relay='re"lay', writer="Writer's")
    names = OutboxNames.parse('"My App"."Out.box"')
    text = [s.as_string(None) for s in grant_statements(needs(names, layout="cursor", sequenced=True), roles)]
    assert 'GRANT INSERT ON TABLE "My App"."Out.box" TO "Writer\'s"' in text
    assert 'GRANT SELECT ("id") ON TABLE "My App"."Out.box" TO "Writer\'s"' in text
    assert 'ALTER TABLE "My App"."Out.box" OWNER TO "re""lay"' in text
    assert 'GRANT "re""lay" TO "harvest_owner"' in text
    hand_over = next(t for t in text if t.startswith("DO "))
    assert 'inhparent = \'"My App"."Out.box"\'::regclass' in hand_over
    assert "part, 're\"lay')" in hand_over
    script = grants_script(needs(names), roles)
    assert script.count(";\n") == len(grant_statements(needs(names), roles))
    assert '-- relay: re"lay' in script
    # a quoted table name may hold a line break: in a comment it would end the comment and run as SQL
    tricky = grants_script(needs(OutboxNames.parse('"out\nDROP TABLE x; --"')), RoleNames(), "outbox out\nDROP")
    assert tricky.splitlines()[0].endswith(": outbox out\\nDROP"), tricky  # escaped (in a statement it is quoted)


@pytest.mark.parametrize(
    ("roles", "message"),
    [
        ({"relay": ""}, "--relay-role: '' is not a role name; give 1-63 bytes"),
        ({"admin": "a" * 64}, "--admin-role: 'aaa"),
        ({"reader": "r\nDROP TABLE x"}, "--reader-role: .* is not a role name; give 1-63 bytes of printable text"),
        ({"writer": "x$harvest_grants$"}, r"--writer-role: .* contains \$harvest_grants\$"),
        ({"writer": "harvest_relay"}, "the roles must differ"),
    ],
)
def test_role_names_are_refused_naming_the_option_and_the_fix(roles: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RoleNames(**roles)


def test_the_defaults_and_the_readers_table_are_the_documented_ones() -> None:
    assert RoleNames() == RoleNames(
        "harvest_owner", "harvest_relay", "harvest_writer", "harvest_admin", "harvest_reader"
    )
    assert CHECKPOINT_TABLE == DEFAULT_TABLE
    custom = needs(OutboxNames.parse("outbox"), checkpoint_table="books.cp")
    assert [n.target for n in custom if n.component == "reader"] == [
        sql.Identifier("books"),
        sql.Identifier("books", "cp"),
    ]
    with pytest.raises(ConfigError, match="outboxLayout: 'marks' is not a layout"):
        needs(OutboxNames.parse("outbox"), layout="marks")


def test_init_db_print_grants_prints_the_decision_for_the_config_and_no_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "h.yaml"
    path.write_text(
        "harvest:\n  dataSource: host=127.0.0.1 port=1 user=relay password=hunter2secret\n"
        "  outboxTable: app.outbox\n  outboxLayout: cursor\n  uuidSequencing: true\n  shards: 2\n"
    )
    code = main(["init-db", "-f", str(path), "--print-grants", "--relay-role", "bob", "--checkpoint-table", "r.cp"])
    out, err = capsys.readouterr()
    wanted = needs(OutboxNames.parse("app.outbox"), layout="cursor", sequenced=True, shards=2, checkpoint_table="r.cp")
    assert code == 0 and out == grants_script(
        wanted, RoleNames(relay="bob"), "outbox app.outbox, outboxLayout: cursor, --uuid-sequencing, shards: 2"
    )
    assert 'ALTER TABLE "app"."outbox" OWNER TO "bob";' in out and '"app"."outbox_harvest_shards" TO "bob"' in out
    assert "hunter2secret" not in out + err and "port=1" not in out

    assert main(["init-db", "-f", str(path), "--print-grants", "--admin-role", "bob", "--relay-role", "bob"]) == 2
    assert "the roles must differ" in capsys.readouterr().err
    assert main(["init-db", "-f", str(path), "--print-grants", "--migrate"]) == 2
    assert "--print-grants and --migrate are two runs" in capsys.readouterr().err
    assert main(["init-db", "-f", str(path), "--writer-role", "app"]) == 2  # nothing created, nothing connected
    assert "init-db: --writer-role names a role of --print-grants' SQL; add --print-grants" in capsys.readouterr().err
