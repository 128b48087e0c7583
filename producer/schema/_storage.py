"""The outbox's storage as a queue table: its fillfactor and autovacuum settings (docs/hygiene.md).

Invariant: ``init-db`` sets only what the table lacks (:func:`missing_storage`): a value its owner set
with ``ALTER TABLE … SET (…)`` is kept; a goharvest table's fillfactor is its owner's call
(:func:`packed_outbox_fix` says what it costs).
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from harvest_outbox.producer.mapping.names import OutboxNames

#: Every outbox row is updated exactly once (the relay's mark sets ``leader_id``) and then deleted.
#: With pages half empty, the mark's new row version fits in the row's own page: a HOT update, no
#: new page and no primary-key entry. Packed pages (Postgres' default, 100) move every marked row to
#: another page and index it again. Measured (bench/bench_relay.py's database loop, 100k rows):
#: 530 ms at 50 against 750 ms at 100; 60 and 70 gain little, 40 nothing more; stashing is as fast.
OUTBOX_FILLFACTOR = 50


#: Autovacuum settings for a queue table, which ``init-db`` gives the outbox where it has none of its
#: own (a value set with ``ALTER TABLE … SET (…)`` is kept; docs/hygiene.md). Every outbox
#: row is inserted, updated once and deleted within seconds: two dead row versions per delivered row,
#: in a table that is empty most of the time and holds a backlog now and then.
OUTBOX_AUTOVACUUM: dict[str, str] = {
    # Vacuum after a count of dead rows, not after 20 % of the table (Postgres' default): 20 % of a table
    # that just held a backlog is millions of rows, left to bloat the heap and the primary key whose head
    # every mark reads. A vacuum of the near-empty table takes milliseconds, and autovacuum visits a table
    # at most once per autovacuum_naptime (1 min) whatever the count.
    "autovacuum_vacuum_scale_factor": "0",
    "autovacuum_vacuum_threshold": "1000",
    # The same for statistics: the outbox's size swings between empty and a backlog within minutes, and
    # the mark's plan (the shard index or the primary key, producer/db/__init__.py) follows the statistics.
    "autovacuum_analyze_scale_factor": "0",
    "autovacuum_analyze_threshold": "1000",
}


def table_reloptions(conn: psycopg.Connection, table: sql.Identifier) -> dict[str, str]:
    """The storage parameters set on ``table`` (``pg_class.reloptions``; empty when none, or no table)."""
    row = conn.execute(
        "SELECT reloptions FROM pg_class WHERE oid = to_regclass(%s)", (table.as_string(conn),)
    ).fetchone()
    return dict(option.partition("=")[::2] for option in (row[0] if row is not None and row[0] else []))


def outbox_fillfactor(conn: psycopg.Connection, names: OutboxNames) -> int:
    """The outbox's fillfactor (Postgres' default, 100, when none is set)."""
    return int(table_reloptions(conn, names.outbox).get("fillfactor", 100))


def missing_storage(conn: psycopg.Connection, names: OutboxNames) -> dict[str, str]:
    """The queue-table settings the outbox lacks, which ``init-db`` sets: :data:`OUTBOX_AUTOVACUUM`,
    and for a table ``init-db`` adopts (and alters anyway: a Debezium table) :data:`OUTBOX_FILLFACTOR`. A
    goharvest table's fillfactor is its owner's call (a backlog takes twice the disk): :func:`packed_outbox_fix`."""
    wanted = dict(OUTBOX_AUTOVACUUM)
    if names.mapping.adopts_existing_table:
        wanted["fillfactor"] = str(OUTBOX_FILLFACTOR)
    have = table_reloptions(conn, names.outbox)
    return {name: value for name, value in wanted.items() if name not in have}


def storage_sql(names: OutboxNames, options: dict[str, str]) -> sql.Composed:
    """``ALTER TABLE outbox SET (…)`` for ``options``: names and numbers of this module's constants, so
    written as they are (``harvest check`` prints the statement as a fix)."""
    return sql.SQL("ALTER TABLE {} SET ({})").format(
        names.outbox, sql.SQL(", ").join(sql.SQL(f"{name} = {float(value):g}") for name, value in options.items())
    )


def packed_outbox_fix(conn: psycopg.Connection, names: OutboxNames) -> str | None:
    """What to tell the owner of an outbox packed tighter than :data:`OUTBOX_FILLFACTOR` (None if
    it is not): the cost and the statement that fixes it."""
    fillfactor = outbox_fillfactor(conn, names)
    if fillfactor <= OUTBOX_FILLFACTOR:
        return None
    return (
        f"outbox {names.display} has fillfactor {fillfactor}: every mark moves its rows to new pages and "
        f"indexes them again. `ALTER TABLE {names.outbox.as_string(conn)} SET (fillfactor = {OUTBOX_FILLFACTOR})` "
        f"makes marks in-page (HOT) updates on pages written from then on: the database's mark+purge loop ran "
        f"~1.4x as fast (docs/writing.md)"
    )
