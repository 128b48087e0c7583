"""Which implementation runs: the compiled fast paths, or the pure-Python reference.

harvest's readers spend their time in a few hot loops (the Sequencer, and the
Kafka record conversion). Those exist twice: as pure-Python modules, the
reference implementation that documents the algorithm, and as Cython
extensions (``sequencer/_native.pyx``, ``consumer/_native.pyx``) with the same
semantics, built at install time when a C compiler is available.

:func:`load` returns a native module, or ``None`` when harvest should use the
pure-Python one: the extension was not built, or ``HARVEST_PURE_PYTHON=1`` is
set (read at import time; the test suite uses it to run both). A built
extension that fails to import (a stale build for another Python, say) is
logged as a warning, never silently ignored.
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

__all__ = ["load", "pure_python_forced"]

logger = logging.getLogger(__name__)


def pure_python_forced() -> bool:
    return os.environ.get("HARVEST_PURE_PYTHON", "") not in ("", "0")


def load(name: str) -> ModuleType | None:
    """The native module ``name`` (e.g. ``"harvest_outbox.sequencer._native"``), or None to use pure Python."""
    if pure_python_forced():
        return None
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        logger.info(
            "%s is not built: using the pure-Python implementation (reinstall with a C compiler for speed)", name
        )
        return None
    except ImportError as exc:
        logger.warning(
            "%s failed to import (%s): using the pure-Python implementation; rebuild with "
            "'pip install -e .' (or ./dev setup)",
            name,
            exc,
        )
        return None
