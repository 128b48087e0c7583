"""Every import of the project's own packages names them ``harvest_outbox.<package>``.

Why a test: the checkout's root holds the folders ``producer/``, ``consumer/``... so wherever the
root is on ``sys.path`` (``python -m pytest`` from it, the benchmarks' ``sys.path`` insert), a
stray ``import producer`` still works there, loading a second copy of the package under another
name (two ``HarvestConfig`` classes, two loggers); installed from the wheel it fails. This finds
such lines in every tracked file, which the other tests would not.
"""

from __future__ import annotations

import ast
import re
import subprocess

import pytest

from harvest_outbox.harvest_local.workdir import project_root

OLD = ("producer", "consumer", "sequencer", "spark_reader", "harvest_local")
_CYTHON = re.compile(rf"^\s*(?:from|import|cimport)\s+(?:{'|'.join(OLD)})\b", re.M)
_DASH_M = re.compile(rf"""(?:-m\s+|["']-m["'],\s*["'])(?:{"|".join(OLD)})\b""")


def _tracked(*patterns: str) -> list[str]:
    root = project_root()
    if root is None or not (root / ".git").exists():
        pytest.fail("this test reads the checkout's files: run it from a git checkout (./dev test)")
    out = subprocess.run(["git", "-C", str(root), "ls-files", *patterns], capture_output=True, text=True, check=True)
    return [str(root / rel) for rel in out.stdout.splitlines()]


def old_imports(source: str, filename: str = "<source>") -> list[str]:
    """``file:line: statement`` for each import whose first name is an old top-level package."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        if any(name.split(".")[0] in OLD for name in names):
            found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_checker_sees_old_and_accepts_new_imports() -> None:
    bad = "import producer\nfrom consumer.record import Record\nimport sequencer.native as n\n"
    good = "from harvest_outbox import producer\nimport harvest_outbox.sequencer.native as n\nfrom . import x\n"
    assert len(old_imports(bad)) == 3
    assert old_imports(good) == []


def test_no_python_file_imports_an_old_top_level_name() -> None:
    found = [hit for path in _tracked("*.py") for hit in old_imports(open(path).read(), path)]
    assert not found, "import these as harvest_outbox.<package>:\n" + "\n".join(found)


def test_no_cython_source_or_module_invocation_uses_an_old_name() -> None:
    found = []
    for path in _tracked("*.pyx", "*.pxd"):
        found += [f"{path}: {m.group(0).strip()}" for m in _CYTHON.finditer(open(path).read())]
    for path in _tracked("*.py", "*.md", "dev", ".ci/run"):
        found += [f"{path}: {m.group(0).strip()}" for m in _DASH_M.finditer(open(path).read())]
    assert not found, "use harvest_outbox.<package>:\n" + "\n".join(found)
