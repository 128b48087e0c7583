"""harvest_outbox._lazy: the packages whose names load their modules on first use (its invariants)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PACKAGES = {
    "harvest_outbox.producer": "_MODULE_OF",
    "harvest_outbox.producer.election": "_MODULE_OF",
    "harvest_outbox.spark_reader": "_WHERE",
}


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_a_lazy_name_is_its_modules_object_and_an_unknown_one_is_refused(package: str) -> None:
    pkg = importlib.import_module(package)
    module_of = getattr(pkg, PACKAGES[package])
    assert module_of and set(module_of) <= set(pkg.__all__)
    for name, module in module_of.items():
        assert name in dir(pkg)
        assert getattr(pkg, name) is getattr(importlib.import_module(f"{package}.{module}"), name), name
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'no_such_name'"):
        pkg.no_such_name  # noqa: B018


def test_a_streams_driver_side_imports_no_batch_reader() -> None:
    """Spark starts a new Python process for a stream's driver side at each query start; it unpickles the
    stream's reader, which imports its module only, not the batch reader's."""
    code = (
        "import sys, harvest_outbox.spark_reader.stream_source\n"
        "print(sorted(m for m in sys.modules if m.startswith('harvest_outbox.spark_reader.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    loaded = eval(out.stdout)  # a printed list of names
    assert "harvest_outbox.spark_reader.stream_source" in loaded
    assert "harvest_outbox.spark_reader.batch" not in loaded and "harvest_outbox.spark_reader.stream" not in loaded


def test_the_stash_name_is_the_stashing_package_in_any_import_order() -> None:
    """``harvest_outbox.producer.stash`` is the subpackage however the names were loaded (the one-call
    function of that name was shadowed by it once the subpackage was imported, so the name gave one or
    the other by import order)."""
    code = (
        "from harvest_outbox.producer import stash as first\n"
        "from harvest_outbox.producer import Stasher, stash_many\n"
        "from harvest_outbox.producer import stash as second\n"
        "import harvest_outbox.producer.stash.stasher as stasher\n"
        "print(first is second, type(first).__name__, first.__name__, callable(stasher.stash))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["True", "module", "harvest_outbox.producer.stash", "True"]
