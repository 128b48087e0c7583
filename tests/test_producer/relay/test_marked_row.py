"""The marked row (producer/relay/marked_row.py): its field names cover its shape, and the rows the mark
returns are plain tuples the garbage collector stops tracking (the module's invariants)."""

from __future__ import annotations

import gc
import uuid
from typing import get_args

import psycopg
import pytest

from harvest_outbox.producer.layouts.mark.database import MarkDatabase
from harvest_outbox.producer.relay import marked_row
from harvest_outbox.producer.relay.marked_row import (
    ROW_BAD,
    ROW_CREATED,
    ROW_FIELDS,
    ROW_HEADER_KEYS,
    ROW_ID,
    ROW_KEY,
    ROW_TOPIC,
    ROW_VALUE,
    MarkedRow,
    with_bad,
    with_encoded,
)
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher


def test_the_field_names_number_every_field_once_in_order() -> None:
    names = {k: v for k, v in vars(marked_row).items() if k.startswith("ROW_") and k != "ROW_FIELDS"}
    assert sorted(names.values()) == list(range(ROW_FIELDS)), names
    assert len(get_args(MarkedRow)) == ROW_FIELDS


def test_replacing_fields_keeps_the_others_and_the_plain_tuple() -> None:
    row: MarkedRow = (7, "t", b"k", b"{}", ("h",), ("v",), None, 2, "e", 3, 1.5)
    enc = with_encoded(row, b"K", b"V")
    assert enc == (7, "t", b"K", b"V", ("h",), ("v",), None, 2, "e", 3, 1.5) and type(enc) is tuple
    bad = with_bad(row, "why")
    assert bad[ROW_BAD] == "why" and bad[:ROW_BAD] == row[:ROW_BAD] and bad[ROW_BAD + 1 :] == row[ROW_BAD + 1 :]
    assert type(bad) is tuple


@pytest.mark.integration
def test_marked_rows_are_plain_tuples_the_garbage_collector_untracks(pg_dsn: str, pg_schema: str) -> None:
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        Stasher(table).stash_many(
            conn,
            [OutboxRecord("t", "k0", "v0"), OutboxRecord("t", "k1", "v1", headers=[("h", "x")])],
        )
    db = MarkDatabase(pg_dsn, names)
    try:
        rows = db.mark(uuid.uuid4(), 10)
    finally:
        db.close()
    assert [(r[ROW_TOPIC], r[ROW_KEY], r[ROW_VALUE]) for r in rows] == [("t", b"k0", b"v0"), ("t", b"k1", b"v1")]
    assert rows[0][ROW_HEADER_KEYS] is None and rows[1][ROW_HEADER_KEYS] == ("h",)
    assert all(type(r) is tuple and len(r) == ROW_FIELDS for r in rows)
    assert rows[0][ROW_ID] < rows[1][ROW_ID] and isinstance(rows[0][ROW_CREATED], float)
    # Two collections: a row whose header tuple was still tracked when the collector looked at it is
    # untracked by the next one (its header tuple is by then).
    gc.collect()
    gc.collect()
    assert not any(gc.is_tracked(r) for r in rows)  # a tuple subclass (NamedTuple) would stay tracked
