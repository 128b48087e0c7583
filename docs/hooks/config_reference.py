"""MkDocs hook: the configuration reference, generated from the code at build time (the command line's:
``cli_reference.py``).

A page holding ``<!-- generated: config-reference -->`` gets a table of every key the relay's YAML
accepts; ``<!-- generated: environment-variables -->`` the table of ``HARVEST_<KEY>`` variables.
Nothing here restates the code:

- the keys are the ones :mod:`producer.config._harvest` accepts (``TOP_KEYS``; the keys of a section, of a
  section's sections and of a list's entries are the ones the loader names when given an unknown key
  there, so a new nested section needs nothing here);
- a key's description is the ``#:`` comment above its dataclass field (``HarvestConfig``, ``Limits``,
  ``FileConfig``: each read with its own module's ``#:`` comments and names): document a new key there
  and it appears here;
- defaults are the dataclass defaults, types the field annotations (a value read as a duration is
  found by reading one), variables ``config_env.variable_name``, flags ``cli.build_parser``.

Invariant: every key :func:`harvest_outbox.producer.config.from_mapping` accepts is a row, with a
description (``tests/test_foundation/test_docs.py`` checks both against the loader's own errors).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

CONFIG_MARKER = "<!-- generated: config-reference -->"
ENV_MARKER = "<!-- generated: environment-variables -->"
DOCS = Path(__file__).resolve().parents[1]


class Row(NamedTuple):
    path: str  # harvest.limits.rowTimeout
    type: str
    default: str
    variable: str  # HARVEST_… or ""
    flag: str  # --… or ""
    description: str


# -- reading the code -------------------------------------------------------------------------------


def comment_docs(obj: Any) -> dict[str, str]:
    """``#:`` comments of a class's fields (or a module's names): name -> text, lines joined."""
    source = inspect.getsource(obj)
    lines = source.splitlines()
    tree = ast.parse(source)
    body = tree.body[0].body if inspect.isclass(obj) else tree.body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for stmt in body:
        targets = (
            [stmt.target] if isinstance(stmt, ast.AnnAssign) else stmt.targets if isinstance(stmt, ast.Assign) else []
        )
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if not names:
            continue
        above: list[str] = []
        i = stmt.lineno - 2
        while i >= 0 and lines[i].strip().startswith("#:"):
            above.insert(0, lines[i].strip()[2:].strip())
            i -= 1
        inline = lines[stmt.lineno - 1].split("#:", 1)[1].strip() if "#:" in lines[stmt.lineno - 1] else ""
        text = " ".join([*above, inline]).strip()
        if text:
            for name in names:
                docs[name] = text
    return docs


def _render_rst(text: str, module: Any, module_docs: Mapping[str, str]) -> str:
    """The comments' reST roles and literals as Markdown; ``docs/x.md`` as links to the page."""

    def see_data(m: re.Match[str]) -> str:  # "(see :data:`X`)": what X's own comment says
        doc = module_docs.get(m.group(1))
        return f"({doc.rstrip('.')})" if doc else m.group(0)

    def data(m: re.Match[str]) -> str:
        value = getattr(module, m.group(1), None)
        if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
            return " / ".join(f"``{v}``" for v in value)
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{value:,}"
        return f"``{m.group(1)}``"

    text = re.sub(r"\(see :data:`~?([\w.]+)`\)", see_data, text)
    text = re.sub(r":data:`~?([\w.]+)`", data, text)
    text = re.sub(r":(?:mod|class|func|meth|attr):`~?([\w.]+)`", lambda m: f"``{m.group(1).split('.')[-1]}``", text)
    text = re.sub(r"``(.+?)``", r"`\1`", text)

    def page(m: re.Match[str]) -> str:
        name = m.group(1)
        return f"[{name}]({name})" if (DOCS / name).is_file() else m.group(0)

    text = re.sub(r"(?<!\]\()(?<![\w/])docs/([\w-]+\.md)", page, text)  # not inside a link already
    return text.replace("|", "\\|")


def _fmt_default(value: Any, duration: bool) -> str:
    from harvest_outbox.producer.config import format_duration

    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if duration and isinstance(value, (int, float)):
        return f"`{format_duration(value)}`"
    if isinstance(value, (list, tuple)):
        return "`[]`" if not value else f"`{list(value)}`"
    if isinstance(value, Mapping):
        return "`{}`" if not value else f"`{dict(value)}`"
    if isinstance(value, str):
        return f'`"{value}"`' if value == "" or " " in value else f"`{value}`"
    if isinstance(value, (int, float)):
        return f"`{value}`"
    kind = getattr(value, "kind", None)  # a TableMapping
    return f"`{kind}`" if kind else f"`{value!r}`"


def _field_default(cls: type, attr: str) -> Any:
    for f in dataclasses.fields(cls):
        if f.name == attr:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    return None


Path_ = tuple[str | int, ...]  # YAML keys below ``harvest:``; 0 stands for "an entry of this list"
PROBE = "__no_such_key__"


def _nest(path: Path_, leaf: Any) -> Any:
    """``harvest:`` data with ``leaf`` at ``path``: ``("a", "b", 0)`` -> ``{"a": {"b": [leaf]}}``."""
    for part in reversed(path):
        leaf = [leaf] if isinstance(part, int) else {part: leaf}
    return leaf


def _dotted(path: Path_, entry: str = "[]") -> str:
    """``("a", "b", 0, "c")`` -> ``a.b[].c`` (the loader's errors say ``[0]``: ``entry="[0]"``)."""
    return "".join(entry if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def _section_keys(path: Path_ | str) -> list[str] | None:
    """The keys a mapping at ``path`` accepts, as its loader lists them for an unknown one; ``None``: not one."""
    from harvest_outbox.producer.config import HarvestConfig
    from harvest_outbox.producer.errors import ConfigError

    path = (path,) if isinstance(path, str) else path
    try:
        HarvestConfig.from_mapping(_nest(path, {PROBE: 1}))
    except ConfigError as exc:
        where = re.escape(f"harvest.{_dotted(path, '[0]')}.{PROBE}")
        m = re.search(rf"^{where}: unknown key; valid keys are: (.+)$", str(exc))
        return [k.strip() for k in m.group(1).split(",")] if m else None
    except Exception:  # a loader that fails on odd input otherwise (a bug, but not the docs' to report)
        return None
    return None


def _dataclass_in(annotation: str, owner: type, default: Any) -> type | None:
    """The dataclass a field holds: its default's type, or the first dataclass its annotation names."""
    if dataclasses.is_dataclass(default) and not isinstance(default, type):
        return type(default)
    namespace = vars(inspect.getmodule(owner))
    for name in re.findall(r"[A-Za-z_]\w*", annotation):
        candidate = namespace.get(name)
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return candidate
    return None


def _nested_rows(path: Path_, cls: type | None, module: Any, module_docs: Mapping[str, str]) -> list[Row]:
    """Rows of the keys of the mapping at ``path`` (``cls``: the dataclass it becomes), then of their sections."""
    from harvest_outbox.producer.config import HarvestConfig
    from harvest_outbox.producer.config._env import attribute_name

    keys = _section_keys(path) or []
    fields = {f.name: f for f in dataclasses.fields(cls)} if cls else {}
    docs = comment_docs(cls) if cls else {}
    if cls is not None and inspect.getmodule(cls) is not module:  # :data:`X` refers to the class's module
        module = inspect.getmodule(cls)
        module_docs = comment_docs(module)
    rows: list[Row] = []
    later: list[Row] = []
    for name in keys:
        attr, sub = attribute_name(name), (*path, name)
        annotation = str(fields[attr].type) if attr in fields else ""
        default = _field_default(cls, attr) if cls and attr in fields else None
        child = _dataclass_in(annotation, cls, default) if cls and attr in fields else None
        listed = _section_keys((*sub, 0)) is not None
        if _section_keys(sub) is not None or listed:
            entry = (*sub, 0) if listed else sub
            anchor = _anchor(f"harvest.{_dotted(entry)}")
            kind = "list of mappings" if listed else "mapping"
            rows.append(
                Row(
                    f"harvest.{_dotted(sub)}",
                    f"{kind} ([below](#{anchor}))",
                    _fmt_default(default, False) if listed else "see below",
                    "",
                    "",
                    _render_rst(docs.get(attr, ""), module, module_docs),
                )
            )
            later += _nested_rows(entry, child, module, module_docs)
            continue

        def read(value: Any, sub: Path_ = sub) -> Any:
            obj: Any = HarvestConfig.from_mapping(_nest(sub, value))
            for part in sub:
                obj = obj[part] if isinstance(part, int) else getattr(obj, attribute_name(part))
            return obj

        duration = "float" in annotation and _reads_duration(read)
        rows.append(
            Row(
                f"harvest.{_dotted(sub)}",
                _type(annotation, None, duration),
                _fmt_default(default, duration) if cls and attr in fields else "unset",
                "",
                "",
                _render_rst(docs.get(attr, ""), module, module_docs),
            )
        )
    return rows + later


def _anchor(heading: str) -> str:
    from markdown.extensions.toc import slugify

    return str(slugify(heading, "-"))


def _reads_duration(data: Callable[[Any], Any]) -> bool:
    """Whether a key's value is read as a duration: given ``"1h"`` (or ``"2s"``) it holds 3600 (2)."""
    from harvest_outbox.producer.errors import ConfigError

    for text, seconds in (("1h", 3600.0), ("2s", 2.0)):
        try:
            if data(text) == seconds:
                return True
        except (ConfigError, TypeError, ValueError, AttributeError, IndexError, KeyError):
            continue
    return False


def _type(annotation: str, env_kind: str | None, duration: bool) -> str:
    if duration:
        return "duration"
    if "TableMapping" in annotation:
        from harvest_outbox.producer.mapping.table import TABLE_MAPPINGS

        return " \\| ".join(f"`{k}`" for k in TABLE_MAPPINGS)
    if env_kind == "mapping" or "Mapping" in annotation or "dict" in annotation:
        return "mapping"
    for word, name in (("bool", "boolean"), ("int", "integer"), ("float", "number"), ("str", "string")):
        if re.search(rf"\b{word}\b", annotation):
            return name
    return annotation


def reference_rows() -> list[Row]:
    """Every key of the YAML file, in the loader's order: ``harvest.*``, its sections' keys, ``logging.level``."""
    from harvest_outbox.producer.config import _file as config_file
    from harvest_outbox.producer.config import _harvest as config
    from harvest_outbox.producer.config._env import LOG_LEVEL_VARIABLE, attribute_name, variable_name
    from harvest_outbox.producer.ops.cli import build_parser

    module_docs = comment_docs(config)
    field_docs = comment_docs(config.HarvestConfig)
    flags = _run_flags(build_parser())
    keys = {attribute_name(key): key for key in config.TOP_KEYS}
    rows: list[Row] = []
    for key in config.TOP_KEYS:
        attr = attribute_name(key)
        fields = {f.name: f for f in dataclasses.fields(config.HarvestConfig)}
        env_kind = config.ENV_KINDS.get(key)
        doc = field_docs.get(attr, "")
        if attr not in fields:  # a key without a field of its own (eventRouter): the field that reads it
            owner = next((name for name, text in field_docs.items() if f"``{key}" in text), None)
            doc = f"Read with ``{keys.get(owner, owner)}``: {field_docs[owner]}" if owner else ""
        annotation = str(fields[attr].type) if attr in fields else ""

        def top(value: Any, key: str = key, attr: str = attr) -> Any:
            return getattr(config.HarvestConfig.from_mapping({key: value}), attr)

        duration = attr in fields and "float" in annotation and _reads_duration(top)
        sub = _section_keys(key)
        default = _field_default(config.HarvestConfig, attr) if attr in fields else None
        rows.append(
            Row(
                f"harvest.{key}",
                f"mapping ([below](#{_anchor(f'harvest.{key}')}))" if sub else _type(annotation, env_kind, duration),
                "see below" if sub else _fmt_default(default, duration) if attr in fields else "unset",
                variable_name(key),
                flags.get(attr, ""),
                _render_rst(doc, config, module_docs),
            )
        )
    for key in config.TOP_KEYS:
        if _section_keys(key) is not None:
            default = _field_default(config.HarvestConfig, attribute_name(key))
            section_cls = type(default) if dataclasses.is_dataclass(default) else None
            rows += _nested_rows((key,), section_cls, config, module_docs)
    level_doc = comment_docs(config_file.FileConfig).get("log_level", "")
    rows.append(
        Row(
            "logging.level",
            "string",
            _fmt_default(_field_default(config_file.FileConfig, "log_level"), False),
            LOG_LEVEL_VARIABLE,
            flags.get("log_level", ""),
            _render_rst(level_doc, config_file, comment_docs(config_file)),
        )
    )
    return rows


def _run_flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """``harvest run``'s flags by the config attribute they override (their ``dest``)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    run = sub.choices["run"]
    out = {a.dest: a.option_strings[-1] for a in run._actions if a.option_strings and a.dest != "help"}
    if "bootstrap_servers" in out:  # overrides baseKafkaConfig's bootstrap.servers
        out["base_kafka_config"] = f"{out.pop('bootstrap_servers')} (`bootstrap.servers`)"
    return {k: f"`{v}`" if "(" not in v else f"`{v.split(' ')[0]}` {v.split(' ', 1)[1]}" for k, v in out.items()}


# -- rendering -------------------------------------------------------------------------------------


def _table(rows: list[Row], columns: tuple[str, ...]) -> str:
    heads = {"path": "key", "type": "type", "default": "default", "variable": "variable", "flag": "flag"}
    out = [
        "| " + " | ".join(heads.get(c, c) for c in columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for row in rows:
        cells = []
        for c in columns:
            value = getattr(row, c)
            cells.append(f"`{value}`" if c in ("path", "variable") and value else value or "")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def config_markdown() -> str:
    from harvest_outbox.producer.config import _harvest as config

    rows = reference_rows()
    top = [r for r in rows if r.path.count(".") == 1 and r.path.startswith("harvest.")]
    parts = [
        "## `harvest`",
        "",
        _table(top, ("path", "type", "default", "variable", "flag", "description")),
    ]
    sections = list(dict.fromkeys(r.path.rsplit(".", 1)[0] for r in rows if r.path.count(".") >= 2))
    for section in sections:
        key = section.split(".")[1]
        top_level = section.count(".") == 1
        where = (
            f"Each entry of the list `{section[:-2]}` is a mapping of these keys."
            if section.endswith("[]")
            else f"Set as a mapping under `{section}`"
            + (
                f", or as a YAML flow mapping in `HARVEST_{_upper(key)}` (merged over the file's)."
                if top_level and config.ENV_KINDS.get(key) == "mapping"
                else "."
            )
        )
        members = [r for r in rows if r.path.rsplit(".", 1)[0] == section]
        parts += ["", f"## `{section}`", "", where, "", _table(members, ("path", "type", "default", "description"))]
    parts += [
        "",
        "## `logging`",
        "",
        _table([r for r in rows if r.path.startswith("logging.")], ("path", "type", "default", "variable", "flag")),
        "",
        next(r.description for r in rows if r.path == "logging.level"),
    ]
    return "\n".join(parts)


def _upper(key: str) -> str:
    from harvest_outbox.producer.config._env import upper_snake

    return upper_snake(key)


def environment_markdown() -> str:
    """The ``HARVEST_<KEY>`` variables by how their text is read (``config_harvest.ENV_KINDS``)."""
    from harvest_outbox.producer.config import _harvest as config
    from harvest_outbox.producer.config._env import LOG_LEVEL_VARIABLE, MAPPING, SCALAR, TEXT, variable_name

    how = {
        TEXT: "as it is (no YAML, no `${…}`: a DSN's `#`, `:` or `$` is safe)",
        SCALAR: "as YAML reads a plain value: `4`, `true`/`false`",
        MAPPING: "a YAML flow mapping, `HARVEST_BASE_KAFKA_CONFIG='{bootstrap.servers: kafka:9092, client.id: "
        "relay}'`, merged over the file's mapping: its keys replace the file's, the file's other keys stay",
    }
    out = ["| variable | key | how the value is read |", "|---|---|---|"]
    for kind in (TEXT, SCALAR, MAPPING):
        keys = [k for k in config.TOP_KEYS if config.ENV_KINDS.get(k, TEXT) == kind]
        out.append(
            f"| {', '.join(f'`{variable_name(k)}`' for k in keys)} | {', '.join(f'`{k}`' for k in keys)} | {how[kind]} |"
        )
    out.append(f"| `{LOG_LEVEL_VARIABLE}` | `logging.level` | as it is |")
    return "\n".join(out)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """MkDocs event: fill the configuration reference's markers."""
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_markdown())
    if ENV_MARKER in markdown:
        markdown = markdown.replace(ENV_MARKER, environment_markdown())
    return markdown
