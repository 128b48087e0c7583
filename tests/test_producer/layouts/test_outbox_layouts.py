"""The two outbox layouts through their one interface (producer/layouts/layout.py's ``OutboxLayout``; docs/design.md
§10), on the same rows in real Postgres:

- the chooser names the layout an existing table is in (``detected_layout``), and each layout's ``require``
  accepts its own table and refuses the other's, naming the fix;
- both layouts count the same unrelayed rows, per shard (``harvest shards``) and in all, with an id bound;
- a halted key's rows wait where each layout says: the outbox (mark) or ``<outbox>_held`` (cursor).
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from harvest_outbox.producer.errors import SchemaError
from harvest_outbox.producer.layouts.choice import CURSOR, MARK, detected_layout
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

SHARDS = 4
ROWS = 200


@pytest.mark.integration
def test_both_layouts_report_the_same_backlog_and_refuse_each_others_table(pg_dsn: str, pg_schema: str) -> None:
    tables = {MARK: f"{pg_schema}.marked", CURSOR: f"{pg_schema}.cursored"}
    names = {
        layout: init_db(pg_dsn, table, shards=SHARDS, layout=layout.name, partition_ids=1000)
        for layout, table in tables.items()
    }
    records = [OutboxRecord("t", f"k{i % 37}", f"v{i}") for i in range(ROWS)]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for table in tables.values():
            with conn.transaction():
                Stasher(table).stash_many(conn, records)
        assert detected_layout(conn, names[MARK]) is MARK and detected_layout(conn, names[CURSOR]) is CURSOR
        assert detected_layout(conn, OutboxNames.parse(f"{pg_schema}.missing")) is None
        for layout, other in ((MARK, CURSOR), (CURSOR, MARK)):
            layout.require(conn, names[layout])
            with pytest.raises(SchemaError, match="outboxLayout"):
                other.require(conn, names[layout])

        per_shard = {layout: layout.backlog_by_shard(conn, names[layout], SHARDS) for layout in tables}
        assert sum(n for n, _age in per_shard[MARK].values()) == ROWS
        assert {k: n for k, (n, _age) in per_shard[MARK].items()} == {
            k: n for k, (n, _age) in per_shard[CURSOR].items() if n
        }  # the same keys in the same shards; the cursor lists every shard, empty ones too
        assert all(age is not None and age >= 0 for n, age in per_shard[MARK].values() if n)

        for layout in tables:
            first = conn.execute(sql.SQL("SELECT min(id) FROM {}").format(names[layout].outbox)).fetchone()
            assert first is not None
            assert layout.backlog(conn, names[layout], shards=SHARDS) == ROWS
            assert layout.backlog(conn, names[layout], up_to=int(first[0]) + 9, shards=SHARDS) == 10

        assert MARK.waiting_table(names[MARK]).as_string(conn) == names[MARK].outbox.as_string(conn)
        assert CURSOR.waiting_table(names[CURSOR]).as_string(conn) == names[CURSOR].held.as_string(conn)
        assert MARK.holds_dropped_rows is False and CURSOR.holds_dropped_rows is True
