"""Read-committed, effectively-once Kafka consumption (docs/design.md §6).

* :class:`ReadUncommittedIter`: every record of the assigned partitions, as
  ``sequencer.Envelope`` (journal ``topic/partition``, Begin = offset,
  End = offset + 1, the ``uuid`` header's message UUID, a :class:`Record`).
* :class:`ReadCommittedIter`: those envelopes through a ``sequencer.Sequencer``:
  committed records only, in order, with replays of spans that left the ring,
  and ``checkpoint() -> bytes`` to resume exactly-once.
* :class:`PostgresCheckpointStore`: checkpoints saved in the caller's Postgres
  transaction, next to the effects (imported lazily: psycopg is only loaded
  when it is used).

Example::

    from harvest_outbox.consumer import ReadCommittedIter
    with ReadCommittedIter({"bootstrap.servers": "localhost:9092"}, topics=["orders"],
                           checkpoint=saved) as it:
        for rec in it:
            handle(rec.key, rec.value)
            saved = it.checkpoint()

Logging goes to the ``consumer.*`` loggers; credentials never appear in logs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .committed import ReadCommittedIter
from .errors import (
    CheckpointMismatchError,
    CheckpointStoreError,
    ConfigError,
    ConsumerClosedError,
    ConsumerError,
    KafkaReadError,
    MissingUUIDError,
    OffsetLostError,
    ReplayFailedError,
)
from .record import HEADER_NAME, Record
from .uncommitted import ReadUncommittedIter
from .uuid_header import UUIDPolicy

if TYPE_CHECKING:
    from .pg_store import PostgresCheckpointStore

__all__ = [
    "HEADER_NAME",
    "CheckpointMismatchError",
    "CheckpointStoreError",
    "ConfigError",
    "ConsumerClosedError",
    "ConsumerError",
    "KafkaReadError",
    "MissingUUIDError",
    "OffsetLostError",
    "PostgresCheckpointStore",
    "ReadCommittedIter",
    "ReadUncommittedIter",
    "Record",
    "ReplayFailedError",
    "UUIDPolicy",
]


def __getattr__(name: str) -> Any:
    if name == "PostgresCheckpointStore":
        from .pg_store import PostgresCheckpointStore

        return PostgresCheckpointStore
    raise AttributeError(f"module 'consumer' has no attribute {name!r}")
