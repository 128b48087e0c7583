"""``deadLetterPolicy: haltKey``: once a row is dead-lettered, the later rows of its key wait.

A *key* here is (topic, key): Kafka orders a key's records within its topic's partition, and a
stuck ``orders`` key must not stop the same id's ``customers`` records. Rows without a topic or a
key halt nothing (a keyless record has no order to keep).

How the relay knows a key is halted, and why so:

1. **In the database, for every mark.** Under ``haltKey`` the mark claims no row whose (topic, key)
   has a dead letter: a ``NOT EXISTS`` probe of the dead-letter table, served by the
   ``(kafka_topic, kafka_key)`` index ``init-db`` creates (:func:`halted_filter`). The dead-letter
   table *is* the halt state: durable, shared by every relay and shard, changed by ``requeue`` /
   ``discard`` / ``deadLetterRetention`` in one transaction with the rows they move. A restart, a
   new leader, a late-committing row of the key (a lower or a higher id) or a requeue by another
   process need no notification, cache or generation counter: the next mark sees the table as it is.
   An in-memory set loaded at leadership start would need all of those, and a miss would let a row
   overtake its dead letter. Cost on the hot path: with no dead letters, one look at the empty
   table per mark (an InitPlan that short-circuits the per-row probe); with dead letters, one index
   probe per claimed row; measured in docs/dead-letters.md (bench/bench_halt.py); ``skip`` adds
   nothing.
2. **In the relay, for the rest of the view.** A row is dead-lettered after its mark claimed the
   key's later rows (same batch, or a mark queued ahead) and before the dead letter is written. So
   the mode halts the key in this view at once (:class:`KeyHalt`): its later rows are not produced
   and stay marked by the view. Once nothing claimed before the halt is left to send, the view ends
   (at-least-once: a remark; ``--uuid-sequencing``: a wind-down that commits what was delivered,
   the dead letter with it). The next view starts after that write, so its marks see the dead
   letter and leave the key's rows in the outbox. One view end per batch of dead letters, not per
   dead letter; clearing the set with the view keeps a key released by another process from being
   held by a stale entry.

Requeue under ``haltKey`` gives the rows back their original ids (:mod:`producer.ops._deadletters`): a
key's waiting rows all have higher ids than its first dead letter, so the requeued row goes first.

Invariants (tests/test_producer/relay/test_halt_key.py, on real Postgres and Kafka, both modes, sharded):
- under ``haltKey`` no record of a (topic, key) is produced after one of its rows was dead-lettered,
  until that dead letter leaves the table (requeue, discard, retention);
- then the key's rows flow in id order, the requeued row first;
- ``skip`` changes nothing (neither the mark nor the modes' paths).
"""

from __future__ import annotations

import logging

from psycopg import sql

from harvest_outbox.producer.relay.marked_row import ROW_ID, ROW_KEY, ROW_TOPIC, MarkedRow
from harvest_outbox.producer.schema import OutboxNames

log = logging.getLogger(__name__)


def halted_filter(names: OutboxNames, topic: sql.Composable, key: sql.Composable) -> sql.Composable:
    """`` AND NOT EXISTS (…)``: the mark's condition that a row's (topic, key) has no dead letter;
    ``topic`` and ``key`` are the record's expressions over the claim's outbox alias."""
    # The first NOT EXISTS is uncorrelated: an InitPlan, run once per mark. While the table is empty (the
    # usual state) it is true, and Postgres, evaluating OR's arms in order, never runs the per-row probe.
    return sql.SQL(
        " AND (NOT EXISTS (SELECT 1 FROM {d}) OR "
        "NOT EXISTS (SELECT 1 FROM {d} AS dl WHERE dl.kafka_topic = {t} AND dl.kafka_key = {k}))"
    ).format(d=names.dead_letters, t=topic, k=key)


class KeyHalt:
    """The (topic, key) pairs this view dead-lettered a row of (see module doc, point 2). One per mode;
    read on the relay thread for every produced row, so :meth:`blocks` is a falsy check while empty."""

    __slots__ = ("enabled", "keys")

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.keys: set[tuple[str, bytes]] = set()

    def __bool__(self) -> bool:
        return bool(self.keys)

    def halt(self, row: MarkedRow) -> None:
        """``row`` is being dead-lettered: under ``haltKey``, its key's later rows wait from now on."""
        topic, key = row[ROW_TOPIC], row[ROW_KEY]
        if not self.enabled or topic is None or key is None:
            return
        pair = (topic, key)
        if pair not in self.keys:
            self.keys.add(pair)
            log.warning(
                "key %r of topic %r halted behind dead letter %d (deadLetterPolicy: haltKey): its later rows "
                "wait in the outbox until the dead letter is requeued or discarded",
                key,
                topic,
                row[ROW_ID],
            )

    def blocks(self, row: MarkedRow) -> bool:
        """Is ``row``'s key halted in this view? (Called only while :meth:`__bool__`.)"""
        return (row[ROW_TOPIC], row[ROW_KEY]) in self.keys

    def clear(self) -> None:
        """The view ended: the next one's marks leave halted keys' rows in the outbox."""
        self.keys.clear()
