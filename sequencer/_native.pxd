# Declarations of the native Sequencer module, for other extension modules
# (consumer/_native.pyx fills EntryBatch objects without Python calls).

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
