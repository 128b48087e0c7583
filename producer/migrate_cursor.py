"""``harvest init-db --migrate``: goharvest's outbox (``outboxLayout: mark``) to the cursor layout, keeping
every undelivered row, in one transaction, with every relay of the outbox stopped.

Under an ``ACCESS EXCLUSIVE`` lock on the old table (writers wait for the few statements it takes; a
writer's INSERT that waited resolves the table's name again and lands in the new table):

1. the old table, its indexes and its id sequence are renamed ``<name>_goharvest[_…]`` (kept: drop it
   once satisfied);
2. the cursor layout is created under the outbox's name (:func:`~producer.schema_ddl.outbox_ddl`; the
   companions -- dead letters, fence row, ACK intents, attempt counts -- are the same tables, kept);
3. the new sequence starts above every id the old table, the dead letters and the attempt counts hold,
   so no new row can take the id of an old dead letter (whose row the dead-letter upsert would
   overwrite) or inherit an old attempt count;
4. every row of the old table is copied in id order with new ids, lowest first: they go out before any
   row written after the migration, each key's rows in their old order; rows a stopped relay had marked
   (``leader_id``) are copied too (as the next view would have re-marked them);
5. attempt counts move to their rows' new ids;
6. ``shards: S``: the shard index on the new table and a cursor row per shard (all at the origin: every
   copied row is pending in its shard).

Invariants (tests/test_producer/test_cursor_relay.py): nothing changes unless all of it does (one
transaction); the copied rows keep their order, columns and attempt counts; the old table is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from harvest_outbox.producer.errors import SchemaError
from harvest_outbox.producer.schema_checks import inspect_outbox, require_utf8_readable
from harvest_outbox.producer.schema_cursor import (
    PARTITION_IDS,
    PARTITIONS_AHEAD,
    add_shard_cursors,
    create_partition,
    layout_of,
    require_server,
)
from harvest_outbox.producer.schema_ddl import outbox_ddl, shard_ddl
from harvest_outbox.producer.schema_names import OutboxNames, derived_name
from harvest_outbox.producer.table_mapping import GOHARVEST, TableMapping


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
) -> Migrated:
    """Migrate ``outbox_table`` (goharvest's table) to the cursor layout (module doc); one transaction.
    ``shards: S`` > 1: the new table gets the shard index and a cursor row per shard, all at the origin.
    A ``mapping`` other than goharvest's (a Debezium table, whose writers' extra columns this does not know) is
    refused, naming the steps by hand (docs/debezium.md)."""
    if mapping.kind != "goharvest":
        raise SchemaError(
            f"init-db --migrate moves goharvest's table only, not a {mapping.kind} table (tableMapping: "
            f"{mapping.kind}); move it by hand, with every relay and writer stopped: rename the table, run "
            f"`harvest init-db` with outboxLayout: cursor, copy the rows the relay has not delivered "
            f"(harvest_seq IS NOT NULL) in harvest_seq order, leaving out harvest_seq, harvest_leader and "
            f"harvest_created (docs/debezium.md, Moving to the cursor layout)"
        )
    names = OutboxNames.parse(outbox_table)
    require_utf8_readable(conn)
    require_server(conn)
    have = layout_of(conn, names)
    if have != "mark":
        raise SchemaError(
            f"outbox {names.display!r} is {'already in the cursor layout' if have else 'missing'}: nothing to "
            f"migrate; run `harvest init-db` (without --migrate)"
        )
    value_type = inspect_outbox(conn, names)
    old_name = derived_name(names.table, "_goharvest")
    old = names.qualified(old_name)
    with conn.transaction():
        conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(names.outbox))
        if conn.execute("SELECT to_regclass(%s)", (old.as_string(conn),)).fetchone() != (None,):
            raise SchemaError(f"{old.as_string(conn)} exists (an earlier migration's): drop or rename it first")
        seq = conn.execute(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = pg_get_serial_sequence(%s, 'id')::regclass",
            (names.outbox.as_string(conn),),
        ).fetchone()
        indexes = conn.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = to_regclass(%s)",
            (names.outbox.as_string(conn),),
        ).fetchall()
        conn.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(names.outbox, sql.Identifier(old_name)))
        for (index,) in indexes:
            conn.execute(
                sql.SQL("ALTER INDEX {} RENAME TO {}").format(
                    names.qualified(index), sql.Identifier(derived_name(index, "_goharvest"))
                )
            )
        if seq is not None:
            conn.execute(
                sql.SQL("ALTER SEQUENCE {} RENAME TO {}").format(
                    sql.Identifier(seq[0], seq[1]), sql.Identifier(derived_name(names.table, "_goharvest_id_seq"))
                )
            )
        for stmt in outbox_ddl(names, value_type, "cursor") + shard_ddl(names, shards):
            conn.execute(stmt)
        add_shard_cursors(conn, names, shards)
        top = conn.execute(
            sql.SQL(
                "SELECT greatest((SELECT max(id) FROM {o}), (SELECT max(id) FROM {d}), (SELECT max(id) FROM {a}), 0), "
                "(SELECT count(*) FROM {o})"
            ).format(o=old, d=names.dead_letters, a=names.delivery_attempts)
        ).fetchone()
        assert top is not None
        above, rows = int(top[0]), int(top[1])
        first = (above // partition_ids) * partition_ids
        for start in range(first, above + rows + PARTITIONS_AHEAD * partition_ids, partition_ids):
            conn.execute(create_partition(names, start, start + partition_ids))
        if above:
            conn.execute("SELECT setval(%s::regclass, %s)", (names.id_sequence.as_string(conn), above))
        # new ids in old id order (nextval over the sorted subquery's rows; the xid is this transaction's,
        # taken by the DDL above: A1 holds)
        conn.execute(
            sql.SQL(
                "CREATE TEMP TABLE harvest_migrated ON COMMIT DROP AS SELECT old_id, nextval({}::regclass) AS new_id "
                "FROM (SELECT id AS old_id FROM {} ORDER BY id) AS s"
            ).format(sql.Literal(names.id_sequence.as_string(conn)), old)
        )
        conn.execute(
            sql.SQL("""
            INSERT INTO {new} (id, create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys,
                               kafka_header_values)
            SELECT m.new_id, o.create_time, o.kafka_topic, o.kafka_key, o.kafka_value, o.kafka_header_keys,
                   o.kafka_header_values
            FROM {old} AS o JOIN harvest_migrated AS m ON m.old_id = o.id ORDER BY m.new_id""").format(
                new=names.outbox, old=old
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
