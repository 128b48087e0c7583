"""The relay's database: the parts both outbox layouts' relay databases compose (docs/design.md, "Outbox
layouts"), each layout's own binding being in its folder (:class:`~producer.layouts.mark.database.MarkDatabase`,
:class:`~producer.layouts.cursor.database.CursorDatabase`).

Its concepts have modules of their own, re-exported here (``from harvest_outbox.producer.db import …``):
- :mod:`~producer.db._session`: :func:`connect` and the session every statement runs in (autocommit,
  UTF-8, timeouts, the connection replaced after a failure): :class:`OutboxSession`;
- :mod:`~producer.db.fence`: ``--uuid-sequencing``'s view start and ACK intents (:class:`Fence`), a fenced
  commit sent as one message, :class:`TxnCommit` (its dead-lettered rows :class:`DeadRow`), :func:`id_range`;
- :mod:`~producer.db._books`: the delivery-attempt counts (:class:`Attempts`) and the dead letters' counts
  and expiry (:class:`DeadLetters`), on :mod:`~producer.db._statements`;
- :mod:`~producer.layouts.mark.marks`: the :data:`MarkedRow` both layouts' reads return;
- :mod:`~producer.db._listener`: :class:`Listener`, LISTEN for a stasher's NOTIFY;
- :mod:`~producer.db._header_arrays`: the header arrays' loader on the relay's connections (compiled in
  ``_text_arrays.pyx``; :func:`header_arrays_path` says whether it runs);
- :mod:`~producer.db.statement_pool`: a fleet's statement connections of one database
  (:class:`StatementPool`), which its relays' sessions lease (:func:`leased`).

Invariants: every statement runs in autocommit mode (each is its own transaction, as in goharvest),
committed synchronously except on a session built with ``async_commit`` (the relay's mark connection:
see ``RelayCore.open``, tests/test_producer/layouts/mark/test_async_mark.py); failures are raised as
:class:`~producer.errors.DatabaseError` chained to the psycopg error, with secrets scrubbed from the
message.
"""

from __future__ import annotations

from harvest_outbox.producer.db._books import Attempts, DeadLetters
from harvest_outbox.producer.db._listener import Listener
from harvest_outbox.producer.db._session import (
    IDLE_IN_TRANSACTION_TIMEOUT,
    LAYOUT_CHANGED_SQLSTATE,
    LOCK_TIMEOUT,
    TCP_DEFAULTS,
    OutboxSession,
    connect,
    leased,
)
from harvest_outbox.producer.db._statements import ANY_IDS
from harvest_outbox.producer.db.fence import MAX_RANGE_HOLES, DeadRow, Fence, TxnCommit, id_range
from harvest_outbox.producer.db.statement_pool import StatementPool, StatementPools
from harvest_outbox.producer.layouts.mark.marks import ROW_CREATED, MarkedAttempts, MarkedRow

__all__ = [
    "ANY_IDS",
    "IDLE_IN_TRANSACTION_TIMEOUT",
    "LAYOUT_CHANGED_SQLSTATE",
    "LOCK_TIMEOUT",
    "MAX_RANGE_HOLES",
    "ROW_CREATED",
    "TCP_DEFAULTS",
    "Attempts",
    "DeadLetters",
    "DeadRow",
    "Fence",
    "Listener",
    "MarkedAttempts",
    "MarkedRow",
    "OutboxSession",
    "StatementPool",
    "StatementPools",
    "TxnCommit",
    "connect",
    "header_arrays_path",
    "id_range",
    "leased",
]


def header_arrays_path() -> str:
    """``native`` when the compiled header-array reader (``_text_arrays.pyx``) runs, ``python`` when psycopg's
    loader reads every array (not built, or ``HARVEST_PURE_PYTHON=1``): part of ``harvest --version``."""
    from harvest_outbox.producer.db import _header_arrays

    return "native" if _header_arrays._native is not None else "python"
