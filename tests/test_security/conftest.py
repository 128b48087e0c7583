"""tests/test_security/: the relay tests' helpers (tests/test_producer/relaylib.py, seqcheck.py and
schema/grantlib.py: roles with passwords and an outbox granted as docs/security.md says) importable here, as
tests/test_producer/conftest.py makes them there."""

from __future__ import annotations

import sys
from pathlib import Path

_PRODUCER_TESTS = Path(__file__).resolve().parent.parent / "test_producer"

for _folder in (_PRODUCER_TESTS, _PRODUCER_TESTS / "schema"):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))
