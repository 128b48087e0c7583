"""``outboxLayout: cursor``: the cursor layout's partitioned outbox, and its cursor row (docs/design.md,
"Outbox layouts"; the decisions are producer/layouts/cursor/_watermark.py's).

Objects, for an outbox table ``[schema.]name`` (next to the companions of :mod:`producer.schema.ddl`:
dead letters, fence row, ACK intents, attempt counts, NOTIFY trigger, which are the same in both layouts):

- ``name``: goharvest's columns (so the Stasher, goharvest's Go stasher and the dead-letter tools work
  unchanged; ``leader_id`` stays, always NULL) plus ``txid xid8 NOT NULL DEFAULT pg_current_xact_id()``,
  the writer's top-level transaction; ``PARTITION BY RANGE (id)``. With ``tableMapping: debezium``
  (docs/debezium.md): Debezium's columns (its ``id`` UUID, the event id, not unique-indexed: a partitioned
  table's unique index must hold the partition key) plus ``harvest_seq`` (the ordering id, the partition key
  and primary key), ``harvest_leader`` (always NULL), ``harvest_created`` and ``txid``, all defaulted;
- ``name_id_seq`` (``name_harvest_seq`` for a Debezium table): the ids, ``CACHE 1``, drawn by the default
  ``CASE WHEN pg_current_xact_id() IS NOT NULL THEN nextval(…) END`` (the writer takes its xid before its id);
- ``name_p<start>``: id-range partitions of :data:`PARTITION_IDS` ids, and ``name_rest``, the DEFAULT
  partition (a net should partition maintenance fall behind the ids: never retired);
- ``name_harvest_cursor``: one row per shard (``shard``, ``epoch``, ``lo``, ``hi``, ``pos``, ``low``,
  ``probe_head``, ``probe_xid``, ``updated_at``): the committed cursor.
- ``name_held`` (made with the companions; :mod:`producer.layouts.cursor.held`): ``deadLetterPolicy: haltKey``'s held
  rows, empty otherwise.

Invariants:
- A1 (producer/layouts/cursor/_watermark.py): the id default takes the xid before the id, from a ``CACHE 1`` sequence;
  :func:`require_cursor_layout` refuses an outbox whose default does not (writers that set ``id``
  themselves break it too: docs/limitations.md);
- a row's transaction is its ``txid`` column, never ``xmin`` (a savepoint's rows carry a subtransaction
  xid, which snapshots do not list);
- identifiers go through :class:`psycopg.sql.Identifier`; every statement is idempotent;
- the relay never runs one layout's statements on the other's table (:func:`is_cursor_table` is checked at start).
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from harvest_outbox.producer.errors import SchemaError
from harvest_outbox.producer.layouts.cursor._ids import id_source_of, id_source_sql
from harvest_outbox.producer.mapping.names import OutboxNames, Statement

#: Ids per partition ``harvest init-db`` creates (and partition maintenance keeps, from the last one's width).
PARTITION_IDS = 1_000_000
#: Partitions ``harvest init-db`` creates at first; maintenance keeps at least this many ahead of the ids.
PARTITIONS_AHEAD = 2
#: Postgres 13: ``xid8``, ``pg_current_xact_id()``, ``pg_snapshot``.
MIN_SERVER_VERSION = 130000
#: The text of the cursor row's ``lo`` before any batch: a snapshot that sees no transaction.
ORIGIN_TEXT = "3:3:"


def id_default(names: OutboxNames) -> sql.Composed:
    """A1: the xid first (a ``CASE`` evaluates its condition before its result), then the id."""
    return sql.SQL("CASE WHEN pg_current_xact_id() IS NOT NULL THEN nextval({}::regclass) END").format(
        sql.Literal(names.id_sequence.as_string(None))
    )


def cursor_outbox_ddl(
    names: OutboxNames, value_type: str, mapped_columns: list[sql.Composable] | None = None
) -> list[Statement]:
    """The partitioned outbox, its sequence and the cursor row (partitions: :func:`create_partition`).
    Its columns are the table mapping's (:meth:`~producer.mapping.protocol.TableMapping.cursor_columns`):
    goharvest's, or a mapped table's own (``mapped_columns``, a migrated table's, else the mapping's convention)
    and then the mapping's ordering, mark and create-time columns; the ordering one with the xid-first default
    (A1) and the partition key."""
    m = names.mapping
    columns = m.cursor_columns(value_type, id_default(names), mapped_columns)
    return [
        sql.SQL("CREATE SEQUENCE IF NOT EXISTS {} CACHE 1").format(names.id_sequence),
        sql.SQL("""
        CREATE TABLE IF NOT EXISTS {outbox} ({columns},
          txid                XID8 NOT NULL DEFAULT pg_current_xact_id(),
          PRIMARY KEY ({id})
        ) PARTITION BY RANGE ({id})""").format(outbox=names.outbox, columns=columns, id=m.id()),
        sql.SQL("ALTER SEQUENCE {} OWNED BY {}.{}").format(names.id_sequence, names.outbox, m.id()),
        sql.SQL("CREATE TABLE IF NOT EXISTS {} PARTITION OF {} DEFAULT").format(
            names.qualified(rest_partition_name(names)), names.outbox
        ),
        sql.SQL("""
        CREATE TABLE IF NOT EXISTS {cursor} (
          shard       INTEGER PRIMARY KEY,
          epoch       BIGINT NOT NULL DEFAULT 0,
          lo          PG_SNAPSHOT NOT NULL,
          hi          PG_SNAPSHOT,
          pos         BIGINT NOT NULL DEFAULT 0,
          low         BIGINT NOT NULL DEFAULT 0,
          probe_head  BIGINT,
          probe_xid   XID8,
          updated_at  TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now()
        )""").format(cursor=names.cursor),
        sql.SQL("INSERT INTO {} (shard, lo) VALUES (0, {}) ON CONFLICT DO NOTHING").format(
            names.cursor, sql.Literal(ORIGIN_TEXT)
        ),
    ]


def rest_partition_name(names: OutboxNames) -> str:
    from harvest_outbox.producer.mapping.names import derived_name

    return derived_name(names.table, "_rest")


def create_partition(names: OutboxNames, start: int, end: int) -> Statement:
    """``CREATE TABLE … PARTITION OF`` (init-db: nobody writes yet; maintenance attaches instead)."""
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
        names.qualified(names.partition_name(start)), names.outbox, sql.Literal(start), sql.Literal(end)
    )


def require_server(conn: psycopg.Connection) -> None:
    if conn.info.server_version < MIN_SERVER_VERSION:
        raise SchemaError(
            f"outboxLayout: cursor needs Postgres 13 or later (xid8, pg_current_xact_id, pg_snapshot); this "
            f"server is {conn.info.server_version}. Use outboxLayout: mark"
        )


def is_cursor_table(conn: psycopg.Connection, names: OutboxNames) -> bool | None:
    """Whether the outbox is the cursor layout's table (partitioned, with ``txid``) or another (the mark
    layout's); None when there is no table. :func:`~producer.layouts.choice.detected_layout` names the layout."""
    row = conn.execute(
        "SELECT c.relkind::text, EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid "
        "AND a.attname = 'txid' AND NOT a.attisdropped) FROM pg_class c WHERE c.oid = to_regclass(%s)",
        (names.outbox.as_string(conn),),
    ).fetchone()
    if row is None:
        return None
    return bool(row[0] == "p" and row[1])


def require_cursor_table(conn: psycopg.Connection, names: OutboxNames) -> None:
    """The outbox, if it exists, is the cursor layout's partitioned table (a relay of the other layout would
    lose or repeat rows) and keeps A1 (:func:`require_cursor_layout`)."""
    have = is_cursor_table(conn, names)
    if have is None:
        return
    if have:
        require_cursor_layout(conn, names)
        return
    raise SchemaError(
        f"outbox {names.display!r} is {names.mapping.described} (outboxLayout: mark), not the cursor layout's "
        f"partitioned table: stop every relay of it and run `harvest init-db --migrate` (one transaction: the "
        f"table is renamed away and its rows copied into the new layout in order; docs/limitations.md), or "
        f"keep outboxLayout: mark"
    )


def require_cursor_layout(conn: psycopg.Connection, names: OutboxNames) -> None:
    """A1 and A2 hold (:class:`~producer.layouts.cursor._ids.IdSource`: the id default takes the xid first from the
    outbox's ``CACHE 1`` sequence; ``txid`` is the writer's transaction) and the cursor table exists. A running
    relay re-checks the id source at every batch start (producer/layouts/cursor/_ids.py)."""
    require_server(conn)
    row = conn.execute(sql.SQL("SELECT g.* FROM ({}) AS g").format(id_source_sql(names))).fetchone()
    assert row is not None  # a one-row subquery
    source = id_source_of(tuple(row))
    fault = source.fault(names) or source.txid_fault(names)
    if fault is not None:
        raise SchemaError(f"{fault}. The cursor relay could otherwise skip a row for good (docs/limitations.md)")
    if conn.execute("SELECT to_regclass(%s)", (names.cursor.as_string(conn),)).fetchone() == (None,):
        raise SchemaError(
            f"outbox {names.display!r} has no cursor table {names.cursor.as_string(conn)}; run `harvest init-db` "
            f"with outboxLayout: cursor (idempotent)"
        )


def range_partitions(conn: psycopg.Connection, names: OutboxNames) -> list[tuple[int, int, str]]:
    """The outbox's id-range partitions ``(start, end, name)`` in id order (the DEFAULT one left out)."""
    rows = conn.execute(
        """SELECT c.relname,
                  (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \\(''?(-?\\d+)''?\\) TO'))[1],
                  (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \\(''?(-?\\d+)''?\\)'))[1]
           FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)""",
        (names.outbox.as_string(conn),),
    ).fetchall()
    return sorted((int(a), int(b), n) for n, a, b in rows if a is not None and b is not None)


def _cursor_shards(conn: psycopg.Connection, names: OutboxNames) -> list[int]:
    return sorted(int(r[0]) for r in conn.execute(sql.SQL("SELECT shard FROM {}").format(names.cursor)).fetchall())


def _other_count(names: OutboxNames, have: list[int], shards: int) -> SchemaError:
    return SchemaError(
        f"the cursor table of {names.display!r} holds the cursors of shards {have[:8]}{'...' if len(have) > 8 else ''} "
        f"(shards: {len(have)}), and the config has shards: {shards}. A cursor-layout outbox keeps the shard count "
        f"it was given (its shards' cursors are not comparable): set shards: {len(have)}, or drain it, stop every "
        f"relay and start a new outbox with `harvest init-db` (docs/sharding.md)"
    )


def require_cursor_rows(conn: psycopg.Connection, names: OutboxNames, shards: int) -> None:
    """The cursor table holds exactly the rows of shards ``0..shards-1`` (a relay never reads a shard
    without its cursor, nor leaves one unread)."""
    have = _cursor_shards(conn, names)
    if have == list(range(shards)):
        return
    if have == [0] and shards > 1:
        raise SchemaError(
            f"the cursor table of {names.display!r} holds one cursor (shards: 1) and the config has shards: {shards}: "
            f"stop the relays of shards: 1, then run `harvest init-db` with shards: {shards} (it gives the new "
            f"shards copies of that cursor: no row is skipped or sent twice)"
        )
    if have and have == list(range(len(have))):
        raise _other_count(names, have, shards)
    raise SchemaError(
        f"the cursor table of {names.display!r} holds the cursors of shards {have} for shards: {shards}; run "
        f"`harvest init-db` with shards: {shards} (idempotent; it adds missing cursor rows)"
    )


def add_shard_cursors(conn: psycopg.Connection, names: OutboxNames, shards: int) -> None:
    """``init-db`` with ``shards: S``: a cursor row per shard. A table with the one cursor of ``shards: 1``
    (or a new one) gives shards ``1..S-1`` copies of it: that cursor passed exactly the rows it delivered,
    whatever their shard, so each shard's copy passes exactly that shard's delivered rows. Rows of another
    shard count are refused (each shard's cursor passed only its shard's rows; they cannot be re-split)."""
    have = _cursor_shards(conn, names)
    if have == list(range(shards)):
        return
    if have != [0]:
        raise _other_count(names, have, shards)
    conn.execute(
        sql.SQL(
            "INSERT INTO {c} (shard, lo, hi, pos, low, probe_head, probe_xid) "
            "SELECT s, c.lo, c.hi, c.pos, c.low, c.probe_head, c.probe_xid "
            "FROM {c} AS c, generate_series(1, {last}) AS s WHERE c.shard = 0"
        ).format(c=names.cursor, last=sql.Literal(shards - 1))
    )
