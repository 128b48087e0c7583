"""What the relay checks of the outbox's database before it runs a statement there: the outbox's columns
and types, a readable encoding, the tables ``init-db`` adds, and those of a sharded relay.

Invariant: each check refuses with a :class:`~producer.errors.SchemaError` that names what is missing
and the fix (usually: run ``harvest init-db`` again, which is idempotent), rather than letting the relay
run on a database where it would fail row by row or lose a guarantee.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from harvest_outbox.producer.errors import SchemaError
from harvest_outbox.producer.mapping.names import OutboxNames, ValueType


def column_types(conn: psycopg.Connection, names: OutboxNames) -> dict[str, str] | None:
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
    cols = column_types(conn, names)
    if cols is None:
        raise SchemaError(
            f"outbox table {names.display!r} does not exist; create it with `harvest init-db` (or producer.init_db)"
        )
    return names.mapping.check_columns(conn, names, cols)


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


def unrelayed_rows(conn: psycopg.Connection, names: OutboxNames) -> int:
    """Rows of a mapped outbox the relay does not own (written before ``init-db`` added its columns)."""
    cond = names.mapping.relayed()
    if cond is None:
        return 0
    row = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE NOT ({})").format(names.outbox, cond)).fetchone()
    return int(row[0]) if row else 0
