"""tests/test_producer/ mirrors producer/'s packages (issue #46, item 1; scripts/test_rooms.py made it so).

Invariants: every test module of tests/test_producer/ lives in a folder named for a package of producer/
(``layouts/cursor`` for ``producer/layouts/cursor/``) or one of the script's extra rooms; none is left at the
top, where only the shared helpers (relaylib, seqcheck, the fakes and models) and the conftest live; and
the script, run again, has nothing left to move.
"""

from __future__ import annotations

import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests" / "test_producer"
PRODUCER = ROOT / "producer"


def _rooms() -> dict[str, object]:
    return runpy.run_path(str(ROOT / "scripts" / "test_rooms.py"), run_name="test_rooms")


def test_every_test_module_sits_in_a_room_named_for_a_producer_package() -> None:
    extra = set(_rooms()["EXTRA_ROOMS"])  # type: ignore[call-overload]
    packages = {
        str(p.parent.relative_to(PRODUCER)) for p in PRODUCER.rglob("__init__.py") if "__pycache__" not in p.parts
    }
    misplaced = []
    for module in TESTS.rglob("test_*.py"):
        room = str(module.parent.relative_to(TESTS))
        if room not in packages and room not in extra:
            misplaced.append(str(module.relative_to(ROOT)))
    assert not misplaced, f"test modules outside a room of producer/'s packages: {misplaced}"


def test_no_test_module_is_left_at_the_top_and_the_map_places_every_module_once() -> None:
    top = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not top, f"move these into their room (add them to ROOMS, run python scripts/test_rooms.py): {top}"
    rooms = _rooms()["ROOMS"]
    placed = [(room, m) for room, modules in rooms.items() for m in modules]  # type: ignore[attr-defined]
    on_disk = {(str(p.parent.relative_to(TESTS)), p.stem) for p in TESTS.rglob("test_*.py")}
    assert set(placed) == on_disk, (
        f"ROOMS and the tree differ: only in ROOMS {sorted(set(placed) - on_disk)}, "
        f"only on disk {sorted(on_disk - set(placed))}"
    )
    assert len(placed) == len(set(m for _, m in placed))
