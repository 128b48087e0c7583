"""The books both outbox layouts' relay databases keep on their session: the delivery-attempt counts
(:class:`Attempts`) and the dead-letter table's counts and expiry (:class:`DeadLetters`).

Invariants: an attempt count never decreases (:func:`~producer.db._statements.record_attempts_sql`); a
count is forgotten once its row is delivered, committed or dead-lettered.
"""

from __future__ import annotations

from collections.abc import Sequence

from harvest_outbox.producer.db._session import OutboxSession
from harvest_outbox.producer.db._statements import (
    dead_letter_stats_sql,
    expire_dead_letters_sql,
    forget_attempts_sql,
    id_array,
    record_attempts_sql,
)


class Attempts:
    """The delivery-attempt counts, on a session both layouts' relay databases compose: failed attempts
    upserted (a count never decreases), and forgotten once their row is delivered (or gone)."""

    def __init__(self, session: OutboxSession) -> None:
        self.session = session
        self._record_sql = record_attempts_sql(session.names)
        #: Delete the counts of ids ``%s`` (a fenced commit sends it with its other statements).
        self.forget_sql = forget_attempts_sql(session.names)

    def record(self, items: Sequence[tuple[int, int, str]]) -> int:
        return self.session.run(
            "recording delivery attempts",
            self._record_sql,
            ([i for i, _, _ in items], [n for _, n, _ in items], [e for _, _, e in items]),
        ).rowcount

    def forget(self, ids: Sequence[int]) -> int:
        return self.session.run("forgetting delivery attempts", self.forget_sql, (id_array(ids),)).rowcount


class DeadLetters:
    """The dead-letter table as both layouts' relay databases see it: its counts for the meter, and
    ``deadLetterRetention``'s expiry (moving a row there is each layout's own statement)."""

    def __init__(self, session: OutboxSession) -> None:
        self.session = session
        self._stats_sql = dead_letter_stats_sql(session.names)
        self._expire_sql = expire_dead_letters_sql(session.names)

    def counts(self) -> tuple[int, int]:
        """(dead letters, (topic, key) pairs with one: the keys ``haltKey`` holds)."""
        dead = self.session.run("metrics query", self._stats_sql, ()).fetchone()
        return (int(dead[0]), int(dead[1])) if dead is not None else (0, 0)

    def expire(self, retention: float, limit: int) -> int:
        return self.session.run("deleting expired dead letters", self._expire_sql, (float(retention), limit)).rowcount
