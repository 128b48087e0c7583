"""The stasher's array literals (producer.stash._text_array): Postgres parses each back into its list."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harvest_outbox.producer.stash._text_array import EMPTY, LiteralCache, array_literal

# Any text Postgres' TEXT holds (no NUL, no lone surrogate: not UTF-8), the characters the literal's rules
# turn on drawn often.
_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
    | st.sampled_from('"\\{},  \t\nNUL'),
    max_size=12,
)
_ITEMS = st.lists(st.none() | _TEXT | st.sampled_from(["NULL", "null", "", " ", '"', "\\"]), max_size=6)

_CASES: list[list[str | None]] = [
    [],
    [""],
    [None],
    ["NULL", None, "null"],
    ['say "hi"', "back\\slash", "\\", '"'],
    ["{a,b}", "a,b", " lead", "trail ", "tab\there", "new\nline"],
    ["ü€😀", "\u2028", "\\N"],
]


@pytest.fixture(scope="module")
def conn(pg_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        yield c


def _parsed(conn: psycopg.Connection, literal: str) -> list[str | None]:
    got = conn.execute("SELECT %s::text::text[]", (literal,)).fetchone()
    assert got is not None
    return list(got[0])


@pytest.mark.integration
@pytest.mark.parametrize("items", _CASES, ids=[repr(c)[:30] for c in _CASES])
def test_postgres_parses_each_literal_back_into_its_list(conn: psycopg.Connection, items: list[str | None]) -> None:
    assert _parsed(conn, array_literal(items)) == items


@pytest.mark.integration
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=_ITEMS)
def test_any_list_round_trips_through_postgres(conn: psycopg.Connection, items: list[str | None]) -> None:
    assert _parsed(conn, array_literal(items)) == items


@given(lists=st.lists(_ITEMS, max_size=20))
def test_the_cache_renders_what_array_literal_renders(lists: list[list[str | None]]) -> None:
    cache = LiteralCache()
    for items in lists + lists:  # each list twice: the second from the cache
        assert cache.literal(items) == array_literal(items)


def test_the_cache_stops_growing_at_its_bound_and_still_renders() -> None:
    cache = LiteralCache()
    for i in range(LiteralCache._MAX + 10):
        assert cache.literal([str(i)]) == f'{{"{i}"}}'
    assert len(cache._seen) == LiteralCache._MAX
    assert cache.literal([]) == EMPTY == "{}"
