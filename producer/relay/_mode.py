"""The interface of the relay's delivery modes: how a leading relay delivers, as a strategy over a
:class:`~producer.relay.core.RelayCore` (:class:`~producer.relay.at_least_once.mode.AtLeastOnceMode`,
:class:`~producer.relay.sequenced.mode.SequencedMode`; :class:`~producer.harvest.Harvest` picks one per relay).

Invariant: the relay thread calls every method, and none of them blocks longer than a drain or a
wind-down; a mode decides and the core mutates (tests/test_producer/relay/test_relay_modes.py).
"""

from __future__ import annotations

from typing import Protocol

from harvest_outbox.producer.kafka import KafkaProducer


class RelayMode(Protocol):
    """How a leading relay delivers: a strategy over a :class:`RelayCore`.

    The relay thread calls every method; none of them blocks longer than a drain or a wind-down."""

    def ensure_producer(self) -> KafkaProducer:
        """The core's producer, created with this mode's settings when there is none."""
        ...

    def on_acquired(self) -> None:
        """A new view was just taken (``core.leader_id`` is set); reset per-view state."""
        ...

    def tick(self) -> None:
        """One step of leader work: mark, produce, purge / commit, or wait briefly for progress."""
        ...

    def relinquish(self, why: str) -> None:
        """Leadership ends: stop sending, drain, finish what may be finished, drop leader state."""
        ...

    def gauges(self) -> tuple[int, int]:
        """(records in flight, records queued) for the meter."""
        ...

    def in_flight_keys(self) -> list[bytes]:
        """Keys of the records in flight (at-least-once mode; empty where records are not tracked by key)."""
        ...
