"""``harvest check``: an outbox's queue-table hygiene, one finding per line, each with its fix.

Reads the catalog and the statistics views (and counts the backlog); changes nothing. A finding is
``OK``, ``WARN`` (the relay works, worse than it could: marks step over dead rows, a stasher's commit
waits for the idle poll, an unused index costs every insert) or ``FAIL`` (the relay refuses to start,
or a part of its work fails or scans the whole outbox). The fixes are statements to run, or
``harvest init-db``, which only adds what is missing and never overwrites a storage parameter its
owner set (docs/hygiene.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, NamedTuple

import psycopg
from psycopg import sql

from harvest_outbox.producer.config import HarvestConfig, format_duration
from harvest_outbox.producer.errors import ConfigError, SchemaError
from harvest_outbox.producer.layouts.choice import layout_of
from harvest_outbox.producer.layouts.cursor.schema import range_partitions
from harvest_outbox.producer.schema import (
    OUTBOX_AUTOVACUUM,
    OutboxNames,
    inspect_outbox,
    missing_storage,
    packed_outbox_fix,
    require_attempts_table,
    require_shards,
    storage_sql,
    table_reloptions,
)

Level = Literal["OK", "WARN", "FAIL"]
_INIT_DB = "run `harvest init-db` with this config (idempotent: it only adds what is missing)"
#: Dead rows that are worth a warning when they also outnumber the live ones: autovacuum (at 1,000 dead
#: rows with OUTBOX_AUTOVACUUM) is not keeping up, or something stops it from removing them.
DEAD_ROWS_WARNING = 100_000
_SHARD_INDEX = re.compile(r"_shard(\d+)(_v2)?_idx$")


@dataclass(frozen=True)
class Finding:
    level: Level
    subject: str
    message: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.level:<4} {self.subject}: {self.message}" + (f"; fix: {self.fix}" if self.fix else "")


class _Index(NamedTuple):
    name: str
    valid: bool
    first_column: str | None  # None: an expression


def check_outbox(conn: psycopg.Connection, config: HarvestConfig) -> list[Finding]:
    """The findings for ``config``'s outbox (its table mapping and shards), in the order to fix them."""
    names = OutboxNames.parse(config.outbox_table, config.table_mapping)
    try:
        value_type = inspect_outbox(conn, names)
    except SchemaError as exc:
        return [Finding("FAIL", "table", str(exc))]
    try:
        layout = layout_of(conn, names, config)  # outboxLayout unset: the table's
        layout.require(conn, names)
    except (SchemaError, ConfigError) as exc:
        return [Finding("FAIL", "layout", str(exc))]
    return layout.check(_Findings(conn, names, config, value_type))


@dataclass(frozen=True)
class _Findings:
    """The findings of each layout (:class:`~producer.layouts.layout.LayoutChecks`): the layout picks its own."""

    conn: psycopg.Connection
    names: OutboxNames
    config: HarvestConfig
    value_type: str

    def mark_layout(self) -> list[Finding]:
        return _mark_layout(self.conn, self.names, self.config, self.value_type)

    def cursor_layout(self) -> list[Finding]:
        return _cursor_layout(self.conn, self.names, self.config, self.value_type)


def _mark_layout(conn: psycopg.Connection, names: OutboxNames, config: HarvestConfig, value_type: str) -> list[Finding]:
    """``outboxLayout: mark``: the table, its storage and indexes, the trigger, the companions, the activity."""
    kind = names.mapping.kind
    found = [Finding("OK", "table", f"{names.display} exists ({kind} table, value type {value_type})")]
    found += _storage(conn, names)
    found += _indexes(conn, names, config.shards)
    found.append(_trigger(conn, names, config))
    found += _companions(conn, names, config)
    found += _activity(conn, names, config)
    return found


def _cursor_layout(
    conn: psycopg.Connection, names: OutboxNames, config: HarvestConfig, value_type: str
) -> list[Finding]:
    """``outboxLayout: cursor``: the partitions, the trigger, the companions and the cursor's backlog (the
    mark layout's storage, index and dead-row findings do not apply: rows are never updated or deleted)."""
    from harvest_outbox.producer.layouts.cursor.database import backlog_sql
    from harvest_outbox.producer.layouts.cursor.schema import require_cursor_rows

    parts = range_partitions(conn, names)
    span = f", ids [{parts[0][0]}, {parts[-1][1]})" if parts else ""
    found = [
        Finding(
            "OK",
            "table",
            f"{names.display} exists ({names.mapping.kind} table, cursor layout, {len(parts)} id-range partition(s)"
            f"{span}, value type {value_type})",
        )
    ]
    found.append(_trigger(conn, names, config))
    found += _companions(conn, names, config)
    count = config.shards
    try:
        require_cursor_rows(conn, names, count)
    except SchemaError as exc:
        return [*found, Finding("FAIL", "cursor", str(exc))]
    if count > 1:
        try:
            require_shards(conn, names, count)
            found.append(
                Finding("OK", "index", f"{names.shard_index_name(count)} (shards: {count}) and the fence rows")
            )
        except SchemaError as exc:
            found.append(Finding("FAIL", "index", str(exc)))
            return found
    per_shard = conn.execute(
        backlog_sql(names, count if count > 1 else None), {"shards": list(range(count))}
    ).fetchall()
    rows = sum(int(r[1]) for r in per_shard)
    ages = [float(r[2]) for r in per_shard if r[2] is not None]
    age = "" if not ages else f", the oldest {format_duration(max(0.0, max(ages)))} old"
    shards = "" if count == 1 else " (" + ", ".join(f"shard {r[0]}: {r[1]}" for r in per_shard) + ")"
    found.append(Finding("OK", "backlog", f"{rows} row(s) the committed cursor has not passed{age}{shards}"))
    if config.dead_letter_policy == "haltKey":
        found.append(_held(conn, names))
    return found


def _held(conn: psycopg.Connection, names: OutboxNames) -> Finding:
    """haltKey on the cursor layout: the held rows' table (producer/layouts/cursor/held.py) and what it holds."""
    table = names.held.as_string(conn)
    if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() in (None, (None,)):
        return Finding(
            "FAIL",
            "held rows",
            f"{table} is missing (the outbox predates it); the relay refuses haltKey without it",
            "run `harvest init-db` (it adds the table)",
        )
    row = conn.execute(
        sql.SQL("SELECT count(*), count(DISTINCT (kafka_topic, kafka_key)) FROM {}").format(names.held)
    ).fetchone()
    rows, keys = (int(row[0]), int(row[1])) if row else (0, 0)
    return Finding("OK", "held rows", f"{rows} row(s) of {keys} halted or held key(s) wait in {table}")


def _storage(conn: psycopg.Connection, names: OutboxNames) -> list[Finding]:
    table, options = names.outbox.as_string(conn), table_reloptions(conn, names.outbox)
    packed = packed_outbox_fix(conn, names)
    found = [
        Finding("WARN", "fillfactor", packed)
        if packed is not None
        else Finding("OK", "fillfactor", f"{options.get('fillfactor', '100')} (a mark updates its rows in their page)")
    ]
    if options.get("autovacuum_enabled", "true").lower() in ("false", "off", "no", "0"):
        found.append(
            Finding(
                "WARN",
                "autovacuum",
                f"off for {names.display} (autovacuum_enabled = "
                f"{options['autovacuum_enabled']}): its dead rows are never removed, and every mark "
                f"steps over more of them",
                f"ALTER TABLE {table} RESET (autovacuum_enabled)",
            )
        )
    if conn.execute("SHOW autovacuum").fetchone() == ("off",):
        found.append(
            Finding(
                "WARN",
                "autovacuum",
                "the server's autovacuum is off: no table is vacuumed unless someone runs VACUUM",
                "set autovacuum = on in postgresql.conf and reload",
            )
        )
    missing = {k: v for k, v in missing_storage(conn, names).items() if k in OUTBOX_AUTOVACUUM}
    if missing:
        found.append(
            Finding(
                "WARN",
                "autovacuum",
                f"{names.display} lacks the queue-table setting(s) "
                f"{', '.join(missing)} (vacuum and analyze after 1,000 changed rows, not a share of the "
                f"table: docs/hygiene.md)",
                f"{_INIT_DB}, or `{storage_sql(names, missing).as_string(conn)}`",
            )
        )
    else:
        found.append(Finding("OK", "autovacuum", ", ".join(f"{k} = {options[k]}" for k in OUTBOX_AUTOVACUUM)))
    return found


def _index_list(conn: psycopg.Connection, table: sql.Identifier) -> list[_Index]:
    rows = conn.execute(
        "SELECT c.relname, i.indisvalid, a.attname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] "
        "WHERE i.indrelid = to_regclass(%s) ORDER BY c.relname",
        (table.as_string(conn),),
    ).fetchall()
    return [_Index(name, bool(valid), column) for name, valid, column in rows]


def _indexes(conn: psycopg.Connection, names: OutboxNames, shards: int) -> list[Finding]:
    table = names.outbox.as_string(conn)
    indexes = _index_list(conn, names.outbox)
    found = []
    for ix in indexes:
        if not ix.valid:  # a CREATE INDEX CONCURRENTLY that failed: never read, yet every insert updates it
            found.append(
                Finding(
                    "WARN",
                    "index",
                    f"{ix.name} is invalid (a failed CREATE INDEX CONCURRENTLY?): "
                    f"no query reads it, every insert still updates it",
                    f"REINDEX INDEX {names.qualified(ix.name).as_string(conn)}",
                )
            )
    id_column = names.mapping.id_column
    on_id = [ix.name for ix in indexes if ix.valid and ix.first_column == id_column]
    if on_id:
        found.append(Finding("OK", "index", f"{on_id[0]} on {id_column} (the mark reads rows in its order)"))
    else:
        built = names.mapping.id_index(names)  # init-db's index, or the table's primary key (its owner's)
        fix = _INIT_DB + f" (it builds {built})" if built else f"ALTER TABLE {table} ADD PRIMARY KEY ({id_column})"
        found.append(
            Finding(
                "FAIL",
                "index",
                f"no valid index of {names.display} starts with {id_column}: every "
                f"mark sorts the whole outbox and every purge scans it",
                fix,
            )
        )
    wanted = names.shard_index_name(shards) if shards > 1 else None
    if wanted is not None:
        try:
            require_shards(conn, names, shards)
            found.append(Finding("OK", "index", f"{wanted} (shards: {shards}) and the shards' fence rows"))
        except SchemaError as exc:
            found.append(Finding("FAIL", "index", str(exc)))
    for ix in indexes:
        m = _SHARD_INDEX.search(ix.name)
        count = int(m.group(1)) if m else 0
        if (
            ix.name == wanted
            or not m
            or ix.name not in (names.shard_index_name(count), names.old_shard_index_name(count))
        ):
            continue
        why = (
            f"built by an older harvest for shards: {count}"
            if m.group(2) is None
            else f"serves relays of shards: {count}, not this config's shards: {shards}"
        )
        found.append(
            Finding(
                "WARN",
                "index",
                f"{ix.name} is {why}: no relay of this config reads it, every insert updates it",
                f"DROP INDEX {names.qualified(ix.name).as_string(conn)} once no relay runs with shards: {count}",
            )
        )
    return found


def _trigger(conn: psycopg.Connection, names: OutboxNames, config: HarvestConfig) -> Finding:
    """The wake-up: the NOTIFY trigger as ``wakeup`` wants it (present for ``notify``, absent for ``poll``),
    and, ``wakeup`` left unset, whether the server allows the prepared transactions it breaks."""
    from harvest_outbox.producer.relay.two_phase import TWO_PHASE_FIX, notify_breaks_two_phase, prepared_transactions

    trigger = names.notify_trigger.as_string(conn)
    row = conn.execute(
        "SELECT t.tgenabled, t.tgargs, p.proname FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid "
        "WHERE t.tgrelid = to_regclass(%s) AND t.tgname = %s",
        (names.outbox.as_string(conn), names.notify_trigger_name),
    ).fetchone()
    # Measured (tests/test_producer/relay/test_two_phase.py): an idle relay without NOTIFY marks every
    # min(idlePollInterval, minPollInterval), 100ms by default.
    poll = format_duration(min(config.limits.idle_poll_interval, config.limits.min_poll_interval))
    slow = f"the relay learns of new rows only by polling (every {poll}: limits.idlePollInterval, minPollInterval)"
    if config.wakeup_mode == "poll":
        if row is None:
            return Finding(
                "OK",
                "trigger",
                f"no NOTIFY trigger on {names.display} (wakeup: poll): writers may PREPARE TRANSACTION; "
                f"the relay polls every {poll}",
            )
        return Finding(
            "FAIL",
            "trigger",
            f"{trigger} NOTIFYs on every INSERT although wakeup is poll: a writer that inserts a row and then "
            f"runs PREPARE TRANSACTION fails ('cannot PREPARE a transaction that has executed LISTEN, UNLISTEN, "
            f"or NOTIFY')",
            _INIT_DB + " (with wakeup: poll it drops the trigger)",
        )
    if row is None:
        return Finding(
            "WARN", "trigger", f"no NOTIFY trigger {trigger} on {names.display}: {slow}", _INIT_DB + ", or wakeup: poll"
        )
    enabled, args, function = row
    channel = bytes(args).split(b"\0")[0].decode(errors="replace")
    if enabled in ("D", "R"):
        state = "fires only in replica sessions" if enabled == "R" else "is disabled"
        return Finding(
            "WARN",
            "trigger",
            f"{trigger} {state}: {slow}",
            f"ALTER TABLE {names.outbox.as_string(conn)} ENABLE TRIGGER {trigger}",
        )
    if function != "harvest_notify" or channel != names.channel:
        return Finding(
            "WARN",
            "trigger",
            f"{trigger} notifies {channel!r} through {function}(), not the relay's "
            f"channel {names.channel!r} (a renamed table?): {slow}",
            _INIT_DB + " (it recreates the trigger)",
        )
    if not config.wakeup:
        risk = notify_breaks_two_phase(prepared_transactions(conn), names.display)
        if risk is not None:
            return Finding("WARN", "trigger", f"{trigger} notifies {names.channel!r}, but {risk}", TWO_PHASE_FIX)
    return Finding("OK", "trigger", f"{trigger} notifies {names.channel!r} after each INSERT statement")


def _exists(conn: psycopg.Connection, table: sql.Identifier) -> bool:
    return conn.execute("SELECT to_regclass(%s)", (table.as_string(conn),)).fetchone() != (None,)


def _companions(conn: psycopg.Connection, names: OutboxNames, config: HarvestConfig) -> list[Finding]:
    tables = [names.dead_letters, names.delivery_attempts, names.state, names.ack_intents, names.layout]
    missing = [t.as_string(conn) for t in tables if not _exists(conn, t)]
    if missing:
        return [
            Finding(
                "FAIL",
                "tables",
                f"missing: {', '.join(missing)} (the relay refuses to start or cannot park a dead letter without them)",
                _INIT_DB,
            )
        ]
    try:
        require_attempts_table(conn, names)  # also the state row's last_clock
    except SchemaError as exc:
        return [Finding("FAIL", "tables", str(exc))]
    found = [Finding("OK", "tables", ", ".join(t.as_string(conn) for t in tables))]
    dead_indexes = {ix.name for ix in _index_list(conn, names.dead_letters)}
    if config.dead_letter_policy == "haltKey" and names.dead_key_index_name not in dead_indexes:
        found.append(
            Finding(
                "WARN",
                "tables",
                f"{names.dead_letters.as_string(conn)} has no index on (kafka_topic, kafka_key): "
                f"deadLetterPolicy: haltKey reads the dead letters for every row a mark claims",
                _INIT_DB,
            )
        )
    if config.dead_letter_retention is not None and names.dead_time_index_name not in dead_indexes:
        found.append(
            Finding(
                "WARN",
                "tables",
                f"{names.dead_letters.as_string(conn)} has no index on dead_time: "
                f"deadLetterRetention reads the whole table to find expired dead letters",
                _INIT_DB,
            )
        )
    return found


def vacuum_finding(table: str, live: int, dead: int, last_vacuum_age: float | None) -> Finding:
    """The outbox's dead rows (``pg_stat_user_tables``) and the age of its last (auto)vacuum, judged."""
    when = "never vacuumed" if last_vacuum_age is None else f"last vacuumed {format_duration(last_vacuum_age)} ago"
    text = f"{dead} dead / {live} live rows, {when}"
    if dead >= DEAD_ROWS_WARNING and dead > live:
        return Finding(
            "WARN",
            "vacuum",
            f"{text}: vacuum is not keeping up, or cannot remove them",
            f"look for what holds back the xmin horizon (a long-open transaction in pg_stat_activity, "
            f"a replication slot's xmin in pg_replication_slots); `VACUUM (VERBOSE) {table}` says how "
            f"many dead rows it could not remove yet",
        )
    return Finding("OK", "vacuum", text)


def _activity(conn: psycopg.Connection, names: OutboxNames, config: HarvestConfig) -> list[Finding]:
    m = names.mapping
    row = conn.execute(
        sql.SQL("SELECT count(*), extract(epoch FROM now() - min({c})) FROM {o}{w}").format(
            c=m.created(), o=names.outbox, w=m.claimable()
        )
    ).fetchone()
    rows, oldest = (int(row[0]), row[1]) if row else (0, None)
    age = "" if oldest is None else f", the oldest {format_duration(max(0.0, float(oldest)))} old"
    found = [Finding("OK", "backlog", f"{rows} row(s) to relay{age}")]
    row = conn.execute(
        sql.SQL("SELECT count(*), extract(epoch FROM now() - min(dead_time)) FROM {}").format(names.dead_letters)
    ).fetchone()
    dead, oldest = (int(row[0]), row[1]) if row else (0, None)
    kept = (
        "kept until requeued (deadLetterRetention: keep)"
        if config.dead_letter_retention is None
        else f"deleted {format_duration(config.dead_letter_retention)} after parking (deadLetterRetention)"
    )
    age = "" if oldest is None else f", the oldest parked {format_duration(max(0.0, float(oldest)))} ago"
    found.append(Finding("OK", "dead letters", f"{dead}{age}; {kept}"))
    if config.dead_letter_policy == "haltKey":
        row = conn.execute(
            sql.SQL(
                "SELECT count(DISTINCT (kafka_topic, kafka_key)) FROM {} "
                "WHERE kafka_topic IS NOT NULL AND kafka_key IS NOT NULL"
            ).format(names.dead_letters)
        ).fetchone()
        halted = int(row[0]) if row else 0
        if halted:
            found.append(
                Finding(
                    "WARN",
                    "halted keys",
                    f"{halted} key(s) halted behind dead letters (deadLetterPolicy: haltKey): their rows wait",
                    "`harvest dead-letters keys` lists them; fix, then `requeue` or `discard` (docs/dead-letters.md)",
                )
            )
        else:
            found.append(Finding("OK", "halted keys", "none (deadLetterPolicy: haltKey)"))
    row = conn.execute(
        "SELECT n_live_tup, n_dead_tup, extract(epoch FROM now() - greatest(last_vacuum, "
        "last_autovacuum)) FROM pg_stat_user_tables WHERE relid = to_regclass(%s)",
        (names.outbox.as_string(conn),),
    ).fetchone()
    if row is not None:
        found.append(
            vacuum_finding(
                names.outbox.as_string(conn), int(row[0]), int(row[1]), None if row[2] is None else float(row[2])
            )
        )
    return found


def exit_code(findings: list[Finding]) -> int:
    """0 when nothing FAILs, else 1."""
    return 1 if any(f.level == "FAIL" for f in findings) else 0
