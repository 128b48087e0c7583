"""A table mapping is the only source of the outbox's column names (docs/design.md "Table mappings"): every
statement that reads, marks, commits, dead-letters or creates the outbox, built for a third mapping
(fake_mapping.py: columns named like neither goharvest's nor Debezium's), names only that mapping's
columns. A statement that hard-codes a mapping's column fails here, so adding a mapping needs no edit
outside producer/mapping/. Pure SQL composition, no database (the two real mappings run against Postgres
in test_table_mapping.py, test_debezium_cursor.py)."""

from __future__ import annotations

import re

import pytest
from fake_mapping import FakeMapping
from psycopg import sql

from harvest_outbox.producer.layouts.cursor import database as cursor_db
from harvest_outbox.producer.layouts.cursor.schema import cursor_outbox_ddl
from harvest_outbox.producer.layouts.mark import database as mark_db
from harvest_outbox.producer.layouts.mark.marks import mark_sql
from harvest_outbox.producer.mapping.goharvest import GOHARVEST
from harvest_outbox.producer.mapping.names import OutboxNames
from harvest_outbox.producer.mapping.protocol import TableMapping
from harvest_outbox.producer.mapping.table import table_mapping
from harvest_outbox.producer.schema.ddl import outbox_ddl, shard_ddl

#: Column names of the real mappings' outboxes (goharvest's relay and record columns, Debezium's).
OTHERS = (
    "leader_id",
    "create_time",
    "kafka_topic",
    "kafka_key",
    "kafka_value",
    "kafka_header",
    "harvest_seq",
    "harvest_leader",
    "harvest_created",
    "aggregatetype",
    "aggregateid",
    "payload",
)
NAMES = OutboxNames.parse("app.box", FakeMapping())


def _text(statement: sql.Composable | list[sql.Composed | sql.SQL]) -> str:
    """The statement's SQL less its string literals (error texts may name goharvest's columns)."""
    text = (
        ";\n".join(s.as_string(None) for s in statement) if isinstance(statement, list) else statement.as_string(None)
    )
    return re.sub(r"'(?:[^']|'')*'", "''", text)


def test_the_fake_is_a_table_mapping() -> None:
    assert isinstance(FakeMapping(), TableMapping)


@pytest.mark.parametrize(
    "what, statement",
    [
        ("mark", mark_sql(NAMES, "varchar", None, frozenset(), False)),
        ("sharded mark", mark_sql(NAMES, "bytea", 4, frozenset({0, 3}), False)),
        ("purge", mark_db.purge_sql(NAMES)),
        ("reset", mark_db.reset_sql(NAMES)),
        ("cursor read", cursor_db.read_sql(NAMES, "varchar", 4)),
        ("cursor backlog", cursor_db.backlog_sql(NAMES, 4)),
        ("cursor table", cursor_outbox_ddl(NAMES, "varchar")),
        ("mark-layout table", outbox_ddl(NAMES, "varchar", "mark")[1]),
        ("shard index", shard_ddl(NAMES, 4)[0]),
    ],
)
def test_statements_name_only_the_mappings_columns(what: str, statement: sql.Composable) -> None:
    text = _text(statement)
    assert [c for c in OTHERS if c in text] == [], f"{what} names another mapping's column:\n{text}"
    assert '"seq"' in text, what


def test_dead_letters_take_the_record_and_the_row_from_the_mapping() -> None:
    for statement in (
        mark_db.dead_letter_sql(NAMES, "varchar", sql.SQL("")),
        cursor_db.copy_dead_letters_sql(NAMES, "varchar"),
    ):
        text = _text(statement)
        # the dead-letter table's own columns are goharvest's names; what fills them is the mapping's
        reads = text[text.index("SELECT") :] if "RETURNING" not in text else text[text.index("RETURNING") :]
        assert '"o"."dest"' in reads and '"o"."body"' in reads and "to_jsonb" in reads, text
        assert [c for c in ("leader_id", "harvest_seq", "aggregatetype", "payload") if c in reads] == [], text


def test_the_real_mappings_texts_are_those_before_the_protocol() -> None:
    """What init-db, check and the layout's refusal print, as they were when the callers tested the mapping's
    name (cli.py, ops/_check.py, layouts/cursor/schema.py)."""
    debezium = table_mapping("debezium")
    names = OutboxNames.parse("app.outbox_event", debezium)
    assert GOHARVEST.ready("bytea", "dead letters, NOTIFY channel c") == (
        "ready (value type bytea; dead letters, NOTIFY channel c)"
    )
    assert debezium.ready("varchar", "dead letters, NOTIFY channel c; 4 shards") == (
        "ready as a debezium outbox (relay columns added with defaults; dead letters, NOTIFY channel c; 4 shards)"
    )
    assert (GOHARVEST.described, debezium.described) == ("goharvest's table", "a debezium table")
    assert GOHARVEST.id_index(names) is None and debezium.id_index(names) == "outbox_event_harvest_seq_idx"
    assert names.id_sequence.as_string(None) == '"app"."outbox_event_harvest_seq"'
    assert OutboxNames.parse("app.outbox").id_sequence.as_string(None) == '"app"."outbox_id_seq"'
