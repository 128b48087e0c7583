"""Every sequencer test runs against both implementations: the compiled Sequencer and the
pure-Python reference (``sequencer.native``). The name ``Sequencer`` is rebound in each test
module (and in ``seq_testlib``) for the duration of the module's run per implementation.

A missing native build fails the native runs (it would otherwise go untested), unless
``HARVEST_PURE_PYTHON=1`` asks for the pure-Python implementation only."""

from __future__ import annotations

import pytest
import seq_testlib
from native_impl import native_module

from harvest_outbox import sequencer


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # A module may pin the implementations it runs under (test_seq_native compares them itself).
    impls = getattr(metafunc.module, "IMPLEMENTATIONS", ["native", "python"])
    metafunc.parametrize("sequencer_impl", impls, indirect=True, scope="module")


@pytest.fixture(scope="module", autouse=True)
def sequencer_impl(request: pytest.FixtureRequest) -> str:
    cls = (
        native_module("harvest_outbox.sequencer._native").Sequencer
        if request.param == "native"
        else sequencer.PySequencer
    )
    mp = pytest.MonkeyPatch()
    for mod in (request.module, seq_testlib):
        if hasattr(mod, "Sequencer"):
            mp.setattr(mod, "Sequencer", cls)
    try:
        yield request.param
    finally:
        mp.undo()
