"""The DDL of the outbox and of the objects the relay adds next to it (listed in :mod:`producer.schema`),
and :func:`init_db`, which runs it.

Invariants:
- every statement is idempotent (``IF NOT EXISTS`` / ``OR REPLACE`` / ``ON CONFLICT DO NOTHING``), so
  :func:`init_db` upgrades an older harvest's objects in place, and it runs in one transaction;
- an existing table is kept as it is (a Debezium table only gains the relay's columns, each with a
  default, so its writers' INSERTs do not change).
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.producer.layouts.choice import layout_for
from harvest_outbox.producer.layouts.cursor.schema import PARTITION_IDS
from harvest_outbox.producer.mapping.goharvest import GOHARVEST
from harvest_outbox.producer.mapping.names import OutboxNames, Statement, ValueType
from harvest_outbox.producer.mapping.protocol import TableMapping
from harvest_outbox.producer.schema._storage import OUTBOX_FILLFACTOR
from harvest_outbox.producer.schema.checks import column_types, inspect_outbox, require_utf8_readable


def outbox_ddl(
    names: OutboxNames,
    value_type: ValueType = "varchar",
    layout: str = "mark",
    mapped_columns: list[sql.Composable] | None = None,
    wakeup: str = "notify",
    create_schema: bool = True,
) -> list[Statement]:
    """Statements that create the outbox, the dead-letter table and the notify trigger (with ``wakeup``
    ``poll``, drop it: producer/relay/two_phase.py); the outbox is ``layout``'s own table where it has one
    (:meth:`~producer.layouts.layout.OutboxLayout.outbox_ddl`: the cursor layout's partitioned outbox and
    cursor row, its partitions being :func:`init_db`'s, with a mapped table's columns ``mapped_columns`` when
    given (a migration keeps the old table's: :mod:`producer.layouts.cursor.migrate`), else the mapping's
    (:meth:`~producer.mapping.protocol.TableMapping.cursor_columns`)), else the mapping's table
    (:meth:`~producer.mapping.protocol.TableMapping.outbox_ddl`). ``create_schema`` False: the outbox's schema
    exists (``CREATE SCHEMA IF NOT EXISTS`` needs CREATE on the database even then: the owner role's grants,
    producer/schema/grants.py, do not include it)."""
    if value_type not in ("varchar", "bytea"):
        raise ConfigError(f"value type: {value_type!r} must be 'varchar' (goharvest) or 'bytea'")
    vtype = sql.SQL("BYTEA" if value_type == "bytea" else "VARCHAR")
    stmts: list[Statement] = []
    if names.schema and create_schema:
        stmts.append(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(names.schema)))
    own = layout_for(layout).outbox_ddl(names, value_type, mapped_columns, _companion_ddl(names, vtype, wakeup))
    if own is not None:  # the layout's own table (the cursor layout's partitioned one)
        return stmts + own
    stmts += names.mapping.outbox_ddl(names, value_type, OUTBOX_FILLFACTOR)
    return stmts + _companion_ddl(names, vtype, wakeup)


def _companion_ddl(names: OutboxNames, vtype: sql.Composable, wakeup: str = "notify") -> list[Statement]:
    """The dead-letter table, the fence and ACK-intent tables, the attempt counts and the NOTIFY
    trigger (``wakeup`` ``notify``; ``poll`` drops it), for any table mapping."""
    return _companion_tables_ddl(names, vtype) + notify_ddl(names, wakeup)


def companion_tables_ddl(names: OutboxNames, value_type: ValueType = "varchar") -> list[Statement]:
    """The companions alone (:func:`_companion_ddl` without the trigger), idempotent: ``init-db --migrate`` runs
    them before it locks the outbox (their ``ALTER TABLE … IF NOT EXISTS`` locks a table the running relay
    writes, which under the outbox's lock could deadlock with a relay transaction waiting for the outbox)."""
    return _companion_tables_ddl(names, sql.SQL("BYTEA" if value_type == "bytea" else "VARCHAR"))


def _companion_tables_ddl(names: OutboxNames, vtype: sql.Composable) -> list[Statement]:
    stmts: list[Statement] = []
    # Dead letters keep the original id (unique) and nullable columns: a row that was bad because a
    # column was NULL must still fit here.
    stmts.append(
        sql.SQL("""
        CREATE TABLE IF NOT EXISTS {dlq} (
          id                  BIGINT PRIMARY KEY,
          create_time         TIMESTAMP WITH TIME ZONE,
          kafka_topic         VARCHAR,
          kafka_key           VARCHAR,
          kafka_value         {vtype},
          kafka_header_keys   TEXT[],
          kafka_header_values TEXT[],
          error               TEXT NOT NULL,
          attempts            INTEGER NOT NULL,
          dead_time           TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now()
        )""").format(dlq=names.dead_letters, vtype=vtype)
    )
    # deadLetterRetention finds expired dead letters by dead_time (without an index: a scan of the table per run).
    stmts.append(
        sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (dead_time)").format(
            sql.Identifier(names.dead_time_index_name), names.dead_letters
        )
    )
    # deadLetterPolicy: haltKey probes the dead letters by (topic, key) for every row it marks (producer.relay.key_halt).
    stmts.append(
        sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (kafka_topic, kafka_key)").format(
            sql.Identifier(names.dead_key_index_name), names.dead_letters
        )
    )
    if names.mapping.source_row("o") is not None:
        # The row as it was (a mapped table's columns are not the record's): a requeue restores it.
        stmts.append(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS source_row JSONB").format(names.dead_letters))
    # --uuid-sequencing: the fence row and the persisted ACK intents (docs/design.md §5).
    stmts.append(
        sql.SQL("""
        CREATE TABLE IF NOT EXISTS {state} (
          singleton   BOOLEAN PRIMARY KEY DEFAULT true CHECK (singleton),
          epoch       BIGINT NOT NULL DEFAULT 0,
          leader_id   UUID,
          leader_name TEXT,
          updated_at  TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now()
        )""").format(state=names.state)
    )
    stmts.append(
        sql.SQL("INSERT INTO {state} (singleton) VALUES (true) ON CONFLICT DO NOTHING").format(state=names.state)
    )
    # Added after the first release: ALTER … IF NOT EXISTS upgrades older state tables in place.
    stmts.append(
        sql.SQL("ALTER TABLE {state} ADD COLUMN IF NOT EXISTS last_clock BIGINT NOT NULL DEFAULT 0").format(
            state=names.state
        )
    )
    # One row per (producer, partition): a commit replaces the producer's older intent there, so a
    # recovery never re-sends an old ACK that would roll back the producer's newer, committed span.
    # clock: a Gazette clock (60-bit timestamp << 4 | counter) fits a signed BIGINT until the year 5236.
    stmts.append(
        sql.SQL("""
        CREATE TABLE IF NOT EXISTS {acks} (
          epoch           BIGINT NOT NULL,
          producer        BYTEA NOT NULL,
          clock           BIGINT NOT NULL,
          topic           VARCHAR NOT NULL,
          kafka_partition INTEGER NOT NULL,
          create_time     TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
          PRIMARY KEY (producer, topic, kafka_partition)
        )""").format(acks=names.ack_intents)
    )
    # Failed delivery attempts per outbox id (no foreign key: the outbox row is deleted first by
    # goharvest-style purges, and a dangling count is harmless, deleted with the next dead letter).
    stmts.append(
        sql.SQL("""
        CREATE TABLE IF NOT EXISTS {attempts} (
          id          BIGINT PRIMARY KEY,
          attempts    INTEGER NOT NULL,
          last_error  TEXT,
          updated_at  TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now()
        )""").format(attempts=names.delivery_attempts)
    )
    # Sharded relays (shards: S): a view recovers only intents of views that led one of its shards
    # (those can no longer commit). An intent of a view still live on other shards, re-sent, would be
    # an old ACK that rolls back that producer's newer, still open span in every reader.
    stmts.append(
        sql.SQL("ALTER TABLE {acks} ADD COLUMN IF NOT EXISTS shard_count INTEGER NOT NULL DEFAULT 1").format(
            acks=names.ack_intents
        )
    )
    stmts.append(
        sql.SQL("ALTER TABLE {acks} ADD COLUMN IF NOT EXISTS shards INTEGER[] NOT NULL DEFAULT '{{0}}'").format(
            acks=names.ack_intents
        )
    )
    # The layout of the relays running on the outbox (producer/relay/admission.py): empty until the first starts.
    stmts.append(
        sql.SQL("""
        CREATE TABLE IF NOT EXISTS {layout} (
          singleton       BOOLEAN PRIMARY KEY DEFAULT true CHECK (singleton),
          shards          INTEGER,
          leader_election TEXT,
          leader_group_id TEXT,
          leader_topic    TEXT,
          updated_by      TEXT,
          updated_at      TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now()
        )""").format(layout=names.layout)
    )
    stmts.append(
        sql.SQL("INSERT INTO {layout} (singleton) VALUES (true) ON CONFLICT DO NOTHING").format(layout=names.layout)
    )
    return stmts


def notify_ddl(names: OutboxNames, wakeup: str = "notify") -> list[Statement]:
    """The outbox's NOTIFY trigger (``wakeup`` ``notify``; ``poll`` drops it)."""
    stmts: list[Statement] = []
    if wakeup not in ("notify", "poll"):
        raise ConfigError(f"wakeup: {wakeup!r} is not a wake-up; use notify or poll")
    if wakeup == "poll":
        # A NOTIFY makes the writer's PREPARE TRANSACTION fail, and a trigger cannot know that one will
        # follow: two-phase-commit writers need the table without it (the relay polls: producer/relay/two_phase.py).
        # The function stays: another outbox of the schema may use it.
        stmts.append(
            sql.SQL("DROP TRIGGER IF EXISTS {trg} ON {outbox}").format(trg=names.notify_trigger, outbox=names.outbox)
        )
        return stmts
    stmts.append(
        sql.SQL("""
        CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          PERFORM pg_notify(TG_ARGV[0], '');
          RETURN NULL;
        END $$""").format(fn=names.notify_function)
    )
    stmts.append(
        sql.SQL("DROP TRIGGER IF EXISTS {trg} ON {outbox}").format(trg=names.notify_trigger, outbox=names.outbox)
    )
    stmts.append(
        sql.SQL(
            "CREATE TRIGGER {trg} AFTER INSERT ON {outbox} FOR EACH STATEMENT EXECUTE FUNCTION {fn}({channel})"
        ).format(
            trg=names.notify_trigger, outbox=names.outbox, fn=names.notify_function, channel=sql.Literal(names.channel)
        )
    )
    return stmts


def shard_ddl(names: OutboxNames, count: int) -> list[Statement]:
    """What ``shards: count`` needs: the per-shard mark index and the shards' fence rows."""
    return shard_index_ddl(names, count) + shard_rows_ddl(names, count)


def shard_index_ddl(names: OutboxNames, count: int) -> list[Statement]:
    """``shards: count``'s per-shard index on the outbox."""
    from harvest_outbox.producer.relay.shards import check_shard_count, shard_expression

    check_shard_count(count)
    if count == 1:
        return []
    expr = shard_expression(count, names.mapping.shard_key())
    return [
        sql.SQL("CREATE INDEX IF NOT EXISTS {idx} ON {outbox} ({expr}, {id})").format(
            idx=sql.Identifier(names.shard_index_name(count)), outbox=names.outbox, expr=expr, id=names.mapping.id()
        ),
        # An older harvest's index (on the old expression) is no relay's any more: one MD5 per insert for nothing.
        sql.SQL("DROP INDEX IF EXISTS {}").format(names._ident(names.old_shard_index_name(count))),
    ]


def shard_rows_ddl(names: OutboxNames, count: int) -> list[Statement]:
    """``shards: count``'s fence rows (their table, idempotent)."""
    from harvest_outbox.producer.relay.shards import check_shard_count

    check_shard_count(count)
    if count == 1:
        return []
    return [
        sql.SQL("""
            CREATE TABLE IF NOT EXISTS {st} (
              shard_count INTEGER NOT NULL,
              shard       INTEGER NOT NULL,
              epoch       BIGINT NOT NULL DEFAULT 0,
              leader_id   UUID,
              leader_name TEXT,
              updated_at  TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
              last_clock  BIGINT NOT NULL DEFAULT 0,
              PRIMARY KEY (shard_count, shard)
            )""").format(st=names.shard_state),
        sql.SQL(
            "INSERT INTO {st} (shard_count, shard) SELECT {n}, s FROM generate_series(0, {last}) AS s "
            "ON CONFLICT DO NOTHING"
        ).format(st=names.shard_state, n=sql.Literal(count), last=sql.Literal(count - 1)),
    ]


def init_db(
    conninfo_or_conn: str | psycopg.Connection,
    outbox_table: str = "outbox",
    value_type: ValueType = "varchar",
    shards: int = 1,
    mapping: TableMapping = GOHARVEST,
    layout: str = "mark",
    partition_ids: int = PARTITION_IDS,
    wakeup: str = "notify",
) -> OutboxNames:
    """Create (idempotently, in one transaction) everything the relay needs. Returns the names.
    ``shards`` > 1 also creates what sharded relays need (:func:`shard_ddl`). Refuses a SQL_ASCII
    database (:func:`require_utf8_readable`). With a Debezium ``mapping`` an existing table is kept
    and only gains the relay's columns (its payload column's type then decides ``value_type``).
    ``layout`` (``outboxLayout``, :func:`~producer.layouts.choice.layout_for`; ``mark`` by default here, as code
    calling it always had it: ``harvest init-db`` with ``outboxLayout`` unset chooses with
    :func:`~producer.layouts.choice.init_layout`, the cursor layout for a new outbox): ``cursor``, the partitioned
    outbox of :mod:`producer.layouts.cursor.schema`, with :data:`~producer.layouts.cursor.schema.PARTITIONS_AHEAD`
    partitions of ``partition_ids`` ids when it has none; an existing table of the other layout is refused,
    never changed. ``wakeup`` ``poll`` leaves the
    outbox without the NOTIFY trigger (dropping one an earlier run made): writers may then use two-phase
    commit, and the relay finds their rows by polling (producer/relay/two_phase.py)."""
    names = OutboxNames.parse(outbox_table, mapping)
    chosen = layout_for(layout)
    chosen.check_partition_ids(partition_ids)

    def run(conn: psycopg.Connection) -> None:
        require_utf8_readable(conn)
        chosen.require_server(conn)
        chosen.require(conn, names)
        vtype = value_type
        if mapping.adopts_existing_table:  # the writers' table, if it exists, decides
            cols = column_types(conn, names)
            if cols is not None:
                vtype = mapping.value_type(cols)
        # Only a missing schema is created: the least-privilege owner may create in its schema, not in the database.
        missing = names.schema is not None and (
            conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (names.schema,)).fetchone() is None
        )
        with conn.transaction():
            for stmt in outbox_ddl(names, vtype, layout, wakeup=wakeup, create_schema=missing) + shard_ddl(
                names, shards
            ):
                conn.execute(stmt)
            chosen.finish_init(conn, names, shards, partition_ids)  # the cursor rows and partitions, or storage
        if mapping.adopts_existing_table:
            inspect_outbox(conn, names)  # the writers' table has the columns the mapping reads

    if isinstance(conninfo_or_conn, psycopg.Connection):
        run(conninfo_or_conn)
        return names
    from harvest_outbox.producer.db.credentials import open_connection  # late: db imports schema

    with open_connection(conninfo_or_conn) as conn:
        run(conn)
    return names
