# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Native Kafka record conversion, the fused batch path, and ``Record``: the compiled twin of
``consumer.record.PyRecord``, ``ReadUncommittedIter._convert_entries`` and ``ReadCommittedIter``'s
per-batch sequencing.

:func:`convert` turns confluent-kafka ``Message`` objects into an
``sequencer._native.EntryBatch`` of ``Sequencer.queue_batch`` entries, reading
the ``uuid`` header's 16 bytes straight into the UUID's two 64-bit halves. It
handles only the common case and stops at the first message that needs the
reader's Python code (a Kafka error, or no usable ``uuid`` header, for the
UUID policy), so policies, warnings and errors stay in one place.

:func:`sequence_raw` is ``ReadCommittedIter.poll_batch``'s loop over one ``consume()`` batch in
one pass: each message is converted as ``convert`` does and queued straight into the native
Sequencer through its C methods (``_queue_fast``: the same decisions as ``queue_batch``), and
each committed sequence is dequeued into the caller's result list (``_step_into``: ``step_many``)
as soon as it commits. No ``EntryBatch``, no Python call per sequence. It stops where the Python
loop must act: a message that needs the UUID policy or is a Kafka error (the reader converts that
one message and resumes), an ACK whose span must be replayed, or a full result list.

Invariants (``tests/test_consumer/test_native.py``):

* ``convert`` accepts exactly what ``uuid_header.parse_header_value`` accepts
  (16 bytes, version 1, RFC 4122 variant, multicast ProducerID, flags 0-2; the
  nil UUID is not version 1) and produces the same entries as the pure converter.
* ``sequence_raw`` leaves the Sequencer, the result list and the reader's state exactly as the
  Python loop over ``convert`` / ``queue_batch`` / ``step_many`` does for the same messages
  (``tests/test_consumer/test_fused_batch.py`` runs both, and the pure-Python reader, over
  generated streams and compares outputs and checkpoints after every call).
* confluent-kafka ``Message`` accessors are called through their C entry points only for objects
  of exactly that type (any other message type takes the ordinary method call).
* ``Record`` behaves as ``PyRecord``: same properties, read-only, equal and
  hashed by position, not picklable.
"""

cimport cython
from libc.stdint cimport int64_t, uint64_t
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyObject, PyTypeObject, Py_TYPE
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.unicode cimport (
    PyUnicode_1BYTE_KIND, PyUnicode_Check, PyUnicode_CheckExact, PyUnicode_CompareWithASCIIString, PyUnicode_DATA,
    PyUnicode_GET_LENGTH, PyUnicode_KIND,
)
from libc.string cimport memcmp

from harvest_outbox.sequencer._native cimport EntryBatch, Sequencer
from harvest_outbox.sequencer._uuid_layout cimport (
    ACK_TXN, MAX_RELAY_FLAGS, clock_of_halves, flags_of_lo, is_relay_halves, producer_of_lo,
)

import uuid as _uuid_mod

from harvest_outbox.consumer.trace_context import TRACEPARENT, TRACESTATE, header_text
from harvest_outbox.sequencer import Flags, QueueOutcome
from harvest_outbox.sequencer.errors import SequencerStateError

__all__ = ["NEEDS_PYTHON", "REPLAY", "Record", "SEQUENCED", "convert", "make_record", "sequence_raw"]

#: sequence_raw's stop reasons (see there).
SEQUENCED = 0
NEEDS_PYTHON = 1
REPLAY = 2
# The Sequencer's outcome codes are QueueOutcome's positions (sequencer/_native.pyx).
cdef int _ACK_COMMIT_REPLAY = tuple(QueueOutcome).index(QueueOutcome.ACK_COMMIT_REPLAY)

_new_uuid = object.__new__
_UUID = _uuid_mod.UUID
_set_uuid_int = _UUID.__dict__["int"].__set__
_set_uuid_safe = _UUID.__dict__["is_safe"].__set__
_SAFE_UNKNOWN = _uuid_mod.SafeUUID.unknown


cdef inline uint64_t _load_be64(const unsigned char* p) noexcept:
    return ((<uint64_t>p[0] << 56) | (<uint64_t>p[1] << 48) | (<uint64_t>p[2] << 40) | (<uint64_t>p[3] << 32)
            | (<uint64_t>p[4] << 24) | (<uint64_t>p[5] << 16) | (<uint64_t>p[6] << 8) | <uint64_t>p[7])


# -- confluent-kafka's Message accessors, called without Python's call protocol --------------
#
# The reader calls five accessors per record (error, headers, topic, partition, offset) and the
# application's reads through Record four more (key, value, headers, offset), each ~15-30 ns of
# attribute lookup and call protocol from here. They are METH_NOARGS C functions of
# confluent_kafka.Message; their C entry points, taken once from the type's method descriptors,
# are called directly for objects whose type is exactly Message: the same functions, with the
# same results and errors, minus the lookup. Anything else (a test's message class, a
# confluent-kafka whose methods are not METH_NOARGS) takes the ordinary method call.

ctypedef object (*_NoArgs)(object, PyObject*)  # METH_NOARGS: a new reference, NULL on error

cdef extern from "Python.h":
    ctypedef struct PyMethodDef:
        const char* ml_name
        void* ml_meth
        int ml_flags
    ctypedef struct PyMethodDescrObject:
        PyMethodDef* d_method
    enum: METH_NOARGS

cdef PyTypeObject* _msg_type = NULL  # confluent_kafka.Message, once all its accessors are bound
cdef _NoArgs _m_error = NULL
cdef _NoArgs _m_headers = NULL
cdef _NoArgs _m_topic = NULL
cdef _NoArgs _m_partition = NULL
cdef _NoArgs _m_offset = NULL
cdef _NoArgs _m_key = NULL
cdef _NoArgs _m_value = NULL
cdef _NoArgs _m_timestamp = NULL


cdef void* _noargs_entry(object tp, str name):
    """The C function of ``tp``'s METH_NOARGS method ``name``, or NULL."""
    d = tp.__dict__.get(name)
    if d is None or type(d) is not type(str.upper):  # a method_descriptor of a C type
        return NULL
    cdef PyMethodDef* m = (<PyMethodDescrObject*> d).d_method
    if m.ml_flags != METH_NOARGS:
        return NULL
    return m.ml_meth


cdef int _bind_message_type(object tp) except -1:
    global _msg_type, _m_error, _m_headers, _m_topic, _m_partition, _m_offset, _m_key, _m_value, _m_timestamp
    cdef void* e = _noargs_entry(tp, "error")
    cdef void* h = _noargs_entry(tp, "headers")
    cdef void* t = _noargs_entry(tp, "topic")
    cdef void* p = _noargs_entry(tp, "partition")
    cdef void* o = _noargs_entry(tp, "offset")
    cdef void* k = _noargs_entry(tp, "key")
    cdef void* v = _noargs_entry(tp, "value")
    cdef void* ts = _noargs_entry(tp, "timestamp")
    if e == NULL or h == NULL or t == NULL or p == NULL or o == NULL or k == NULL or v == NULL or ts == NULL:
        return 0  # left unbound: every message takes the method call
    _m_error, _m_headers, _m_topic = <_NoArgs> e, <_NoArgs> h, <_NoArgs> t
    _m_partition, _m_offset = <_NoArgs> p, <_NoArgs> o
    _m_key, _m_value, _m_timestamp = <_NoArgs> k, <_NoArgs> v, <_NoArgs> ts
    _msg_type = <PyTypeObject*> tp
    return 0


try:
    from confluent_kafka import Message as _Message
except ImportError:  # pragma: no cover - confluent-kafka is a dependency
    pass
else:
    _bind_message_type(_Message)


def message_accessors_bound():
    """True when confluent_kafka.Message's accessors are called through their C entry points."""
    return _msg_type != NULL


cdef inline bint _exact(object m) noexcept:
    return _msg_type != NULL and <PyTypeObject*> Py_TYPE(m) == _msg_type


cdef inline object _error(object m):
    return _m_error(m, NULL) if _exact(m) else m.error()


cdef inline object _headers(object m):
    return _m_headers(m, NULL) if _exact(m) else m.headers()


cdef inline object _topic(object m):
    return _m_topic(m, NULL) if _exact(m) else m.topic()


cdef inline object _partition(object m):
    return _m_partition(m, NULL) if _exact(m) else m.partition()


cdef inline object _offset(object m):
    return _m_offset(m, NULL) if _exact(m) else m.offset()


cdef inline object _key(object m):
    return _m_key(m, NULL) if _exact(m) else m.key()


cdef inline object _value(object m):
    return _m_value(m, NULL) if _exact(m) else m.value()


cdef inline object _timestamp(object m):
    return _m_timestamp(m, NULL) if _exact(m) else m.timestamp()


cdef extern from *:
    """
    #if PY_VERSION_HEX < 0x030C0000
    #define harvest_str_ready(o) PyUnicode_IS_READY(o)
    #else
    #define harvest_str_ready(o) 1  /* 3.12+: every str is ready */
    #endif
    """
    bint _str_ready "harvest_str_ready"(object o)


cdef inline bint _is_uuid_key(object k) except -1:
    """``k == "uuid"`` for a header name; a plain ready str (confluent-kafka's) is compared in place."""
    if PyUnicode_CheckExact(k) and _str_ready(k):
        return (PyUnicode_GET_LENGTH(k) == 4 and PyUnicode_KIND(k) == PyUnicode_1BYTE_KIND
                and memcmp(PyUnicode_DATA(k), b"uuid", 4) == 0)
    return PyUnicode_Check(k) and PyUnicode_CompareWithASCIIString(k, "uuid") == 0


cdef inline bint _same_str(object a, object b) except -1:
    """``a == b`` for two topic names; plain ready strs (confluent-kafka's) are compared in place."""
    cdef Py_ssize_t n
    if a is b:
        return True
    if PyUnicode_CheckExact(a) and PyUnicode_CheckExact(b) and _str_ready(a) and _str_ready(b):
        n = PyUnicode_GET_LENGTH(a)
        if n != PyUnicode_GET_LENGTH(b) or PyUnicode_KIND(a) != PyUnicode_KIND(b):
            return False
        return memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), n * PyUnicode_KIND(a)) == 0
    return a == b


cdef inline bint _relay_uuid(object headers, uint64_t* hi, uint64_t* lo) except -1:
    """True, with the halves set, if the first ``uuid`` header holds a relay's UUID (module doc)."""
    cdef Py_ssize_t j, nh
    cdef const unsigned char* p
    cdef object h, k, v
    if type(headers) is not list:
        return False
    nh = PyList_GET_SIZE(headers)
    for j in range(nh):
        h = <object> PyList_GET_ITEM(headers, j)
        if type(h) is not tuple or PyTuple_GET_SIZE(h) != 2:
            return False  # not confluent-kafka's shape: let the pure path judge it
        k = <object> PyTuple_GET_ITEM(h, 0)
        if _is_uuid_key(k):
            v = <object> PyTuple_GET_ITEM(h, 1)
            if PyBytes_CheckExact(v) and PyBytes_GET_SIZE(v) == 16:
                p = <const unsigned char*> PyBytes_AS_STRING(v)
                hi[0] = _load_be64(p)
                lo[0] = _load_be64(p + 8)
                # uuid_header.is_relay_uuid_int: version 1, RFC 4122 variant, multicast
                # ProducerID, flags 0-2 (sequencer/uuid_layout.py).
                return is_relay_halves(hi[0], lo[0])
            return False
    return False


@cython.no_gc
@cython.freelist(1024)
cdef class Record:
    """A Kafka record plus its Gazette message identity (see ``consumer.record``)."""

    # Not tracked by the cyclic GC: a Record references its confluent Message and what the
    # message's accessors returned (bytes, an int, the header list the message holds too), none
    # of which references a Record, so it cannot be part of a cycle. Readers create one per Kafka
    # record, and each tracked allocation brings the next young-generation collection closer
    # (measured: ~0.2 us per record). A freelist keeps the memory of freed Records for the next
    # ones: a reader frees and creates one per record.
    #
    # key, value, headers and offset are read from the message once, when the Record is made
    # (confluent-kafka returns the same objects on every call, and the reader has the headers and
    # offset at hand anyway), and are plain attributes: an application reads each with a slot
    # load instead of a property call into the message (~35 ns per record for the four,
    # bench_consumer), made a member descriptor below (harvest_record_member_slots).

    cdef readonly object key
    cdef readonly object value
    cdef readonly object headers  # all record headers (the uuid header included), as confluent-kafka returns them
    cdef readonly object offset
    cdef object _msg
    cdef uint64_t _hi  # the UUID's high and low halves; both 0 for none
    cdef uint64_t _lo

    def __init__(self, message, message_uuid=None):
        _fill(self, message, _headers_of(message), _offset_of(message))
        if message_uuid is not None:
            x = message_uuid.int
            self._hi = <uint64_t>(x >> 64)
            self._lo = <uint64_t>(x & 0xFFFFFFFFFFFFFFFF)

    # -- Kafka fields -------------------------------------------------------

    @property
    def topic(self):
        return _topic(self._msg)

    @property
    def partition(self):
        return _partition(self._msg)

    @property
    def traceparent(self):
        """The W3C ``traceparent`` header the stasher recorded (None without one)."""
        return header_text(self.headers, TRACEPARENT)

    @property
    def tracestate(self):
        """The W3C ``tracestate`` header, if the stashing span had one."""
        return header_text(self.headers, TRACESTATE)

    @property
    def timestamp(self):
        """Record timestamp in ms since the epoch, or None when the broker gave none."""
        kind, ts = _timestamp(self._msg)
        return None if kind == 0 else ts

    @property
    def timestamp_type(self):
        return _timestamp(self._msg)[0]

    @property
    def journal(self):
        return f"{_topic(self._msg)}/{_partition(self._msg)}"

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
        return (_topic(m), _partition(m), self.offset)

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


cdef inline int _fill(Record r, object msg, object headers, object offset) except -1:
    r._msg = msg
    r.headers = headers
    r.offset = offset
    if _exact(msg):
        r.key = _m_key(msg, NULL)
        r.value = _m_value(msg, NULL)
    else:  # another message type (a test's, or None): what it has
        r.key = _call_or_none(msg, "key")
        r.value = _call_or_none(msg, "value")
    return 0


cdef object _call_or_none(object msg, str name):
    f = getattr(msg, name, None)
    return None if f is None else f()


cdef object _headers_of(object msg):
    return _headers(msg) if _exact(msg) else _call_or_none(msg, "headers")


cdef object _offset_of(object msg):
    return _offset(msg) if _exact(msg) else _call_or_none(msg, "offset")


cdef inline Record _record(object msg, uint64_t hi, uint64_t lo, object headers, object offset):
    cdef Record r = Record.__new__(Record)
    _fill(r, msg, headers, offset)
    r._hi = hi
    r._lo = lo
    return r


# Record's key, value, headers and offset as member descriptors. Cython exposes a cdef class's
# readonly attributes as properties (getset descriptors), which CPython 3.11+ does not specialise:
# each ``rec.key`` takes the generic attribute lookup and a getter call (~10 ns). A T_OBJECT_EX
# member descriptor is specialised into a direct slot read (LOAD_ATTR_SLOT), as for a Python
# class's __slots__; it differs from the getset only for a NULL field (AttributeError instead of
# None), and a Record's never is (tp_new sets the fields to None). The offsets are the C
# compiler's (offsetof on the struct Cython generates for Record: a rename fails the build).
cdef extern from *:
    """
    #include "structmember.h"
    #define HARVEST_RECORD_OFF(f) ((Py_ssize_t) offsetof(struct __pyx_obj_14harvest_outbox_8consumer_7_native_Record, f))
    #define HARVEST_RECORD_KEY_OFF HARVEST_RECORD_OFF(key)
    #define HARVEST_RECORD_VALUE_OFF HARVEST_RECORD_OFF(value)
    #define HARVEST_RECORD_HEADERS_OFF HARVEST_RECORD_OFF(headers)
    #define HARVEST_RECORD_OFFSET_OFF HARVEST_RECORD_OFF(offset)
    static PyMemberDef harvest_record_members[] = {
        {"key", T_OBJECT_EX, 0, READONLY, "The record key (bytes), or None."},
        {"value", T_OBJECT_EX, 0, READONLY, "The record value (bytes), or None."},
        {"headers", T_OBJECT_EX, 0, READONLY,
         "All record headers (the uuid header included), as confluent-kafka returns them."},
        {"offset", T_OBJECT_EX, 0, READONLY, "The Kafka offset (the Sequencer's Begin; End is offset + 1)."},
        {NULL, 0, 0, 0, NULL}
    };
    static int harvest_record_member_slots(PyTypeObject *tp, Py_ssize_t k, Py_ssize_t v, Py_ssize_t h,
                                           Py_ssize_t o) {
        PyMemberDef *m;
        harvest_record_members[0].offset = k;
        harvest_record_members[1].offset = v;
        harvest_record_members[2].offset = h;
        harvest_record_members[3].offset = o;
        for (m = harvest_record_members; m->name != NULL; m++) {
            PyObject *d = PyDescr_NewMember(tp, m);
            if (d == NULL) return -1;
            if (PyDict_SetItemString(tp->tp_dict, m->name, d) < 0) { Py_DECREF(d); return -1; }
            Py_DECREF(d);
        }
        PyType_Modified(tp);
        return 0;
    }
    """
    Py_ssize_t HARVEST_RECORD_KEY_OFF
    Py_ssize_t HARVEST_RECORD_VALUE_OFF
    Py_ssize_t HARVEST_RECORD_HEADERS_OFF
    Py_ssize_t HARVEST_RECORD_OFFSET_OFF
    int harvest_record_member_slots(PyTypeObject* tp, Py_ssize_t k, Py_ssize_t v, Py_ssize_t h, Py_ssize_t o) except -1


harvest_record_member_slots(
    <PyTypeObject*> Record, HARVEST_RECORD_KEY_OFF, HARVEST_RECORD_VALUE_OFF, HARVEST_RECORD_HEADERS_OFF,
    HARVEST_RECORD_OFFSET_OFF,
)


def make_record(message, x):
    """A Record of ``message`` with the UUID ``x`` (its 128-bit int; 0 for none)."""
    return _record(
        message, <uint64_t>(x >> 64), <uint64_t>(x & 0xFFFFFFFFFFFFFFFF), _headers_of(message), _offset_of(message)
    )


def convert(list raw, Py_ssize_t pos, dict journals, EntryBatch out):
    """Append the entries of ``raw[pos:]`` to ``out``, up to the first message that needs Python.

    Each entry is ``(journal, offset, offset + 1, uuid, Record)``; ``journals``
    caches ``(topic, partition) -> "topic/partition"`` (filled as needed).
    Returns the index of the first message with an error or without a usable
    ``uuid`` header (not converted), or ``len(raw)`` when all were converted.
    """
    cdef Py_ssize_t n = PyList_GET_SIZE(raw), i
    cdef object msg, topic, journal = None, last_topic = None
    cdef long partition, last_partition = -1
    cdef object headers, offset_obj
    cdef int64_t offset
    cdef uint64_t hi = 0, lo = 0
    for i in range(pos, n):
        msg = <object> PyList_GET_ITEM(raw, i)
        if _error(msg) is not None:
            return i
        headers = _headers(msg)
        if not _relay_uuid(headers, &hi, &lo):
            return i
        topic = _topic(msg)
        partition = _partition(msg)
        # Consumed batches come in runs of one partition: skip the lookup within a run.
        if partition != last_partition or journal is None or not _same_str(topic, last_topic):
            journal = _journal(journals, topic, partition)
            last_topic = topic
            last_partition = partition
        offset_obj = _offset(msg)
        offset = offset_obj
        out.push(journal, offset, offset + 1, hi, lo, _record(msg, hi, lo, headers, offset_obj))
    return n


cdef object _journal(dict journals, object topic, long partition):
    key = (topic, partition)
    journal = journals.get(key)
    if journal is None:
        journal = journals[key] = f"{topic}/{partition}"
    return journal


cdef inline bint _is_ack(object item) except -1:
    if type(item) is Record:
        return flags_of_lo((<Record> item)._lo) == ACK_TXN
    return bool(item.is_ack)


def sequence_raw(Sequencer seq, list raw, Py_ssize_t pos, dict journals, list out, Py_ssize_t max_records,
                 bint include_acks, object ahead, bint one_topic=False):
    """``ReadCommittedIter._poll_batch``'s loop over ``raw[pos:]``, in one pass (module doc).

    ``ahead`` is the reader's next committed record (stepped, not yet delivered), or None; a
    replay must not be in progress. Committed records are appended to ``out`` until it holds
    ``max_records``; ACKs are left out unless ``include_acks``. Returns ``(pos, ahead, why)``:
    the next message to take, the new ``ahead``, and why it stopped: ``SEQUENCED`` (``out`` is
    full, or ``raw`` is used up with no sequence left to dequeue), ``NEEDS_PYTHON``
    (``raw[pos]`` is a Kafka error or has no usable ``uuid`` header: the reader converts it),
    or ``REPLAY`` (the message before ``pos`` committed a span that left the ring: the reader
    starts the replay; the sequence has not been stepped). ``one_topic``: every message of ``raw``
    is of one topic (the reader reads one), so a message of the same partition as the one before
    it is of the same journal without reading and comparing its topic.
    """
    cdef Py_ssize_t n = PyList_GET_SIZE(raw), k, room
    cdef object msg, topic, journal = None, last_topic = None, run_journal = None, headers, offset_obj
    cdef long partition, last_partition = -1
    cdef int64_t offset, run_end = 0
    cdef uint64_t hi = 0, lo = 0
    cdef int outcome
    cdef dict offsets = seq._offsets_d
    if max_records < 1:
        raise ValueError(f"max_records must be >= 1, got {max_records}")
    try:
        while True:
            if ahead is not None:
                # poll_batch's dequeue: ahead, then up to room - 1 more through step_many's loop;
                # the last is marked processed by the step() after it, which is the next ahead.
                room = max_records - PyList_GET_SIZE(out)
                if room <= 0:
                    return pos, ahead, SEQUENCED
                out.append(ahead)
                k = seq._step_into(out, room - 1)
                ahead = seq._step() if k == room - 1 else None
                # Only a sequence's committing (last) record can be an ACK.
                if ahead is None and not include_acks and _is_ack(out[PyList_GET_SIZE(out) - 1]):
                    out.pop()
                if PyList_GET_SIZE(out) >= max_records:
                    return pos, ahead, SEQUENCED
                continue
            if pos >= n:
                return pos, None, SEQUENCED
            if seq._emit_p is not None:
                raise SequencerStateError("sequence_raw: a committed sequence remains to dequeue but ahead is None")
            msg = <object> PyList_GET_ITEM(raw, pos)
            # convert()'s steps for one message
            if _error(msg) is not None:
                return pos, None, NEEDS_PYTHON
            headers = _headers(msg)
            if not _relay_uuid(headers, &hi, &lo):
                return pos, None, NEEDS_PYTHON
            partition = _partition(msg)
            if partition != last_partition or journal is None or not one_topic:
                topic = _topic(msg)
                if partition != last_partition or journal is None or not _same_str(topic, last_topic):
                    journal = _journal(journals, topic, partition)
                    last_topic = topic
                    last_partition = partition
            offset_obj = _offset(msg)
            offset = offset_obj
            # queue_batch's steps for one entry: the read-through offset of a run of fast-path
            # entries of one journal is written once, when the run ends.
            if run_journal is not None and journal is not run_journal:
                offsets[run_journal] = run_end
                run_journal = None
            outcome = seq._queue_fast(journal, offset, offset + 1, hi, lo, _record(msg, hi, lo, headers, offset_obj))
            pos += 1
            if outcome == -1:
                run_journal = journal
                run_end = offset + 1
            elif seq._emit_p is not None:  # it commits: the run ends before the sequence is stepped
                if run_journal is not None:
                    offsets[run_journal] = run_end
                    run_journal = None
                if outcome == _ACK_COMMIT_REPLAY:
                    return pos, None, REPLAY
                ahead = seq._step()
            else:
                run_journal = None  # _queue() wrote a newer offset
    finally:
        if run_journal is not None:
            offsets[run_journal] = run_end
