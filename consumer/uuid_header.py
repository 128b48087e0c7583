"""The ``uuid`` record header: parsing, and the policy for records without one.

Sequenced records carry a Gazette v1 UUID as 16 raw bytes in a header named
``uuid`` (DESIGN.md section 2). What happens to a record whose header is
missing or malformed (wrong length, not RFC 4122 version 1) is the reader's
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
  accepts (16 bytes, nil or version 1 / RFC 4122 variant) and returns None
  otherwise; it never raises.
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

from sequencer import NIL_UUID, parse_uuid

__all__ = ["UUIDPolicy", "parse_header_value", "describe_problem", "RateLimitedLog"]

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
    # version nibble 1 and RFC 4122 variant bits 10
    if (x >> 76) & 0xF != 1 or (x >> 62) & 0x3 != 2:
        return None
    u = _new(_UUID)
    _set_int(u, x)
    _set_safe(u, _SAFE_UNKNOWN)
    return u


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
    return "'uuid' header is valid"  # pragma: no cover - callers only ask on failure


class RateLimitedLog:
    """Logs a warning at most once per ``interval`` seconds per key."""

    __slots__ = ("_logger", "_interval", "_last", "_suppressed")

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
