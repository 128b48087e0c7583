"""``harvest init-db --migrate [--online]``: goharvest's outbox (``outboxLayout: mark``), or a Debezium one
(``tableMapping: debezium``), to the cursor layout, keeping every undelivered row, in one transaction
(docs/design.md, "Moving an outbox to the cursor layout"; docs/migrating.md).

Under an ``ACCESS EXCLUSIVE`` lock on the old table (writers wait for the few statements it takes; a
writer's INSERT that waited resolves the table's name again and lands in the new table):

1. the old table, its indexes and its id sequence are renamed ``<name>_goharvest[_…]`` (``<name>_debezium[_…]``)
   (kept: drop it once satisfied);
2. the cursor layout is created under the outbox's name (its own objects only; the companions -- dead
   letters, fence row, ACK intents, attempt counts -- are the same tables, kept, brought up to date by init-db's
   statements in a transaction of their own before the lock, where they cannot deadlock with a relay); a
   Debezium table's columns are the old table's own (type, NOT NULL, default: its writers' INSERTs work
   unchanged), keyed by ``harvest_seq`` instead of its ``id``;
3. the new table refuses every row ``UPDATE`` and ``DELETE`` (a statement trigger raising SQLSTATE
   :data:`~producer.db.LAYOUT_CHANGED_SQLSTATE`): the cursor relay never writes a row, and a relay of the
   mark layout still running fails its next mark, release or purge there and stops
   (:class:`~producer.errors.LayoutChanged`, producer/relay/layout_change.py) instead of claiming rows;
4. the new sequence starts above every id the old table, the dead letters and the attempt counts hold,
   so no new row can take the id of an old dead letter (whose row the dead-letter upsert would
   overwrite) or inherit an old attempt count;
5. every row of the old table the relay owns is copied in id order with new ids, lowest first: they go out
   before any row written after the migration, each key's rows in their old order; rows a relay had
   marked (``leader_id``) are copied too (as the next view would have re-marked them); a Debezium table's
   rows without ``harvest_seq`` (the previous relay's) stay in the old table;
6. attempt counts move to their rows' new ids;
7. ``shards: S``: the shard index on the new table and a cursor row per shard (all at the origin: every
   copied row is pending in its shard).

Offline (:func:`migrate_to_cursor`) the lock is waited for as any statement of the CLI's connection (2 s) and
every row is copied. Online (:func:`migrate_online`) relays and writers keep running: the lock is waited for at
most :data:`LOCK_WAIT_MS` (a writer queued behind the request waits no longer), and the swap goes ahead only
when at most :data:`MAX_ROWS_UNDER_LOCK` rows are to be copied under it; otherwise it rolls back and tries again
after :data:`RETRY_PAUSE_S` while the relays drain, for at most ``give_up_after`` seconds. Writers then wait at
most the lock wait plus the swap (measured: :attr:`Migrated.locked_s`).

Invariants (tests/test_producer/layouts/cursor/test_cursor_relay.py, test_debezium_cursor.py,
test_online_migration.py): nothing changes unless all of it does (one transaction); the copied rows keep
their order, columns and attempt counts; the old table is kept; a mark-layout statement that updates or deletes
rows of the new table fails; an online attempt that cannot take the lock in time, or would copy too many rows,
changes nothing.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import psycopg
from psycopg import sql

from harvest_outbox.producer.db import LAYOUT_CHANGED_SQLSTATE
from harvest_outbox.producer.errors import HarvestError, SchemaError
from harvest_outbox.producer.layouts.cursor.held import held_table
from harvest_outbox.producer.layouts.cursor.schema import (
    PARTITION_IDS,
    PARTITIONS_AHEAD,
    add_shard_cursors,
    create_partition,
    cursor_outbox_ddl,
    is_cursor_table,
    require_server,
)
from harvest_outbox.producer.mapping.names import OutboxNames, Statement, ValueType, derived_name
from harvest_outbox.producer.mapping.table import GOHARVEST, TableMapping
from harvest_outbox.producer.schema.checks import inspect_outbox, require_utf8_readable
from harvest_outbox.producer.schema.ddl import companion_tables_ddl, notify_ddl, shard_index_ddl, shard_rows_ddl

log = logging.getLogger(__name__)


#: Online: the longest the swap waits for the outbox's lock per attempt (writers queued behind the request
#: wait no longer than this for it).
LOCK_WAIT_MS = 100
#: Online: the most unrelayed rows copied under the lock (the scenario test's swaps, DDL included: 40-602 ms, median
#: 128, with about 3,200 rows on 2 loaded cores); more, and the attempt rolls back while the relays drain them.
MAX_ROWS_UNDER_LOCK = 10_000
#: Online: the pause between two attempts.
RETRY_PAUSE_S = 0.5
#: Attempts at bringing the companions up to date before the swap (:meth:`_Plan.prepare`).
PREPARE_ATTEMPTS = 10


@dataclass(frozen=True)
class Migrated:
    """What a migration did: rows copied, the old table's new name, the first new id; online, how long the
    outbox was locked (from the lock request to the commit: the longest a writer waited) and the attempts."""

    copied: int
    old_table: str
    first_id: int
    locked_s: float = 0.0
    attempts: int = 1


class _TooManyRows(HarvestError):
    """An online attempt found more rows to copy than it may under the lock (rolled back, tried again: never
    raised out of this module)."""


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
    plan = _Plan.of(conn, outbox_table, partition_ids, shards, mapping, wakeup)
    with conn.transaction():
        conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(plan.names.outbox))
        return plan.swap(conn)


def migrate_online(
    conn: psycopg.Connection,
    outbox_table: str,
    partition_ids: int = PARTITION_IDS,
    shards: int = 1,
    mapping: TableMapping = GOHARVEST,
    wakeup: str = "notify",
    *,
    lock_wait_ms: int = LOCK_WAIT_MS,
    max_rows: int = MAX_ROWS_UNDER_LOCK,
    give_up_after: float = 300.0,
    pause: float = RETRY_PAUSE_S,
) -> Migrated:
    """:func:`migrate_to_cursor` while writers write and relays run (module doc): each attempt waits at most
    ``lock_wait_ms`` for the lock and copies at most ``max_rows`` under it, else changes nothing and is tried
    again ``pause`` seconds later; :class:`~producer.errors.SchemaError` after ``give_up_after`` seconds.
    ``conn`` must be in autocommit mode (each attempt is its own transaction)."""
    if not conn.autocommit:
        raise SchemaError("init-db --migrate --online: the connection must be in autocommit mode")
    plan = _Plan.of(conn, outbox_table, partition_ids, shards, mapping, wakeup)
    deadline = time.monotonic() + give_up_after
    attempts = 0
    why = ""
    while True:
        attempts += 1
        began = time.monotonic()
        try:
            waiting = plan.rows(conn, max_rows)  # without the lock: no lock taken while the relays are behind
            if waiting > max_rows:
                raise _TooManyRows
            began = time.monotonic()
            with conn.transaction():
                conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{lock_wait_ms}ms")))
                conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(plan.names.outbox))
                rows = plan.rows(conn, max_rows)
                if rows > max_rows:
                    raise _TooManyRows
                done = plan.swap(conn)
            locked = time.monotonic() - began
            log.info(
                "outbox %s moved to the cursor layout online in %.1f ms (attempt %d)",
                plan.names.display,
                locked * 1000,
                attempts,
            )
            return Migrated(done.copied, done.old_table, done.first_id, locked, attempts)
        except psycopg.errors.LockNotAvailable:
            why = (
                f"a lock the swap needs (the outbox's, or a companion table's) was not free within {lock_wait_ms} ms "
                f"(a long transaction holds it?)"
            )
        except _TooManyRows:
            why = f"more than the {max_rows} unrelayed rows copied under the lock are waiting (are the relays running?)"
        if time.monotonic() + pause > deadline:
            raise SchemaError(
                f"init-db --migrate --online: gave up on {plan.names.display!r} after {attempts} attempt(s): {why}; "
                f"nothing changed. Run it again once the relays have drained the outbox, or stop them and run "
                f"--migrate without --online"
            )
        log.info(
            "outbox %s: migration attempt %d rolled back: %s; again in %.1fs", plan.names.display, attempts, why, pause
        )
        time.sleep(pause)


@dataclass(frozen=True)
class _Plan:
    """A migration's checks done and names resolved, outside the lock: the swap under it is :meth:`swap`."""

    names: OutboxNames
    mapping: TableMapping
    value_type: ValueType
    partition_ids: int
    shards: int
    wakeup: str

    @classmethod
    def of(
        cls,
        conn: psycopg.Connection,
        outbox_table: str,
        partition_ids: int,
        shards: int,
        mapping: TableMapping,
        wakeup: str,
    ) -> _Plan:
        names = OutboxNames.parse(outbox_table, mapping)
        require_utf8_readable(conn)
        require_server(conn)
        have = is_cursor_table(conn, names)
        if have is not False:  # a mark-layout table, nothing else, is migrated
            raise SchemaError(
                f"outbox {names.display!r} is {'already in the cursor layout' if have else 'missing'}: nothing to "
                f"migrate; run `harvest init-db` (without --migrate)"
            )
        plan = cls(names, mapping, inspect_outbox(conn, names), partition_ids, shards, wakeup)
        plan.prepare(conn)
        return plan

    def prepare(self, conn: psycopg.Connection) -> None:
        """The companions (dead letters, fence and ACK intents, attempt counts, shard fence rows) up to date, in a
        transaction of their own before the swap: their ``ALTER TABLE … IF NOT EXISTS`` locks tables a running
        relay writes in the same transactions as the outbox, so under the outbox's lock it could deadlock with a
        relay transaction waiting for the outbox (idempotent: init-db's own statements). A running relay's commit
        can still take them in another order: a deadlock or a lock not granted within 1 s rolls back and tries
        again, up to :data:`PREPARE_ATTEMPTS` times."""
        for attempt in range(1, PREPARE_ATTEMPTS + 1):
            try:
                with conn.transaction():
                    conn.execute("SET LOCAL lock_timeout = '1s'")
                    for stmt in companion_tables_ddl(self.names, self.value_type) + shard_rows_ddl(
                        self.names, self.shards
                    ):
                        conn.execute(stmt)
                return
            except (psycopg.errors.DeadlockDetected, psycopg.errors.LockNotAvailable) as exc:
                if attempt == PREPARE_ATTEMPTS:
                    raise SchemaError(
                        f"init-db --migrate: the companion tables of {self.names.display!r} stayed locked ({exc}); "
                        f"nothing changed, run it again"
                    ) from exc
                time.sleep(0.2)

    @property
    def old(self) -> sql.Identifier:
        return self.names.qualified(derived_name(self.names.table, f"_{self.mapping.kind}"))

    def rows(self, conn: psycopg.Connection, limit: int) -> int:
        """The rows the swap would copy, counted up to ``limit`` + 1 (under the lock the count's time is the
        writers' wait: bounded by the limit, not by the backlog)."""
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM (SELECT 1 FROM {}{} LIMIT {}) AS s").format(
                self.names.outbox, self.mapping.claimable(), sql.Literal(limit + 1)
            )
        ).fetchone()
        assert row is not None  # an aggregate
        return int(row[0])

    def swap(self, conn: psycopg.Connection) -> Migrated:
        """Steps 1-7 of the module doc, in the caller's transaction, which holds the outbox's lock."""
        names, mapping, partition_ids = self.names, self.mapping, self.partition_ids
        suffix = f"_{mapping.kind}"
        old_name = derived_name(names.table, suffix)
        old = self.old
        oid, mine = mapping.id(), mapping.claimable()
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
        # the new outbox's own objects only: the companions were brought up to date by prepare(), before the lock
        own = cursor_outbox_ddl(names, self.value_type, mapped) + notify_ddl(names, self.wakeup)
        for stmt in own + held_table(names, self.value_type) + shard_index_ddl(names, self.shards):
            conn.execute(stmt)
        add_shard_cursors(conn, names, self.shards)
        for stmt in refuse_row_writes_ddl(names):
            conn.execute(stmt)
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


def refuse_row_writes_ddl(names: OutboxNames) -> list[Statement]:
    """The migrated outbox's statement trigger refusing every row ``UPDATE`` and ``DELETE`` with
    :data:`~producer.db.LAYOUT_CHANGED_SQLSTATE` (module doc, step 3); nothing the cursor layout does
    updates or deletes a row of it (partitions are truncated)."""
    fn = names.qualified("harvest_refuse_row_writes")
    return [
        sql.SQL("""
        CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          RAISE EXCEPTION USING ERRCODE = {code}, MESSAGE = format(
            'outbox %I.%I is in the cursor layout (moved by harvest init-db --migrate): its rows are never updated '
            'or deleted; a relay of the mark layout stops here (docs/migrating.md)', TG_TABLE_SCHEMA, TG_TABLE_NAME);
        END $$""").format(fn=fn, code=sql.Literal(LAYOUT_CHANGED_SQLSTATE)),
        sql.SQL("CREATE TRIGGER {} BEFORE UPDATE OR DELETE ON {} FOR EACH STATEMENT EXECUTE FUNCTION {}()").format(
            sql.Identifier(derived_name(names.table, "_refuses_row_writes")), names.outbox, fn
        ),
    ]


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
