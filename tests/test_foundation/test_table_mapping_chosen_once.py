"""The table mapping is a strategy chosen once (issue #46; docs/design.md "Table mappings"):

- only the chooser, :func:`producer.mapping.table.table_mapping`, tells the mappings apart: no other module
  of the library tests ``isinstance(…, DebeziumMapping)``, compares a mapping's ``kind`` (its name) or
  compares a mapping with :data:`GOHARVEST`; they call the mapping they are given;
- each mapping implements the :class:`~producer.mapping.protocol.TableMapping` Protocol on its own: no
  inheritance, between them or from a shared base;
- a mapping's dead letter keeps the row exactly when its row is not its record.

Reads the source (AST), imports nothing of it but the mappings; no database.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harvest_outbox.producer.mapping.debezium import DebeziumMapping
from harvest_outbox.producer.mapping.goharvest import GOHARVEST, GoharvestMapping
from harvest_outbox.producer.mapping.protocol import TableMapping
from harvest_outbox.producer.mapping.table import TABLE_MAPPINGS, table_mapping

ROOT = Path(__file__).resolve().parents[2]
#: The library's folders (tests and benchmarks may name a mapping: they choose one, as a config does).
LIBRARY = ("producer", "consumer", "spark_reader", "sequencer", "harvest_local", "harvest_outbox")
CHOOSER = ROOT / "producer" / "mapping" / "table.py"
#: The mapping classes and singletons, by the names code would test them under.
MAPPING_NAMES = {"DebeziumMapping", "GoharvestMapping", "GOHARVEST"}


def _names(node: ast.AST) -> set[str]:
    """Every name and attribute name in ``node`` (``names.mapping.kind`` -> names, mapping, kind)."""
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
    return found


def _is_mapping_name(node: ast.AST) -> bool:
    """``mapping.kind``, ``self.table_mapping.kind``: the name of a mapping."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "kind"
        and any("mapping" in name.lower() for name in _names(node.value))
    )


def variant_tests(source: str, filename: str = "<source>") -> list[str]:
    """``file:line: code`` for each place ``source`` asks which mapping it holds."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        hit = False
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
        ):
            hit = len(node.args) == 2 and bool(_names(node.args[1]) & MAPPING_NAMES)
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            hit = any(_is_mapping_name(o) for o in operands) or any(
                _names(o) & MAPPING_NAMES for o in operands if not isinstance(o, ast.Call)
            )
            # a mapping's name compared with anything (``kind in (None, "goharvest")``)
            hit = hit or any(
                isinstance(c, ast.Constant) and c.value in TABLE_MAPPINGS for o in operands for c in ast.walk(o)
            )
        elif isinstance(node, ast.MatchClass):
            hit = bool(_names(node.cls) & MAPPING_NAMES)
        if hit:
            found.append(f"{filename}:{getattr(node, 'lineno', '?')}: {ast.unparse(node)}")
    return found


def test_the_checker_sees_each_way_of_asking_which_mapping() -> None:
    asks = [
        "if isinstance(names.mapping, DebeziumMapping): pass",
        "x = isinstance(m, (GoharvestMapping, str))",
        "ok = self.table_mapping.kind != 'goharvest'",
        "if names.mapping.kind == 'debezium': pass",
        "s = '_id_seq' if mapping is GOHARVEST else '_harvest_seq'",
        "y = cfg.table_mapping in ('debezium',)",
        "match m:\n    case DebeziumMapping(): pass",
    ]
    for code in asks:
        assert len(variant_tests(code)) == 1, code
    calls = (
        "text = f'{names.mapping.kind} table'\n"
        "if names.mapping.adopts_existing_table: pass\n"
        "m = table_mapping('debezium', options)\n"
        "suffix = mapping.sequence_suffix\n"
        "if layout == 'cursor': pass\n"
        "same = x.kind == 'hold'\n"
        "ok = policy in ('skip', 'haltKey')\n"
    )
    assert variant_tests(calls) == []


def test_only_the_chooser_tells_the_mappings_apart() -> None:
    found = [
        hit
        for folder in LIBRARY
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != CHOOSER
        for hit in variant_tests(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]
    assert found == [], (
        "call the table mapping (producer/mapping/protocol.py) instead of asking which one it is; only "
        "producer/mapping/table.py chooses:\n" + "\n".join(found)
    )
    assert variant_tests(CHOOSER.read_text(encoding="utf-8")), "the chooser moved: point CHOOSER at it"


@pytest.mark.parametrize("mapping", [GOHARVEST, table_mapping("debezium")], ids=["goharvest", "debezium"])
def test_each_mapping_implements_the_protocol_on_its_own(mapping: TableMapping) -> None:
    assert isinstance(mapping, TableMapping)
    assert type(mapping).__mro__ == (type(mapping), object), "share code through functions, not a base class"
    # a dead letter keeps the row (source_row) exactly when the row is not the record
    assert (mapping.source_row("o") is None) == mapping.row_is_record
    assert mapping.kind in TABLE_MAPPINGS


def test_the_mappings_are_the_chooser_s_only() -> None:
    assert table_mapping(None) is GOHARVEST and isinstance(GOHARVEST, GoharvestMapping)
    assert isinstance(table_mapping("debezium", {"route.by.field": "kind"}), DebeziumMapping)
    assert {table_mapping(kind).kind for kind in TABLE_MAPPINGS} == set(TABLE_MAPPINGS)
