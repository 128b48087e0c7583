"""Envelope: one read-uncommitted message and where it sits in its journal.

A journal is one Kafka topic-partition, named ``"topic/partition"``
(see :func:`journal_name`); ``begin`` and ``end`` are offsets bracketing the
message, with ``end > begin`` and the next message's ``begin >= end``. Offsets
need not be contiguous: for Kafka, ``begin`` is the record offset and ``end``
is ``offset + 1``.

Invariants:

* ``uuid`` is a version-1 message UUID (see :mod:`sequencer.identity`) or the
  nil UUID; validate untrusted bytes with ``parse_uuid`` before building one.
* An Envelope is never mutated by the Sequencer; the object handed to
  ``queue_uncommitted`` (or served by a replay) is the one ``step()`` returns.
"""

from __future__ import annotations

import uuid as _uuid
from dataclasses import dataclass
from typing import Any

__all__ = ["Envelope", "journal_name"]


@dataclass(slots=True)
class Envelope:
    """A message read from ``journal`` at offsets ``[begin, end)``."""

    journal: str
    begin: int
    end: int
    uuid: _uuid.UUID
    message: Any = None


def journal_name(topic: str, partition: int) -> str:
    """The journal name of a Kafka topic-partition: ``"topic/partition"``."""
    return f"{topic}/{partition}"
