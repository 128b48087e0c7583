"""Dead letters: listing them and putting them back into the outbox.

Requeue moves rows back in one statement (delete from the dead-letter table + insert into the
outbox), so a row is never lost or doubled. Requeued rows get NEW ids: they go to the back of the
outbox, i.e. after any record of the same key that was stashed meanwhile — an operator decision,
made explicit here. A row that is still bad (e.g. NULL topic) fails the outbox's NOT NULL checks
and the whole requeue is rolled back with a :class:`~producer.errors.DatabaseError` saying why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import sql

from producer.errors import DatabaseError
from producer.schema import OutboxNames


@dataclass(frozen=True)
class DeadLetter:
    id: int
    create_time: datetime | None
    kafka_topic: str | None
    kafka_key: str | None
    error: str
    attempts: int
    dead_time: datetime


def list_dead_letters(conn: psycopg.Connection, outbox_table: str, limit: int = 100) -> list[DeadLetter]:
    names = OutboxNames.parse(outbox_table)
    q = sql.SQL("SELECT id, create_time, kafka_topic, kafka_key, error, attempts, dead_time FROM {} "
                "ORDER BY id LIMIT %s").format(names.dead_letters)
    try:
        return [DeadLetter(*row) for row in conn.execute(q, (limit,)).fetchall()]
    except psycopg.Error as exc:
        raise DatabaseError(f"listing dead letters of {names.display!r} failed: {exc}".strip()) from exc


def requeue(conn: psycopg.Connection, outbox_table: str, ids: Sequence[int] | None) -> int:
    """Move dead letters ``ids`` (all when ``None``) back to the outbox; returns how many moved."""
    names = OutboxNames.parse(outbox_table)
    where = sql.SQL("") if ids is None else sql.SQL("WHERE id = ANY(%(ids)s)")
    q = sql.SQL("""
        WITH moved AS (DELETE FROM {d} {where}
                       RETURNING id, create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys,
                                 kafka_header_values)
        INSERT INTO {o} (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
        SELECT coalesce(create_time, now()), kafka_topic, kafka_key, kafka_value,
               coalesce(kafka_header_keys, '{{}}'), coalesce(kafka_header_values, '{{}}')
        FROM moved ORDER BY id""").format(d=names.dead_letters, o=names.outbox, where=where)
    try:
        with conn.transaction():
            return conn.execute(q, {"ids": list(ids) if ids is not None else None}).rowcount
    except psycopg.Error as exc:
        raise DatabaseError(f"requeue into {names.display!r} failed (nothing was moved): "
                            f"{str(exc).strip()}; fix the dead-letter row(s) first") from exc
