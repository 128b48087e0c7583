"""Type-check the ``harvest_outbox`` package under the names it is imported by (``./dev lint`` runs it).

``harvest_outbox.producer`` is the ``producer/`` folder, ``harvest_outbox.sequencer`` is ``sequencer/``...
(pyproject.toml's ``[tool.setuptools.package-dir]``); the editable install maps the names when Python
imports them (setuptools' import finder), which mypy cannot see. ``mypy producer/`` would name the
modules ``producer.*`` and fail to resolve their own ``import harvest_outbox.producer...``; ``mypy -p
harvest_outbox`` finds only ``harvest_outbox/``. So this hands mypy every module of the package with its
import name, read from the same ``package-dir`` table (one owner of the mapping), through mypy's build
API. Everything else — flags, per-module strictness, the cache — is mypy's, from ``[tool.mypy]``.

Usage: ``python scripts/typecheck.py [mypy flags]``; exit status 0 when clean, 1 on type errors, 2 when
mypy could not run.
"""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # mypy itself depends on tomli before 3.11
    import tomli as tomllib

from mypy import build
from mypy.errors import CompileError
from mypy.fscache import FileSystemCache
from mypy.main import process_options
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parent.parent


def sources(root: Path = ROOT) -> list[BuildSource]:
    """Every module of every mapped package, as ``BuildSource(path, import name)``. Sub-folders count
    only as packages (with an ``__init__.py``): data folders (``harvest_local/maven``) hold no modules."""
    package_dir: dict[str, str] = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    found: list[BuildSource] = []
    for package, folder in package_dir.items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if not all((base.joinpath(*parts[:i]) / "__init__.py").is_file() for i in range(len(parts))):
                continue
            name = ".".join((package, *parts[:-1], *([] if parts[-1] == "__init__" else [parts[-1]])))
            found.append(BuildSource(str(path.relative_to(root)), name))
    return found


def main(argv: list[str]) -> int:
    t0 = time.perf_counter()
    fscache = FileSystemCache()
    # The config file ([tool.mypy] in pyproject.toml) and any flags given; the targets are ours. mypy
    # only warns about a bad config entry (a module pattern it cannot match is skipped, so its modules
    # would silently lose their strictness): here that fails the check.
    complaints = io.StringIO()
    _, options = process_options(argv, stderr=complaints, require_targets=False, fscache=fscache)
    if complaints.getvalue():
        print(complaints.getvalue().rstrip(), file=sys.stderr)
        print("mypy: fix the configuration above ([tool.mypy] in pyproject.toml)", file=sys.stderr)
        return 2
    modules = sources()
    try:
        result = build.build(modules, options, fscache=fscache, stdout=sys.stdout, stderr=sys.stderr)
    except CompileError as exc:  # a blocking error (syntax, a duplicate module): mypy stops at once
        print("\n".join(exc.messages), file=sys.stderr)
        return 2
    for line in result.errors:
        print(line)
    errors = sum(": error:" in line for line in result.errors)
    took = time.perf_counter() - t0
    if errors:
        print(f"mypy: {errors} error(s) in {len(modules)} modules ({took:.1f} s)", file=sys.stderr)
        return 1
    print(f"mypy: no issues in {len(modules)} modules ({took:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
