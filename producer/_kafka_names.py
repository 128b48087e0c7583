"""What Kafka accepts as a topic name: the one definition of the rule, used wherever a name is checked.

Kafka (``org.apache.kafka.common.internals.Topic``) takes 1-249 characters from ``[a-zA-Z0-9._-]``
and refuses ``.`` and ``..``; harvest applies the same character rule to the leader election's
group id and topic, and uses it to make a host name safe inside a relay's default name.

Invariant (``tests/test_foundation/test_owners.py``): this module is the only one in the package
that spells the character class; the checks in ``config``, ``outbox_rows`` and ``preflight`` use it.
"""

from __future__ import annotations

import re

__all__ = ["LEGAL_NAME", "NAME_RULE", "NOT_A_NAME_CHAR"]

_CHARS = r"a-zA-Z0-9._\-"
#: A whole legal name (``LEGAL_NAME.match(name)``); ``.`` and ``..`` also match: the callers that
#: name topics refuse those two themselves.
LEGAL_NAME = re.compile(rf"^[{_CHARS}]{{1,249}}$")
#: One character a name may not hold (``NOT_A_NAME_CHAR.sub("_", text)`` makes text legal).
NOT_A_NAME_CHAR = re.compile(rf"[^{_CHARS}]")
#: The rule as error messages state it.
NAME_RULE = "1-249 characters from [a-zA-Z0-9._-]"
