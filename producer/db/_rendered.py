"""A composed statement rendered once per connection, not at every run.

The relay builds its statements once (``psycopg.sql`` compositions: quoted identifiers, literals) and runs
them thousands of times a second. psycopg renders a composition each time it runs it, walking the whole tree
and quoting every identifier again (~15 µs for the cursor layout's id-source look-up alone); at a trickle,
where every row is a batch of its own, that was ~8 % of the relay's interpreter time (py-spy, a cursor-layout
sequenced relay at 500 rows/s). :func:`rendered` gives the bytes psycopg would have rendered, from a cache
kept per connection (quoting depends on its encoding and settings).

Invariants (tests/test_producer/db/test_rendered.py):
- R1: the bytes are those ``query.as_bytes(conn)`` gives, for the connection it runs on;
- R2: an entry is found by its composition's identity, never by an equal-looking one built later: the entry
  keeps its composition alive, so no other composition takes its id while it is cached;
- R3: the cache of a connection is bounded (:data:`MAX_ENTRIES`), and goes with the connection.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import psycopg
from psycopg import sql

#: Compositions kept per connection; the relay's own are a few dozen, and a composition built for each call
#: (rare on hot paths) only churns the cache: it is emptied when full.
MAX_ENTRIES = 256

_caches: weakref.WeakKeyDictionary[Any, dict[int, tuple[sql.Composable, bytes]]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def rendered(conn: psycopg.Connection[Any], query: Any) -> Any:
    """``query`` as bytes when it is a composition (rendered for ``conn`` once), else ``query`` as it is."""
    if not isinstance(query, sql.Composable):
        return query
    cache = _caches.get(conn)
    if cache is None:
        with _lock:
            cache = _caches.setdefault(conn, {})
    entry = cache.get(id(query))
    if entry is not None:
        return entry[1]
    text = query.as_bytes(conn)
    if len(cache) >= MAX_ENTRIES:
        cache.clear()
    cache[id(query)] = (query, text)
    return text
