"""Dead letters: listing them and putting them back into the outbox.

Requeue moves rows back in one statement (delete from the dead-letter table + insert into the
outbox), so a row is never lost or doubled. Requeued rows get NEW ids: they go to the back of the
outbox, i.e. after any record of the same key that was stashed meanwhile — an operator decision,
made explicit here. A row that is still bad (e.g. NULL topic) fails the outbox's NOT NULL checks
and the whole requeue is rolled back with a :class:`~producer.errors.DatabaseError` saying why.

The CLI checks the rows' topics against Kafka first (:func:`missing_topics`) and moves nothing when a
topic does not exist: those rows would only be dead-lettered again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from harvest_outbox.producer.election import _PRODUCER_ONLY
from harvest_outbox.producer.errors import DatabaseError, HarvestError
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.table_mapping import GOHARVEST, TableMapping


class KafkaCheckError(HarvestError):
    """``dead-letters requeue`` could not check the rows' topics against Kafka."""


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


def topics_of(conn: psycopg.Connection, outbox_table: str, ids: Sequence[int] | None) -> set[str | None]:
    """The distinct topics of dead letters ``ids`` (all when ``None``)."""
    names = OutboxNames.parse(outbox_table)
    where = sql.SQL("") if ids is None else sql.SQL("WHERE id = ANY(%(ids)s)")
    q = sql.SQL("SELECT DISTINCT kafka_topic FROM {} {}").format(names.dead_letters, where)
    try:
        return {row[0] for row in conn.execute(q, {"ids": list(ids) if ids is not None else None}).fetchall()}
    except psycopg.Error as exc:
        raise DatabaseError(f"reading dead letters of {names.display!r} failed: {str(exc).strip()}") from exc


def missing_topics(kafka_config: Mapping[str, Any], topics: set[str | None], timeout: float = 15.0) -> list[str]:
    """Which of ``topics`` the Kafka cluster does not have (``None``, a row without a topic, is skipped:
    the outbox refuses it anyway). Requeueing rows of a missing topic only dead-letters them again."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    wanted = sorted(t for t in topics if t is not None)
    if not wanted:
        return []
    admin = AdminClient({**{k: v for k, v in kafka_config.items() if k not in _PRODUCER_ONLY}, "log_level": 0})
    try:
        known = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise KafkaCheckError(f"cannot reach Kafka at {kafka_config.get('bootstrap.servers')!r} to check that the "
                              f"dead letters' topics exist ({exc.args[0].str()}); retry, or pass --skip-topic-check "
                              f"to requeue without the check") from exc
    return [t for t in wanted if t not in known or known[t].error is not None]


def requeue(conn: psycopg.Connection, outbox_table: str, ids: Sequence[int] | None,
            mapping: TableMapping = GOHARVEST) -> int:
    """Move dead letters ``ids`` (all when ``None``) back to the outbox; returns how many moved. A
    mapped table's rows are restored from ``source_row`` (the row as the writer wrote it), less the
    relay's own columns, which take their defaults: the row goes to the end of the outbox, as a
    requeued goharvest row gets a new id."""
    names = OutboxNames.parse(outbox_table, mapping)
    where = sql.SQL("") if ids is None else sql.SQL("WHERE id = ANY(%(ids)s)")
    if mapping.source_row("o") is not None:
        own = {mapping.id_column, mapping.leader_column, mapping.created_column}
        cols = [c for (c,) in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped "
            "ORDER BY attnum", (names.outbox.as_string(conn),)).fetchall() if c not in own]
        listed = sql.SQL(", ").join(sql.Identifier(c) for c in cols)
        q = sql.SQL("""
            WITH moved AS (DELETE FROM {d} {where} RETURNING id, source_row)
            INSERT INTO {o} ({cols})
            SELECT {picked} FROM moved, jsonb_populate_record(NULL::{o}, moved.source_row) AS r
            ORDER BY moved.id""").format(
            d=names.dead_letters, o=names.outbox, where=where, cols=listed,
            picked=sql.SQL(", ").join(sql.Identifier("r", c) for c in cols))
    else:
        q = _requeue_goharvest(names, where)
    try:
        with conn.transaction():
            return conn.execute(q, {"ids": list(ids) if ids is not None else None}).rowcount
    except psycopg.Error as exc:
        raise DatabaseError(f"requeue into {names.display!r} failed (nothing was moved): "
                            f"{str(exc).strip()}; fix the dead-letter row(s) first") from exc


def _requeue_goharvest(names: OutboxNames, where: sql.Composable) -> sql.Composed:
    return sql.SQL("""
        WITH moved AS (DELETE FROM {d} {where}
                       RETURNING id, create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys,
                                 kafka_header_values)
        INSERT INTO {o} (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
        SELECT coalesce(create_time, now()), kafka_topic, kafka_key, kafka_value,
               coalesce(kafka_header_keys, '{{}}'), coalesce(kafka_header_values, '{{}}')
        FROM moved ORDER BY id""").format(d=names.dead_letters, o=names.outbox, where=where)
