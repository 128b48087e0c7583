"""scripts/typecheck.py (run by ``./dev lint``) hands mypy every module of the package under its import
name: a module left out, or named after its folder (``producer.db``), would not be type-checked as the
code that imports it sees it."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _typecheck() -> ModuleType:
    if not (ROOT / "scripts" / "typecheck.py").is_file():
        pytest.fail("this test reads the checkout's files: run it from a git checkout (./dev test)")
    spec = importlib.util.spec_from_file_location("typecheck", ROOT / "scripts" / "typecheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_module_of_the_package_is_checked_under_its_import_name() -> None:
    found = {s.path: s.module for s in _typecheck().sources(ROOT)}
    folders = {"harvest_outbox", "producer", "sequencer", "consumer", "spark_reader", "harvest_local"}
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    modules = {p for p in tracked.stdout.split() if p.split("/")[0] in folders}
    assert modules and not modules - set(found), "not type-checked: " + ", ".join(sorted(modules - set(found)))
    for path, name in found.items():
        folder, *inner = Path(path).with_suffix("").parts
        package = "harvest_outbox" if folder == "harvest_outbox" else f"harvest_outbox.{folder}"
        assert name == ".".join((package, *(inner[:-1] if inner[-1:] == ["__init__"] else inner))), (path, name)
    assert found["producer/relay/core.py"] == "harvest_outbox.producer.relay.core"
    assert found["sequencer/__init__.py"] == "harvest_outbox.sequencer"
