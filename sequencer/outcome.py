"""QueueOutcome: the decision ``Sequencer.queue_uncommitted`` made for a message.

Values and order are Gazette's (``QueueOutsideAlreadyAcked`` .. ``QueueAckCommitReplay``),
numbered from 0. Outcomes ``>= ACK_EMPTY`` plus ``OUTSIDE_COMMIT`` commit a
sequence: the caller must then call ``step()`` until it returns ``None``
(after ``start_replay`` for ``ACK_COMMIT_REPLAY``). All others are ignored or
buffered messages whose offsets are already read through.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["COMMITTING_OUTCOMES", "QueueOutcome"]


class QueueOutcome(IntEnum):
    #: OUTSIDE_TXN message already acknowledged: ignored.
    OUTSIDE_ALREADY_ACKED = 0
    #: OUTSIDE_TXN message committed: dequeue it with step().
    OUTSIDE_COMMIT = 1
    #: CONTINUE_TXN message already acknowledged: ignored.
    CONTINUE_ALREADY_ACKED = 2
    #: CONTINUE_TXN message with a clock not above the open span's: ignored.
    CONTINUE_TXN_CLOCK_LARGER = 3
    #: CONTINUE_TXN message opening a new span for its producer.
    CONTINUE_BEGIN_SPAN = 4
    #: CONTINUE_TXN message extending its producer's open span.
    CONTINUE_EXTEND_SPAN = 5
    #: ACK_TXN at or below the last ACK: the open span (if any) is discarded.
    ACK_ROLLBACK = 6
    #: ACK_TXN committing no preceding messages: dequeue it with step().
    ACK_EMPTY = 7
    #: ACK_TXN committing a span held wholly in the ring: dequeue with step().
    ACK_COMMIT_RING = 8
    #: ACK_TXN committing a span that left the ring: replay_range(),
    #: start_replay(), then dequeue with step().
    ACK_COMMIT_REPLAY = 9

    @property
    def commits(self) -> bool:
        """True if step() must now be called until it returns None."""
        return self in COMMITTING_OUTCOMES


COMMITTING_OUTCOMES = frozenset(
    {
        QueueOutcome.OUTSIDE_COMMIT,
        QueueOutcome.ACK_EMPTY,
        QueueOutcome.ACK_COMMIT_RING,
        QueueOutcome.ACK_COMMIT_REPLAY,
    }
)
