# cython: language_level=3
"""The relay's header arrays (``text[]`` in binary), compiled: :func:`load_text_array` reads the one-dimensional
arrays the outbox's header columns hold straight into a tuple of ``str`` (and ``None``).

psycopg's binary array loader parses in Python (a ``struct`` call and a loader call per element): with two
headers a row, ~27 % of an at-least-once drain's interpreter time. The reference is psycopg's loader
(``producer.db._header_arrays.HeaderArrayLoader`` falls back to it), and this module is used only where it
gives the same result.

Invariants (tests/test_producer/db/test_text_arrays.py):
- for every one-dimensional array of ``text`` or ``varchar`` elements, as Postgres sends it in binary,
  :func:`load_text_array` returns what psycopg's loader returns (as a tuple), elements decoded as UTF-8;
- for anything else (more dimensions, another element type, a truncated buffer, bytes that are not UTF-8)
  it returns None and the caller uses psycopg's loader, which decides (and raises) as it always did.
"""

from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.ref cimport Py_INCREF
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, uint32_t

cdef enum:
    TEXT_OID = 25
    VARCHAR_OID = 1043


cdef inline uint32_t _u32(const unsigned char[:] buf, Py_ssize_t at) noexcept nogil:
    return (<uint32_t>buf[at] << 24) | (<uint32_t>buf[at + 1] << 16) | (<uint32_t>buf[at + 2] << 8) | buf[at + 3]


def load_text_array(data):
    """``data`` (Postgres' binary array format) as a tuple of str and None, or None when it is not a
    one-dimensional text array this reads (see the module's invariants)."""
    cdef const unsigned char[:] buf = data
    cdef Py_ssize_t size = buf.shape[0]
    if size < 12:
        return None
    cdef uint32_t ndim = _u32(buf, 0)
    cdef uint32_t oid = _u32(buf, 8)
    if ndim == 0:
        return ()
    if ndim != 1 or (oid != TEXT_OID and oid != VARCHAR_OID) or size < 20:
        return None
    cdef int32_t count = <int32_t>_u32(buf, 12)
    if count < 0 or count > (size - 20) // 4:  # each element takes at least its 4-byte length
        return None
    cdef Py_ssize_t at = 20, i
    cdef int32_t length
    out = PyTuple_New(count)
    for i in range(count):
        if at + 4 > size:
            return None
        length = <int32_t>_u32(buf, at)
        at += 4
        if length < 0:
            item = None
        elif length == 0:
            item = ""
        else:
            if at + length > size:
                return None
            try:
                item = PyUnicode_DecodeUTF8(<const char*>&buf[at], length, NULL)
            except UnicodeDecodeError:
                return None
            at += length
        Py_INCREF(item)
        PyTuple_SET_ITEM(out, i, item)
    if at != size:
        return None
    return out
