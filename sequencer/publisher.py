"""Publisher: stamps outgoing messages with UUIDs and builds ACK intents.

A port of the sequencing half of Gazette's ``message.Publisher`` (appending
is the caller's job, e.g. the relay's Kafka producer). A Publisher owns a
producer id and a :class:`Clock`; each published message gets the next tick.

* ``publish_committed(journal)``: an OUTSIDE_TXN UUID; the message is readable
  by read-committed readers as soon as it is written.
* ``publish_uncommitted(journal)``: a CONTINUE_TXN UUID; the journal is
  remembered until the next ``build_ack_intents()``.
* ``build_ack_intents()``: one :class:`AckIntent` (journal, ACK_TXN UUID) per
  journal published to uncommitted since the last call, in the order those
  journals were first published to, each ACK a fresh tick after every message
  before it. Persist the intents *before* writing them, and re-write all of
  them after a fault: a re-sent ACK is harmless (readers roll back to it).

Invariants (each backed by ``tests/test_sequencer/test_publisher.py``):

* Clocks of one Publisher's UUIDs strictly increase in call order.
* Every ACK clock exceeds the clocks of all messages it acknowledges.
* ``build_ack_intents()`` returns each touched journal exactly once, then
  forgets them; a second call with no publishes in between returns ``[]``.

Not thread-safe: drive a Publisher (and any Clock it shares) from one thread.
"""

from __future__ import annotations

import time
import uuid
from typing import NamedTuple

from .clock import Clock
from .errors import UUIDError
from .identity import Flags, build_uuid, new_producer_id

__all__ = ["AckIntent", "Publisher"]


class AckIntent(NamedTuple):
    """An ACK_TXN message to append to ``journal``, carrying ``uuid``."""

    journal: str
    uuid: uuid.UUID


class Publisher:
    """Assigns message UUIDs for one producer id (see module doc)."""

    __slots__ = ("_auto_update", "_clock", "_producer", "_touched")

    def __init__(self, clock: Clock | None = None, producer_id: bytes | None = None) -> None:
        """Create a Publisher.

        Without ``clock``, an own Clock is updated to wall time before every
        publish (as Gazette does). With one, the caller keeps it current, e.g.
        ``clock.update(time.time_ns())`` once per batch, saving system calls.
        """
        if producer_id is None:
            producer_id = new_producer_id()
        elif not isinstance(producer_id, (bytes, bytearray)) or len(producer_id) != 6:
            raise UUIDError(f"producer_id must be 6 bytes, got {producer_id!r}; use new_producer_id()")
        self._producer = bytes(producer_id)
        self._auto_update = clock is None
        self._clock = Clock() if clock is None else clock
        # Journals published to uncommitted since the last build_ack_intents(),
        # in first-publish order (dicts keep insertion order).
        self._touched: dict[str, None] = {}

    @property
    def producer_id(self) -> bytes:
        return self._producer

    @property
    def clock(self) -> Clock:
        return self._clock

    def _next_clock(self) -> int:
        if self._auto_update:
            self._clock.update(time.time_ns())
        return self._clock.tick()

    def publish_committed(self, journal: str | None = None) -> uuid.UUID:
        """UUID for a message that commits on its own (OUTSIDE_TXN).

        ``journal`` is accepted for symmetry and not tracked: committed
        messages need no acknowledgement.
        """
        return build_uuid(self._producer, self._next_clock(), Flags.OUTSIDE_TXN)

    def publish_uncommitted(self, journal: str) -> uuid.UUID:
        """UUID for a message of the open transaction (CONTINUE_TXN) to ``journal``."""
        if journal not in self._touched:
            if not isinstance(journal, str) or not journal:
                raise ValueError(f"journal must be a non-empty str such as 'topic/0', got {journal!r}")
            self._touched[journal] = None
        return build_uuid(self._producer, self._next_clock(), Flags.CONTINUE_TXN)

    def pending_journals(self) -> tuple[str, ...]:
        """Journals that the next ``build_ack_intents()`` will acknowledge."""
        return tuple(self._touched)

    def build_ack_intents(self) -> list[AckIntent]:
        """ACK intents committing every uncommitted publish since the last call."""
        # Gazette does not update the clock here either: ticks suffice to
        # order the ACKs after the messages they commit.
        out = [
            AckIntent(journal, build_uuid(self._producer, self._clock.tick(), Flags.ACK_TXN))
            for journal in self._touched
        ]
        self._touched.clear()
        return out
