"""The ``uuid`` record header: parsing, and the policy for records without one.

Sequenced records carry a Gazette v1 UUID as 16 raw bytes in a header named
``uuid`` (docs/design.md §2).

The contract: a ``uuid`` header is the message's identity only when it *can*
come from a harvest relay (or Gazette's Go code, which lays UUIDs out the same
way): 16 bytes, RFC 4122 variant, version 1, a ProducerID (the v1 "node",
bytes 10-15) with the multicast bit set (``b[10] & 1``: harvest and Gazette
draw random ids and set it; a real MAC address, what ``uuid.uuid1()`` puts
there, has it clear), and flags (the low 10 bits of bytes 8-9) of 0, 1 or 2
(``OUTSIDE_TXN``, ``CONTINUE_TXN``, ``ACK_TXN``; the other values are
reserved). Any other header value -- an application's own ``uuid`` header
holding a ``uuid1()``, a version 4 UUID, text -- is *not* an identity: were it
read as one, its arbitrary clock and flags could commit or roll back another
message (read as an ACK) or have the record dropped as a duplicate. A foreign
UUID that passes all of these checks by chance (a ``uuid1()`` from a host
without a MAC address gets a random multicast node, and 3 of 1024 clock
sequences give flags 0-2) is indistinguishable from a relay's: applications
must not put their own ids in a header named ``uuid``.

What happens to a record whose header is missing or unusable is the reader's
:class:`UUIDPolicy`:

* ``DELIVER`` (default): the record is sequenced as an unsequenced OUTSIDE
  message (the nil UUID: it commits at once, in log order, and is never
  tracked as a producer), so it is delivered at-least-once, with
  ``Record.uuid is None``. A warning is logged, rate-limited.
* ``DROP``: the record is skipped, with the same rate-limited warning.
* ``RAISE``: :class:`~consumer.errors.MissingUUIDError` is raised from
  ``poll()``; a caller that catches it and polls again continues after the
  offending record.

Dropped and raising records never reach the Sequencer, so they do not move
checkpoint offsets: a reader resumed from a checkpoint taken before later
records were delivered may meet them again (and drop or raise again).

Invariants (backed by ``tests/test_consumer/test_uuid_policy.py``):

* :func:`parse_header_value` accepts exactly what ``sequencer.parse_uuid``
  accepts (16 bytes, version 1 / RFC 4122 variant) that also has a multicast
  ProducerID and flags 0-2 (:func:`is_relay_uuid_int`), and returns None
  otherwise; it never raises. The compiled converter (``consumer/_native.pyx``),
  the pure converters in ``consumer/uncommitted.py`` and Spark's column-wise
  ``spark_reader.sequencing.uuid_words`` apply the same rule
  (``tests/test_consumer/test_native.py`` compares the first two over a table,
  ``tests/test_spark_reader/test_sequencing_columns.py`` the third).
* The nil UUID in a header counts as "unsequenced", like a missing header.
* Nothing in this module raises on any header content.
* Warnings are rate-limited: at most one per ``interval`` seconds per logger
  key, each counting the records suppressed since the previous one.
"""

from __future__ import annotations

import enum
import logging
import time
import uuid as _uuid
from typing import Any

from harvest_outbox.sequencer import NIL_UUID, parse_uuid
from harvest_outbox.sequencer.uuid_layout import (
    FLAGS_MASK,
    FLAGS_SHIFT,
    MAX_RELAY_FLAGS,
    MULTICAST_SHIFT,
    RELAY_UUID_BITS,
    RELAY_UUID_MASK,
    flags_of_int,
)

__all__ = [
    "MAX_RELAY_FLAGS",
    "RELAY_UUID_BITS",
    "RELAY_UUID_MASK",
    "RateLimitedLog",
    "UUIDPolicy",
    "describe_problem",
    "is_relay_uuid_int",
    "parse_header_value",
]

# RELAY_UUID_MASK / RELAY_UUID_BITS (the version nibble, the variant and the ProducerID's multicast
# bit a relay's UUID fixes) and MAX_RELAY_FLAGS (flags above it are reserved) are defined by
# sequencer.uuid_layout, with the rest of the layout; re-exported here, where they were first.

_new = object.__new__
_UUID = _uuid.UUID
_set_int = _UUID.__dict__["int"].__set__
_set_safe = _UUID.__dict__["is_safe"].__set__
_SAFE_UNKNOWN = _uuid.SafeUUID.unknown
_from_bytes = int.from_bytes


class UUIDPolicy(str, enum.Enum):
    """What to do with a record whose ``uuid`` header is missing or malformed."""

    DELIVER = "deliver"
    DROP = "drop"
    RAISE = "raise"


def parse_header_value(raw: Any) -> _uuid.UUID | None:
    """The message UUID in a header value, or None if unusable (or nil)."""
    if type(raw) is not bytes or len(raw) != 16:
        return None
    x = _from_bytes(raw, "big")
    if x & RELAY_UUID_MASK != RELAY_UUID_BITS or (x >> FLAGS_SHIFT) & FLAGS_MASK > MAX_RELAY_FLAGS:
        return None
    u = _new(_UUID)
    _set_int(u, x)
    _set_safe(u, _SAFE_UNKNOWN)
    return u


def is_relay_uuid_int(x: int) -> bool:
    """True if the 128-bit int ``x`` is a UUID a harvest relay (or Gazette) can have written (module doc)."""
    return x & RELAY_UUID_MASK == RELAY_UUID_BITS and (x >> FLAGS_SHIFT) & FLAGS_MASK <= MAX_RELAY_FLAGS


def describe_problem(headers: list[tuple[str, Any]] | None) -> str:
    """Why a record's headers hold no usable UUID (for logs and errors)."""
    raw = None
    found = False
    for k, v in headers or ():
        if k == "uuid":
            raw, found = v, True
            break
    if not found:
        return "no 'uuid' header"
    if raw is None:
        return "'uuid' header has no value"
    try:
        u = parse_uuid(raw)
    except Exception as exc:  # UUIDError: its message names the bad field
        return f"malformed 'uuid' header: {exc}"
    if u == NIL_UUID:
        return "'uuid' header is the nil UUID (unsequenced)"
    if not (u.int >> MULTICAST_SHIFT) & 1:
        return (
            "'uuid' header is a version 1 UUID whose node is not a harvest ProducerID (multicast bit clear: "
            "a MAC address, e.g. from uuid.uuid1()); not read as a message identity"
        )
    flags = flags_of_int(u.int)
    if flags > MAX_RELAY_FLAGS:
        return f"'uuid' header has reserved flags {flags:#x} (a relay writes 0, 1 or 2); not read as a message identity"
    return "'uuid' header is valid"  # pragma: no cover - callers only ask on failure


class RateLimitedLog:
    """Logs a warning at most once per ``interval`` seconds per key."""

    __slots__ = ("_interval", "_last", "_logger", "_suppressed")

    def __init__(self, logger: logging.Logger, interval: float = 10.0) -> None:
        self._logger = logger
        self._interval = interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, key: str, msg: str, *args: Any) -> None:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        if len(self._last) > 10_000:  # bound memory for pathological key counts
            self._last.clear()
            self._suppressed.clear()
        self._last[key] = now
        n = self._suppressed.pop(key, 0)
        if n:
            self._logger.warning(msg + " (%d similar suppressed in the last %.0fs)", *args, n, self._interval)
        else:
            self._logger.warning(msg, *args)
