"""Errors of the Spark reader."""

from __future__ import annotations

from harvest_outbox.errors import HarvestOutboxError


class SparkReaderError(HarvestOutboxError):
    """Base class of every error raised by :mod:`spark_reader`."""


class ReaderConfigError(SparkReaderError, ValueError):
    """A bad argument or option; the message names it, the value and the fix."""


class MissingUUIDError(SparkReaderError):
    """A record has no valid ``uuid`` header and the policy is ``"raise"``."""


class StreamStateError(SparkReaderError):
    """``readCommittedStream(state_location=...)`` cannot find sequencing state it stored earlier."""
