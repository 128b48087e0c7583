"""Exceptions raised by the sequencer package.

Every error derives from :class:`SequencerError`, so callers can catch the
whole family at once (it is a :class:`harvest_outbox.errors.HarvestOutboxError`,
the root of every harvest error). Errors about bad *values* also derive from
:class:`ValueError`, and errors about calling the API out of order derive from
:class:`RuntimeError`, so generic handlers keep working.

Invariants:

* Every exception raised deliberately by this package is a ``SequencerError``.
* An error caused by another exception chains it (``raise ... from exc``).
"""

from __future__ import annotations

from harvest_outbox.errors import HarvestOutboxError

__all__ = [
    "CheckpointError",
    "CheckpointMismatchError",
    "ReplayError",
    "SequencerError",
    "SequencerStateError",
    "UUIDError",
]


class SequencerError(HarvestOutboxError):
    """Base class of every error raised by the sequencer package."""


class UUIDError(SequencerError, ValueError):
    """A message UUID, producer id, clock or flags value is malformed."""


class ReplayError(SequencerError):
    """A replay supplied to ``Sequencer.start_replay`` is wrong or failed.

    Raised by ``Sequencer.step()`` when the replayed envelopes are not from the
    journal and offset range named by ``Sequencer.replay_range()``, or when the
    replay iterator itself raised (the original error is chained). The
    Sequencer is left mid-sequence; recover by restoring the last checkpoint.
    """


class CheckpointError(SequencerError, ValueError):
    """A checkpoint (encoded bytes or restored states) is corrupt or unsupported."""


class CheckpointMismatchError(CheckpointError):
    """A valid checkpoint that belongs to another reader: it covers none of the partitions this
    reader reads (another topic, other partitions), or partitions its topic does not have."""


class SequencerStateError(SequencerError, RuntimeError):
    """The Sequencer API was used out of order (a programming error)."""
