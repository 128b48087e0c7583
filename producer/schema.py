"""The outbox table (goharvest's schema, as is) and the objects the relay adds next to it.

Objects, for an outbox table ``[schema.]name``:
- ``name``: goharvest's outbox (``id BIGSERIAL PK, create_time, kafka_topic, kafka_key,
  kafka_value, kafka_header_keys, kafka_header_values, leader_id``); ``kafka_value`` is
  ``VARCHAR`` (goharvest) or ``BYTEA`` (binary payloads). Existing goharvest tables work unchanged.
- ``name_dead_letters``: rows the relay gave up on, with the error and attempt count.
- ``name_harvest_state``: one row (``epoch``, ``leader_id``, ``leader_name``, ``updated_at``,
  ``last_clock``) — the fence of ``--uuid-sequencing``: every leader view increments ``epoch``; a
  commit checks it and raises ``last_clock`` to its ACK clock, the floor of every later view's
  UUID clock (so clocks rise across views even when a leader's wall clock steps back).
- ``name_ack_intents``: persisted, not yet confirmed ACK_TXN intents of committed harvest
  transactions (``epoch``, ``producer``, ``clock``, ``topic``, ``kafka_partition``).
- ``name_delivery_attempts``: failed delivery attempts per outbox row id (``attempts``,
  ``last_error``, ``updated_at``), so ``maxDeliveryAttempts`` counts across relay restarts and
  leader changes. Rows exist only for ids that failed at least once; they are deleted when the row
  is delivered, committed or dead-lettered.
- with ``shards: S`` (S > 1): an expression index ``name_shard<S>_v2_idx`` on ``(shard, id)``
  (:func:`producer.shards.shard_expression`) and ``name_harvest_shards``, the fence row of each shard
  (``shard_count``, ``shard``, then the columns of ``name_harvest_state``); ACK intents carry
  ``shard_count`` and ``shards``, the shards of the view that wrote them (1 and ``{0}`` for the
  unsharded relay), so a view recovers only intents of views that led one of its shards.
- ``name_harvest_layout``: one row, the layout of the relays running on the outbox (``shards``,
  ``leader_election``, ``leader_group_id``, ``leader_topic``, ``updated_by``, ``updated_at``;
  :mod:`producer.layout`); empty until the first relay starts.
- storage parameters of a queue table on the outbox: ``fillfactor`` (:data:`OUTBOX_FILLFACTOR`) and
  autovacuum (:data:`OUTBOX_AUTOVACUUM`), each only where the table has no value of its own.
- ``harvest_notify()`` + statement-level trigger ``name_notify``: ``pg_notify(channel)`` after each
  INSERT statement. Notifications are delivered at commit (and dropped on rollback), so any writer,
  including goharvest's Go stasher, wakes the relay without code changes.

Invariants:
- identifiers are always passed through :class:`psycopg.sql.Identifier`; a table name is split
  into at most (schema, table) and never interpolated raw;
- :func:`init_db` is idempotent (``IF NOT EXISTS`` / ``OR REPLACE``) and runs in one transaction.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal

import psycopg
from psycopg import sql

from harvest_outbox.producer.errors import ConfigError, SchemaError, shown
from harvest_outbox.producer.table_mapping import (
    DEBEZIUM_PAYLOAD_TYPES,
    DEBEZIUM_TEXT_TYPES,
    GOHARVEST,
    DebeziumMapping,
    TableMapping,
)

ValueType = Literal["varchar", "bytea"]
#: A complete statement as harvest composes them (psycopg.sql): what execute() and mogrify() take.
Statement = sql.SQL | sql.Composed
_MAX_IDENT = 63  # NAMEDATALEN - 1


def parse_table_name(name: str) -> tuple[str | None, str]:
    """``"outbox"`` -> ``(None, "outbox")``; ``"app.outbox"`` -> ``("app", "outbox")``;
    ``'"My Schema"."Out.box"'`` -> ``("My Schema", "Out.box")`` (double quotes allow dots/case)."""
    parts: list[str] = []
    text = name.strip()
    i = 0
    while i < len(text):
        if text[i] == '"':
            j = i + 1
            buf = []
            while True:
                k = text.find('"', j)
                if k < 0:
                    raise ConfigError(f"outboxTable: {shown(name)} has an unterminated double quote")
                buf.append(text[j:k])
                if k + 1 < len(text) and text[k + 1] == '"':
                    buf.append('"')
                    j = k + 2
                    continue
                i = k + 1
                break
            parts.append("".join(buf))
        else:
            k = text.find(".", i)
            k = len(text) if k < 0 else k
            part = text[i:k]
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*", part):
                raise ConfigError(
                    f"outboxTable: {shown(name)}: {shown(part)} is not a plain identifier; quote it "
                    f"with double quotes, e.g. {shown(chr(34) + part + chr(34))}"
                )
            parts.append(part.lower())  # Postgres folds unquoted names to lower case
            i = k
        if i < len(text):
            if text[i] != ".":
                raise ConfigError(f"outboxTable: {shown(name)}: expected '.' between schema and table")
            i += 1
            if i == len(text):
                raise ConfigError(f"outboxTable: {shown(name)} ends with '.'")
    if not parts or len(parts) > 2 or any(not p for p in parts):
        raise ConfigError(f"outboxTable: {shown(name)} must be 'table' or 'schema.table'")
    for part in parts:
        if len(part.encode()) > _MAX_IDENT:
            raise ConfigError(f"outboxTable: {shown(part)} is longer than Postgres' {_MAX_IDENT}-byte identifier limit")
    return (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])


def _derived(base: str, suffix: str) -> str:
    """``base + suffix`` kept within 63 bytes (a hash keeps truncated names distinct)."""
    name = base + suffix
    if len(name.encode()) <= _MAX_IDENT:
        return name
    digest = hashlib.sha1(base.encode()).hexdigest()[:8]
    return base.encode()[: _MAX_IDENT - len(suffix) - 9].decode(errors="ignore") + "_" + digest + suffix


@dataclass(frozen=True)
class OutboxNames:
    """Quoted SQL fragments for the outbox and its companions."""

    schema: str | None
    table: str
    #: Which columns make a record (goharvest's table, or Debezium's outbox: producer.table_mapping).
    mapping: TableMapping = GOHARVEST

    @classmethod
    def parse(cls, outbox_table: str, mapping: TableMapping = GOHARVEST) -> OutboxNames:
        schema, table = parse_table_name(outbox_table)
        return cls(schema, table, mapping)

    def _ident(self, name: str) -> sql.Identifier:
        return sql.Identifier(self.schema, name) if self.schema else sql.Identifier(name)

    @property
    def outbox(self) -> sql.Identifier:
        return self._ident(self.table)

    @property
    def dead_letters(self) -> sql.Identifier:
        return self._ident(_derived(self.table, "_dead_letters"))

    @property
    def state(self) -> sql.Identifier:
        return self._ident(_derived(self.table, "_harvest_state"))

    @property
    def ack_intents(self) -> sql.Identifier:
        return self._ident(_derived(self.table, "_ack_intents"))

    @property
    def delivery_attempts(self) -> sql.Identifier:
        return self._ident(_derived(self.table, "_delivery_attempts"))

    @property
    def layout(self) -> sql.Identifier:
        return self._ident(_derived(self.table, "_harvest_layout"))

    @property
    def shard_state(self) -> sql.Identifier:
        return self._ident(_derived(self.table, "_harvest_shards"))

    def shard_index_name(self, count: int) -> str:
        # _v2: the expression maps a NULL key to a shard (producer/shards.py); an index is used only for
        # its own expression, so a new expression needs a name `init-db` has not created yet.
        return _derived(self.table, f"_shard{count}_v2_idx")

    def old_shard_index_name(self, count: int) -> str:
        """The index an older harvest built, on the expression that left NULL-key rows in no shard."""
        return _derived(self.table, f"_shard{count}_idx")

    @property
    def debezium_seq_index(self) -> str:
        """The unique index of a Debezium outbox's ordering column (the mark reads it in order)."""
        return _derived(self.table, "_harvest_seq_idx")

    @property
    def debezium_sequence(self) -> sql.Identifier:
        """The sequence of a Debezium outbox's ordering column (``harvest_seq``)."""
        return self._ident(_derived(self.table, "_harvest_seq"))

    @property
    def notify_function(self) -> sql.Identifier:
        return self._ident("harvest_notify")

    @property
    def notify_trigger(self) -> sql.Identifier:
        return sql.Identifier(self.notify_trigger_name)

    @property
    def notify_trigger_name(self) -> str:
        return _derived(self.table, "_notify")

    def qualified(self, name: str) -> sql.Identifier:
        """``name`` (an index, a table) in the outbox's schema."""
        return self._ident(name)

    @property
    def dead_time_index_name(self) -> str:
        return _derived(self.table, "_dead_letters_time_idx")

    @property
    def dead_key_index_name(self) -> str:
        return _derived(self.table, "_dead_letters_key_idx")

    @property
    def id_index_name(self) -> sql.Identifier:
        return sql.Identifier(_derived(self.table, "_leader_id_idx"))

    @property
    def channel(self) -> str:
        """LISTEN/NOTIFY channel: ``harvest_<schema>_<table>``, hashed if too long."""
        return _derived("harvest_" + (f"{self.schema}_" if self.schema else "") + self.table, "")

    @property
    def display(self) -> str:
        return f"{self.schema}.{self.table}" if self.schema else self.table


#: Every outbox row is updated exactly once (the relay's mark sets ``leader_id``) and then deleted.
#: With pages half empty, the mark's new row version fits in the row's own page: a HOT update, no
#: new page and no primary-key entry. Packed pages (Postgres' default, 100) move every marked row to
#: another page and index it again. Measured (bench/bench_relay.py's database loop, 100k rows):
#: 530 ms at 50 against 750 ms at 100; 60 and 70 gain little, 40 nothing more; stashing is as fast.
OUTBOX_FILLFACTOR = 50


def unrelayed_rows(conn: psycopg.Connection, names: OutboxNames) -> int:
    """Rows of a mapped outbox the relay does not own (written before ``init-db`` added its columns)."""
    cond = names.mapping.relayed()
    if cond is None:
        return 0
    row = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE NOT ({})").format(names.outbox, cond)).fetchone()
    return int(row[0]) if row else 0


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
    # the mark's plan (the shard index or the primary key, producer/db.py) follows the statistics.
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
    and for a Debezium table (which ``init-db`` alters anyway) :data:`OUTBOX_FILLFACTOR`. A goharvest
    table's fillfactor is its owner's call (a backlog takes twice the disk): :func:`packed_outbox_fix`."""
    wanted = dict(OUTBOX_AUTOVACUUM)
    if isinstance(names.mapping, DebeziumMapping):
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


def outbox_ddl(names: OutboxNames, value_type: ValueType = "varchar") -> list[Statement]:
    """Statements that create the outbox, the dead-letter table and the notify trigger."""
    if value_type not in ("varchar", "bytea"):
        raise ConfigError(f"value type: {value_type!r} must be 'varchar' (goharvest) or 'bytea'")
    vtype = sql.SQL("BYTEA" if value_type == "bytea" else "VARCHAR")
    stmts: list[Statement] = []
    if names.schema:
        stmts.append(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(names.schema)))
    if isinstance(names.mapping, DebeziumMapping):
        stmts += debezium_outbox_ddl(names, names.mapping, value_type)
        return stmts + _companion_ddl(names, vtype)
    # goharvest's DDL (sh/init-outbox.sh) with the length limits dropped (they only get in the way),
    # create_time defaulted so writers may omit it, and pages left half empty (OUTBOX_FILLFACTOR).
    stmts.append(
        sql.SQL("""
        CREATE TABLE IF NOT EXISTS {outbox} (
          id                  BIGSERIAL PRIMARY KEY,
          create_time         TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
          kafka_topic         VARCHAR NOT NULL,
          kafka_key           VARCHAR NOT NULL,
          kafka_value         {vtype},
          kafka_header_keys   TEXT[] NOT NULL,
          kafka_header_values TEXT[] NOT NULL,
          leader_id           UUID
        ) WITH (fillfactor = {ff})""").format(outbox=names.outbox, vtype=vtype, ff=sql.Literal(OUTBOX_FILLFACTOR))
    )
    return stmts + _companion_ddl(names, vtype)


def debezium_outbox_ddl(names: OutboxNames, mapping: DebeziumMapping, value_type: ValueType) -> list[Statement]:
    """A Debezium outbox: the table in Debezium's convention if it does not exist yet (an existing one
    is kept as it is), then the relay's bookkeeping columns, each with a default, so the writers'
    INSERTs stay as they are. Rows written before ``init-db`` have no ``harvest_seq`` and are never
    relayed: they belong to the tool that relayed the table until then (docs/debezium.md)."""
    r = mapping.router
    payload = sql.SQL("BYTEA" if value_type == "bytea" else "JSONB")
    cols = [sql.SQL("{} UUID PRIMARY KEY").format(sql.Identifier(r.field_event_id))]
    seen = {r.field_event_id, r.field_event_payload}
    for col in (r.route_by_field, r.field_event_key, "type"):
        if col not in seen:
            seen.add(col)
            cols.append(sql.SQL("{} VARCHAR(255) NOT NULL").format(sql.Identifier(col)))
    cols.append(sql.SQL("{} {}").format(sql.Identifier(r.field_event_payload), payload))
    seq = names.debezium_sequence
    return [
        sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}) WITH (fillfactor = {})").format(
            names.outbox, sql.SQL(", ").join(cols), sql.Literal(OUTBOX_FILLFACTOR)
        ),
        sql.SQL("CREATE SEQUENCE IF NOT EXISTS {}").format(seq),
        sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} BIGINT").format(names.outbox, mapping.id()),
        sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET DEFAULT nextval({})").format(
            names.outbox, mapping.id(), sql.Literal(_regclass_text(names))
        ),
        sql.SQL("ALTER SEQUENCE {} OWNED BY {}.{}").format(seq, names.outbox, mapping.id()),
        sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} UUID").format(names.outbox, mapping.leader()),
        sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now()").format(
            names.outbox, mapping.created()
        ),
        sql.SQL("CREATE UNIQUE INDEX IF NOT EXISTS {} ON {} ({})").format(
            sql.Identifier(names.debezium_seq_index), names.outbox, mapping.id()
        ),
        # The half-empty pages (OUTBOX_FILLFACTOR) unless the owner chose a fillfactor: init_db, missing_storage.
    ]


def _regclass_text(names: OutboxNames) -> str:
    """The sequence's name as nextval() reads it (a quoted, schema-qualified identifier)."""
    seq = _derived(names.table, "_harvest_seq")
    quoted = '"' + seq.replace('"', '""') + '"'
    return ('"' + names.schema.replace('"', '""') + '".' + quoted) if names.schema else quoted


def _companion_ddl(names: OutboxNames, vtype: sql.Composable) -> list[Statement]:
    """The dead-letter table, the fence and ACK-intent tables, the attempt counts and the NOTIFY
    trigger, for any table mapping."""
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
    # deadLetterPolicy: haltKey probes the dead letters by (topic, key) for every row it marks (producer.key_halt).
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
    # The layout of the relays running on the outbox (producer/layout.py): empty until the first starts.
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
    from harvest_outbox.producer.shards import check_shard_count, shard_expression

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
) -> OutboxNames:
    """Create (idempotently, in one transaction) everything the relay needs. Returns the names.
    ``shards`` > 1 also creates what sharded relays need (:func:`shard_ddl`). Refuses a SQL_ASCII
    database (:func:`require_utf8_readable`). With a Debezium ``mapping`` an existing table is kept
    and only gains the relay's columns (its payload column's type then decides ``value_type``)."""
    names = OutboxNames.parse(outbox_table, mapping)

    def run(conn: psycopg.Connection) -> None:
        require_utf8_readable(conn)
        vtype = value_type
        if isinstance(mapping, DebeziumMapping):
            cols = _column_types(conn, names)
            if cols is not None:
                vtype = "bytea" if cols.get(mapping.router.field_event_payload) == "bytea" else "varchar"
        with conn.transaction():
            for stmt in outbox_ddl(names, vtype) + shard_ddl(names, shards):
                conn.execute(stmt)
            missing = missing_storage(conn, names)  # only what the table lacks: an owner's value is kept
            if missing:
                conn.execute(storage_sql(names, missing))
        if isinstance(mapping, DebeziumMapping):
            inspect_outbox(conn, names)  # the router's columns exist, with types rendered as Debezium does

    if isinstance(conninfo_or_conn, psycopg.Connection):
        run(conninfo_or_conn)
        return names
    with psycopg.connect(conninfo_or_conn) as conn:
        run(conn)
    return names


_EXPECTED = {
    "id",
    "create_time",
    "kafka_topic",
    "kafka_key",
    "kafka_value",
    "kafka_header_keys",
    "kafka_header_values",
    "leader_id",
}


def _column_types(conn: psycopg.Connection, names: OutboxNames) -> dict[str, str] | None:
    """The outbox's columns and their types (``format_type`` without modifiers), None if no table."""
    row = conn.execute("SELECT to_regclass(%s)::oid", (names.outbox.as_string(conn),)).fetchone()
    if row is None or row[0] is None:
        return None
    return dict(
        conn.execute(
            "SELECT attname, format_type(atttypid, NULL) FROM pg_attribute "
            "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped",
            (row[0],),
        ).fetchall()
    )


def inspect_outbox(conn: psycopg.Connection, names: OutboxNames) -> ValueType:
    """Check the outbox has the columns its table mapping reads; return the value column's type."""
    cols = _column_types(conn, names)
    if cols is None:
        raise SchemaError(
            f"outbox table {names.display!r} does not exist; create it with "
            f"`harvest init-db` (or producer.schema.init_db)"
        )
    if isinstance(names.mapping, DebeziumMapping):
        return _inspect_debezium(names, names.mapping, cols)
    missing = _EXPECTED - cols.keys()
    if missing:
        raise SchemaError(
            f"outbox table {names.display!r} lacks column(s) {', '.join(sorted(missing))}; "
            f"expected goharvest's schema ({', '.join(sorted(_EXPECTED))})"
        )
    return "bytea" if cols["kafka_value"] == "bytea" else "varchar"


def _inspect_debezium(names: OutboxNames, mapping: DebeziumMapping, cols: dict[str, str]) -> ValueType:
    r = mapping.router
    options = {
        r.field_event_id: "table.field.event.id",
        r.field_event_key: "table.field.event.key",
        r.field_event_payload: "table.field.event.payload",
        r.route_by_field: "route.by.field",
    }
    for a in r.additional:
        options.setdefault(a.column, "table.fields.additional.placement")
    partition = {a.column for a in r.additional if a.placement == "partition"}
    for col, option in options.items():
        if col not in cols:
            raise SchemaError(
                f"outbox table {names.display!r} has no column {col!r}, which the event router reads "
                f"({option}); set eventRouter.{option} to the column's name"
            )
        allowed = DEBEZIUM_PAYLOAD_TYPES if option == "table.field.event.payload" else DEBEZIUM_TEXT_TYPES
        if col in partition:
            allowed = frozenset({"integer"})  # the router reads the partition as an INT32
        if cols[col] not in allowed:
            raise SchemaError(
                f"outbox table {names.display!r}: column {col!r} ({option}) has type {cols[col]}, whose "
                f"Debezium rendering harvest does not reproduce byte for byte; supported: "
                f"{', '.join(sorted(allowed))}"
            )
    missing = {mapping.id_column, mapping.leader_column, mapping.created_column} - cols.keys()
    if missing:
        raise SchemaError(
            f"outbox table {names.display!r} lacks the relay's column(s) {', '.join(sorted(missing))}; "
            f"run `harvest init-db` with tableMapping: debezium (idempotent; it adds them with "
            f"defaults, so the writers' INSERTs do not change)"
        )
    return "bytea" if cols[r.field_event_payload] == "bytea" else "varchar"


def require_utf8_readable(conn: psycopg.Connection) -> None:
    """Refuse a SQL_ASCII database. The relay reads as UTF-8, and Postgres checks SQL_ASCII text
    (stored unchecked) against UTF-8 on the way out: one row holding a byte that is not UTF-8 fails
    the whole statement, so every mark would fail and no row would go out, not even earlier ones.
    Other server encodings convert to UTF-8 cleanly. The server reports its encoding when the
    connection starts: no query."""
    encoding = conn.info.parameter_status("server_encoding")
    if encoding == "SQL_ASCII":
        raise SchemaError(
            f"database {conn.info.dbname!r} has encoding SQL_ASCII: Postgres stores its text unchecked, and one "
            f"byte that is not UTF-8 in an outbox row (topic, key, value or a header) would fail every mark, so no "
            f"row would be delivered. Fix: keep the outbox in a UTF8 database (CREATE DATABASE ... ENCODING 'UTF8' "
            f"TEMPLATE template0, then move the tables there with pg_dump/pg_restore); other encodings (LATIN1, ...) "
            f"work as they are"
        )


def require_attempts_table(conn: psycopg.Connection, names: OutboxNames) -> None:
    """The relay refuses to run without the delivery-attempts table rather than silently counting
    attempts in memory only (a crash loop on a row would then never park it), and without the
    state row's ``last_clock`` (the UUID clock floor of ``--uuid-sequencing``)."""
    row = conn.execute("SELECT to_regclass(%s)::oid", (names.delivery_attempts.as_string(conn),)).fetchone()
    if row is None or row[0] is None:
        raise SchemaError(
            f"table {names.delivery_attempts.as_string(conn)} (delivery-attempt counts, which make "
            f"maxDeliveryAttempts survive relay restarts) does not exist: the outbox {names.display!r} "
            f"was initialised by an older harvest. Fix: run `harvest init-db` again (idempotent; it only "
            f"adds what is missing)"
        )
    row = conn.execute(
        "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = 'last_clock' AND NOT attisdropped",
        (names.state.as_string(conn),),
    ).fetchone()
    if row is None:
        raise SchemaError(
            f"{names.state.as_string(conn)} lacks column last_clock (the UUID clock floor that keeps "
            f"--uuid-sequencing clocks rising across leaders): the outbox {names.display!r} was "
            f"initialised by an older harvest. Fix: run `harvest init-db` again (idempotent)"
        )


def require_shards(conn: psycopg.Connection, names: OutboxNames, count: int) -> None:
    """A sharded relay refuses to run without its shard index (every mark would scan the outbox) and
    the shards' fence rows."""
    row = conn.execute(
        "SELECT to_regclass(%s)::oid", (names._ident(names.shard_index_name(count)).as_string(conn),)
    ).fetchone()
    if row is None or row[0] is None:
        old = names.old_shard_index_name(count)
        if conn.execute("SELECT to_regclass(%s)", (names._ident(old).as_string(conn),)).fetchone() != (None,):
            raise SchemaError(
                f"the shard index {old} of the outbox {names.display!r} was built by an older harvest, "
                f"on an expression that leaves rows with a NULL kafka_key in no shard (never sent, never "
                f"dead-lettered). Fix: run `harvest init-db` with shards: {count} in the config "
                f"(idempotent): it builds {names.shard_index_name(count)} and drops {old}; every other "
                f"row keeps its shard"
            )
    have_rows = None
    if row is not None and row[0] is not None:
        try:
            have_rows = conn.execute(
                sql.SQL("SELECT count(*) FROM {} WHERE shard_count = %s").format(names.shard_state), (count,)
            ).fetchone()
        except psycopg.errors.UndefinedTable:
            have_rows = None
    if row is None or row[0] is None or have_rows is None or int(have_rows[0]) != count:
        raise SchemaError(
            f"the outbox {names.display!r} is not initialised for shards: {count} (the shard index "
            f"{names.shard_index_name(count)} and the shards' fence rows are missing). Fix: run "
            f"`harvest init-db` with shards: {count} in the config (idempotent)"
        )
