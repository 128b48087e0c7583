"""The row an outbox layout's read hands the relay (:data:`MarkedRow`), and the names of its fields.

The mark (producer.layouts.mark.marks) and the cursor layout's read and release
(producer.layouts.cursor.database) return rows in this shape straight from the driver; both delivery
modes, the encoders and the dwell histograms read them by the names below.

Invariants (tests/test_producer/relay/test_marked_row.py):
- a marked row is a plain ``tuple``, exactly as psycopg's default row factory makes it: CPython's
  cyclic garbage collector stops tracking a tuple of atomic values (``PyTuple_CheckExact`` in its
  ``untrack_tuples``), but never an instance of a tuple subclass (``typing.NamedTuple``) or of a
  class with slots. The relay holds tens of thousands of marked rows during a drain; tracked, each
  mark's rows reach the oldest generation and make full collections frequent and long (a NamedTuple
  row measured ~2 µs a row more over a 300k-object heap: ~20 % of the relay's per-row budget);
- its fields are read by the ``ROW_*`` names, never by a bare number: each is ``Final``, so mypy
  types ``row[ROW_TOPIC]`` as that field's type; unpacking a row (the hot paths' one-step read) binds
  them in this order.
"""

from __future__ import annotations

from typing import Final

# A marked row: (id, topic, key bytes, value bytes|None, header keys, header values, bad, persisted
# attempts, last error, partition, created). Header arrays are tuples, or None when the row has no
# headers (empty arrays come back as NULL: no loader call per row). ``bad`` is None, or why the row
# can never be produced (decided by the statement: the table mapping's RecordSql.bad, then
# HEADER_BAD). ``partition`` is None (the producer's partitioner, by key) unless the table mapping
# places a column there (producer.mapping.table). ``created`` is the row's create time on this
# process's time.monotonic() clock (producer.observe._histograms).
#
# Topic and key are NULL only in a bad row; each mode checks them with ``bad`` (two ``is None`` tests
# a row) and so reads them as str and bytes after. Header keys are typed without NULL: a NULL header
# key makes the row bad (HEADER_BAD), and a bad row's headers are never read (it is dead-lettered
# by id); proving it per row would cost a scan of every header array.
MarkedRow = tuple[
    int,
    "str | None",
    "bytes | None",
    "bytes | None",
    "tuple[str, ...] | None",
    "tuple[str | None, ...] | None",
    "str | None",
    "int | None",
    "str | None",
    "int | None",
    float,
]

#: The outbox row's id.
ROW_ID: Final = 0
#: The Kafka topic (NULL only in a bad row).
ROW_TOPIC: Final = 1
#: The Kafka key (NULL only in a bad row).
ROW_KEY: Final = 2
#: The Kafka value (NULL: a tombstone).
ROW_VALUE: Final = 3
#: Header names, or None when the row has none.
ROW_HEADER_KEYS: Final = 4
#: Header values, one per name, or None when the row has none.
ROW_HEADER_VALUES: Final = 5
#: Why the row can never be produced, or None.
ROW_BAD: Final = 6
#: Failed delivery attempts persisted for the row, or None.
ROW_ATTEMPTS: Final = 7
#: The last persisted delivery error, or None.
ROW_LAST_ERROR: Final = 8
#: The partition the table mapping places the row in, or None (the producer's partitioner).
ROW_PARTITION: Final = 9
#: The create time (time.monotonic() seconds): the dwell histogram's start.
ROW_CREATED: Final = 10

#: Fields of a marked row.
ROW_FIELDS: Final = 11


def with_encoded(row: MarkedRow, key: bytes | None, value: bytes | None) -> MarkedRow:
    """``row`` with its key and value replaced (by their serialized forms: producer.encode.serialization)."""
    return (row[ROW_ID], row[ROW_TOPIC], key, value, *row[ROW_HEADER_KEYS:])


def with_bad(row: MarkedRow, bad: str) -> MarkedRow:
    """``row`` made bad: it can never be produced, for the reason ``bad`` (it goes to the dead letters)."""
    return (*row[:ROW_BAD], bad, *row[ROW_ATTEMPTS:])
