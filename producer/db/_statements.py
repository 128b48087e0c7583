"""The statements both outbox layouts' relay databases run on rows they name by id: the delivery-attempt
counts, and the dead letters' counts and expiry (the mark layout's purge, reset and dead-letter move are
its own: producer/layouts/mark/database.py).

- attempts: failed attempts are upserted (``GREATEST`` of the stored and the new count), and deleted
  when the row is purged, committed or dead-lettered.

Invariants:
- an attempt count never decreases;
- every id list is read through :data:`ANY_IDS` (a runtime array, planned as one index scan).
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from harvest_outbox.producer.schema import OutboxNames

# The id arrays are read through a scalar subquery (an InitPlan): as a constant, or as a
# parameter of a custom plan, Postgres estimated the selectivity of each of its thousands of
# elements while planning (~0.8 ms for 5,000 ids, as long as a quarter of the DELETE itself);
# through the subquery it plans an index scan of a runtime array at once.
ANY_IDS = sql.SQL("ANY(CAST((SELECT %s::bigint[]) AS bigint[]))")


def id_array(ids: Sequence[int]) -> str:
    """A bigint[] literal: much cheaper to build than letting the driver dump a list element-wise."""
    return "{" + ",".join(map(str, ids)) + "}"


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
