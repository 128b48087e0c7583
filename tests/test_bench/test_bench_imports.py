"""``bench/`` is a package run from the root (``python -m bench``, ``python -m bench.<module>``):
its modules import each other as ``bench.<module>``, never patch ``sys.path``, and import no cycle
(issue #32). Read from the sources (every import, including those inside functions)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harvest_outbox.harvest_local.workdir import project_root


def _bench() -> Path:
    root = project_root()
    if root is None:
        pytest.fail("this test reads the checkout's bench/: run it from an editable install (./dev test)")
    return root / "bench"


def _sources() -> list[Path]:
    """The bench modules git tracks (a file being written in a checkout is not yet the project's)."""
    bench = _bench()
    out = subprocess.run(["git", "-C", str(bench.parent), "ls-files", "bench/*.py"], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.fail(f"this test reads the checkout's tracked files: git ls-files failed: {out.stderr}")
    return [bench.parent / rel for rel in out.stdout.split() if "/goharvest/" not in rel]


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The bench modules ``path`` imports, wherever the import statement is."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module if node.level == 0 else f"bench.{node.module}"
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            names = [f"bench.{alias.name}" for alias in node.names]
        found |= {name for name in names if name in modules}
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (module -> modules it imports), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (found := visit(dep)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_bench_modules_import_no_cycle() -> None:
    files = _sources()
    modules = {f"bench.{p.stem}" for p in files if p.stem != "__init__"} | {"bench"}
    graph = {f"bench.{p.stem}" if p.stem != "__init__" else "bench": _imports(p, modules) for p in files}
    graph = {name: deps - {name} for name, deps in graph.items()}
    assert len(graph) > 8 and any(graph.values()), graph
    assert _cycle(graph) is None, f"bench/ import cycle: {' -> '.join(_cycle(graph) or [])}"


def test_bench_modules_do_not_patch_sys_path() -> None:
    patched = [
        f"{p.name}:{n}"
        for p in _sources()
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if "sys.path" in line
    ]
    assert not patched, f"run bench modules as python -m bench.<module> instead of patching sys.path: {patched}"


def test_a_bench_module_runs_as_a_module_from_the_root() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.bench_goharvest", "--help"],
        cwd=_bench().parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage" in proc.stdout


def test_every_benchmark_has_a_table_renderer_and_a_script() -> None:
    """`./dev bench` writes one table of every benchmark it ran: one without a renderer ended the run
    with a KeyError after all the measuring."""
    root = project_root()
    assert root is not None
    code = (
        "import json, bench.__main__ as b; print(json.dumps([{k: v[0] for k, v in b.BENCHES.items()}, sorted(b.ROWS)]))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True).stdout
    scripts, renderers = json.loads(out)
    assert sorted(scripts) == renderers, f"benchmarks {sorted(scripts)} vs table renderers {renderers}"
    missing = [f"{name}: bench/{script}" for name, script in scripts.items() if not (root / "bench" / script).is_file()]
    assert not missing, missing
