"""Package names that import their module on first use (PEP 562), the one way this project does it.

A package lists ``{name: submodule}`` and gets the module-level ``__getattr__`` and ``__dir__`` that
import ``<package>.<submodule>`` the first time the name is read, keep the value in the package's
namespace (later reads are plain attribute reads) and list the names before they are loaded. Used
where a package's import must stay light: the relay's start (``harvest_outbox.producer``), the
elections (no confluent-kafka or psycopg until one is used), and the Spark reader (a streaming
query's driver-side Python process imports only the stream's modules).

Invariant (``tests/test_foundation/test_lazy.py``): a name reads the same object as importing it
from its submodule; an unknown name raises AttributeError naming the package.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def exports(
    package: str, module_of: Mapping[str, str], listed: Iterable[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` (its ``__name__``): ``module_of`` maps each lazily
    loaded name to its submodule (relative to the package); ``listed``: more names ``dir()`` shows."""
    extra = tuple(listed)

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *module_of, *extra})

    return __getattr__, __dir__
