"""What to do with records that carry no valid ``uuid`` header (same policy as ReadCommittedIter).

- ``"outside"`` (default): deliver the record at once, as if it were an OUTSIDE_TXN message with
  the nil UUID: at-least-once, the same as a reader that knows nothing of sequencing. A warning is
  logged (once per partition and read).
- ``"drop"``: skip it (logged at INFO).
- ``"raise"``: fail the read with :class:`~spark_reader.errors.MissingUUIDError` naming the
  topic, partition and offset.
"""

from __future__ import annotations

from typing import Literal

from spark_reader.errors import ReaderConfigError

MissingUUIDPolicy = Literal["outside", "drop", "raise"]
POLICIES: tuple[str, ...] = ("outside", "drop", "raise")


def check_policy(value: str) -> MissingUUIDPolicy:
    if value not in POLICIES:
        raise ReaderConfigError(
            f"missing_uuid={value!r} is not a policy; use one of {', '.join(POLICIES)} "
            "(default 'outside': deliver such records at-least-once)"
        )
    return value  # type: ignore[return-value]
