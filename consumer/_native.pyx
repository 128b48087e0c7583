# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Native Kafka record conversion and ``Record``: the compiled twin of ``consumer.record.PyRecord``
and ``ReadUncommittedIter._convert_entries``.

:func:`convert` turns confluent-kafka ``Message`` objects into an
``sequencer._native.EntryBatch`` of ``Sequencer.queue_batch`` entries, reading
the ``uuid`` header's 16 bytes straight into the UUID's two 64-bit halves. It
handles only the common case and stops at the first message that needs the
reader's Python code (a Kafka error, or no usable ``uuid`` header, for the
UUID policy), so policies, warnings and errors stay in one place.

Invariants (``tests/test_consumer/test_native.py``):

* ``convert`` accepts exactly what ``uuid_header.parse_header_value`` accepts
  (16 bytes, version 1, RFC 4122 variant, multicast ProducerID, flags 0-2; the
  nil UUID is not version 1) and produces the same entries as the pure converter.
* ``Record`` behaves as ``PyRecord``: same properties, read-only, equal and
  hashed by position, not picklable.
"""

cimport cython
from libc.stdint cimport int64_t, uint64_t
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.unicode cimport PyUnicode_Check, PyUnicode_CompareWithASCIIString

from harvest_outbox.sequencer._native cimport EntryBatch
from harvest_outbox.sequencer._uuid_layout cimport (
    ACK_TXN, MAX_RELAY_FLAGS, clock_of_halves, flags_of_lo, is_relay_halves, producer_of_lo,
)

import uuid as _uuid_mod

from harvest_outbox.consumer.trace_context import TRACEPARENT, TRACESTATE, header_text
from harvest_outbox.sequencer import Flags

__all__ = ["Record", "convert", "make_record"]

_new_uuid = object.__new__
_UUID = _uuid_mod.UUID
_set_uuid_int = _UUID.__dict__["int"].__set__
_set_uuid_safe = _UUID.__dict__["is_safe"].__set__
_SAFE_UNKNOWN = _uuid_mod.SafeUUID.unknown


cdef inline uint64_t _load_be64(const unsigned char* p) noexcept:
    return ((<uint64_t>p[0] << 56) | (<uint64_t>p[1] << 48) | (<uint64_t>p[2] << 40) | (<uint64_t>p[3] << 32)
            | (<uint64_t>p[4] << 24) | (<uint64_t>p[5] << 16) | (<uint64_t>p[6] << 8) | <uint64_t>p[7])


@cython.no_gc
cdef class Record:
    """A Kafka record plus its Gazette message identity (see ``consumer.record``)."""

    # Not tracked by the cyclic GC: a Record references only its confluent Message,
    # which never references a Record, so it cannot be part of a cycle. Readers
    # create one per Kafka record, and each tracked allocation brings the next
    # young-generation collection closer (measured: ~0.2 us per record).

    cdef object _msg
    cdef uint64_t _hi  # the UUID's high and low halves; both 0 for none
    cdef uint64_t _lo

    def __init__(self, message, message_uuid=None):
        self._msg = message
        if message_uuid is not None:
            x = message_uuid.int
            self._hi = <uint64_t>(x >> 64)
            self._lo = <uint64_t>(x & 0xFFFFFFFFFFFFFFFF)

    # -- Kafka fields -------------------------------------------------------

    @property
    def topic(self):
        return self._msg.topic()

    @property
    def partition(self):
        return self._msg.partition()

    @property
    def offset(self):
        return self._msg.offset()

    @property
    def key(self):
        return self._msg.key()

    @property
    def value(self):
        return self._msg.value()

    @property
    def headers(self):
        """All record headers (the ``uuid`` header included), as confluent-kafka returns them."""
        return self._msg.headers()

    @property
    def traceparent(self):
        """The W3C ``traceparent`` header the stasher recorded (None without one)."""
        return header_text(self._msg.headers(), TRACEPARENT)

    @property
    def tracestate(self):
        """The W3C ``tracestate`` header, if the stashing span had one."""
        return header_text(self._msg.headers(), TRACESTATE)

    @property
    def timestamp(self):
        """Record timestamp in ms since the epoch, or None when the broker gave none."""
        kind, ts = self._msg.timestamp()
        return None if kind == 0 else ts

    @property
    def timestamp_type(self):
        return self._msg.timestamp()[0]

    @property
    def journal(self):
        return f"{self._msg.topic()}/{self._msg.partition()}"

    # -- identity -----------------------------------------------------------

    @property
    def _x(self):
        """The UUID as its 128-bit int, 0 for none."""
        return (int(self._hi) << 64) | int(self._lo)

    @property
    def uuid(self):
        if self._hi == 0 and self._lo == 0:
            return None
        u = _new_uuid(_UUID)
        _set_uuid_int(u, self._x)
        _set_uuid_safe(u, _SAFE_UNKNOWN)
        return u

    @property
    def producer(self):
        if self._hi == 0 and self._lo == 0:
            return None
        return int(producer_of_lo(self._lo)).to_bytes(6, "big")

    @property
    def clock(self):
        return clock_of_halves(self._hi, self._lo)

    @property
    def flags(self):
        """``Flags`` value of the UUID (an unknown value is returned as the raw int)."""
        cdef uint64_t f = flags_of_lo(self._lo)
        return Flags(f) if f <= MAX_RELAY_FLAGS else f

    @property
    def is_ack(self):
        return flags_of_lo(self._lo) == ACK_TXN

    @property
    def kafka_message(self):
        """The underlying ``confluent_kafka.Message``."""
        return self._msg

    # -- value semantics ----------------------------------------------------

    def _position(self):
        m = self._msg
        return (m.topic(), m.partition(), m.offset())

    def __eq__(self, other):
        if not isinstance(other, Record):
            return NotImplemented
        return self._position() == (<Record> other)._position()

    def __hash__(self):
        return hash(self._position())

    def __repr__(self):
        if self._hi == 0 and self._lo == 0:
            ident = "unsequenced"
        else:
            ident = f"producer={self.producer.hex()} clock={self.clock} flags={self.flags!r}"
        return f"Record({self.topic}/{self.partition}@{self.offset} key={self.key!r} {ident})"

    def __reduce__(self):
        raise TypeError("Record wraps a live confluent_kafka.Message and cannot be pickled; copy its fields")


cdef inline Record _record(object msg, uint64_t hi, uint64_t lo):
    cdef Record r = Record.__new__(Record)
    r._msg = msg
    r._hi = hi
    r._lo = lo
    return r


def make_record(message, x):
    """A Record of ``message`` with the UUID ``x`` (its 128-bit int; 0 for none)."""
    return _record(message, <uint64_t>(x >> 64), <uint64_t>(x & 0xFFFFFFFFFFFFFFFF))


def convert(list raw, Py_ssize_t pos, dict journals, EntryBatch out):
    """Append the entries of ``raw[pos:]`` to ``out``, up to the first message that needs Python.

    Each entry is ``(journal, offset, offset + 1, uuid, Record)``; ``journals``
    caches ``(topic, partition) -> "topic/partition"`` (filled as needed).
    Returns the index of the first message with an error or without a usable
    ``uuid`` header (not converted), or ``len(raw)`` when all were converted.
    """
    cdef Py_ssize_t n = PyList_GET_SIZE(raw), i, j, nh
    cdef object msg, headers, h, k, v, topic, journal = None, last_topic = None
    cdef long partition, last_partition = -1
    cdef int64_t offset
    cdef uint64_t hi, lo
    cdef const unsigned char* p
    cdef bint found
    for i in range(pos, n):
        msg = <object> PyList_GET_ITEM(raw, i)
        if msg.error() is not None:
            return i
        headers = msg.headers()
        found = False
        if type(headers) is list:
            nh = PyList_GET_SIZE(headers)
            for j in range(nh):
                h = <object> PyList_GET_ITEM(headers, j)
                if type(h) is not tuple or PyTuple_GET_SIZE(h) != 2:
                    break  # not confluent-kafka's shape: let the pure path judge it
                k = <object> PyTuple_GET_ITEM(h, 0)
                if PyUnicode_Check(k) and PyUnicode_CompareWithASCIIString(k, "uuid") == 0:
                    v = <object> PyTuple_GET_ITEM(h, 1)
                    if PyBytes_CheckExact(v) and PyBytes_GET_SIZE(v) == 16:
                        p = <const unsigned char*> PyBytes_AS_STRING(v)
                        hi = _load_be64(p)
                        lo = _load_be64(p + 8)
                        # uuid_header.is_relay_uuid_int: version 1, RFC 4122 variant, multicast
                        # ProducerID, flags 0-2 (sequencer/uuid_layout.py).
                        found = is_relay_halves(hi, lo)
                    break
        if not found:
            return i
        topic = msg.topic()
        partition = msg.partition()
        # Consumed batches come in runs of one partition: skip the lookup within a run.
        if partition != last_partition or journal is None or topic != last_topic:
            key = (topic, partition)
            journal = journals.get(key)
            if journal is None:
                journal = journals[key] = f"{topic}/{partition}"
            last_topic = topic
            last_partition = partition
        offset = msg.offset()
        out.push(journal, offset, offset + 1, hi, lo, _record(msg, hi, lo))
    return n
