"""Builds the optional native (Cython) fast paths; everything else is in pyproject.toml.

``sequencer._native`` (the Sequencer) and ``consumer._native`` (Kafka record
conversion and ``Record``) are compiled when Cython and a C compiler are
available. When they are not, or ``HARVEST_PURE_PYTHON=1`` is set at build
time, the install still succeeds and harvest runs the pure-Python modules,
which are the reference implementation: same semantics, about 2-3x slower
readers. ``python -m harvest_local check`` and ``harvest --version`` say which
one is in use.
"""

from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

MODULES = ["sequencer/_native.pyx", "consumer/_native.pyx"]
DIRECTIVES = {
    "language_level": 3,
    "boundscheck": False,
    "wraparound": False,
    "initializedcheck": False,
    "cdivision": True,
    "embedsignature": True,
}


def _warn(msg: str) -> None:
    print(f"harvest setup: WARNING: {msg}; installing the pure-Python implementation", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """A failed compile leaves the pure-Python implementation in place instead of failing the install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler, no Python headers...
            _warn(f"native extensions not built ({exc})")

    def build_extension(self, ext) -> None:  # type: ignore[no-untyped-def]
        try:
            super().build_extension(ext)
        except Exception as exc:
            _warn(f"native extension {ext.name} not built ({exc})")


def extensions() -> list:
    if os.environ.get("HARVEST_PURE_PYTHON", "") not in ("", "0"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        _warn("Cython is not installed")
        return []
    return cythonize(MODULES, compiler_directives=DIRECTIVES, include_path=["."], quiet=True)


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
