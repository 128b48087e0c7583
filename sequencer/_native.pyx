# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Native Sequencer: ``sequencer.sequencer.Sequencer`` compiled, with the same semantics and API.

The pure-Python module is the reference: this one is the same algorithm with
C integers (UUIDs as two 64-bit halves, clocks as ``uint64``, offsets as
``int64``) and C arrays for the ring's bookkeeping, so readers stop paying
CPython's per-message object overhead. Every public method, outcome and
exception is the reference's; ``tests/test_sequencer`` runs each test against
both implementations and ``test_seq_native.py`` compares them on random logs.

Differences a caller can see, all of them limits of the C types:

* offsets must fit a signed 64-bit integer and checkpoint clocks (``last_ack``)
  an unsigned one, else ``OverflowError`` (queueing) or ``CheckpointError``
  (restoring); Kafka offsets and Gazette clocks always do.
* ``queue_batch`` also accepts an :class:`EntryBatch`, a columnar batch that
  extension modules (the Kafka reader's converter) fill without creating a
  tuple and a 128-bit int per message.

The ``_ring``, ``_next``, ``_head``... attributes the reference exposes as
plain fields are read-only properties here (tests inspect them).
"""

cimport cython
from libc.stdint cimport int64_t, uint64_t
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc

from harvest_outbox.sequencer._uuid_layout cimport CONTINUE_TXN, PRODUCER_BITS, clock_of_halves, flags_of_lo

import logging
from types import MappingProxyType

from .envelope import Envelope
from .errors import CheckpointError, ReplayError, SequencerStateError
from .outcome import QueueOutcome
from .state import ProducerState

__all__ = ["EntryBatch", "Sequencer"]

# The reference's logger: anomaly warnings look the same whichever implementation runs.
logger = logging.getLogger("harvest_outbox.sequencer.sequencer")

DEF_RING_SIZE = 8192
cdef uint64_t _PRODUCER_MASK = (<uint64_t>1 << PRODUCER_BITS) - 1
cdef uint64_t _MASK64 = 0xFFFFFFFFFFFFFFFF
cdef Py_ssize_t _MAX_LOGGED_ANOMALIES = 4096

# Outcome codes: QueueOutcome's values.
cdef enum:
    OUTSIDE_ALREADY_ACKED = 0
    OUTSIDE_COMMIT = 1
    CONTINUE_ALREADY_ACKED = 2
    CONTINUE_TXN_CLOCK_LARGER = 3
    CONTINUE_BEGIN_SPAN = 4
    CONTINUE_EXTEND_SPAN = 5
    ACK_ROLLBACK = 6
    ACK_EMPTY = 7
    ACK_COMMIT_RING = 8
    ACK_COMMIT_REPLAY = 9

cdef tuple _OUTCOMES = tuple(QueueOutcome)


cdef inline int _split(object x, uint64_t* hi, uint64_t* lo) except -1:
    """A UUID's 128-bit int as its two 64-bit halves."""
    hi[0] = <uint64_t>(x >> 64)
    lo[0] = <uint64_t>(x & 0xFFFFFFFFFFFFFFFF)
    return 0


@cython.no_gc
cdef class _Partial:
    """Partial, not yet acknowledged sequence of one (journal, producer); hashes by identity.

    Not tracked by the cyclic GC: it references only its journal name (a str).
    """

    # Attributes: sequencer/_native.pxd.

    def __repr__(self):
        return (
            f"_Partial({self.journal!r}, {self.producer:012x}, min={self.min_clock}, "
            f"max={self.max_clock}, begin={self.begin}, ring={self.ring_start}..{self.ring_stop})"
        )


cdef inline _Partial _new_partial(object journal, uint64_t producer, uint64_t min_clock, uint64_t max_clock, int64_t begin):
    cdef _Partial p = _Partial.__new__(_Partial)
    p.journal = journal
    p.producer = producer
    p.min_clock = min_clock
    p.max_clock = max_clock
    p.begin = begin
    p.ring_start = -1
    p.ring_stop = -1
    return p


cdef class EntryBatch:
    """A columnar batch of ``queue_batch`` entries: ``(journal, begin, end, uuid_int, item)`` each.

    Indexing returns the entry as that tuple, so code that handles lists of
    entries (filtering a buffer on a rebalance, say) handles these too.
    """

    def __cinit__(self, Py_ssize_t capacity=256):
        if capacity < 16:
            capacity = 16
        self._journals = []
        self._items = []
        self._n = 0
        self._cap = capacity
        self._begins = <int64_t*> PyMem_Malloc(capacity * sizeof(int64_t))
        self._ends = <int64_t*> PyMem_Malloc(capacity * sizeof(int64_t))
        self._his = <uint64_t*> PyMem_Malloc(capacity * sizeof(uint64_t))
        self._los = <uint64_t*> PyMem_Malloc(capacity * sizeof(uint64_t))
        if not (self._begins and self._ends and self._his and self._los):
            raise MemoryError()

    def __dealloc__(self):
        PyMem_Free(self._begins)
        PyMem_Free(self._ends)
        PyMem_Free(self._his)
        PyMem_Free(self._los)

    cdef int _grow(self) except -1:
        cdef Py_ssize_t cap = self._cap * 2
        cdef void* p
        p = PyMem_Realloc(self._begins, cap * sizeof(int64_t))
        if not p:
            raise MemoryError()
        self._begins = <int64_t*> p
        p = PyMem_Realloc(self._ends, cap * sizeof(int64_t))
        if not p:
            raise MemoryError()
        self._ends = <int64_t*> p
        p = PyMem_Realloc(self._his, cap * sizeof(uint64_t))
        if not p:
            raise MemoryError()
        self._his = <uint64_t*> p
        p = PyMem_Realloc(self._los, cap * sizeof(uint64_t))
        if not p:
            raise MemoryError()
        self._los = <uint64_t*> p
        self._cap = cap
        return 0

    cdef int push(self, object journal, int64_t begin, int64_t end, uint64_t hi, uint64_t lo, object item) except -1:
        cdef Py_ssize_t i = self._n
        if i == self._cap:
            self._grow()
        self._begins[i] = begin
        self._ends[i] = end
        self._his[i] = hi
        self._los[i] = lo
        self._journals.append(journal)
        self._items.append(item)
        self._n = i + 1
        return 0

    def append(self, journal, int64_t begin, int64_t end, x, item):
        """Add the entry ``(journal, begin, end, x, item)``; ``x`` is the UUID as a 128-bit int."""
        cdef uint64_t hi, lo
        _split(x, &hi, &lo)
        self.push(journal, begin, end, hi, lo, item)

    @staticmethod
    def from_columns(journal, const int64_t[:] offsets, const uint64_t[:] his, const uint64_t[:] los, rows=None):
        """Entries ``(journal, offsets[i], offsets[i] + 1, uuid_i, i)`` for each row ``i`` in ``rows``.

        ``his``/``los`` are the UUIDs' high and low 64-bit halves (e.g. numpy
        ``uint64`` views of Arrow's 16-byte column, byte-swapped from big-endian),
        ``rows`` the row indices to include (an ``int64`` array; default: all).
        The item of each entry is its row index, as Spark's reader wants it: no
        128-bit int or tuple is made per row.
        """
        cdef Py_ssize_t n = offsets.shape[0], i, k, m
        cdef const int64_t[:] sel
        if his.shape[0] != n or los.shape[0] != n:
            raise ValueError(f"columns differ in length: offsets {n}, his {his.shape[0]}, los {los.shape[0]}")
        cdef EntryBatch eb
        if rows is None:
            eb = EntryBatch(n)
            for i in range(n):
                eb.push(journal, offsets[i], offsets[i] + 1, his[i], los[i], i)
            return eb
        sel = rows
        m = sel.shape[0]
        eb = EntryBatch(m)
        for k in range(m):
            i = sel[k]
            if i < 0 or i >= n:
                raise IndexError(f"row {i} out of range for {n} rows")
            eb.push(journal, offsets[i], offsets[i] + 1, his[i], los[i], i)
        return eb

    def __len__(self):
        return self._n

    def __getitem__(self, Py_ssize_t i):
        if i < 0:
            i += self._n
        if i < 0 or i >= self._n:
            raise IndexError("EntryBatch index out of range")
        x = (int(self._his[i]) << 64) | int(self._los[i])
        return (self._journals[i], self._begins[i], self._ends[i], x, self._items[i])

    def __repr__(self):
        return f"EntryBatch({self._n} entries)"


cdef inline void _link(Sequencer self, Py_ssize_t head, object item, int64_t begin, uint64_t clock, _Partial partial):
    """Append item at the ring's head and to partial's linked list; advance the head."""
    self._ring_l[head] = item
    self._rbegin_a[head] = begin
    self._rclock_a[head] = clock
    self._rpart_l[head] = partial
    self._next_a[head] = -1
    if partial.ring_stop == -1:
        partial.ring_start = head
    else:
        self._next_a[partial.ring_stop] = head
    partial.ring_stop = head
    head += 1
    self._head_i = 0 if head == self._size else head


cdef class Sequencer:
    """Sequences read-uncommitted messages into committed ones (see ``sequencer.sequencer``)."""

    # Attributes and C methods: sequencer/_native.pxd (consumer/_native.pyx cimports them).

    def __cinit__(self, offsets=None, states=None, Py_ssize_t ring_size=DEF_RING_SIZE):
        cdef Py_ssize_t size = ring_size if ring_size > 0 else 1
        cdef Py_ssize_t i
        self._size = size
        self._rbegin_a = <int64_t*> PyMem_Malloc(size * sizeof(int64_t))
        self._rclock_a = <uint64_t*> PyMem_Malloc(size * sizeof(uint64_t))
        self._next_a = <Py_ssize_t*> PyMem_Malloc(size * sizeof(Py_ssize_t))
        if not (self._rbegin_a and self._rclock_a and self._next_a):
            raise MemoryError()
        for i in range(size):
            self._rbegin_a[i] = 0
            self._rclock_a[i] = 0
            self._next_a[i] = -1

    def __dealloc__(self):
        PyMem_Free(self._rbegin_a)
        PyMem_Free(self._rclock_a)
        PyMem_Free(self._next_a)

    def __init__(self, offsets=None, states=None, Py_ssize_t ring_size=DEF_RING_SIZE):
        cdef uint64_t pid
        self._offsets_d = dict(offsets) if offsets is not None else {}
        for journal, off in self._offsets_d.items():
            if not -(1 << 63) <= off < (1 << 63):
                raise CheckpointError(f"offset {off!r} of journal {journal!r} does not fit a signed 64-bit integer")
        self._offsets_view = MappingProxyType(self._offsets_d)
        self._partials_d = {}
        self._pending_s = set()
        self._emit_p = None
        self._dequeued_o = None
        self._dequeued_clock_v = 0
        self._replay_iter = None
        self._ring_l = [None] * self._size
        self._rpart_l = [None] * self._size
        self._emit_end = 0
        self._head_i = 0
        self._logged = set()
        self._reset_cache()
        for st in states or ():
            if not isinstance(st, ProducerState):
                raise CheckpointError(f"states must hold ProducerState values, got {st!r}")
            if len(st.producer) != 6:
                raise CheckpointError(
                    f"ProducerState.producer must be 6 bytes, got {st.producer!r} "
                    f"(journal {st.journal!r}); the checkpoint is corrupt"
                )
            if st.last_ack < 0 or st.begin < -1:
                raise CheckpointError(
                    f"ProducerState of journal {st.journal!r} has last_ack={st.last_ack}, "
                    f"begin={st.begin}; expected last_ack >= 0 and begin >= -1"
                )
            if st.last_ack >= (1 << 64) or st.begin >= (1 << 63):
                raise CheckpointError(
                    f"ProducerState of journal {st.journal!r} has last_ack={st.last_ack}, "
                    f"begin={st.begin}; clocks are 64-bit and offsets signed 64-bit: the checkpoint is corrupt"
                )
            pid = int.from_bytes(st.producer, "big")
            # As in Gazette, a later state for the same producer replaces an earlier one.
            self._partials_d.setdefault(st.journal, {})[pid] = _new_partial(
                st.journal, pid, st.last_ack, st.last_ack, st.begin
            )

    cdef void _reset_cache(self):
        self._c_journal = None
        self._c_jparts = None
        self._c_producer = 0
        self._c_partial = None

    # -- queueing ---------------------------------------------------------

    def queue_uncommitted(self, env):
        """Apply the next read-uncommitted message and return the decision."""
        cdef uint64_t hi, lo
        if self._emit_p is not None:
            raise SequencerStateError(
                "committed messages remain to dequeue: call step() until it returns None before queue_uncommitted()"
            )
        _split(env.uuid.int, &hi, &lo)
        return _OUTCOMES[self._queue(env.journal, env.begin, env.end, hi, lo, env)]

    def queue_batch(self, entries, Py_ssize_t pos=0):
        """Queue ``entries[pos:]`` in order, stopping after the first committing one.

        The reference's ``queue_batch``: entries are ``(journal, begin, end,
        uuid_int, item)`` tuples (any sequence of them) or an :class:`EntryBatch`.
        Returns ``(next_pos, outcome)``.
        """
        cdef EntryBatch eb = None
        cdef Py_ssize_t n
        cdef uint64_t hi, lo
        cdef int64_t begin, end
        cdef int outcome
        if self._emit_p is not None:
            raise SequencerStateError(
                "committed messages remain to dequeue: call step() until it returns None before queue_batch()"
            )
        # The fast path leaves the read-through offset to this loop, which
        # writes it once per run of fast-path entries of one journal
        # (observably the same: offsets are read between calls). A run ends at
        # a journal switch, or at an entry _queue() decides: it writes a newer
        # offset itself, except for a committing one, which leaves the run's.
        cdef object run_journal = None
        cdef int64_t run_end = 0
        cdef bint columnar = type(entries) is EntryBatch
        if columnar:
            eb = <EntryBatch> entries
            n = eb._n
        else:
            n = len(entries)
        try:
            while pos < n:
                if columnar:
                    journal = eb._journals[pos]
                    begin = eb._begins[pos]
                    end = eb._ends[pos]
                    hi = eb._his[pos]
                    lo = eb._los[pos]
                    item = eb._items[pos]
                else:
                    journal, begin, end, x, item = entries[pos]
                    _split(x, &hi, &lo)
                if run_journal is not None and journal is not run_journal:
                    self._offsets_d[run_journal] = run_end
                    run_journal = None
                outcome = self._queue_fast(journal, begin, end, hi, lo, item)
                pos += 1
                if outcome == -1:
                    run_journal = journal
                    run_end = end
                elif self._emit_p is not None:
                    return pos, _OUTCOMES[outcome]
                else:
                    run_journal = None  # _queue() wrote a newer offset
            return pos, None
        finally:
            if run_journal is not None:
                self._offsets_d[run_journal] = run_end

    cdef int _queue_fast(self, object journal, int64_t begin, int64_t end, uint64_t hi, uint64_t lo, object item) except -2:
        """_queue(), with the common case inline: a CONTINUE_TXN above both bounds of a known producer.

        Returns -1 when the fast path took it (CONTINUE_BEGIN_SPAN / _EXTEND_SPAN), else _queue()'s outcome.
        """
        cdef Py_ssize_t head = self._head_i
        cdef uint64_t producer, clock
        cdef _Partial partial
        cdef dict jparts
        if self._ring_l[head] is not None:
            self._evict_at_head(head)
        if flags_of_lo(lo) == CONTINUE_TXN:
            producer = lo & _PRODUCER_MASK
            partial = None
            if journal is self._c_journal:
                if producer == self._c_producer:
                    partial = self._c_partial
                jparts = self._c_jparts
            else:
                jparts = self._partials_d.get(journal)
            # A miss (also a cached miss: _queue() may have created the
            # producer's partial since) looks the producer up again.
            if partial is None and jparts is not None:
                partial = jparts.get(producer)
                self._c_journal = journal
                self._c_jparts = jparts
                self._c_producer = producer
                self._c_partial = partial
            if partial is not None:
                clock = clock_of_halves(hi, lo)
                if clock > partial.max_clock and clock > partial.min_clock:
                    if partial.begin == -1:
                        partial.begin = begin
                        self._pending_s.add(partial)
                    _link(self, head, item, begin, clock, partial)
                    partial.max_clock = clock
                    return -1  # the caller writes offsets[journal] = end
        return self._queue(journal, begin, end, hi, lo, item)

    cdef int _queue(self, object journal, int64_t begin, int64_t end, uint64_t hi, uint64_t lo, object item) except -1:
        """queue_uncommitted() on an Envelope's fields; returns the outcome code."""
        cdef Py_ssize_t head = self._head_i
        cdef uint64_t producer = lo & _PRODUCER_MASK
        cdef uint64_t clock = clock_of_halves(hi, lo)
        cdef uint64_t flags = flags_of_lo(lo)
        cdef uint64_t raw_clock = clock  # what the ring keeps: 0 for an unsequenced message
        cdef uint64_t min_clock
        cdef int outcome
        cdef _Partial partial
        cdef dict jparts
        if self._ring_l[head] is not None:
            self._evict_at_head(head)

        jparts = self._partials_d.get(journal)
        if jparts is None:
            jparts = self._partials_d[journal] = {}
        partial = jparts.get(producer)

        if clock == 0:
            # Unsequenced message (e.g. the nil UUID): commits at once through a
            # throw-away partial, so its producer is never tracked.
            partial = _new_partial(journal, producer, 0, 0, -1)
            flags = 0
            clock = 1
        elif partial is None:
            partial = _new_partial(journal, producer, clock - 1, clock - 1, -1)
            jparts[producer] = partial

        if flags == 1:  # CONTINUE_TXN
            if clock <= partial.min_clock:
                self._offsets_d[journal] = end
                return CONTINUE_ALREADY_ACKED
            if clock <= partial.max_clock:
                self._offsets_d[journal] = end
                return CONTINUE_TXN_CLOCK_LARGER
            if partial.begin == -1:
                outcome = CONTINUE_BEGIN_SPAN
                partial.begin = begin
                self._pending_s.add(partial)
            else:
                outcome = CONTINUE_EXTEND_SPAN
            _link(self, head, item, begin, clock, partial)
            partial.max_clock = clock
            self._offsets_d[journal] = end
            return outcome

        if flags == 2:  # ACK_TXN
            min_clock = partial.min_clock
            if clock < min_clock:
                # An upstream producer recovered an older checkpoint: accept the
                # earlier clock (at-least-once) rather than risk losing messages.
                self._log_anomaly(
                    "unexpected ACK_TXN which is less than last ACK (loss of exactly-once semantics)",
                    journal, begin, end, partial, clock, flags,
                )
                outcome = ACK_ROLLBACK
            elif clock == min_clock:
                outcome = ACK_ROLLBACK
            elif partial.begin == -1:
                outcome = ACK_EMPTY
            elif partial.ring_start == -1:
                outcome = ACK_COMMIT_REPLAY  # no part of the span is in the ring
            elif partial.begin != self._rbegin_a[partial.ring_start]:
                outcome = ACK_COMMIT_REPLAY  # only a trailing part is in the ring
            else:
                outcome = ACK_COMMIT_RING

            if outcome == ACK_ROLLBACK:
                partial.min_clock = clock
                partial.max_clock = clock
                partial.begin = -1
                partial.ring_start = -1
                partial.ring_stop = -1
                self._pending_s.discard(partial)
                self._offsets_d[journal] = end
                return outcome
        else:
            if flags != 0:
                self._log_anomaly(
                    "unexpected UUID flags (handled as OUTSIDE_TXN)", journal, begin, end, partial, clock, flags
                )
            if clock <= partial.min_clock:
                self._offsets_d[journal] = end
                return OUTSIDE_ALREADY_ACKED
            if partial.begin != -1:
                self._log_anomaly(
                    "unexpected OUTSIDE_TXN with a preceding CONTINUE_TXN "
                    "(mixed committed and uncommitted publishing to one journal?); "
                    "the open span is rolled back",
                    journal, begin, end, partial, clock, flags,
                )
            outcome = OUTSIDE_COMMIT

        # A committing outcome. Offsets are *not* advanced here: only once the
        # sequence is fully stepped, so that a checkpoint taken before then
        # makes a restored reader see this committing message again.
        _link(self, head, item, begin, raw_clock, partial)
        if outcome == ACK_EMPTY:
            partial.begin = begin
        elif outcome == OUTSIDE_COMMIT:
            # Any open span is clobbered (an effective rollback): the sequence is this one message.
            partial.begin = begin
            partial.ring_start = partial.ring_stop
        # Commit through this clock; larger span clocks are rolled back.
        partial.max_clock = clock
        self._emit_p = partial
        self._emit_end = end
        return outcome

    cdef int _evict_at_head(self, Py_ssize_t head) except -1:
        """Drop the ring entry about to be overwritten, unlinking it from its span."""
        cdef object po = self._rpart_l[head]
        cdef _Partial p
        cdef Py_ssize_t nxt
        if po is not None:
            p = <_Partial> po
            if p.ring_start == head:
                nxt = self._next_a[head]
                if p.ring_start == p.ring_stop and nxt == -1:
                    p.ring_start = -1
                    p.ring_stop = -1
                elif p.ring_start != p.ring_stop and nxt != -1:
                    p.ring_start = nxt
                else:
                    raise AssertionError("ring invariant violated: ring_start == ring_stop iff next[ring_start] == -1")
        self._ring_l[head] = None
        self._rpart_l[head] = None
        self._next_a[head] = -1
        return 0

    # -- dequeueing -------------------------------------------------------

    def step(self):
        """Return the next committed message, or None when the sequence is done."""
        return self._step()

    cdef object _step(self):
        cdef _Partial emit = self._emit_p
        cdef uint64_t min_clock, max_clock, clock, hi, lo
        cdef int64_t begin
        cdef Py_ssize_t idx
        if emit is None:
            return None
        if self._dequeued_o is None:
            if self._replay_iter is None and emit.begin != self._rbegin_a[emit.ring_start]:
                raise SequencerStateError(
                    "this sequence must be replayed: call replay_range() and start_replay() "
                    "before step() (queue_uncommitted returned ACK_COMMIT_REPLAY)"
                )
        else:
            # The previous message is processed: tighten the lower bound to it.
            emit.min_clock = self._dequeued_clock_v

        min_clock = emit.min_clock
        max_clock = emit.max_clock
        while emit.ring_start != -1:
            if self._replay_iter is None:
                idx = emit.ring_start
                item = self._ring_l[idx]
                clock = self._rclock_a[idx]
                begin = self._rbegin_a[idx]
                emit.ring_start = self._next_a[idx]
                self._ring_l[idx] = None
                self._rpart_l[idx] = None
            else:
                env = self._next_replayed(emit)
                if env is None:
                    continue
                item = env
                begin = env.begin
                _split(env.uuid.int, &hi, &lo)
                clock = clock_of_halves(hi, lo)
            self._dequeued_o = item
            self._dequeued_clock_v = clock
            if clock != 0 and clock <= min_clock:
                continue  # a duplicate
            if clock > max_clock:
                continue  # rolled back by a smaller ACK clock
            emit.begin = begin
            return item

        # The committing message was the last one: only now is it read through.
        self._finish(emit, emit.min_clock)
        return None

    cdef void _finish(self, _Partial emit, uint64_t min_clock):
        self._offsets_d[emit.journal] = self._emit_end
        emit.min_clock = min_clock
        emit.max_clock = min_clock
        emit.begin = -1
        emit.ring_start = -1
        emit.ring_stop = -1
        self._pending_s.discard(emit)
        self._dequeued_o = None
        self._dequeued_clock_v = 0
        self._emit_p = None

    def step_many(self, Py_ssize_t max_n):
        """Up to ``max_n`` results of ``step()``, in one call (see the reference)."""
        cdef list out = []
        self._step_into(out, max_n)
        return out

    cdef Py_ssize_t _step_into(self, list out, Py_ssize_t max_n) except -1:
        """step_many(), appending to ``out``; returns how many were appended."""
        cdef Py_ssize_t k = 0, idx
        cdef _Partial emit
        cdef uint64_t max_clock, last_clock, min_clock, clock
        cdef int64_t begin, b
        cdef bint ended
        if max_n <= 0:
            return 0
        while k < max_n:
            emit = self._emit_p
            if emit is None:
                return k
            if self._replay_iter is not None or self._dequeued_o is None:
                item = self._step()
                if item is None:
                    return k
                out.append(item)
                k += 1
                continue
            max_clock = emit.max_clock
            last_item = self._dequeued_o
            last_clock = self._dequeued_clock_v
            min_clock = last_clock
            begin = emit.begin
            idx = emit.ring_start
            while k < max_n:
                min_clock = last_clock  # the previous message is processed
                ended = True
                while idx != -1:
                    item = self._ring_l[idx]
                    clock = self._rclock_a[idx]
                    b = self._rbegin_a[idx]
                    self._ring_l[idx] = None
                    self._rpart_l[idx] = None
                    idx = self._next_a[idx]
                    last_item = item
                    last_clock = clock
                    if clock != 0 and clock <= min_clock:
                        continue
                    if clock > max_clock:
                        continue
                    begin = b
                    out.append(item)
                    k += 1
                    ended = False
                    break
                if ended:
                    self._finish(emit, min_clock)
                    return k
            emit.min_clock = min_clock
            emit.ring_start = idx
            emit.begin = begin
            self._dequeued_o = last_item
            self._dequeued_clock_v = last_clock
        return k

    cdef object _next_replayed(self, _Partial emit):
        """Next replayed message of the emitting producer, or None to re-check the loop."""
        cdef int64_t ring_begin
        try:
            env = next(self._replay_iter)
        except StopIteration:
            self._replay_iter = None  # replay done: continue from the ring
            return None
        except Exception as exc:
            raise ReplayError(f"replay reader: {exc}") from exc
        ring_begin = self._rbegin_a[emit.ring_start]
        if env.journal != emit.journal:
            raise ReplayError(
                f"replay of wrong journal ({env.journal}; expected {emit.journal}); "
                "serve exactly the journal and offsets of replay_range()"
            )
        if env.begin < emit.begin:
            raise ReplayError(
                f"replay has wrong Begin ({env.begin}; expected >= {emit.begin}); "
                "serve exactly the journal and offsets of replay_range()"
            )
        if env.end > ring_begin:
            raise ReplayError(
                f"replay has wrong End ({env.end}; expected <= {ring_begin}); "
                "serve exactly the journal and offsets of replay_range()"
            )
        if env.uuid.int & _PRODUCER_MASK != emit.producer:
            return None  # other producers' messages are interleaved in the range
        return env

    def replay_range(self):
        """Journal and ``[begin, end)`` offsets to re-read for the current sequence."""
        cdef _Partial emit = self._emit_p
        if emit is None:
            raise SequencerStateError("replay_range(): no committed sequence to dequeue")
        return emit.journal, emit.begin, self._rbegin_a[emit.ring_start]

    def start_replay(self, envelopes):
        """Supply the envelopes of ``replay_range()`` (all producers, in order)."""
        if self._emit_p is None:
            raise SequencerStateError("start_replay(): no committed sequence to dequeue")
        self._replay_iter = iter(envelopes)

    # -- state ------------------------------------------------------------

    def has_pending(self):
        """True if a span was opened since the last checkpoint and is still open."""
        return bool(self._pending_s)

    @property
    def offsets(self):
        """Read-through offset per journal (a live, read-only view)."""
        return self._offsets_view

    def drop_journals(self, journals):
        """Forget the offsets and producer states of ``journals`` (see the reference)."""
        if self._emit_p is not None:
            raise SequencerStateError("drop_journals(): call step() until it returns None first")
        self._reset_cache()
        for journal in journals:
            self._offsets_d.pop(journal, None)
            jparts = self._partials_d.pop(journal, None)
            if jparts:
                for p in jparts.values():
                    self._pending_s.discard(p)

    def checkpoint(self, prune_horizon_ns=0):
        """Snapshot offsets and producer states, pruning idle producers (see the reference)."""
        cdef _Partial p
        states = []
        horizon = (prune_horizon_ns // 100) << 4 if prune_horizon_ns > 0 else 0
        self._reset_cache()
        for journal, jparts in list(self._partials_d.items()):
            if prune_horizon_ns > 0 and jparts:
                # Gazette computes this in unsigned arithmetic, which wraps for
                # horizons beyond the clock's age; signed is the intent.
                bound = max([(<_Partial> q).min_clock for q in jparts.values()]) - horizon
            else:
                bound = 0
            for pid, po in list(jparts.items()):
                p = <_Partial> po
                if p.max_clock >= bound:
                    states.append(ProducerState(journal, pid.to_bytes(6, "big"), p.min_clock, p.begin))
                else:
                    del jparts[pid]
            if not jparts:
                del self._partials_d[journal]
        self._pending_s.clear()
        return dict(self._offsets_d), states

    # -- what the reference keeps as fields (read by tests) -----------------

    @property
    def _ring(self):
        return list(self._ring_l)

    @property
    def _rbegin(self):
        return [self._rbegin_a[i] for i in range(self._size)]

    @property
    def _rclock(self):
        return [self._rclock_a[i] for i in range(self._size)]

    @property
    def _next(self):
        return [self._next_a[i] for i in range(self._size)]

    @property
    def _head(self):
        return self._head_i

    @property
    def _emit(self):
        return self._emit_p

    @property
    def _pending(self):
        return self._pending_s

    @property
    def _partials(self):
        return self._partials_d

    @property
    def _dequeued(self):
        return self._dequeued_o

    @property
    def _dequeued_clock(self):
        return self._dequeued_clock_v

    @property
    def _replay_it(self):
        return self._replay_iter

    @_replay_it.setter
    def _replay_it(self, value):
        self._replay_iter = value

    # -- diagnostics ------------------------------------------------------

    cdef int _log_anomaly(self, str reason, object journal, int64_t begin, int64_t end, _Partial partial,
                          uint64_t clock, uint64_t flags) except -1:
        key = (reason, journal, partial.producer)
        if key in self._logged:
            return 0
        level = logging.WARNING
        if len(self._logged) < _MAX_LOGGED_ANOMALIES:
            self._logged.add(key)
        else:
            level = logging.DEBUG
        logger.log(
            level,
            "%s: journal=%s begin=%d end=%d producer=%012x clock=%d flags=%#x "
            "partial.min_clock=%d partial.max_clock=%d partial.begin=%d (logged once per producer)",
            reason, journal, begin, end, partial.producer, clock, flags,
            partial.min_clock, partial.max_clock, partial.begin,
        )
        return 0
