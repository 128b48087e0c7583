"""PostgreSQL array literals for the stasher's COPY: the header columns as text, not as Python lists.

psycopg dumps a Python list for a ``TEXT[]`` column element by element in Python (its array dumper has no
compiled form): ~1.3 µs of a batch row's ~3.8 µs with one header. A literal rendered here is one string,
which COPY's compiled text dumper escapes like any other, and the server parses it into the array the
INSERT path stores from the list.

Invariants (tests/test_producer/stash/test_text_array.py):
- Postgres parses :func:`array_literal` ``(items)`` back into ``items`` for every list of strings and
  ``None`` (``None`` is SQL NULL, the string ``"NULL"`` stays a string; empty strings, quotes, backslashes,
  braces, commas, whitespace and any Unicode but NUL round-trip), and an empty list into ``'{}'``;
- :class:`LiteralCache` returns the same literal as :func:`array_literal` for every list.
"""

from __future__ import annotations

from collections.abc import Sequence

EMPTY = "{}"


def _element(item: str | None) -> str:
    if item is None:
        return "NULL"
    # Every element quoted: inside double quotes only a backslash and a double quote are special, so
    # whitespace, commas, braces and the word NULL need no rules of their own.
    return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'


def array_literal(items: Sequence[str | None]) -> str:
    """``items`` as a one-dimensional array literal (``{"a","b",NULL}``)."""
    if not items:
        return EMPTY
    return "{" + ",".join([_element(i) for i in items]) + "}"


class LiteralCache:
    """:func:`array_literal` remembered per list of items: a batch's rows mostly repeat a few header
    lists (the same source, the batch's one trace context), so each is rendered once per batch."""

    __slots__ = ("_seen",)

    _MAX = 4096  # distinct lists kept; past it every list is rendered as it comes (per-row ids in headers)

    def __init__(self) -> None:
        self._seen: dict[tuple[str | None, ...], str] = {}

    def literal(self, items: Sequence[str | None]) -> str:
        if not items:
            return EMPTY
        key = tuple(items)
        got = self._seen.get(key)
        if got is None:
            got = array_literal(items)
            if len(self._seen) < self._MAX:
                self._seen[key] = got
        return got
