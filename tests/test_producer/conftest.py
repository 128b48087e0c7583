"""tests/test_producer/: the relay's tests, in folders that mirror producer/'s packages (scripts/test_rooms.py).

This folder holds the helpers the tests import by name (relaylib, seqcheck, the fakes and the models);
pytest puts a conftest's folder on ``sys.path``, which makes them importable from every folder below. The
folders themselves go on ``sys.path`` too, so a test module that reuses another's helpers
(``from test_table_mapping import _insert``) finds it in whichever room it lives: test module names stay
unique across tests/ (pytest's default import mode requires it), so a name means one file.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent

for _room in sorted(p for p in _HERE.rglob("*") if p.is_dir() and p.name != "__pycache__"):
    if str(_room) not in sys.path:
        sys.path.append(str(_room))
