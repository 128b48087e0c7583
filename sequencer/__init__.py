"""Gazette-compatible exactly-once sequencing.

Message identity (:mod:`.identity`, :mod:`.clock`), the read-committed
:class:`Sequencer`, the UUID-stamping :class:`Publisher` and checkpoint
encoding. See docs/design.md §2 and §3. No Kafka, Postgres or Spark
imports here: callers adapt their records to :class:`Envelope`.

:class:`Sequencer` is the compiled one (``_native.pyx``) when it is built,
else the pure-Python reference (:class:`PySequencer`); ``IMPLEMENTATION``
says which (see :mod:`.native`).

Typical reader loop::

    outcome = seq.queue_uncommitted(env)
    if outcome == QueueOutcome.ACK_COMMIT_REPLAY:
        journal, begin, end = seq.replay_range()
        seq.start_replay(read_envelopes(journal, begin, end))
    while (committed := seq.step()) is not None:
        process(committed)
"""

from typing import TYPE_CHECKING, Any

from .checkpoint import CHECKPOINT_VERSION, check_checkpoint_scope, decode_checkpoint, encode_checkpoint
from .clock import TICK, Clock
from .envelope import Envelope, journal_name
from .errors import (
    CheckpointError,
    CheckpointMismatchError,
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
from .native import load as _load_native
from .outcome import COMMITTING_OUTCOMES, QueueOutcome
from .publisher import AckIntent, Publisher
from .sequencer import DEFAULT_PRUNE_HORIZON_NS, DEFAULT_RING_SIZE
from .sequencer import Sequencer as PySequencer
from .state import ProducerState

_native = _load_native("harvest_outbox.sequencer._native")
#: "native" (compiled) or "python" (the reference).
IMPLEMENTATION = "python" if _native is None else "native"
if TYPE_CHECKING:  # the compiled class has PySequencer's interface (test_seq_native checks both)
    Sequencer = PySequencer
else:
    #: The Sequencer in use: the native one when built, else :class:`PySequencer`.
    Sequencer = PySequencer if _native is None else _native.Sequencer
#: Columnar ``queue_batch`` entries (native only; None with the pure-Python implementation).
EntryBatch: Any = None if _native is None else _native.EntryBatch  # a compiled class: no stub

__all__ = [
    "CHECKPOINT_VERSION",
    "COMMITTING_OUTCOMES",
    "DEFAULT_PRUNE_HORIZON_NS",
    "DEFAULT_RING_SIZE",
    "IMPLEMENTATION",
    "NIL_UUID",
    "TICK",
    "AckIntent",
    "CheckpointError",
    "CheckpointMismatchError",
    "Clock",
    "EntryBatch",
    "Envelope",
    "Flags",
    "ProducerState",
    "Publisher",
    "PySequencer",
    "QueueOutcome",
    "ReplayError",
    "Sequencer",
    "SequencerError",
    "SequencerStateError",
    "UUIDError",
    "build_uuid",
    "check_checkpoint_scope",
    "clock_of",
    "decode_checkpoint",
    "encode_checkpoint",
    "flags_of",
    "journal_name",
    "new_producer_id",
    "parse_uuid",
    "producer_of",
]
