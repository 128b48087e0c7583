"""The loader of the outbox's header arrays (``text[]``, binary) on the relay's connections.

Invariants (tests/test_producer/db/test_text_arrays.py):
- a header array loads as a tuple, never a list: a marked row is then a tuple of atomic values, which
  Python's cyclic garbage collector stops tracking (the relay holds tens of thousands of marked rows in its
  queues during a drain; as tracked objects they made every full collection walk all of them);
- the compiled reader (``producer/db/_text_arrays.pyx``) runs only on a connection whose encoding is UTF-8
  and only where it reads the array itself; everything else goes to psycopg's loader, the reference, so a
  row loads the same either way (``HARVEST_PURE_PYTHON=1``: always the reference).
"""

from __future__ import annotations

from typing import Any

from psycopg.abc import AdaptContext
from psycopg.types.array import ArrayBinaryLoader

from harvest_outbox.sequencer.native import load

TEXT_ARRAY_OID = 1009

# The compiled reader, or None: psycopg's loader reads every array.
_native = load("harvest_outbox.producer.db._text_arrays")


class HeaderArrayLoader(ArrayBinaryLoader):
    """``text[]`` as a tuple (the mark returns empty header arrays as NULL, so this runs only for rows that
    have headers)."""

    def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        conn = self.connection
        self._fast = (
            _native.load_text_array
            if _native is not None and conn is not None and conn.info.encoding == "utf-8"
            else None
        )

    def load(self, data: Any) -> tuple[Any, ...]:  # type: ignore[override]  # a tuple on purpose (module doc)
        if self._fast is not None:
            got = self._fast(data)
            if got is not None:
                return got  # type: ignore[no-any-return]
        return tuple(super().load(data))
