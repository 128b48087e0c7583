"""The mark: goharvest's statement that claims the next rows of the outbox for a leader view, and the row it returns.

``UPDATE … SET leader_id=$leader WHERE ctid = ANY(ARRAY(SELECT ctid … WHERE leader_id IS NULL OR
leader_id <> $leader ORDER BY id LIMIT n)) RETURNING …`` (rows addressed by ``ctid``, see
:func:`mark_sql`). No ``FOR UPDATE SKIP LOCKED``: rows are only ever contended by a zombie leader, and
stealing them is exactly what salvaging a dead leader's rows means; blocking briefly on its row lock is
harmless.

Invariants:
- every mark scans from the start of the outbox (or of each led shard): a row committed late (a long
  transaction's, lower id) goes out in the next mark, before any later row of its key
  (tests/test_producer/relay/test_relay.py);
- the marked rows come back in id order, each a :data:`MarkedRow` in its final shape (no per-row work
  in Python), with why a row can never be produced decided by the statement (``bad``) and its
  persisted failed-attempt count joined in the same statement;
- with ``deadLetterPolicy: haltKey`` the mark leaves the rows of a (topic, key) that has a dead letter.
"""

from __future__ import annotations

from psycopg import sql

from harvest_outbox.producer.relay.key_halt import halted_filter

# The row the mark returns, re-exported where it was defined before it got a module of its own.
from harvest_outbox.producer.relay.marked_row import ROW_CREATED as ROW_CREATED
from harvest_outbox.producer.relay.marked_row import MarkedRow as MarkedRow
from harvest_outbox.producer.relay.shards import shard_expression
from harvest_outbox.producer.schema import OutboxNames, ValueType

# Persisted failed delivery attempts of marked rows: id -> (attempts, last error).
MarkedAttempts = dict[int, tuple[int, "str | None"]]


# Why a marked row can never be produced, decided in the mark statement (NULL for a good row): the
# relay thread then checks one value per row instead of five. Its texts are the dead letters' errors.
# Two steps, so a row without headers (nearly every row) costs no array function: the table mapping's
# RecordSql.bad, in the UPDATE's RETURNING, tests only NULLs and the topic; HEADER_BAD runs on the returned rows and only
# for a row with a header array that is not empty (``hk``/``hv``: the arrays, NULL when empty). Each
# array function detoasts (copies) its array: five of them on every row were 8 % of a 5,000-row mark.
# Multi-dimensional arrays are refused before array_position, which would raise on them.
HEADER_BAD = """CASE
  WHEN m.bad IS NOT NULL OR (m.hk IS NULL AND m.hv IS NULL) THEN m.bad
  WHEN array_ndims(m.hk) > 1 OR array_ndims(m.hv) > 1 THEN
    'header arrays are multi-dimensional: ' || coalesce(m.hk::text, '{}') || ' / ' || coalesce(m.hv::text, '{}')
    || '; use one-dimensional text arrays'
  WHEN coalesce(cardinality(m.hk), 0) <> coalesce(cardinality(m.hv), 0) THEN
    'header arrays differ in length: ' || coalesce(cardinality(m.hk), 0) || ' key(s) ' || coalesce(m.hk::text, '{}')
    || ' but ' || coalesce(cardinality(m.hv), 0) || ' value(s); each header needs one key and one value'
  WHEN array_position(m.hk, NULL) IS NOT NULL THEN
    'kafka_header_keys contains NULL: header names must not be NULL'
END"""


def mark_sql(
    names: OutboxNames, value_type: ValueType, shard_count: int | None, shards: frozenset[int], halt_keys: bool
) -> sql.Composed:
    """The mark of ``names``' outbox (of its ``shards`` when ``shard_count`` is set), its text and values
    read as ``value_type``; parameters ``leader``, ``n`` (the limit) and ``t0`` (the relay's
    ``time.monotonic()`` just before sending it)."""
    # goharvest's mark, with the rows addressed by ctid (a TID scan) instead of a second
    # primary-key probe per row (``id IN (SELECT id …)``): half the database work per marked
    # row (bench/bench_relay.py measures both). A row updated by someone else between the
    # subquery and the UPDATE has moved to a new ctid and is simply left for the next mark.
    # Sharded, the subquery reads the led shards' rows from the (shard, id) index.
    o, m = names.outbox, names.mapping
    oid, leader, mine = m.id(), m.leader(), m.claimable("AND")
    if halt_keys:  # the claim's outbox is ``c``; see producer.relay.key_halt
        c = m.record("c", value_type)
        mine = sql.Composed([mine, halted_filter(names, c.topic, c.key)])
    if shard_count is None:
        claim: sql.Composable = sql.SQL(
            "SELECT ctid FROM {o} AS c WHERE ({l} IS NULL OR {l} <> %(leader)s){mine} ORDER BY {id} LIMIT %(n)s"
        ).format(o=o, l=leader, id=oid, mine=mine)
    else:
        # One index range per led shard, merged in id order (a Merge Append of the (shard, id)
        # index scans): a relay leading several shards never reads other shards' rows.
        expr = shard_expression(shard_count, m.shard_key())
        branches = [
            sql.SQL(
                "(SELECT ctid, {id} AS id FROM {o} AS c WHERE {e} = {k} AND ({l} IS NULL OR {l} <> "
                "%(leader)s){mine} ORDER BY {id} LIMIT %(n)s)"
            ).format(o=o, e=expr, k=sql.Literal(k), l=leader, id=oid, mine=mine)
            for k in sorted(shards)
        ] or [sql.SQL("(SELECT ctid, {id} AS id FROM {o} WHERE false)").format(o=o, id=oid)]
        claim = sql.SQL("SELECT ctid FROM ({}) AS led ORDER BY id LIMIT %(n)s").format(
            sql.SQL(" UNION ALL ").join(branches)
        )
    # Sorted by Postgres, and each row in its final shape (MarkedRow): the relay's thread, which
    # holds the GIL while it turns the result into Python objects, does no per-row work after
    # the driver (slicing and sorting 5,000 rows in Python cost ~3 ms a mark, on the critical path).
    # The create time comes back on the relay's time.monotonic() clock: %(t0)s (the relay's reading
    # just before sending the mark) minus the row's age at the statement's start on the database's
    # own clock, so neither host's wall clock (nor their skew) enters a dwell. A row without one
    # (NULL) counts from its mark. One float per row, no per-row work in Python.
    return sql.SQL("""
        WITH m AS (
          UPDATE {o} AS o SET {l} = %(leader)s
          WHERE ctid = ANY(ARRAY({claim}))
          RETURNING {oid} AS id, {t} AS t, {k} AS k, {v} AS v, {hk} AS hk, {hv} AS hv, {row_bad} AS bad,
                    {p} AS p, {c} AS c)
        SELECT m.id, m.t, m.k, m.v, m.hk, m.hv, {header_bad}, a.attempts, a.last_error::text, m.p,
               %(t0)s::float8 - coalesce(date_part('epoch', statement_timestamp() - m.c), 0)
        FROM m LEFT JOIN {a} AS a ON a.id = m.id ORDER BY m.id""").format(
        o=o,
        l=leader,
        claim=claim,
        **read_row_fields(names, value_type),
    )


def read_row_fields(names: OutboxNames, value_type: ValueType) -> dict[str, sql.Composable]:
    """The placeholders every statement that reads rows as :data:`MarkedRow` fills (the outbox aliased
    ``o``): the mark's, and the cursor layout's read and release (producer/layouts/cursor/database.py)."""
    m = names.mapping
    rec = m.record("o", value_type)
    return {
        "oid": m.id("o"),
        "t": rec.topic,
        "k": rec.key,
        "v": rec.value,
        "hk": rec.header_keys,
        "hv": rec.header_values,
        "row_bad": rec.bad,
        "p": rec.partition,
        "c": m.created("o"),
        "header_bad": sql.SQL(HEADER_BAD),
        "a": names.delivery_attempts,
    }
