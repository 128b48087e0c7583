# cython: language_level=3
"""The ``--uuid-sequencing`` relay's fill loop, compiled: :func:`fill` is
:meth:`producer.relay.sequenced._produce.RowProducer.fill_python` (the reference, whose docstring and
module doc state the rules) with the row's fields, the clock and the counts in C and the record's UUID
built in place, and :func:`continue_uuid` is :func:`producer.relay.sequenced._view.continue_uuid`.

Invariants (tests/test_producer/relay/sequenced/test_native_fill.py):
- for every sequence of rows and every produce() outcome (queued, queue full, a Kafka error, refused
  arguments), :func:`fill` produces the same records with the same UUIDs and headers, dead-letters, holds
  and parks the same rows, and leaves the transaction, the clock, the slot pool and the ready queue as
  the reference does, returning the same ``(in_flight, full, abandon)``;
- every cold branch (a halted key, a parked row, a bad row, a held topic, a refused topic, a row too
  large, a partition out of range, a refused produce) calls the same Python methods as the reference,
  so the rules live in one place: only the per-row bookkeeping is compiled.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint64_t
from libc.string cimport memcpy

from harvest_outbox.sequencer._uuid_layout cimport (
    COUNTER_MASK,
    CONTINUE_TXN,
    HI_VERSION_SHIFT,
    TIME_HI_MASK,
    TIME_MID_MASK,
    VARIANT_RFC4122,
    VERSION_1,
)
from harvest_outbox.producer.ops._header_room cimport headers_may_exceed

import time
from functools import partial

from confluent_kafka import KafkaException

from harvest_outbox.producer.kafka import ANY_PARTITION
from harvest_outbox.producer.ops.preflight import HEADER_BYTES_PER_CHAR, HEADER_OVERHEAD, header_bytes, too_large
from harvest_outbox.producer.relay.sequenced._txn import Slot, TracedSlot
from harvest_outbox.sequencer import TICK as _TICK


cdef Py_ssize_t _PER_CHAR = HEADER_BYTES_PER_CHAR, _PER_HEADER = HEADER_OVERHEAD
cdef uint64_t TICK = _TICK
_yield = time.sleep


cdef inline bytes _uuid(bytes producer, uint64_t clock):
    # uuid_layout.pack(producer, clock, CONTINUE_TXN) as 16 big-endian bytes: time_low (clock bits
    # 4-35), time_mid (36-51), version | time_hi (52-63), variant | counter (bits 0-3) | flags, then
    # the 6-byte ProducerID.
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 16)
    cdef unsigned char* p = <unsigned char*>PyBytes_AS_STRING(out)
    cdef uint64_t low = (clock >> 4) & 0xFFFFFFFF
    cdef uint64_t mid = (clock >> 36) & TIME_MID_MASK
    cdef uint64_t hi = ((clock >> 52) & TIME_HI_MASK) | (VERSION_1 << HI_VERSION_SHIFT)
    cdef uint64_t word4 = (<uint64_t>VARIANT_RFC4122 << 14) | ((clock & COUNTER_MASK) << 10) | CONTINUE_TXN
    if len(producer) != 6:
        raise ValueError(f"a ProducerID is 6 bytes, not {len(producer)}")
    p[0] = (low >> 24) & 0xFF
    p[1] = (low >> 16) & 0xFF
    p[2] = (low >> 8) & 0xFF
    p[3] = low & 0xFF
    p[4] = (mid >> 8) & 0xFF
    p[5] = mid & 0xFF
    p[6] = (hi >> 8) & 0xFF
    p[7] = hi & 0xFF
    p[8] = (word4 >> 8) & 0xFF
    p[9] = word4 & 0xFF
    memcpy(p + 10, PyBytes_AS_STRING(producer), 6)
    return out


def continue_uuid(bytes producer, uint64_t clock):
    """:func:`producer.relay.sequenced._view.continue_uuid`, in C."""
    return _uuid(producer, clock)


def fill(rp, t, Py_ssize_t max_records, Py_ssize_t in_flight):
    """:meth:`RowProducer.fill_python <producer.relay.sequenced._produce.RowProducer.fill_python>` for
    ``rp``, compiled; returns ``(in_flight, full, abandon)`` for the caller's ``Filled``."""
    core = rp.core
    ready, held, txns, guard = core.ready, core.held, rp.txns, core.guard
    producer = core.producer
    assert producer is not None
    cdef Py_ssize_t limit = rp.limits.in_flight_limit
    clock = t.view.clock
    poison = rp.poison
    parked = poison.rows
    halted = core.halt.keys
    cdef dict verdicts = guard.verdicts
    event_id = core.event_id
    spans = core.spans
    make_slot = Slot if spans is None else partial(TracedSlot, spans=spans)
    cdef bytes prod = t.producer
    cdef list rows = t.rows
    cdef list ids = t.ids
    cdef list slots = rp.slots
    popleft = ready.popleft
    produce = producer.produce
    dead_letter_in = rp._dead_letter_in
    cdef uint64_t c
    cdef tuple row
    cdef list headers
    cdef Py_ssize_t size
    while ready and in_flight < limit:
        row = ready[0]
        rid, topic, key, value, hkeys, hvals, bad, _attempts, _error, partition, _created = row
        if halted and (topic, key) in halted:
            popleft()
            t.held.append(rid)
            continue
        if parked and rid in parked:
            popleft()
            reason, attempts = poison.take(rid)
            dead_letter_in(t, row, reason, attempts)
            continue
        if bad is not None or topic is None or key is None:
            popleft()
            dead_letter_in(t, row, f"bad row: {bad}", 0)
            continue
        if held and topic in held:
            popleft()
            core.hold(row)
            continue
        verdict = verdicts.get(topic)
        if verdict is None:
            verdict = guard.verdict(topic)
        if isinstance(verdict, str):
            popleft()
            if core.hold_missing and topic in guard.missing:
                core.hold(row)
                continue
            dead_letter_in(t, row, f"cannot be sent: {verdict}", 0)
            continue
        size = len(key) + (len(value) if value is not None else 0)
        if size > verdict or (
            hkeys and hvals and headers_may_exceed(size, hkeys, hvals, verdict, _PER_CHAR, _PER_HEADER)
            and size + header_bytes(hkeys, hvals) > verdict
        ):
            popleft()
            why = too_large(verdict, key, value, hkeys, hvals)
            dead_letter_in(t, row, f"cannot be sent: {why}", 0)
            continue
        if partition is not None:
            beyond = guard.partition_problem(topic, partition, core.partition_column)
            if beyond is not None:
                popleft()
                dead_letter_in(t, row, f"cannot be sent: {beyond}", 0)
                continue
        c = <uint64_t>clock.value + TICK
        headers = [("uuid", _uuid(prod, c))]
        if event_id is not None:
            headers.append((event_id[0], event_id[1] + b"%d" % rid))
        if hkeys and hvals:
            headers.extend(zip(hkeys, hvals, strict=True))
        slot = slots.pop() if slots else make_slot(slots)
        slot.txn = t
        slot.clock = c
        if spans is not None and hkeys and isinstance(slot, TracedSlot):
            slot.span = spans.start(rid, topic, _created, headers)
        try:
            produce(topic, value, key, ANY_PARTITION if partition is None else partition, slot, None, 0, headers)
        except BufferError:
            slot.txn = None
            if isinstance(slot, TracedSlot):
                slot.span = None
            slots.append(slot)
            producer.poll(0.005)
            in_flight = sum([x.pending for x in txns])
            continue
        except KafkaException as exc:
            slot.txn = None
            slots.append(slot)
            err = exc.args[0]
            if spans is not None:
                rp._refused_span(slot, err.name(), f"produce() refused the record: {err.str()}")
            why = rp._refused(t, row, err)
            if why is not None:
                return in_flight, False, why
            continue
        except (TypeError, ValueError) as exc:
            slot.txn = None
            slots.append(slot)
            if spans is not None:
                rp._refused_span(slot, type(exc).__name__, f"produce() refused the record: {exc}")
            popleft()
            dead_letter_in(t, row, f"cannot produce: {exc}", 1)
            continue
        popleft()
        rp.sync_failures = 0
        clock.value = c
        t.pending += 1
        rows.append(row)
        ids.append(rid)
        in_flight += 1
        if not in_flight & 1023:
            _yield(0)
        if len(ids) >= max_records:
            return in_flight, True, None
    return in_flight, False, None
