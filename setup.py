"""Builds the optional native (Cython) fast paths; everything else is in pyproject.toml.

``harvest_outbox.sequencer._native`` (the Sequencer), ``harvest_outbox.consumer._native``
(Kafka record conversion and ``Record``) and ``harvest_outbox.producer.relay.{sequenced,at_least_once}._native``
(the relay's per-record paths) and ``harvest_outbox.producer.db._text_arrays`` (the header arrays it
reads) are compiled when Cython and a C compiler are
available. When they are not, or ``HARVEST_PURE_PYTHON=1`` is set at build
time, the install still succeeds and harvest runs the pure-Python modules,
which are the reference implementation: same semantics, about 2-3x slower
readers. ``python -m harvest_outbox.harvest_local check`` and ``harvest --version`` say
which one is in use.

The repository keeps its packages as top-level folders (``sequencer/``, ``consumer/``...) and
pyproject.toml's ``package-dir`` installs them as ``harvest_outbox.<folder>``. Cython resolves a
``cimport harvest_outbox.sequencer._native`` through folders on its include path, so the build
stages the declaration files (``.pxd``) under that dotted layout in ``build/cython-include``; the
extension modules are named explicitly, so each compiles under its installed, dotted name.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

TOP = "harvest_outbox"
#: Installed module name -> its source in the repository's layout.
MODULES = {
    f"{TOP}.sequencer._native": "sequencer/_native.pyx",
    f"{TOP}.consumer._native": "consumer/_native.pyx",
    f"{TOP}.producer.relay.sequenced._native": "producer/relay/sequenced/_native.pyx",
    f"{TOP}.producer.relay.at_least_once._native": "producer/relay/at_least_once/_native.pyx",
    f"{TOP}.producer.db._text_arrays": "producer/db/_text_arrays.pyx",
}
#: Declaration files other modules cimport, by installed module name.
PXDS = {
    f"{TOP}.sequencer._native": "sequencer/_native.pxd",
    f"{TOP}.sequencer._uuid_layout": "sequencer/_uuid_layout.pxd",
    f"{TOP}.producer.ops._header_room": "producer/ops/_header_room.pxd",
}
INCLUDE = Path("build") / "cython-include"
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

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None and self.extensions:  # independent modules: compiled side by side (-j N wins)
            self.parallel = len(self.extensions)

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


def _stage_pxds() -> str:
    """The .pxd files under their installed, dotted layout (``harvest_outbox/sequencer/_native.pxd``),
    with ``__init__.pxd`` markers so Cython treats the folders as packages; returns the folder."""
    shutil.rmtree(INCLUDE, ignore_errors=True)
    for module, source in PXDS.items():
        parts = module.split(".")
        folder = INCLUDE.joinpath(*parts[:-1])
        folder.mkdir(parents=True, exist_ok=True)
        for depth in range(1, len(parts)):
            INCLUDE.joinpath(*parts[:depth], "__init__.pxd").touch()
        shutil.copyfile(source, folder / f"{parts[-1]}.pxd")
    return str(INCLUDE)


def extensions() -> list:
    if os.environ.get("HARVEST_PURE_PYTHON", "") not in ("", "0"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        _warn("Cython is not installed")
        return []
    exts = [Extension(name, [source]) for name, source in MODULES.items()]
    return cythonize(exts, compiler_directives=DIRECTIVES, include_path=[_stage_pxds()], quiet=True)


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
