"""MkDocs hook: the configuration and CLI reference pages, generated from the code at build time.

A page holding ``<!-- generated: config-reference -->`` gets a table of every key the relay's YAML
accepts; ``<!-- generated: environment-variables -->`` the table of ``HARVEST_<KEY>`` variables;
``<!-- generated: cli-reference -->`` ``harvest --help`` of every command.
Nothing here restates the code:

- the keys are the ones :mod:`producer.config` accepts (``_TOP_KEYS``; a section's keys are the ones its
  loader names when given an unknown key, so a new nested section needs nothing here);
- a key's description is the ``#:`` comment above its dataclass field (``HarvestConfig``, ``Limits``,
  ``FileConfig``): document a new key there and it appears here;
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
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

CONFIG_MARKER = "<!-- generated: config-reference -->"
CLI_MARKER = "<!-- generated: cli-reference -->"
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


def _section_keys(path_key: str) -> list[str] | None:
    """The keys a ``harvest:`` section accepts, as its loader lists them; ``None``: not a section."""
    from harvest_outbox.producer.config import HarvestConfig
    from harvest_outbox.producer.errors import ConfigError

    probe = "__no_such_key__"
    try:
        HarvestConfig.from_mapping({path_key: {probe: 1}})
    except ConfigError as exc:
        m = re.search(rf"\.{probe}: unknown key; valid keys are: (.+)$", str(exc))
        return [k.strip() for k in m.group(1).split(",")] if m else None
    return None


def _reads_duration(data: Callable[[Any], Any]) -> bool:
    """Whether a key's value is read as a duration: given ``"1h"`` (or ``"2s"``) it holds 3600 (2)."""
    from harvest_outbox.producer.errors import ConfigError

    for text, seconds in (("1h", 3600.0), ("2s", 2.0)):
        try:
            if data(text) == seconds:
                return True
        except (ConfigError, TypeError, ValueError):
            continue
    return False


def _type(annotation: str, env_kind: str | None, duration: bool) -> str:
    if duration:
        return "duration"
    if "TableMapping" in annotation:
        from harvest_outbox.producer.table_mapping import TABLE_MAPPINGS

        return " \\| ".join(f"`{k}`" for k in TABLE_MAPPINGS)
    if env_kind == "mapping" or "Mapping" in annotation or "dict" in annotation:
        return "mapping"
    for word, name in (("bool", "boolean"), ("int", "integer"), ("float", "number"), ("str", "string")):
        if re.search(rf"\b{word}\b", annotation):
            return name
    return annotation


def reference_rows() -> list[Row]:
    """Every key of the YAML file, in the loader's order: ``harvest.*``, its sections' keys, ``logging.level``."""
    from harvest_outbox.producer import config
    from harvest_outbox.producer.cli import build_parser
    from harvest_outbox.producer.config_env import LOG_LEVEL_VARIABLE, attribute_name, variable_name

    module_docs = comment_docs(config)
    field_docs = comment_docs(config.HarvestConfig)
    flags = _run_flags(build_parser())
    keys = {attribute_name(key): key for key in config._TOP_KEYS}
    rows: list[Row] = []
    for key in config._TOP_KEYS:
        attr = attribute_name(key)
        fields = {f.name: f for f in dataclasses.fields(config.HarvestConfig)}
        env_kind = config._ENV_KINDS.get(key)
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
                f"mapping ([below](#harvest{key.lower()}))" if sub else _type(annotation, env_kind, duration),
                "see below" if sub else _fmt_default(default, duration) if attr in fields else "unset",
                variable_name(key),
                flags.get(attr, ""),
                _render_rst(doc, config, module_docs),
            )
        )
    for key in config._TOP_KEYS:
        sub = _section_keys(key)
        if not sub:
            continue
        section_cls = type(_field_default(config.HarvestConfig, attribute_name(key)))
        sub_docs = comment_docs(section_cls) if dataclasses.is_dataclass(section_cls) else {}
        fields = (
            {f.name: f for f in dataclasses.fields(section_cls)}
            if sub_docs or dataclasses.is_dataclass(section_cls)
            else {}
        )
        for name in sub:
            attr = attribute_name(name)

            def nested(value: Any, key: str = key, name: str = name, attr: str = attr) -> Any:
                section = getattr(config.HarvestConfig.from_mapping({key: {name: value}}), attribute_name(key))
                return getattr(section, attr)

            annotation = str(fields[attr].type) if attr in fields else ""
            duration = _reads_duration(nested)
            rows.append(
                Row(
                    f"harvest.{key}.{name}",
                    _type(annotation, None, duration),
                    _fmt_default(_field_default(section_cls, attr), duration) if attr in fields else "unset",
                    "",
                    "",
                    _render_rst(sub_docs.get(attr, ""), config, module_docs),
                )
            )
    level_doc = comment_docs(config.FileConfig).get("log_level", "")
    rows.append(
        Row(
            "logging.level",
            "string",
            _fmt_default(_field_default(config.FileConfig, "log_level"), False),
            LOG_LEVEL_VARIABLE,
            flags.get("log_level", ""),
            _render_rst(level_doc, config, module_docs),
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
    from harvest_outbox.producer import config

    rows = reference_rows()
    top = [r for r in rows if r.path.count(".") == 1 and r.path.startswith("harvest.")]
    parts = [
        "## `harvest`",
        "",
        _table(top, ("path", "type", "default", "variable", "flag", "description")),
    ]
    sections = sorted({r.path.rsplit(".", 1)[0] for r in rows if r.path.count(".") == 2})
    for section in sections:
        key = section.split(".")[1]
        parts += [
            "",
            f"## `{section}`",
            "",
            f"Set as a mapping under `{section}`"
            + (
                f", or as a YAML flow mapping in `HARVEST_{_upper(key)}` (merged over the file's)."
                if config._ENV_KINDS.get(key) == "mapping"
                else "."
            ),
            "",
            _table([r for r in rows if r.path.startswith(section + ".")], ("path", "type", "default", "description")),
        ]
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
    from harvest_outbox.producer.config_env import upper_snake

    return upper_snake(key)


def environment_markdown() -> str:
    """The ``HARVEST_<KEY>`` variables by how their text is read (``config._ENV_KINDS``)."""
    from harvest_outbox.producer import config
    from harvest_outbox.producer.config_env import LOG_LEVEL_VARIABLE, MAPPING, SCALAR, TEXT, variable_name

    how = {
        TEXT: "as it is (no YAML, no `${…}`: a DSN's `#`, `:` or `$` is safe)",
        SCALAR: "as YAML reads a plain value: `4`, `true`/`false`",
        MAPPING: "a YAML flow mapping, `HARVEST_BASE_KAFKA_CONFIG='{bootstrap.servers: kafka:9092, client.id: "
        "relay}'`, merged over the file's mapping: its keys replace the file's, the file's other keys stay",
    }
    out = ["| variable | key | how the value is read |", "|---|---|---|"]
    for kind in (TEXT, SCALAR, MAPPING):
        keys = [k for k in config._TOP_KEYS if config._ENV_KINDS.get(k, TEXT) == kind]
        out.append(
            f"| {', '.join(f'`{variable_name(k)}`' for k in keys)} | {', '.join(f'`{k}`' for k in keys)} | {how[kind]} |"
        )
    out.append(f"| `{LOG_LEVEL_VARIABLE}` | `logging.level` | as it is |")
    return "\n".join(out)


def cli_markdown() -> str:
    from harvest_outbox.producer.cli import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: fix the width for a stable page
    try:
        parser = build_parser()
        parts = ["### `harvest`", "", "```text", parser.format_help().rstrip(), "```"]
        for name, sub in _commands(parser):
            parts += ["", f"### `{name}`", "", "```text", sub.format_help().rstrip(), "```"]
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    return "\n".join(parts)


def _commands(parser: argparse.ArgumentParser, prefix: str = "harvest") -> list[tuple[str, argparse.ArgumentParser]]:
    out: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for entry in action._choices_actions:  # one per command, aliases left out
                name, sub = entry.dest, action.choices[entry.dest]
                out.append((f"{prefix} {name}", sub))
                out += _commands(sub, f"{prefix} {name}")
    return out


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """MkDocs event: fill the markers of the reference pages."""
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_markdown())
    if ENV_MARKER in markdown:
        markdown = markdown.replace(ENV_MARKER, environment_markdown())
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_markdown())
    return markdown
