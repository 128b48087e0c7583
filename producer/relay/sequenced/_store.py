"""The database work of the ``--uuid-sequencing`` relay, as one narrow interface (docs/design.md §5).

:class:`~producer.layouts.mark.database.MarkDatabase` and :class:`~producer.layouts.cursor.database.CursorDatabase`
(psycopg, real Postgres; the part of :class:`~producer.layouts.layout.RelayDatabase` this mode asks) are the
implementations the relay runs on; tests/test_producer/model_db.py is an in-memory one with the same semantics, on which
tests/test_producer/relay/sequenced/test_protocol_model.py drives the protocol through thousands of schedules.

What an implementation must guarantee (the protocol's safety rests on these, not on the relay):
- ``start_view_with_floor`` is one transaction: it raises the fence epoch and then reads every
  unconfirmed ACK intent (commit order: epoch, clock), so it sees every commit made before it;
- ``commit_txns`` is one transaction: it checks the fence still holds ``epoch`` and that every id
  (and dead row) is still owned by ``leader_id``, else changes nothing and raises
  :class:`~producer.errors.FenceError`; otherwise it deletes the ids, dead-letters the dead rows,
  writes one ACK intent per journal of each transaction, forgets the attempt counts of ``forget``,
  and raises ``last_clock`` to the largest ACK clock. A :class:`~producer.errors.DatabaseError` means
  the outcome is unknown (it may have committed: the reply can be lost);
- ``mark_with_attempts`` claims up to ``limit`` rows not owned by ``leader_id``, in id order;
- attempt counts never decrease (``record_attempts``); ``confirm_acks`` deletes intents by
  (producer, clock).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from harvest_outbox.producer.db import MarkedAttempts, MarkedRow, TxnCommit


@runtime_checkable
class SequencedStore(Protocol):
    """What the sequenced mode asks of the database (see module doc)."""

    def start_view_with_floor(
        self, leader_id: uuid.UUID, name: str
    ) -> tuple[int, list[tuple[int, bytes, int, str, int]], int]:
        """(new epoch, unconfirmed intents (epoch, producer, clock, topic, partition), clock floor)."""
        ...

    def commit_txns(self, epoch: int, leader_id: uuid.UUID, txns: Sequence[TxnCommit]) -> None:
        """The fenced commit of consecutive transactions of one view."""
        ...

    def confirm_acks(self, items: Sequence[tuple[bytes, int]]) -> int:
        """Delete the intents of ACKs known to be in the log."""
        ...

    def record_attempts(self, items: Sequence[tuple[int, int, str]]) -> int:
        """Persist failed delivery attempts ``(id, attempts so far, error)``."""
        ...

    def mark_with_attempts(self, leader_id: uuid.UUID, limit: int) -> tuple[list[MarkedRow], MarkedAttempts]:
        """Claim the next rows for ``leader_id`` with their persisted attempt counts."""
        ...
