"""The rows the ``--uuid-sequencing`` relay will dead-letter instead of producing again (docs/design.md §5,
"Poison records"): a part of :class:`~producer.relay.sequenced.mode.SequencedMode` that owns them.

Invariants:
- a row is parked here when its failed attempts reach ``maxDeliveryAttempts`` (counted in this or in
  crashed processes, :meth:`PoisonBook.adopt`), after one permanent asynchronous error, or when its
  failed delivery held up other rows for ``rowTimeout`` while they were delivered;
- a parked row is taken out exactly once, by the transaction that meets it, which dead-letters it in
  its fenced commit (:meth:`PoisonBook.take`);
- every failed attempt is counted per row (``core.attempts``) and queued for the database
  (``core.attempt_buf``) before the row can be produced again.
"""

from __future__ import annotations

from typing import NamedTuple

from confluent_kafka import KafkaError

from harvest_outbox.producer.kafka import is_access_denied, is_permanent
from harvest_outbox.producer.relay.core import RelayCore


class Poisoned(NamedTuple):
    """Why a parked row goes to the dead letters, and its failed attempts (the dead letter's count)."""

    reason: str
    attempts: int


class PoisonBook:
    """Rows to dead-letter when next seen, by id (see module doc)."""

    __slots__ = ("core", "rows")

    def __init__(self, core: RelayCore) -> None:
        self.core = core
        self.rows: dict[int, Poisoned] = {}

    def __bool__(self) -> bool:
        return bool(self.rows)

    def __contains__(self, rid: int) -> bool:
        return rid in self.rows

    def take(self, rid: int) -> Poisoned:
        """The parked row ``rid``, no longer parked (its transaction dead-letters it)."""
        return self.rows.pop(rid)

    def park(self, rid: int, reason: str, attempts: int) -> None:
        self.rows[rid] = Poisoned(reason, attempts)

    def clear(self) -> None:
        self.rows.clear()

    def adopt(self, persisted: dict[int, tuple[int, str | None]]) -> None:
        """Adopt the stored attempt counts of freshly marked rows; rows that used them up (in this
        or in crashed processes) are dead-lettered by the transaction that meets them."""
        limit = self.core.limits.max_delivery_attempts
        for rid, (n, error) in persisted.items():
            n = self.core.adopt_attempts(rid, n)
            if n >= limit and rid not in self.rows:
                self.park(rid, f"failed {n} delivery attempts (counted across relay restarts); last error: {error}", n)

    def count_failure(self, rid: int, err: KafkaError, asynchronous: bool) -> None:
        """A failed attempt of ``rid``: counted and stored; parked when permanent or the last allowed."""
        core = self.core
        core.metrics.delivery_failures += 1
        if is_access_denied(err):
            # An ACL missing (or removed since the preflight's verdict): not the row's fault, not an attempt.
            # The preflight asks again when the row comes back (TopicGuard.denied: refuse the topic, or stop).
            core.guard.forget()
            return
        attempts = core.next_attempt(rid)
        permanent = asynchronous and is_permanent(err, False)
        if permanent or attempts >= core.limits.max_delivery_attempts:
            why = "cannot be sent" if permanent else f"failed {attempts} delivery attempts"
            self.park(rid, f"{why}: {err.name()}: {err.str()}", attempts)
        core.store_attempt(rid, attempts, err)
        if err.fatal():
            core.producer_failed()
