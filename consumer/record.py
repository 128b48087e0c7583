"""Record: one Kafka record as the readers deliver it, with its message identity.

``Record`` is the compiled class (``consumer/_native.pyx``) when the native
extensions are built, else :class:`PyRecord`, the pure-Python reference
(``sequencer.native`` chooses); both behave the same, and
:func:`make_record` builds whichever is in use.

A :class:`Record` is an immutable, slotted view of a confluent-kafka
``Message`` plus the parsed ``uuid`` header. :class:`PyRecord` reads the Kafka
fields from the underlying message on access; the compiled Record reads
``key``, ``value``, ``headers`` and ``offset`` once, when it is made (the
objects confluent-kafka's accessors return on every call, which the reader has
at hand while converting), and keeps them as slots, so an application reads
each as cheaply as a plain attribute. The two differ only if the application
changes the message afterwards (``Message.set_value()`` and the like). The UUID
is kept as its 128-bit int, and the ``uuid.UUID`` object is built on access.

Invariants (backed by ``tests/test_consumer/test_config_and_records.py``):

* Records are read-only: setting or deleting any attribute raises
  ``AttributeError``.
* ``uuid`` is the validated v1 message UUID, or ``None`` when the record had no
  usable ``uuid`` header (then ``producer`` is ``None``, ``clock`` is 0 and
  ``flags`` is ``Flags.OUTSIDE_TXN``: the record was treated as an unsequenced,
  at-least-once OUTSIDE message). The nil UUID is reported as ``None`` too.
* ``journal`` is ``"topic/partition"``; ``offset`` is the Kafka offset (the
  Sequencer's Begin; End is ``offset + 1``).
* Equality and hashing are by ``(topic, partition, offset)``: a record's
  identity is its position in the log.
* ``traceparent`` / ``tracestate`` are the W3C trace-context headers the stasher
  recorded (``consumer.trace_context``), ``None`` when absent or not UTF-8.
"""

from __future__ import annotations

import uuid as _uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from harvest_outbox.consumer.trace_context import TRACEPARENT, TRACESTATE, header_text
from harvest_outbox.sequencer import Flags
from harvest_outbox.sequencer.native import load as load_native
from harvest_outbox.sequencer.uuid_layout import ACK_TXN, MAX_RELAY_FLAGS, clock_of_int, flags_of_int, producer_of_int

__all__ = ["HEADER_NAME", "PyRecord", "Record", "make_record"]

#: Name of the record header carrying the 16 raw UUID bytes.
HEADER_NAME = "uuid"

_new = object.__new__
_UUID = _uuid.UUID
_set_uuid_int = _UUID.__dict__["int"].__set__
_set_uuid_safe = _UUID.__dict__["is_safe"].__set__
_SAFE_UNKNOWN = _uuid.SafeUUID.unknown


class PyRecord:
    """A Kafka record plus its Gazette message identity (see module doc)."""

    # _x: the UUID's 128-bit int, 0 for none (the nil UUID is "none" too).
    __slots__ = ("_msg", "_x")
    _msg: Any  # the confluent_kafka.Message
    _x: int

    def __init__(self, message: Any, message_uuid: _uuid.UUID | None = None) -> None:
        _set_msg(self, message)
        _set_x(self, 0 if message_uuid is None else message_uuid.int)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Record is read-only (cannot set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Record is read-only (cannot delete {name!r})")

    # -- Kafka fields -------------------------------------------------------

    @property
    def topic(self) -> str:
        return self._msg.topic()  # type: ignore[no-any-return]

    @property
    def partition(self) -> int:
        return self._msg.partition()  # type: ignore[no-any-return]

    @property
    def offset(self) -> int:
        return self._msg.offset()  # type: ignore[no-any-return]

    @property
    def key(self) -> bytes | None:
        return self._msg.key()  # type: ignore[no-any-return]

    @property
    def value(self) -> bytes | None:
        return self._msg.value()  # type: ignore[no-any-return]

    @property
    def headers(self) -> list[tuple[str, bytes | None]] | None:
        """All record headers (the ``uuid`` header included), as confluent-kafka returns them."""
        return self._msg.headers()  # type: ignore[no-any-return]

    @property
    def traceparent(self) -> str | None:
        """The W3C ``traceparent`` header the stasher recorded (None without one); see ``consumer.trace_context``."""
        return header_text(self._msg.headers(), TRACEPARENT)

    @property
    def tracestate(self) -> str | None:
        """The W3C ``tracestate`` header, if the stashing span had one."""
        return header_text(self._msg.headers(), TRACESTATE)

    @property
    def timestamp(self) -> int | None:
        """Record timestamp in ms since the epoch, or None when the broker gave none."""
        kind, ts = self._msg.timestamp()
        return None if kind == 0 else ts

    @property
    def timestamp_type(self) -> int:
        """confluent_kafka.TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME or TIMESTAMP_NOT_AVAILABLE."""
        return self._msg.timestamp()[0]  # type: ignore[no-any-return]

    @property
    def journal(self) -> str:
        return f"{self._msg.topic()}/{self._msg.partition()}"

    # -- identity -----------------------------------------------------------

    @property
    def uuid(self) -> _uuid.UUID | None:
        x = self._x
        if not x:
            return None
        u = _new(_UUID)
        _set_uuid_int(u, x)
        _set_uuid_safe(u, _SAFE_UNKNOWN)
        return u

    @property
    def producer(self) -> bytes | None:
        x = self._x
        return None if not x else producer_of_int(x).to_bytes(6, "big")

    @property
    def clock(self) -> int:
        return clock_of_int(self._x)

    @property
    def flags(self) -> int:
        """``Flags`` value of the UUID (an unknown value is returned as the raw int)."""
        f = flags_of_int(self._x)
        return Flags(f) if f <= MAX_RELAY_FLAGS else f

    @property
    def is_ack(self) -> bool:
        return flags_of_int(self._x) == ACK_TXN

    @property
    def kafka_message(self) -> Any:
        """The underlying ``confluent_kafka.Message``."""
        return self._msg

    # -- value semantics ----------------------------------------------------

    def _position(self) -> tuple[str, int, int]:
        m = self._msg
        return (m.topic(), m.partition(), m.offset())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PyRecord):
            return NotImplemented
        return self._position() == other._position()

    def __hash__(self) -> int:
        return hash(self._position())

    def __repr__(self) -> str:
        producer = self.producer
        ident = (
            "unsequenced" if producer is None else f"producer={producer.hex()} clock={self.clock} flags={self.flags!r}"
        )
        return f"Record({self.topic}/{self.partition}@{self.offset} key={self.key!r} {ident})"

    def __reduce__(self) -> Any:
        raise TypeError("Record wraps a live confluent_kafka.Message and cannot be pickled; copy its fields")


# Slot descriptors bypass the read-only __setattr__ (used only at construction).
_set_msg = PyRecord.__dict__["_msg"].__set__
_set_x = PyRecord.__dict__["_x"].__set__


def _make_py_record(message: Any, x: int) -> PyRecord:
    """A PyRecord of ``message`` with the UUID ``x`` (its 128-bit int; 0 for none)."""
    r = _new(PyRecord)
    _set_msg(r, message)
    _set_x(r, x)
    return r


_native = load_native("harvest_outbox.consumer._native")
if TYPE_CHECKING:  # the compiled class has PyRecord's interface (tests/test_consumer check both)
    Record = PyRecord
else:
    #: The Record class in use: the compiled one when built, else :class:`PyRecord`.
    Record = PyRecord if _native is None else _native.Record
#: ``make_record(message, x)``: a ``Record`` with the UUID ``x`` (its 128-bit int; 0 for none).
make_record: Callable[[Any, int], Record] = _make_py_record if _native is None else _native.make_record
