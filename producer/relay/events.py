"""Events the relay reports to an embedding application's handler (goharvest's set).

The handler runs on the relay's own thread: it must be quick and must not call back into the
:class:`~producer.harvest.Harvest` in a blocking way. Exceptions it raises are logged and ignored.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from harvest_outbox.producer.observe.metrics import MeterStats


@dataclass(frozen=True)
class LeaderAcquired:
    """This process became leader; ``leader_id`` marks the rows it owns from now on."""

    leader_id: uuid.UUID


@dataclass(frozen=True)
class LeaderRefreshed:
    """After a failure the relay took a new leader id so that every unpurged row is marked again."""

    leader_id: uuid.UUID


@dataclass(frozen=True)
class LeaderRevoked:
    """Leadership was handed over (rebalance or stop), after in-flight work drained."""


@dataclass(frozen=True)
class LeaderFenced:
    """No heartbeat came back within the heartbeat timeout: this process stopped acting as leader."""


@dataclass(frozen=True)
class ViewStarted:
    """``--uuid-sequencing``: a leader view started. ``epoch`` is its fence epoch; ``recovered_acks``
    the number of persisted ACK intents it re-published (and saw delivered) before anything else;
    ``producers`` its ring of Gazette ProducerIDs (6 bytes each)."""

    leader_id: uuid.UUID
    epoch: int
    recovered_acks: int
    producers: tuple[bytes, ...]


@dataclass(frozen=True)
class MeterRead:
    """Periodic metrics (every ``limits.minMetricsInterval``)."""

    stats: MeterStats


Event = LeaderAcquired | LeaderRefreshed | LeaderRevoked | LeaderFenced | ViewStarted | MeterRead
EventHandler = Callable[[Event], None]
