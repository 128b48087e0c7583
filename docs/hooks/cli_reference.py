"""MkDocs hook: the command-line reference, ``harvest --help`` of every command, generated from
:func:`harvest_outbox.producer.ops.cli.build_parser` at build time (a page holding
``<!-- generated: cli-reference -->``). A new command or flag appears without a docs change."""

from __future__ import annotations

import argparse
import os
from typing import Any

CLI_MARKER = "<!-- generated: cli-reference -->"


def cli_markdown() -> str:
    from harvest_outbox.producer.ops.cli import build_parser

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
    """MkDocs event: fill the command-line reference's marker."""
    return markdown.replace(CLI_MARKER, cli_markdown()) if CLI_MARKER in markdown else markdown
