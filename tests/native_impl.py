"""The compiled fast paths under test: a missing build fails the test that needs it (it would
otherwise go untested), unless ``HARVEST_PURE_PYTHON=1`` asks for the pure-Python implementation
only, which skips it."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

from harvest_outbox.sequencer.native import pure_python_forced


def native_module(name: str) -> ModuleType:
    """The compiled module ``name`` (e.g. ``"harvest_outbox.sequencer._native"``)."""
    if pure_python_forced():
        pytest.skip(f"HARVEST_PURE_PYTHON=1: {name} is not under test")
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        pytest.fail(
            f"{name} is not built ({exc}); run ./dev setup (or pip install -e .) "
            "or set HARVEST_PURE_PYTHON=1 to test only the pure-Python implementation"
        )
