"""Gazette-compatible exactly-once sequencing, in pure Python.

Message identity (:mod:`.identity`, :mod:`.clock`), the read-committed
:class:`Sequencer`, the UUID-stamping :class:`Publisher` and checkpoint
encoding. See ``DESIGN.md`` sections 2 and 3. No Kafka, Postgres or Spark
imports here: callers adapt their records to :class:`Envelope`.

Typical reader loop::

    outcome = seq.queue_uncommitted(env)
    if outcome == QueueOutcome.ACK_COMMIT_REPLAY:
        journal, begin, end = seq.replay_range()
        seq.start_replay(read_envelopes(journal, begin, end))
    while (committed := seq.step()) is not None:
        process(committed)
"""

from .checkpoint import CHECKPOINT_VERSION, decode_checkpoint, encode_checkpoint
from .clock import TICK, Clock
from .envelope import Envelope, journal_name
from .errors import (
    CheckpointError,
    ReplayError,
    SequencerError,
    SequencerStateError,
    UUIDError,
)
from .identity import (
    NIL_UUID,
    Flags,
    build_uuid,
    clock_of,
    flags_of,
    new_producer_id,
    parse_uuid,
    producer_of,
)
from .outcome import COMMITTING_OUTCOMES, QueueOutcome
from .publisher import AckIntent, Publisher
from .sequencer import DEFAULT_PRUNE_HORIZON_NS, DEFAULT_RING_SIZE, Sequencer
from .state import ProducerState

__all__ = [
    "CHECKPOINT_VERSION",
    "COMMITTING_OUTCOMES",
    "DEFAULT_PRUNE_HORIZON_NS",
    "DEFAULT_RING_SIZE",
    "NIL_UUID",
    "TICK",
    "AckIntent",
    "CheckpointError",
    "Clock",
    "Envelope",
    "Flags",
    "ProducerState",
    "Publisher",
    "QueueOutcome",
    "ReplayError",
    "Sequencer",
    "SequencerError",
    "SequencerStateError",
    "UUIDError",
    "build_uuid",
    "clock_of",
    "decode_checkpoint",
    "encode_checkpoint",
    "flags_of",
    "journal_name",
    "new_producer_id",
    "parse_uuid",
    "producer_of",
]
