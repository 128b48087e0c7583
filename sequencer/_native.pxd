# Declarations of the native Sequencer module, for other extension modules: consumer/_native.pyx
# fills EntryBatch objects without Python calls, and its fused batch path (sequence_raw) queues
# records and dequeues committed ones through the Sequencer's own C methods below, so the
# decisions stay in one place (sequencer/_native.pyx).

from libc.stdint cimport int64_t, uint64_t


cdef class EntryBatch:
    cdef list _journals
    cdef list _items
    cdef int64_t* _begins
    cdef int64_t* _ends
    cdef uint64_t* _his
    cdef uint64_t* _los
    cdef Py_ssize_t _n
    cdef Py_ssize_t _cap

    cdef int _grow(self) except -1
    cdef int push(self, object journal, int64_t begin, int64_t end, uint64_t hi, uint64_t lo, object item) except -1


cdef class _Partial:
    cdef readonly object journal
    cdef readonly uint64_t producer
    cdef public uint64_t min_clock  # exclusive: clock of the last ACK (or processed message)
    cdef public uint64_t max_clock  # inclusive: largest clock of the span (or the ACK's)
    cdef public int64_t begin  # offset of the first unprocessed span message, or -1
    cdef public Py_ssize_t ring_start  # ring index of the span's first entry still in the ring
    cdef public Py_ssize_t ring_stop  # ring index of the span's last entry


cdef class Sequencer:
    cdef dict _offsets_d
    cdef object _offsets_view
    cdef dict _partials_d
    cdef set _pending_s
    cdef _Partial _emit_p
    cdef object _dequeued_o  # the item step() returned last
    cdef uint64_t _dequeued_clock_v
    cdef object _replay_iter
    cdef list _ring_l  # queued items (what step() returns)
    cdef list _rpart_l  # each slot's partial (for eviction)
    cdef int64_t* _rbegin_a
    cdef uint64_t* _rclock_a
    cdef Py_ssize_t* _next_a
    cdef int64_t _emit_end  # end offset of the committing message of _emit_p
    cdef Py_ssize_t _head_i
    cdef Py_ssize_t _size
    cdef set _logged
    # The partial last looked up by queue_batch's fast path: batches come in
    # runs of one journal and one producer. Reset whenever partials are removed.
    cdef object _c_journal
    cdef dict _c_jparts
    cdef uint64_t _c_producer
    cdef _Partial _c_partial

    cdef void _reset_cache(self)
    cdef int _queue_fast(self, object journal, int64_t begin, int64_t end, uint64_t hi, uint64_t lo, object item) except -2
    cdef int _queue(self, object journal, int64_t begin, int64_t end, uint64_t hi, uint64_t lo, object item) except -1
    cdef int _evict_at_head(self, Py_ssize_t head) except -1
    cdef object _step(self)
    cdef Py_ssize_t _step_into(self, list out, Py_ssize_t max_n) except -1
    cdef void _finish(self, _Partial emit, uint64_t min_clock)
    cdef object _next_replayed(self, _Partial emit)
    cdef int _log_anomaly(self, str reason, object journal, int64_t begin, int64_t end, _Partial partial,
                          uint64_t clock, uint64_t flags) except -1
