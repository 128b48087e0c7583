"""What to do with records that carry no valid ``uuid`` header (same policy as ReadCommittedIter).

- ``"deliver"`` (default): deliver the record at once, as if it were an OUTSIDE_TXN message with
  the nil UUID: at-least-once, the same as a reader that knows nothing of sequencing. A warning is
  logged (once per partition and read).
- ``"drop"``: skip it (logged at INFO).
- ``"raise"``: fail the read with :class:`~spark_reader.errors.MissingUUIDError` naming the
  topic, partition and offset.
"""

from __future__ import annotations

from typing import Literal

from harvest_outbox.spark_reader.errors import ReaderConfigError

UUIDPolicyName = Literal["deliver", "drop", "raise"]
POLICIES: tuple[str, ...] = ("deliver", "drop", "raise")


def check_policy(value: str) -> UUIDPolicyName:
    value = getattr(value, "value", value)  # consumer.UUIDPolicy members work too
    if value not in POLICIES:
        raise ReaderConfigError(
            f"uuid_policy={value!r} is not a policy; use one of {', '.join(POLICIES)} "
            "(default 'deliver': deliver such records at-least-once)"
        )
    return value  # type: ignore[return-value]
