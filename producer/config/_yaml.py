"""Reading the config file's YAML: PyYAML's safe loader, made strict.

- A mapping that repeats a key is refused (PyYAML keeps the last one silently), naming the key and
  both lines: two ``dataSource:`` lines mean one of them is a mistake nobody sees.
- Aliases may share blocks (``<<: *base``), but the document they expand to is bounded by
  :data:`MAX_EXPANDED_NODES`: nine nested aliases of nine ("billion laughs") expand to ~10^9
  items, and rendering one in an error message took 48 s and 2.4 GB before failing. An alias to a
  node that contains it is refused too. Both are counted while the file is composed, before any
  Python object is built.
- Errors carry a line and a column, never the offending line (it may hold dataSource's password).
- A ``rewrite`` hook (the ``${…}`` references of :mod:`producer.config._env`) sees scalar values only,
  never mapping keys, once per occurrence; a rewritten plain (unquoted, untagged) scalar is typed as YAML
  would type the new text written there (``shards: ${SHARDS}`` -> an int), a quoted one stays a string.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from harvest_outbox.producer.errors import shown

#: Where a scalar is in the document: the mapping keys (their text) and sequence indexes from the root.
YamlPath = tuple[Any, ...]
#: A value's new text, or None to keep it.
Rewrite = Callable[[YamlPath, str], "str | None"]

#: A config file is a few dozen nodes; anything near this many is not a config.
MAX_EXPANDED_NODES = 10_000
_MERGE_TAG = "tag:yaml.org,2002:merge"


class StrictLoader(yaml.SafeLoader):
    """:class:`yaml.SafeLoader` that refuses duplicate keys, alias bombs and recursive aliases."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._expanded = 0
        self._sizes: dict[int, int] = {}  # id(node) -> its expanded node count (nodes are kept alive)
        self._open: set[str] = set()  # anchors of the nodes being composed
        self._plain: set[int] = set()  # id() of plain untagged scalars: typed by the resolver from their text

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            if event.anchor in self._open:
                raise ComposerError(
                    None,
                    None,
                    f"alias *{event.anchor} refers to a node that contains it "
                    f"(a recursive structure); write the value out",
                    event.start_mark,  # type: ignore[arg-type]  # types-PyYAML adds the C parser's Mark
                )
            node = self._compose(parent, index)
            self._count(self._size(node), event)
            return node
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self._open.add(anchor)
        try:
            node = self._compose(parent, index)
        finally:
            self._open.discard(anchor)
        self._count(1, event)
        return node

    def _compose(self, parent: Node | None, index: Any) -> Node:
        # PyYAML's compose_node always returns a node (types-PyYAML says Node | None).
        return super().compose_node(parent, index)  # type: ignore[return-value]

    # types-PyYAML types the anchor as a dict: PyYAML passes its name (or None).
    def compose_scalar_node(self, anchor: str | None) -> ScalarNode:  # type: ignore[override]
        implicit = self.peek_event().implicit[0]
        node = super().compose_scalar_node(anchor)  # type: ignore[arg-type]
        if implicit:
            self._plain.add(id(node))
        return node

    def rewrite_scalars(self, root: Node, rewrite: Rewrite) -> None:
        """Replace every scalar value ``rewrite`` changes by a new node (keys stay: a node used as a key and,
        through an alias, as a value is not shared after). Each container is walked once, however many
        aliases refer to it: the walk is bounded by the composed nodes."""
        walked: set[int] = set()
        stack: list[tuple[YamlPath, Node]] = [((), root)]
        while stack:
            path, node = stack.pop()
            if id(node) in walked or isinstance(node, ScalarNode):
                continue
            walked.add(id(node))
            if isinstance(node, SequenceNode):
                for i, item in enumerate(node.value):
                    node.value[i] = self._rewritten((*path, i), item, rewrite, stack)
            elif isinstance(node, MappingNode):
                for i, (key, value) in enumerate(node.value):
                    name = key.value if isinstance(key, ScalarNode) else "?"
                    node.value[i] = (key, self._rewritten((*path, name), value, rewrite, stack))

    def _rewritten(self, path: YamlPath, node: Node, rewrite: Rewrite, stack: list[tuple[YamlPath, Node]]) -> Node:
        if not isinstance(node, ScalarNode):
            stack.append((path, node))
            return node
        text = rewrite(path, node.value)
        if text is None or text == node.value:
            return node
        plain = id(node) in self._plain
        tag = self.resolve(ScalarNode, text, (True, False)) if plain else node.tag
        new = ScalarNode(tag, text, node.start_mark, node.end_mark, node.style)
        if plain:
            self._plain.add(id(new))
        return new

    def _count(self, nodes: int, event: Any) -> None:
        self._expanded += nodes
        if self._expanded > MAX_EXPANDED_NODES:
            what = f"alias *{event.anchor}" if isinstance(event, AliasEvent) else "this node"
            raise ComposerError(
                None,
                None,
                f"{what} makes the document expand to more than "
                f"{MAX_EXPANDED_NODES:,} values (an alias bomb?); a config file needs a few dozen: "
                f"write the values out instead of nesting aliases",
                event.start_mark,
            )

    def _size(self, node: Node) -> int:
        """Nodes ``node`` stands for with every alias in it expanded (memoised: shared nodes are
        counted once per use without walking them again)."""
        known = self._sizes.get(id(node))
        if known is not None:
            return known
        if isinstance(node, SequenceNode):
            size = 1 + sum(self._size(item) for item in node.value)
        elif isinstance(node, MappingNode):
            size = 1 + sum(self._size(k) + self._size(v) for k, v in node.value)
        else:
            size = 1
        self._sizes[id(node)] = size
        return size

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE_TAG:
                    continue  # merged keys may be overridden; that is what merging is for
                key = self.construct_object(key_node)
                try:
                    seen = first_line.get(key)
                    first_line[key] = key_node.start_mark.line + 1
                except TypeError:
                    continue  # unhashable: the base class says so
                if seen is not None:
                    raise ConstructorError(
                        None,
                        None,
                        f"duplicate key {shown(key)} (first on line {seen}); keep one of them",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep)


def load_document(text: str, rewrite: Rewrite | None = None) -> Any:
    """The YAML document ``text`` as Python values (see the module doc for what is refused), its scalar
    values passed through ``rewrite`` first.

    Raises :class:`yaml.YAMLError` for a document that is not valid or is refused, and ValueError for
    a value Python will not build (an integer of more than 4,300 digits); whatever ``rewrite`` raises."""
    loader = StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if rewrite is not None:
            loader.rewrite_scalars(node, rewrite)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def plain_scalar(text: str) -> Any:
    """``text`` typed as YAML types a plain scalar (``4`` -> 4, ``true`` -> True, ``''`` -> None, else
    the text): resolved, never parsed, so ``#`` or ``: `` in it mean nothing. ValueError for a number
    Python will not build."""
    loader = StrictLoader("")
    try:
        return loader.construct_object(ScalarNode(loader.resolve(ScalarNode, text, (True, False)), text))
    finally:
        loader.dispose()


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error without the source snippet PyYAML quotes (the offending line may be the one holding
    dataSource's password): position, problem and context only."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = exc.problem or "syntax error"
        context = f" ({exc.context})" if exc.context else ""
        return f"{where}{problem}{context}"
    if isinstance(exc, yaml.reader.ReaderError):
        return f"character #x{exc.character:04x} at position {exc.position} is not allowed in YAML"
    return type(exc).__name__
