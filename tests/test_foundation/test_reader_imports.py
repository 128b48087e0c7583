"""The readers never import the relay (issue #46: "the readers import the relay package").

Invariant: no module of ``consumer/``, ``spark_reader/``, ``sequencer/`` or the shared ``harvest_outbox/*.py``
imports ``harvest_outbox.producer`` (at any depth: lazy imports count), so a reader's install and import
graph do not depend on the relay's; what both sides use lives in ``harvest_outbox/`` (``redact``,
``protobuf_schema``, ``librdkafka_properties``, ``errors``). Nor does any of them import the demo harness
(``harvest_local``, dev tooling, which imports the readers): the pipeline on a local Spark or the embedded
services is ``harvest_local/pipeline_local.py``'s, which builds on ``spark_reader/pipeline.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READERS = ("consumer", "spark_reader", "sequencer")


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def _reader_modules() -> list[Path]:
    paths = [p for folder in READERS for p in (ROOT / folder).rglob("*.py")]
    return paths + sorted((ROOT / "harvest_outbox").glob("*.py"))


def test_no_reader_or_shared_module_imports_the_relay() -> None:
    offenders = sorted(
        f"{p.relative_to(ROOT)} imports {m}"
        for p in _reader_modules()
        for m in _imports(p)
        if m == "harvest_outbox.producer" or m.startswith("harvest_outbox.producer.")
    )
    assert not offenders, offenders


def test_no_reader_or_shared_module_imports_the_demo_harness() -> None:
    offenders = sorted(
        str(p.relative_to(ROOT))
        for p in _reader_modules()
        if any(
            m == "harvest_outbox.harvest_local" or m.startswith("harvest_outbox.harvest_local.") for m in _imports(p)
        )
    )
    assert not offenders, offenders
