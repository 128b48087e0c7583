# The Gazette v1 message UUID layout for the compiled modules: sequencer/uuid_layout.py's
# constants and its *_halves functions on the UUID's two 64-bit halves (hi = x >> 64,
# lo = x & MASK64), as C. tests/test_sequencer/test_uuid_layout.py checks every constant of the
# enum below equal to the Python module's, and the compiled readers against it on random UUIDs.
# Declarations and inline functions only: cimporting this imports no module at run time.

from libc.stdint cimport uint64_t


cdef enum:
    OUTSIDE_TXN = 0
    CONTINUE_TXN = 1
    ACK_TXN = 2
    MAX_RELAY_FLAGS = 2
    FLAGS_SHIFT = 48
    FLAGS_MASK = 0x3FF
    PRODUCER_BITS = 48
    MULTICAST_SHIFT = 40
    TIME_LOW_SHIFT = 96
    TIME_MID_SHIFT = 80
    TIME_MID_MASK = 0xFFFF
    TIME_HI_SHIFT = 64
    TIME_HI_MASK = 0x0FFF
    COUNTER_SHIFT = 58
    COUNTER_MASK = 0xF
    VERSION_1 = 1
    HI_VERSION_SHIFT = 12
    VARIANT_SHIFT = 62
    VARIANT_RFC4122 = 2


cdef inline uint64_t clock_of_halves(uint64_t hi, uint64_t lo) noexcept nogil:
    # uuid_layout.clock_of_halves: time_low << 4 | time_mid << 36 | time_hi << 52 | counter.
    return (((hi >> (TIME_LOW_SHIFT - 64)) << 4) | (((hi >> (TIME_MID_SHIFT - 64)) & TIME_MID_MASK) << 36)
            | ((hi & TIME_HI_MASK) << 52) | ((lo >> COUNTER_SHIFT) & COUNTER_MASK))


cdef inline uint64_t flags_of_lo(uint64_t lo) noexcept nogil:
    return (lo >> FLAGS_SHIFT) & FLAGS_MASK


cdef inline uint64_t producer_of_lo(uint64_t lo) noexcept nogil:
    return lo & ((<uint64_t>1 << PRODUCER_BITS) - 1)


cdef inline bint is_relay_halves(uint64_t hi, uint64_t lo) noexcept nogil:
    # uuid_layout.is_relay_halves: version 1, RFC 4122 variant, multicast ProducerID, flags 0-2.
    return (((hi >> HI_VERSION_SHIFT) & 0xF) == VERSION_1 and (lo >> VARIANT_SHIFT) == VARIANT_RFC4122
            and ((lo >> MULTICAST_SHIFT) & 1) == 1 and flags_of_lo(lo) <= MAX_RELAY_FLAGS)
