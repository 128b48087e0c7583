"""The relay's statements on rows it names by id: purge, reset, dead-letter, and the delivery-attempt counts.

- purge: ``DELETE … WHERE id = ANY($ids)``, many ids per statement;
- reset: ``UPDATE … SET leader_id = NULL WHERE id = ANY($ids)``;
- dead-letter: one statement (a CTE) that deletes from the outbox and inserts into the dead-letter
  table, and forgets the row's delivery-attempt count;
- attempts: failed attempts are upserted (``GREATEST`` of the stored and the new count), and deleted
  when the row is purged, committed or dead-lettered.

Invariants:
- a dead-lettered row is never in both tables or neither (one statement);
- an attempt count never decreases;
- every id list is read through :data:`ANY_IDS` (a runtime array, planned as one index scan).
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from harvest_outbox.producer.schema import OutboxNames, ValueType

# The id arrays are read through a scalar subquery (an InitPlan): as a constant, or as a
# parameter of a custom plan, Postgres estimated the selectivity of each of its thousands of
# elements while planning (~0.8 ms for 5,000 ids, as long as a quarter of the DELETE itself);
# through the subquery it plans an index scan of a runtime array at once.
ANY_IDS = sql.SQL("ANY(CAST((SELECT %s::bigint[]) AS bigint[]))")


def id_array(ids: Sequence[int]) -> str:
    """A bigint[] literal: much cheaper to build than letting the driver dump a list element-wise."""
    return "{" + ",".join(map(str, ids)) + "}"


def purge_sql(names: OutboxNames) -> sql.Composed:
    """Delete the rows of ids ``%s`` (an :func:`id_array`)."""
    return sql.SQL("DELETE FROM {} WHERE {} = {ids}").format(names.outbox, names.mapping.id(), ids=ANY_IDS)


def reset_sql(names: OutboxNames) -> sql.Composed:
    """Give up the rows of ids ``%s``: the next mark of any view claims them."""
    m = names.mapping
    return sql.SQL("UPDATE {} SET {} = NULL WHERE {} = {ids}").format(names.outbox, m.leader(), m.id(), ids=ANY_IDS)


def record_attempts_sql(names: OutboxNames) -> sql.Composed:
    """Upsert failed delivery attempts ``(ids, counts, errors)``: a count never decreases."""
    return sql.SQL("""
            INSERT INTO {a} AS a (id, attempts, last_error)
            SELECT * FROM unnest(%s::bigint[], %s::int[], %s::text[])
            ON CONFLICT (id) DO UPDATE SET attempts = GREATEST(a.attempts, EXCLUDED.attempts),
                                           last_error = EXCLUDED.last_error, updated_at = now()""").format(
        a=names.delivery_attempts
    )


def forget_attempts_sql(names: OutboxNames) -> sql.Composed:
    """Delete the attempt counts of ids ``%s`` (an :func:`id_array`)."""
    return sql.SQL("DELETE FROM {} WHERE id = {ids}").format(names.delivery_attempts, ids=ANY_IDS)


def dead_letter_sql(names: OutboxNames, value_type: ValueType, owned: sql.Composable) -> sql.Composed:
    """Move rows ``(id, error, attempts)`` to the dead letters in one statement (a CTE), so a row is
    never in both tables or neither; forgets their attempt counts. ``owned``: an extra condition on
    the outbox row (the fenced commit's ``AND leader = %s``). The dead letter holds the record as
    the table mapping makes it, and, for a mapped table, the row itself (``source_row``)."""
    n, m = names, names.mapping
    rec = m.record("o", value_type)
    source = m.source_row("o")
    cols = sql.SQL(
        "id, create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values, "
        "error, attempts{}"
    ).format(sql.SQL(", source_row") if source is not None else sql.SQL(""))
    return sql.SQL("""
        WITH bad(id, error, attempts) AS (SELECT * FROM unnest(%s::bigint[], %s::text[], %s::int[])),
        forgotten AS (DELETE FROM {a} AS a USING bad WHERE a.id = bad.id),
        moved AS (
          DELETE FROM {o} AS o USING bad WHERE {oid} = bad.id{owned}
          RETURNING {oid}, {created}, {topic}, {key}, {value}, {hk}, {hv}, bad.error, bad.attempts{source})
        INSERT INTO {d} ({cols})
        SELECT * FROM moved
        ON CONFLICT (id) DO UPDATE SET error = EXCLUDED.error, attempts = EXCLUDED.attempts,
                                       dead_time = now()""").format(
        a=n.delivery_attempts,
        o=n.outbox,
        d=n.dead_letters,
        oid=m.id("o"),
        owned=owned,
        created=m.created("o"),
        topic=rec.topic,
        key=rec.key,
        value=rec.value,
        hk=sql.SQL("coalesce({}, '{{}}')").format(rec.header_keys),
        hv=sql.SQL("coalesce({}, '{{}}')").format(rec.header_values),
        source=sql.SQL(", {}").format(source) if source is not None else sql.SQL(""),
        cols=cols,
    )


def expire_dead_letters_sql(names: OutboxNames) -> sql.Composed:
    """deadLetterRetention: delete one batch of expired dead letters (found by the dead_time index init-db
    makes); parameters: the retention in seconds, the batch's size."""
    return sql.SQL(
        "DELETE FROM {d} WHERE id = ANY(ARRAY(SELECT id FROM {d} "
        "WHERE dead_time < now() - make_interval(secs => %s) LIMIT %s))"
    ).format(d=names.dead_letters)


def dead_letter_stats_sql(names: OutboxNames) -> sql.Composed:
    """(dead letters, (topic, key) pairs with one: the keys ``haltKey`` holds)."""
    return sql.SQL(
        "SELECT count(*), count(DISTINCT (kafka_topic, kafka_key)) "
        "FILTER (WHERE kafka_topic IS NOT NULL AND kafka_key IS NOT NULL) FROM {}"
    ).format(names.dead_letters)
