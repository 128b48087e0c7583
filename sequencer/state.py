"""ProducerState: what a checkpoint remembers about one producer in one journal.

Invariants:

* ``producer`` is 6 bytes; ``last_ack >= 0`` is the clock of the producer's
  last ACK_TXN or OUTSIDE_TXN (or, mid-dequeue, of its last processed
  message); ``begin`` is the offset of the first unprocessed CONTINUE_TXN
  message after ``last_ack``, or ``-1`` when there is none.
* States are immutable values, safe to share between Sequencers.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ProducerState"]


@dataclass(frozen=True, slots=True)
class ProducerState:
    """Resumable sequencing state of ``producer`` within ``journal``."""

    journal: str
    producer: bytes
    last_ack: int
    begin: int
