"""The relay's header-array loader (producer/db/_header_arrays.py) and its compiled reader
(producer/db/_text_arrays.pyx) against psycopg's loader, on arrays as a real Postgres sends them."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from native_impl import native_module
from psycopg.pq import Format
from psycopg.types.array import ArrayBinaryLoader

from harvest_outbox.producer.db import _header_arrays
from harvest_outbox.producer.db._header_arrays import TEXT_ARRAY_OID, HeaderArrayLoader
from harvest_outbox.producer.db._session import open_session_connection
from harvest_outbox.producer.stash._text_array import array_literal as _literal

NATIVE = "harvest_outbox.producer.db._text_arrays"

_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=10)
_ITEMS = st.lists(st.none() | _TEXT | st.sampled_from(["", "NULL", '"', "\\", "ü€😀"]), max_size=6)


def _binary_array(conn: psycopg.Connection, literal: str, cast: str = "text[]") -> bytes:
    """The array as Postgres sends it in binary (what the loaders are given)."""
    cur = conn.cursor(binary=True)
    cur.adapters.register_loader(TEXT_ARRAY_OID, _Raw)
    cur.adapters.register_loader(1015, _Raw)  # varchar[]
    cur.adapters.register_loader(1007, _Raw)  # int4[]
    got = cur.execute(f"SELECT %s::{cast}", (literal,)).fetchone()
    assert got is not None
    return bytes(got[0])


class _Raw(psycopg.adapt.Loader):
    format = Format.BINARY

    def load(self, data: bytes | bytearray | memoryview) -> bytes:
        return bytes(data)


def _reference(conn: psycopg.Connection, data: bytes) -> tuple[object, ...]:
    return tuple(ArrayBinaryLoader(TEXT_ARRAY_OID, conn).load(data))


@pytest.fixture(scope="module")
def conn(pg_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        yield c


@pytest.mark.integration
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=_ITEMS, cast=st.sampled_from(["text[]", "varchar[]"]))
def test_the_compiled_reader_loads_what_psycopg_loads(
    conn: psycopg.Connection, items: list[str | None], cast: str
) -> None:
    native = native_module(NATIVE)
    data = _binary_array(conn, _literal(items), cast)
    got = native.load_text_array(data)
    assert got == _reference(conn, data) == tuple(items)
    assert native.load_text_array(memoryview(data)) == got  # psycopg may hand a memoryview


@pytest.mark.integration
def test_what_the_compiled_reader_does_not_read_goes_to_psycopg(conn: psycopg.Connection) -> None:
    """Another element type, two dimensions, a truncated or padded buffer, bytes that are not UTF-8: None,
    so the loader asks psycopg (which loads or raises as it always did)."""
    native = native_module(NATIVE)
    ints = _binary_array(conn, "{1,2}", "int4[]")
    two_dims = _binary_array(conn, '{{"a","b"},{"c","d"}}')
    ok = _binary_array(conn, '{"abc","d"}')
    not_utf8 = ok.replace(b"abc", b"a\xffc")
    lying_count = ok[:12] + struct.pack(">i", 1_000_000) + ok[16:]
    for data in (ints, two_dims, ok[:-1], ok + b"\x00", ok[:10], not_utf8, lying_count):
        assert native.load_text_array(data) is None, data
    assert native.load_text_array(_binary_array(conn, "{}")) == ()


@pytest.mark.integration
@pytest.mark.parametrize("native", [True, False], ids=["compiled", "reference"])
def test_the_relay_connection_loads_header_arrays_as_tuples(
    pg_dsn: str, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Either way a header array is a tuple (the garbage collector leaves marked rows alone) holding what was
    stored; HARVEST_PURE_PYTHON (no compiled reader) gives the same rows."""
    compiled = native_module(NATIVE) if native else None
    if not native:
        monkeypatch.setattr(_header_arrays, "_native", None)
    session = open_session_connection(pg_dsn)
    try:
        loader = session.conn.adapters.get_loader(TEXT_ARRAY_OID, Format.BINARY)
        assert loader is HeaderArrayLoader
        cur = session.conn.cursor(binary=True)
        items = ["source", None, "", "ü€😀", 'q"\\']
        row = cur.execute("SELECT %s::text::text[], '{}'::text[]", (_literal(items),)).fetchone()
        assert row == (tuple(items), ())
        assert HeaderArrayLoader(TEXT_ARRAY_OID, session.conn)._fast is (compiled.load_text_array if compiled else None)
    finally:
        session.conn.close()


@pytest.mark.integration
def test_a_connection_not_in_utf8_uses_psycopg(pg_dsn: str) -> None:
    """The compiled reader decodes UTF-8 only: on another client encoding psycopg's loader decides."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("SET client_encoding TO 'LATIN1'")
        assert HeaderArrayLoader(TEXT_ARRAY_OID, c)._fast is None
        c.adapters.register_loader(TEXT_ARRAY_OID, HeaderArrayLoader)
        row = c.cursor(binary=True).execute("SELECT ARRAY['é', NULL]::text[]").fetchone()
        assert row == (("é", None),)
