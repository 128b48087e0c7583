# cython: language_level=3
# The relay's compiled per-record paths (producer/relay/{at_least_once,sequenced}/_native.pyx) share this bound:
# whether a record's headers may take it past its topic's limit, from their lengths in characters (UTF-8 takes
# at most ``per_char`` = preflight.HEADER_BYTES_PER_CHAR bytes each; ``per_header`` = preflight.HEADER_OVERHEAD),
# so that the exact count (preflight.header_bytes, an encode per header) runs only near the limit. Held to the
# reference by the paths' equivalence tests (their ``near-limit`` rows).


cdef inline bint headers_may_exceed(
    Py_ssize_t size, hkeys, hvals, verdict, Py_ssize_t per_char, Py_ssize_t per_header
):
    cdef Py_ssize_t bound = size
    for h in hkeys:
        bound += per_char * len(h) + per_header
    for h in hvals:
        if h is not None:
            bound += per_char * len(h)
    return bound > verdict
