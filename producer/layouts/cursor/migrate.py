"""``harvest init-db --migrate``: goharvest's outbox (``outboxLayout: mark``), or a Debezium one
(``tableMapping: debezium``), to the cursor layout, keeping every undelivered row, in one transaction, with
every relay of the outbox stopped.

Under an ``ACCESS EXCLUSIVE`` lock on the old table (writers wait for the few statements it takes; a
writer's INSERT that waited resolves the table's name again and lands in the new table):

1. the old table, its indexes and its id sequence are renamed ``<name>_goharvest[_…]`` (``<name>_debezium[_…]``)
   (kept: drop it once satisfied);
2. the cursor layout is created under the outbox's name (:func:`~producer.schema.ddl.outbox_ddl`; the
   companions -- dead letters, fence row, ACK intents, attempt counts -- are the same tables, kept); a
   Debezium table's columns are the old table's own (type, NOT NULL, default: its writers' INSERTs work
   unchanged), keyed by ``harvest_seq`` instead of its ``id``;
3. the new sequence starts above every id the old table, the dead letters and the attempt counts hold,
   so no new row can take the id of an old dead letter (whose row the dead-letter upsert would
   overwrite) or inherit an old attempt count;
4. every row of the old table the relay owns is copied in id order with new ids, lowest first: they go out
   before any row written after the migration, each key's rows in their old order; rows a stopped relay had
   marked (``leader_id``) are copied too (as the next view would have re-marked them); a Debezium table's
   rows without ``harvest_seq`` (the previous relay's) stay in the old table;
5. attempt counts move to their rows' new ids;
6. ``shards: S``: the shard index on the new table and a cursor row per shard (all at the origin: every
   copied row is pending in its shard).

Invariants (tests/test_producer/layouts/cursor/test_cursor_relay.py, test_debezium_cursor.py): nothing changes unless all
of it does (one transaction); the copied rows keep their order, columns and attempt counts; the old table is
kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from harvest_outbox.producer.errors import SchemaError
from harvest_outbox.producer.layouts.cursor.schema import (
    PARTITION_IDS,
    PARTITIONS_AHEAD,
    add_shard_cursors,
    create_partition,
    is_cursor_table,
    require_server,
)
from harvest_outbox.producer.mapping.names import OutboxNames, derived_name
from harvest_outbox.producer.mapping.table import GOHARVEST, TableMapping
from harvest_outbox.producer.schema.checks import inspect_outbox, require_utf8_readable
from harvest_outbox.producer.schema.ddl import outbox_ddl, shard_ddl


@dataclass(frozen=True)
class Migrated:
    """What a migration did: rows copied, the old table's new name, the first new id."""

    copied: int
    old_table: str
    first_id: int


def migrate_to_cursor(
    conn: psycopg.Connection,
    outbox_table: str,
    partition_ids: int = PARTITION_IDS,
    shards: int = 1,
    mapping: TableMapping = GOHARVEST,
    wakeup: str = "notify",
) -> Migrated:
    """Migrate ``outbox_table`` (goharvest's table, or with a Debezium ``mapping`` Debezium's) to the cursor
    layout (module doc); one transaction. ``shards: S`` > 1: the new table gets the shard index and a cursor
    row per shard, all at the origin. ``wakeup`` ``poll``: the new table gets no NOTIFY trigger (two-phase-commit
    writers: producer/relay/two_phase.py)."""
    names = OutboxNames.parse(outbox_table, mapping)
    require_utf8_readable(conn)
    require_server(conn)
    have = is_cursor_table(conn, names)
    if have is not False:  # a mark-layout table, nothing else, is migrated
        raise SchemaError(
            f"outbox {names.display!r} is {'already in the cursor layout' if have else 'missing'}: nothing to "
            f"migrate; run `harvest init-db` (without --migrate)"
        )
    value_type = inspect_outbox(conn, names)
    suffix = f"_{mapping.kind}"
    old_name = derived_name(names.table, suffix)
    old = names.qualified(old_name)
    oid, mine = mapping.id(), mapping.claimable()
    with conn.transaction():
        conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(names.outbox))
        if conn.execute("SELECT to_regclass(%s)", (old.as_string(conn),)).fetchone() != (None,):
            raise SchemaError(f"{old.as_string(conn)} exists (an earlier migration's): drop or rename it first")
        seq = conn.execute(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = pg_get_serial_sequence(%s, %s)::regclass",
            (names.outbox.as_string(conn), mapping.id_column),
        ).fetchone()
        indexes = conn.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = to_regclass(%s)",
            (names.outbox.as_string(conn),),
        ).fetchall()
        mapped = None if mapping.row_is_record else _mapped_columns(conn, names)
        conn.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(names.outbox, sql.Identifier(old_name)))
        for (index,) in indexes:
            conn.execute(
                sql.SQL("ALTER INDEX {} RENAME TO {}").format(
                    names.qualified(index), sql.Identifier(derived_name(index, suffix))
                )
            )
        if seq is not None:
            conn.execute(
                sql.SQL("ALTER SEQUENCE {} RENAME TO {}").format(
                    sql.Identifier(seq[0], seq[1]),
                    sql.Identifier(derived_name(names.table, suffix + mapping.sequence_suffix)),
                )
            )
        for stmt in outbox_ddl(names, value_type, "cursor", mapped, wakeup) + shard_ddl(names, shards):
            conn.execute(stmt)
        add_shard_cursors(conn, names, shards)
        top = conn.execute(
            sql.SQL(
                "SELECT greatest((SELECT max({id}) FROM {o}), (SELECT max(id) FROM {d}), (SELECT max(id) FROM {a}), 0), "
                "(SELECT count(*) FROM {o}{mine})"
            ).format(id=oid, o=old, d=names.dead_letters, a=names.delivery_attempts, mine=mine)
        ).fetchone()
        assert top is not None
        above, rows = int(top[0]), int(top[1])
        first = (above // partition_ids) * partition_ids
        for start in range(first, above + rows + PARTITIONS_AHEAD * partition_ids, partition_ids):
            conn.execute(create_partition(names, start, start + partition_ids))
        if above:
            conn.execute("SELECT setval(%s::regclass, %s)", (names.id_sequence.as_string(conn), above))
        # new ids in old id order (nextval over the sorted subquery's rows; the xid is this transaction's,
        # taken by the DDL above: A1 holds). A Debezium table's rows without harvest_seq stay behind: they were
        # the previous relay's (docs/debezium.md)
        conn.execute(
            sql.SQL(
                "CREATE TEMP TABLE harvest_migrated ON COMMIT DROP AS SELECT old_id, nextval({}::regclass) AS new_id "
                "FROM (SELECT {} AS old_id FROM {}{} ORDER BY 1) AS s"
            ).format(sql.Literal(names.id_sequence.as_string(conn)), oid, old, mine)
        )
        # every column both tables have but the relay's own (the ordering id, the mark, txid): the writers'
        copied = [
            c for c in _columns(conn, names.outbox) if c not in (mapping.id_column, mapping.leader_column, "txid")
        ]
        copied = [c for c in copied if c in set(_columns(conn, old))]
        conn.execute(
            sql.SQL("""
            INSERT INTO {new} ({id}, {cols})
            SELECT m.new_id, {ocols}
            FROM {old} AS o JOIN harvest_migrated AS m ON m.old_id = {oid} ORDER BY m.new_id""").format(
                new=names.outbox,
                old=old,
                id=oid,
                oid=mapping.id("o"),
                cols=sql.SQL(", ").join(sql.Identifier(c) for c in copied),
                ocols=sql.SQL(", ").join(sql.Identifier("o", c) for c in copied),
            )
        )
        conn.execute(
            sql.SQL("""
            WITH moved AS (DELETE FROM {a} AS a USING harvest_migrated AS m WHERE a.id = m.old_id
                           RETURNING m.new_id, a.attempts, a.last_error, a.updated_at)
            INSERT INTO {a} (id, attempts, last_error, updated_at) SELECT * FROM moved""").format(
                a=names.delivery_attempts
            )
        )
    return Migrated(rows, old.as_string(conn), above + 1)


def _columns(conn: psycopg.Connection, table: sql.Composable) -> list[str]:
    return [
        str(r[0])
        for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped "
            "ORDER BY attnum",
            (table.as_string(conn),),
        ).fetchall()
    ]


def _mapped_columns(conn: psycopg.Connection, names: OutboxNames) -> list[sql.Composable]:
    """A mapped table's own columns as they are (type, NOT NULL, default; not its keys or indexes: the new
    table is keyed by the ordering id), less the relay's, which the cursor layout's DDL makes."""
    m = names.mapping
    rows = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid) "
        "FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
        "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (names.outbox.as_string(conn),),
    ).fetchall()
    own = {m.id_column, m.leader_column, m.created_column}
    return [
        sql.SQL("{} {}{}{}").format(
            sql.Identifier(name),
            sql.SQL(typ),  # format_type's text: a type name as Postgres prints it
            sql.SQL(" NOT NULL") if notnull else sql.SQL(""),
            sql.SQL(" DEFAULT {}").format(sql.SQL(default)) if default is not None else sql.SQL(""),
        )
        for name, typ, notnull, default in rows
        if name not in own
    ]
