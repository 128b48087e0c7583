"""Compositions rendered once per connection (producer/db/_rendered.py): R1-R3 on a real Postgres."""

from __future__ import annotations

import gc
import weakref

import psycopg
import pytest
from psycopg import sql

from harvest_outbox.producer.db import _rendered
from harvest_outbox.producer.db._rendered import MAX_ENTRIES, rendered


@pytest.fixture
def conn(pg_dsn: str) -> psycopg.Connection:
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        yield c


def test_a_composition_renders_as_psycopg_renders_it_and_runs(conn: psycopg.Connection) -> None:
    """R1: the bytes are as_bytes' (quoted identifiers and literals included), and they run."""
    query = sql.SQL("SELECT {}::text AS {}, %s::int").format(sql.Literal("it's"), sql.Identifier('odd "name"'))
    text = rendered(conn, query)
    assert text == query.as_bytes(conn)
    assert conn.execute(text, (7,)).fetchone() == ("it's", 7)
    assert rendered(conn, text) is text
    assert rendered(conn, "SELECT 1") == "SELECT 1"


def test_a_composition_is_rendered_once_per_connection(conn: psycopg.Connection, pg_dsn: str) -> None:
    """R1/R3: the second run finds the first's bytes; another connection renders its own."""
    renders = []

    class Counted(sql.SQL):
        def as_bytes(self, context: object = None) -> bytes:
            renders.append(context)
            return super().as_bytes(context)  # type: ignore[arg-type]

    query = Counted("SELECT 1")
    first = rendered(conn, query)
    assert rendered(conn, query) is first
    assert renders == [conn]
    with psycopg.connect(pg_dsn, autocommit=True) as other:
        rendered(other, query)
        assert renders == [conn, other]
    gone = weakref.ref(other)
    del other
    renders.clear()
    gc.collect()
    assert gone() is None and conn in _rendered._caches, "a connection's cache outlived it"


def test_an_entry_is_found_by_identity_not_by_a_reused_id(conn: psycopg.Connection) -> None:
    """R2: an entry keeps its composition alive, so no other takes its id while it is cached; once the cache
    is emptied, a later composition that takes a freed one's id gets its own bytes."""
    seen: dict[int, bytes] = {}
    reused = 0
    for n in range(3 * MAX_ENTRIES):
        query = sql.SQL("SELECT {}").format(sql.Literal(n))
        text = rendered(conn, query)
        assert text == query.as_bytes(conn) == f"SELECT {n}".encode()
        reused += id(query) in seen
        seen[id(query)] = text
        del query
    assert reused, "no id was reused: the scenario did not exercise R2"


def test_the_cache_of_a_connection_is_bounded(conn: psycopg.Connection) -> None:
    """R3: compositions built for each call churn the cache; it never holds more than MAX_ENTRIES."""
    kept = [sql.SQL("SELECT {}").format(sql.Literal(n)) for n in range(3 * MAX_ENTRIES)]
    for query in kept:
        rendered(conn, query)
        assert len(_rendered._caches[conn]) <= MAX_ENTRIES
    assert rendered(conn, kept[-1]) == kept[-1].as_bytes(conn)
