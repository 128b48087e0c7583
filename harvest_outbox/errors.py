"""The root of every error harvest raises on purpose.

Each subpackage has its own root, and each of those derives from :class:`HarvestOutboxError`, so an
application embedding harvest can catch the whole family with one ``except``:

* :class:`harvest_outbox.producer.errors.HarvestError` (the relay and the stashers),
* :class:`harvest_outbox.sequencer.errors.SequencerError`,
* :class:`harvest_outbox.consumer.errors.ConsumerError`,
* :class:`harvest_outbox.spark_reader.errors.SparkReaderError`,
* :class:`harvest_outbox.harvest_local.errors.HarvestLocalError`.

The subpackage roots keep their other bases (``ValueError`` for bad values, ``RuntimeError`` for
misuse), so handlers written against those keep working. The root is named for the distribution,
not ``HarvestError``: that name is the producer's root, which does not cover the readers' errors.

Invariant (``tests/test_foundation/test_errors.py``): every exception class defined in a module of
``harvest_outbox`` derives from :class:`HarvestOutboxError`. This module imports nothing, so every
subpackage can import it without pulling in another.
"""

from __future__ import annotations

__all__ = ["HarvestOutboxError"]


class HarvestOutboxError(Exception):
    """Base class of every error raised on purpose by any part of harvest."""
