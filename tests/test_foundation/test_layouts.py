"""The outbox layouts are strategies chosen once (issue #46, item 2; docs/design.md, "Outbox layouts"):

- only producer/layouts/choice.py tells the layouts apart by name: no other module of the library
  compares a value with a layout's name (``== "cursor"``, ``!= "mark"``, ``in ("mark", …)``, a ``case
  "cursor"``), looks a layout up by its name, or asks ``isinstance`` of a layout or a layout's database;
- no layout inherits another: the classes of producer/layouts/ and producer/db/ inherit no class of the
  project but an error (each layout's relay database composes the session, fence and books of producer/db/).

No DB, no Kafka: the checks read the source and the classes.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

from harvest_outbox.producer import errors
from harvest_outbox.producer.layouts.choice import CURSOR, LAYOUTS, MARK, layout_for

ROOT = Path(__file__).resolve().parents[2]
#: The library's code that may run a layout (the readers never do).
LIBRARY = ("producer", "harvest_local")
CHOOSER = ROOT / "producer" / "layouts" / "choice.py"
#: The classes that are one layout's: its strategy and its relay database.
LAYOUT_CLASSES = {"MarkLayout", "CursorLayout", "MarkDatabase", "CursorDatabase"}


def layout_tests(source: str, filename: str = "<source>") -> list[str]:
    """``file:line: code`` for each place ``source`` tells a layout apart by its name or its class."""
    names = set(LAYOUTS)
    found = []

    def named(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant) and node.value in names:
            return True
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(named(e) for e in node.elts)

    for node in ast.walk(ast.parse(source, filename)):
        hit = False
        if isinstance(node, ast.Compare):
            hit = any(named(side) for side in (node.left, *node.comparators))
        elif isinstance(node, ast.match_case):
            hit = any(isinstance(p, ast.MatchValue) and named(p.value) for p in ast.walk(node.pattern))
        elif isinstance(node, ast.Subscript):
            hit = named(node.slice)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
        ):
            classes = node.args[1] if len(node.args) > 1 else None
            elts = classes.elts if isinstance(classes, ast.Tuple) else [classes]
            hit = any(
                isinstance(e, (ast.Name, ast.Attribute)) and ast.unparse(e).split(".")[-1] in LAYOUT_CLASSES
                for e in elts
            )
        if hit:
            found.append(f"{filename}:{getattr(node, 'lineno', '?')}: {ast.unparse(node)[:100]}")
    return found


def test_the_checker_sees_a_layout_told_apart_by_name_or_class() -> None:
    bad = (
        'if cfg.outbox_layout == "cursor":\n    pass\n'
        'x = "mark" != layout\n'
        'y = name in ("mark", "cursor")\n'
        'z = table["cursor"]\n'
        "isinstance(layout, CursorLayout)\n"
        "isinstance(db, (int, layouts.mark.database.MarkDatabase))\n"
        'match name:\n    case "mark":\n        pass\n'
    )
    assert len(layout_tests(bad)) == 7, layout_tests(bad)
    good = (
        "if layout.holds_dropped_rows:\n    pass\n"
        'policy = missing_topic_policy == "hold"\n'
        'db.run("mark", q, ())\n'
        "isinstance(mapping, DebeziumMapping)\n"
    )
    assert layout_tests(good) == []


def test_only_the_chooser_tells_the_layouts_apart() -> None:
    paths = [p for folder in LIBRARY for p in sorted((ROOT / folder).rglob("*.py")) if p != CHOOSER]
    assert ROOT / "producer" / "schema" / "ddl.py" in paths and ROOT / "producer" / "relay" / "core.py" in paths
    found = [hit for p in paths for hit in layout_tests(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))]
    assert found == [], "ask the layout chosen by producer/layouts/choice.py instead:\n" + "\n".join(found)


def test_the_chooser_maps_each_name_once_and_refuses_others() -> None:
    assert layout_for("mark") is MARK and layout_for("cursor") is CURSOR
    assert [layout.name for layout in LAYOUTS.values()] == list(LAYOUTS) == ["mark", "cursor"]
    try:
        layout_for("Cursor")
    except errors.ConfigError as exc:
        assert "outboxLayout: 'Cursor' is not a layout; use mark" in str(exc)
    else:
        raise AssertionError("layout_for accepted 'Cursor'")


def _classes(package: str) -> list[type]:
    """Every class defined in the modules of ``package`` (producer's, by dotted name)."""
    found = []
    root = importlib.import_module(f"harvest_outbox.producer.{package}")
    modules = [root] + [
        importlib.import_module(info.name)
        for info in pkgutil.walk_packages(root.__path__, root.__name__ + ".")  # type: ignore[attr-defined]
    ]
    for module in modules:
        found += [c for _n, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == module.__name__]
    return found


def test_no_layout_inherits_another() -> None:
    classes = _classes("layouts") + _classes("db")
    assert LAYOUT_CLASSES <= {c.__name__ for c in classes}
    project = "harvest_outbox.producer."
    inherited = sorted(
        f"{c.__module__}.{c.__qualname__}({base.__module__}.{base.__qualname__})"
        for c in classes
        for base in c.__mro__[1:]
        if base.__module__.startswith(project)
        and not issubclass(base, errors.HarvestError)
        and base.__name__ not in ("Protocol", "Generic")
        and not getattr(base, "_is_protocol", False)
    )
    assert inherited == [], f"compose the shared part (producer/db/) instead: {inherited}"
