"""Operating dead letters: selecting them, stuck keys, discarding, exporting, and the audit log.

:mod:`producer.ops._deadletters` moves dead letters back (requeue); this module is what an operator
needs around that: a :class:`Selection` (ids, topic, key, error text, age) shared by ``list``,
``export``, ``discard`` and ``requeue``; the keys ``deadLetterPolicy: haltKey`` holds
(:func:`stuck_keys`: key, topic, since, reason, rows waiting); and :func:`audit`, one log line per
action naming who (``--actor``, else the OS user) and what.

Invariants (tests/test_producer/relay/test_halt_key.py, test_deadletter_admin.py on the real Postgres):
- a selection with no condition selects nothing for ``discard`` unless ``all_rows`` says so: an
  operator never deletes every dead letter by leaving out a filter;
- ``discard`` is one ``DELETE … RETURNING``: what it reports is exactly what it removed;
- ``export`` reads only; each line is one JSON object with the row's columns (a bytea value as
  base64 in ``kafka_value_base64``), in id order, so ``jq`` and a re-import can use it;
- every action of the ``harvest dead-letters`` verbs that changes the table or exports it is audited
  (:func:`discard` itself; requeue and export by producer.ops._deadletters_cli), whatever the log level.
"""

from __future__ import annotations

import base64
import getpass
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any

import psycopg
from psycopg import sql

from harvest_outbox.producer.errors import ConfigError, DatabaseError
from harvest_outbox.producer.layouts.choice import MARK, detected_layout
from harvest_outbox.producer.layouts.layout import OutboxLayout
from harvest_outbox.producer.mapping.table import GOHARVEST, TableMapping
from harvest_outbox.producer.schema import OutboxNames, Statement

#: Audit lines: always emitted (the logger's own level, whatever ``--log-level`` sets on the root).
audit_log = logging.getLogger("harvest.audit")
audit_log.setLevel(logging.INFO)


def actor(given: str | None) -> str:
    """Who acts: ``--actor`` when given, else the OS user (``uid N`` where none can be named)."""
    if given is not None:
        if not given.strip() or not given.isprintable():
            raise ConfigError(f"--actor: {given!r} is not a name; give who runs the command, e.g. --actor alice")
        return given
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def audit(who: str, verb: str, what: str) -> None:
    audit_log.info("dead-letters %s by %s: %s", verb, who, what)


@dataclass(frozen=True)
class Selection:
    """Which dead letters an action applies to: every given condition holds (all rows when none is)."""

    ids: tuple[int, ...] | None = None
    topic: str | None = None
    key: str | None = None
    reason: str | None = None  # a substring of the error, case-insensitive
    older_than: float | None = None  # seconds since dead_time
    newer_than: float | None = None

    @property
    def empty(self) -> bool:
        return all(v is None for v in (self.ids, self.topic, self.key, self.reason, self.older_than, self.newer_than))

    def where(self) -> tuple[sql.Composable, dict[str, Any]]:
        """``WHERE …`` (or nothing) and its parameters."""
        conds: list[sql.Composable] = []
        params: dict[str, Any] = {}
        if self.ids is not None:
            conds.append(sql.SQL("id = ANY(%(ids)s)"))
            params["ids"] = list(self.ids)
        for name, column in (("topic", "kafka_topic"), ("key", "kafka_key")):
            if getattr(self, name) is not None:
                conds.append(sql.SQL("{} = %({})s").format(sql.Identifier(column), sql.SQL(name)))
                params[name] = getattr(self, name)
        if self.reason is not None:
            conds.append(sql.SQL("strpos(lower(error), lower(%(reason)s)) > 0"))
            params["reason"] = self.reason
        if self.older_than is not None:
            conds.append(sql.SQL("dead_time < now() - make_interval(secs => %(older)s)"))
            params["older"] = float(self.older_than)
        if self.newer_than is not None:
            conds.append(sql.SQL("dead_time >= now() - make_interval(secs => %(newer)s)"))
            params["newer"] = float(self.newer_than)
        if not conds:
            return sql.SQL(""), params
        return sql.SQL("WHERE ") + sql.SQL(" AND ").join(conds), params


def selected_ids(conn: psycopg.Connection, outbox_table: str, sel: Selection) -> list[int]:
    names = OutboxNames.parse(outbox_table)
    where, params = sel.where()
    q = sql.SQL("SELECT id FROM {} {} ORDER BY id").format(names.dead_letters, where)
    return [i for (i,) in _run(conn, names, "reading dead letters", q, params)]


@dataclass(frozen=True)
class StuckKey:
    """A (topic, key) with dead letters: under haltKey its later rows wait in the outbox."""

    topic: str
    key: str
    since: datetime  # its first dead letter's dead_time
    reason: str  # its first dead letter's error
    dead_letters: int
    waiting: int  # its rows in the outbox


def stuck_keys(
    conn: psycopg.Connection, outbox_table: str, mapping: TableMapping = GOHARVEST, limit: int = 1000
) -> list[StuckKey]:
    """The keys with dead letters, oldest first, each with the rows of it waiting in the outbox (one
    scan of the outbox for all keys, joined by hash; rows without a topic or a key halt nothing)."""
    names = OutboxNames.parse(outbox_table, mapping)
    rec = mapping.record("c", "varchar")
    # the cursor layout: a halted key's rows wait in _held (producer/layouts/cursor/held.py), not in the outbox
    waiting_in = outbox_layout(conn, names).waiting_table(names)
    q = sql.SQL("""
        WITH dead AS (
          SELECT kafka_topic, kafka_key, min(dead_time) AS since, (array_agg(error ORDER BY id))[1] AS reason,
                 count(*) AS n
          FROM {d} WHERE kafka_topic IS NOT NULL AND kafka_key IS NOT NULL GROUP BY 1, 2),
        waiting AS (
          SELECT {t}::varchar AS t, {k} AS k, count(*) AS n FROM {o} AS c
          WHERE ({t}, {k}) IN (SELECT kafka_topic, kafka_key FROM dead){mine} GROUP BY 1, 2)
        SELECT dead.kafka_topic, dead.kafka_key, dead.since, dead.reason, dead.n, coalesce(waiting.n, 0)
        FROM dead LEFT JOIN waiting ON waiting.t = dead.kafka_topic AND waiting.k = dead.kafka_key
        ORDER BY dead.since, 1, 2 LIMIT %(limit)s""").format(
        d=names.dead_letters, o=waiting_in, t=rec.topic, k=rec.key, mine=mapping.claimable("AND")
    )
    return [StuckKey(*row) for row in _run(conn, names, "reading stuck keys", q, {"limit": limit})]


def discard(
    conn: psycopg.Connection,
    outbox_table: str,
    sel: Selection,
    who: str,
    all_rows: bool = False,
    mapping: TableMapping = GOHARVEST,
) -> list[tuple[int, str | None, str | None]]:
    """Delete the selected dead letters for good; returns their (id, topic, key). Under haltKey this
    releases their keys: the keys' waiting rows flow (without the discarded ones). ``mapping``: the outbox's
    (on the cursor layout the dead letters' outbox rows are found by its ordering column)."""
    if sel.empty and not all_rows:
        raise ConfigError(
            "dead-letters discard: give ids or a filter (--topic, --key, --reason, --older-than), or --all"
        )
    names = OutboxNames.parse(outbox_table, mapping)
    where, params = sel.where()
    # the cursor layout: read again after the discard, the row would be held and sent
    outbox_layout(conn, names).require_passed(conn, names, where, params, "discard")
    q = sql.SQL("DELETE FROM {} {} RETURNING id, kafka_topic, kafka_key").format(names.dead_letters, where)
    with conn.transaction():
        gone = sorted(_run(conn, names, "discarding dead letters", q, params))
    audit(who, "discard", f"{len(gone)} dead letter(s) of {names.display}{_summary(gone)}")
    return gone


def export(conn: psycopg.Connection, outbox_table: str, sel: Selection, out: IO[str]) -> int:
    """Write the selected dead letters to ``out`` as JSON lines, in id order; returns how many."""
    names = OutboxNames.parse(outbox_table)
    where, params = sel.where()
    q = sql.SQL("SELECT * FROM {} {} ORDER BY id").format(names.dead_letters, where)
    n = 0
    try:
        with conn.cursor(name="harvest_export") as cur, conn.transaction():
            cur.execute(q, params)
            columns = [c.name for c in cur.description or ()]
            for row in cur:
                out.write(json.dumps(_jsonable(dict(zip(columns, row, strict=True))), ensure_ascii=False) + "\n")
                n += 1
    except psycopg.Error as exc:
        raise DatabaseError(f"exporting dead letters of {names.display!r} failed: {str(exc).strip()}") from exc
    return n


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in row.items():
        if isinstance(value, (bytes, memoryview)):
            out[f"{name}_base64"] = base64.b64encode(bytes(value)).decode()
        elif isinstance(value, datetime):
            out[name] = value.isoformat()
        else:
            out[name] = value
    return out


def _summary(rows: list[tuple[int, str | None, str | None]], shown: int = 10) -> str:
    if not rows:
        return ""
    keys = sorted({(t or "", k or "") for _i, t, k in rows})
    ids = ", ".join(str(i) for i, _t, _k in rows[:shown]) + (
        f" and {len(rows) - shown} more" if len(rows) > shown else ""
    )
    named = "; ".join(f"{t}/{k}" for t, k in keys[:shown]) + (
        f" and {len(keys) - shown} more" if len(keys) > shown else ""
    )
    return f": ids {ids} (topic/key {named})"


def _run(
    conn: psycopg.Connection, names: OutboxNames, what: str, q: Statement, params: dict[str, Any]
) -> Iterator[Any]:
    try:
        return iter(conn.execute(q, params).fetchall())
    except psycopg.Error as exc:
        raise DatabaseError(f"{what} of {names.display!r} failed: {str(exc).strip()}") from exc


def outbox_layout(conn: psycopg.Connection, names: OutboxNames) -> OutboxLayout:
    """The outbox's layout, as its table is (the mark layout's statements where there is no table: they fail
    naming it)."""
    return detected_layout(conn, names) or MARK
