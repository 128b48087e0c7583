# cython: language_level=3
"""The at-least-once relay's per-record path, compiled: :func:`dispatch`, :func:`send` and
:func:`on_delivery` are :class:`~producer.relay.at_least_once._records.AtLeastOnceRecords`'s
``_dispatch_python``, ``_send_python`` and ``_on_delivery_python`` (the reference, whose docstrings and
module doc state the rules), with the row's fields and the counts in C.

Invariants (tests/test_producer/relay/test_native_records.py):
- for every sequence of rows, ``produce()`` outcomes and delivery reports, the compiled path produces the
  same records in the same order, keeps the same keys in flight and the same rows parked, and leaves the
  same purges, dead letters, attempt counts and counters as the reference;
- every cold branch (a halted key, a bad row, a held or refused topic, a row too large, a partition out of
  range, rich headers, a full queue, a refused produce, a failed or purged report) calls the same Python
  methods as the reference, so the rules live in one place: only the per-record bookkeeping is compiled.
"""

from harvest_outbox.producer.ops._header_room cimport headers_may_exceed

import time
from collections import deque

from confluent_kafka import KafkaException

from harvest_outbox.producer.kafka import ANY_PARTITION, PURGED_CODES
from harvest_outbox.producer.ops.preflight import HEADER_BYTES_PER_CHAR, HEADER_OVERHEAD, header_bytes, too_large

_sleep = time.sleep


cdef Py_ssize_t _PER_CHAR = HEADER_BYTES_PER_CHAR, _PER_HEADER = HEADER_OVERHEAD


def dispatch(rec):
    """``AtLeastOnceRecords._dispatch_python``, compiled."""
    ready = rec._ready
    cdef dict in_flight = rec._in_flight
    cdef dict waiting = rec._waiting
    cdef Py_ssize_t limit = rec.limits.in_flight_limit
    core = rec.core
    popleft = ready.popleft
    cdef tuple row
    while ready and len(in_flight) < limit and not core.remark:
        row = popleft()
        key = row[2]
        if key in in_flight:
            parked = waiting.get(key)
            if parked is None:
                waiting[key] = deque((row,))
            else:
                parked.append(row)
            rec._waiting_count += 1
        else:
            send(rec, row)
            if not len(in_flight) & 127:
                _sleep(0)


def send(rec, tuple row):
    """``AtLeastOnceRecords._send_python``, compiled: True if the record is now in flight (or the relay
    must remark), False if it was dead-lettered on the spot (its key is still free)."""
    rid, topic, key, value, hkeys, hvals, bad, _attempts, _error, partition, _created = row
    halted = rec._halted
    if halted and (topic, key) in halted:
        layout = rec.core.layout  # the one open() chose (outboxLayout unset: the table's)
        if layout is not None and layout.holds_dropped_rows:
            rec._hold_buf.append(rid)
        return False
    if bad is not None or topic is None or key is None:
        rec._dead_letter(row, f"bad row: {bad}", 0)
        return False
    held = rec._held
    core = rec.core
    if held and topic in held:
        core.hold(row)
        return False
    verdict = rec._verdicts.get(topic)
    if verdict is None:
        verdict = rec._guard.verdict(topic)
    if isinstance(verdict, str):
        if core.hold_missing and topic in rec._guard.missing:
            core.hold(row)
            return False
        rec._dead_letter(row, f"cannot be sent: {verdict}", 0)
        return False
    cdef Py_ssize_t size = len(key) + (len(value) if value is not None else 0)
    if size > verdict or (
        hkeys and hvals and headers_may_exceed(size, hkeys, hvals, verdict, _PER_CHAR, _PER_HEADER)
        and size + header_bytes(hkeys, hvals) > verdict
    ):
        rec._dead_letter(row, f"cannot be sent: {too_large(verdict, key, value, hkeys, hvals)}", 0)
        return False
    if partition is not None:
        beyond = rec._guard.partition_problem(topic, partition, core.partition_column)
        if beyond is not None:
            rec._dead_letter(row, f"cannot be sent: {beyond}", 0)
            return False
    producer = core.producer
    assert producer is not None
    rec._in_flight[key] = row
    try:
        if partition is not None or rec._rich_headers:
            producer.produce(
                topic, value, key, ANY_PARTITION if partition is None else partition, headers=rec._headers(row, topic, key)
            )
        elif hkeys and hvals:
            producer.produce(topic, value, key, headers=list(zip(hkeys, hvals, strict=True)))
        else:
            producer.produce(topic, value, key)
        return True
    except BufferError:
        return rec._send_when_room(row, producer, topic, key)
    except (KafkaException, TypeError, ValueError) as exc:
        return rec._refused(row, key, exc)


def on_delivery(rec, err, msg):
    """``AtLeastOnceRecords._on_delivery_python``, compiled."""
    key = msg.key()
    if key is None:
        return
    cdef dict in_flight = rec._in_flight
    row = in_flight.pop(key, None)
    if row is None:
        return
    if err is None:
        rid = row[0]
        rec._purge_buf.append(rid)
        rec._acked.append(row)
        rec.metrics.delivered += 1
        attempts = rec._attempts
        if attempts and attempts.pop(rid, None) is not None:
            rec._forget_buf.append(rid)
        waiting = rec._waiting
        parked = waiting.get(key)
        if parked and not rec.core.remark:
            nxt = parked.popleft()
            rec._waiting_count -= 1
            if not parked:
                del waiting[key]
            if not send(rec, nxt):
                rec._release(key)
    elif rec._draining and err.code() in PURGED_CODES:
        return
    elif not rec._failed(row, err, synchronous=False, latency=msg.latency()):
        rec._release(key)
