"""Dead letters: listing them and putting them back into the outbox.

Requeue moves rows back in one statement (delete from the dead-letter table + insert into the
outbox), so a row is never lost or doubled. Requeued rows get NEW ids: they go to the back of the
outbox, i.e. after any record of the same key that was stashed meanwhile — an operator decision,
made explicit here. Except under ``deadLetterPolicy: haltKey`` (``keep_ids``): there the key's later
rows wait in the outbox with higher ids, so the row gets its own id back and goes first (a row that
a stasher commits meanwhile cannot take that id: ids come from a sequence). A row that is still bad in a way the outbox refuses (e.g. NULL key) fails its
NOT NULL checks and the whole :func:`requeue` is rolled back with a
:class:`~producer.errors.DatabaseError` saying why.

The CLI requeues through :func:`requeue_what_can_be`: rows that would only be dead-lettered again
(no topic, no key, a topic name Kafka refuses, a topic missing in Kafka) stay where they are and are
reported by topic and reason; every other row of the selection moves.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from harvest_outbox.producer.errors import DatabaseError, HarvestError, shown
from harvest_outbox.producer.kafka.client_settings import for_admin
from harvest_outbox.producer.mapping.table import GOHARVEST, TableMapping
from harvest_outbox.producer.ops._deadletter_admin import Selection, outbox_layout
from harvest_outbox.producer.ops.preflight import topic_name_problem
from harvest_outbox.producer.schema import OutboxNames


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


def list_dead_letters(
    conn: psycopg.Connection, outbox_table: str, limit: int = 100, sel: Selection | None = None
) -> list[DeadLetter]:
    """The dead letters ``sel`` selects (all when None), in id order, at most ``limit``."""
    names = OutboxNames.parse(outbox_table)
    where, params = (sel or Selection()).where()
    q = sql.SQL(
        "SELECT id, create_time, kafka_topic, kafka_key, error, attempts, dead_time FROM {} {} ORDER BY id "
        "LIMIT %(limit)s"
    ).format(names.dead_letters, where)
    try:
        return [DeadLetter(*row) for row in conn.execute(q, {**params, "limit": limit}).fetchall()]
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


def missing_topics(kafka_config: Mapping[str, Any], topics: Collection[str | None], timeout: float = 15.0) -> list[str]:
    """Which of ``topics`` the Kafka cluster does not have (``None``, a row without a topic, is skipped:
    the outbox refuses it anyway). Requeueing rows of a missing topic only dead-letters them again."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    wanted = sorted(t for t in topics if t is not None)
    if not wanted:
        return []
    admin = AdminClient({**for_admin(kafka_config), "log_level": 0})
    try:
        known = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise KafkaCheckError(
            f"cannot reach Kafka at {kafka_config.get('bootstrap.servers')!r} to check that the "
            f"dead letters' topics exist ({exc.args[0].str()}); retry, or pass --skip-topic-check "
            f"to requeue without the check"
        ) from exc
    return [t for t in wanted if t not in known or known[t].error is not None]


def requeue(
    conn: psycopg.Connection,
    outbox_table: str,
    ids: Sequence[int] | None,
    mapping: TableMapping = GOHARVEST,
    topics: Sequence[str] | None = None,
    keep_ids: bool = False,
) -> int:
    """Move dead letters ``ids`` (all when ``None``) back to the outbox; returns how many moved. A
    mapped table's rows are restored from ``source_row`` (the row as the writer wrote it), less the
    relay's own columns, which take their defaults: the row goes to the end of the outbox, as a
    requeued goharvest row gets a new id. With ``topics``, only rows of those topics move (and, of a
    goharvest outbox, only rows with a key: its kafka_key is NOT NULL). With ``keep_ids`` (haltKey),
    each row gets its original id back instead (see module doc); on the cursor layout it goes to
    ``_held`` ahead of its key's held rows instead (producer/layouts/cursor/held.py), and there a requeue waits
    (refused, nothing moved) until the relay has passed the dead letters' outbox rows."""
    names = OutboxNames.parse(outbox_table, mapping)
    conds = [] if ids is None else [sql.SQL("id = ANY(%(ids)s)")]
    if topics is not None:
        conds.append(sql.SQL("kafka_topic = ANY(%(topics)s)"))
        if mapping.source_row("o") is None:
            conds.append(sql.SQL("kafka_key IS NOT NULL"))
    where = sql.SQL("WHERE ") + sql.SQL(" AND ").join(conds) if conds else sql.SQL("")
    params = {"ids": list(ids) if ids is not None else None, "topics": list(topics) if topics is not None else None}
    layout = outbox_layout(conn, names)
    # the cursor layout (producer/layouts/cursor/held.py): the relay must have passed their outbox rows
    layout.require_passed(conn, names, where, params, "requeue")
    own_requeue = layout.requeue_sql(names, where, keep_ids)  # the cursor layout's haltKey: into _held, with ids
    if own_requeue is not None:
        q = own_requeue
    elif mapping.source_row("o") is not None:
        own = {mapping.leader_column, mapping.created_column} | (set() if keep_ids else {mapping.id_column})
        own |= layout.writer_columns  # the cursor layout's txid: an old one would hide the row from the cursor
        cols = [
            c
            for (c,) in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped "
                "ORDER BY attnum",
                (names.outbox.as_string(conn),),
            ).fetchall()
            if c not in own
        ]
        listed = sql.SQL(", ").join(sql.Identifier(c) for c in cols)
        q = sql.SQL("""
            WITH moved AS (DELETE FROM {d} {where} RETURNING id, source_row)
            INSERT INTO {o} ({cols}) {overriding}
            SELECT {picked} FROM moved, jsonb_populate_record(NULL::{o}, moved.source_row) AS r
            ORDER BY moved.id""").format(
            d=names.dead_letters,
            o=names.outbox,
            where=where,
            cols=listed,
            overriding=_OVERRIDING if keep_ids else sql.SQL(""),
            picked=sql.SQL(", ").join(
                sql.SQL("moved.id") if c == mapping.id_column else sql.Identifier("r", c) for c in cols
            ),
        )
    else:
        q = _requeue_goharvest(names, where, keep_ids)
    try:
        with conn.transaction():
            return conn.execute(q, params).rowcount
    except psycopg.Error as exc:
        raise DatabaseError(
            f"requeue into {names.display!r} failed (nothing was moved): "
            f"{str(exc).strip()}; fix the dead-letter row(s) first"
        ) from exc


#: An id given back to its row must be taken even where the id column is GENERATED ALWAYS AS IDENTITY.
_OVERRIDING = sql.SQL("OVERRIDING SYSTEM VALUE")


def _requeue_goharvest(names: OutboxNames, where: sql.Composable, keep_ids: bool = False) -> sql.Composed:
    return sql.SQL("""
        WITH moved AS (DELETE FROM {d} {where}
                       RETURNING id, create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys,
                                 kafka_header_values)
        INSERT INTO {o} ({id_col}create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys,
                         kafka_header_values) {overriding}
        SELECT {id_val}coalesce(create_time, now()), kafka_topic, kafka_key, kafka_value,
               coalesce(kafka_header_keys, '{{}}'), coalesce(kafka_header_values, '{{}}')
        FROM moved ORDER BY id""").format(
        d=names.dead_letters,
        o=names.outbox,
        where=where,
        id_col=sql.SQL("id, ") if keep_ids else sql.SQL(""),
        id_val=sql.SQL("id, ") if keep_ids else sql.SQL(""),
        overriding=_OVERRIDING if keep_ids else sql.SQL(""),
    )


#: Ids a held-back group names; the rest are counted.
HELD_IDS_SHOWN = 10


@dataclass(frozen=True)
class HeldBack:
    """Dead letters of one topic a requeue left in place, and why."""

    kafka_topic: str | None
    why: str
    count: int
    ids: tuple[int, ...]  # the first HELD_IDS_SHOWN

    def __str__(self) -> str:
        more = f" and {self.count - len(self.ids)} more" if self.count > len(self.ids) else ""
        label = "id" if self.count == 1 else "ids"
        return f"{label} {', '.join(map(str, self.ids))}{more} (topic {shown(self.kafka_topic)}): {self.why}"


@dataclass(frozen=True)
class RequeueResult:
    moved: int
    held: tuple[HeldBack, ...]

    @property
    def left(self) -> int:
        return sum(h.count for h in self.held)


def requeue_what_can_be(
    conn: psycopg.Connection,
    outbox_table: str,
    ids: Sequence[int] | None,
    kafka_config: Mapping[str, Any] | None,
    mapping: TableMapping = GOHARVEST,
    keep_ids: bool = False,
) -> RequeueResult:
    """Requeue the dead letters ``ids`` (all when ``None``) that the relay can deliver, leave the others.

    Left in place: rows without a topic or a key, rows whose topic name Kafka refuses (illegal,
    internal) and, unless ``kafka_config`` is None (no topic check), rows whose topic the cluster
    does not have: requeued, each would only be dead-lettered again."""
    topics = topics_of(conn, outbox_table, ids)
    why: dict[str | None, str] = {None: "kafka_topic is NULL; set the row's topic, then requeue"}
    for topic in topics:
        problem = None if topic is None else topic_name_problem(topic)
        if problem is not None:
            why[topic] = problem
    legal = {t for t in topics if t is not None and t not in why}
    if kafka_config is not None:
        where = shown(kafka_config.get("bootstrap.servers"))
        for topic in missing_topics(kafka_config, legal):
            why[topic] = (
                f"topic {shown(topic)} does not exist in Kafka at {where}; create it (auto-creation is "
                f"usually off), then requeue"
            )
    moved = requeue(conn, outbox_table, ids, mapping, sorted(t for t in legal if t not in why), keep_ids)
    return RequeueResult(moved, tuple(_held_back(conn, outbox_table, ids, why)))


def _held_back(
    conn: psycopg.Connection, outbox_table: str, ids: Sequence[int] | None, why: Mapping[str | None, str]
) -> list[HeldBack]:
    """The selection's rows still in the dead letters after a requeue, by topic and reason."""
    names = OutboxNames.parse(outbox_table)
    where = sql.SQL("") if ids is None else sql.SQL("WHERE id = ANY(%(ids)s)")
    q = sql.SQL(
        "SELECT kafka_topic, kafka_key IS NULL, count(*), (array_agg(id ORDER BY id))[1:%(shown)s] "
        "FROM {} {} GROUP BY 1, 2 ORDER BY min(id)"
    ).format(names.dead_letters, where)
    try:
        rows = conn.execute(q, {"ids": list(ids) if ids is not None else None, "shown": HELD_IDS_SHOWN}).fetchall()
    except psycopg.Error as exc:
        raise DatabaseError(f"reading dead letters of {names.display!r} failed: {str(exc).strip()}") from exc
    held = []
    for topic, no_key, count, first_ids in rows:
        if topic in why:
            reason = why[topic] + ("; its kafka_key is NULL too: set one" if no_key else "")
        elif no_key:
            reason = "kafka_key is NULL; set the row's key, then requeue"
        else:  # a topic the requeue moved: these rows arrived while it ran
            reason = "dead-lettered while the requeue ran; requeue again"
        held.append(HeldBack(topic, reason, int(count), tuple(first_ids)))
    return held
