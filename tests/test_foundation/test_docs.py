"""The documentation: the MkDocs site builds with ``--strict`` (no broken link, anchor or nav entry), the
generated configuration reference lists every key the config loader accepts, and the README's relative
links resolve (to files, and to headings of the pages they name).

The accepted keys are asked of the loader itself (its "unknown key; valid keys are: …" errors), not of the
generator: a key added to ``producer/config/_harvest.py`` without reaching the reference fails here. No services.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harvest_outbox.producer.config import from_mapping
from harvest_outbox.producer.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
PROBE = "__no_such_key__"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        # no --quiet: it hides the warnings --strict counts (a broken anchor passed with it)
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def _valid_keys(data: dict[str, object], at: str) -> list[str]:
    """The keys the loader accepts at ``at``, from its error for an unknown one."""
    with pytest.raises(ConfigError) as err:
        from_mapping(data, env={})
    m = re.search(rf"^{re.escape(at)}: unknown (?:top-level )?key; valid keys are: (.+)$", str(err.value))
    assert m, f"the loader's error for an unknown key at {at} changed: {err.value}"
    return [k.strip() for k in m.group(1).split(",")]


def accepted_keys() -> list[str]:
    """Every key of the YAML file, as dotted paths (``harvest.limits.rowTimeout``, a list's entries as
    ``topics[]``), asked of the loader: a mapping answers an unknown key inside it with its list of keys."""
    keys = [f"logging.{k}" for k in _valid_keys({"logging": {PROBE: 1}}, f"logging.{PROBE}")]
    pending: list[tuple[object, ...]] = [()]
    while pending:
        path = pending.pop(0)
        data: object = {PROBE: 1}
        for part in reversed(path):
            data = [data] if part == 0 else {part: data}
        shown = "".join("[0]" if p == 0 else f".{p}" for p in path)
        try:
            from_mapping({"harvest": data}, env={})
        except ConfigError as exc:
            m = re.search(rf"^harvest{re.escape(shown)}\.{PROBE}: unknown key; valid keys are: (.+)$", str(exc))
            if not m:
                continue
            for key in (k.strip() for k in m.group(1).split(",")):
                keys.append("harvest" + "".join("[]" if p == 0 else f".{p}" for p in (*path, key)))
                pending += [(*path, key), (*path, key, 0)]
        except Exception:
            continue
    assert len(keys) > 30, keys
    return keys


def _text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def test_site_builds_strict_with_every_page_in_the_nav(site: Path) -> None:
    pages = {p.relative_to(ROOT / "docs").with_suffix("") for p in (ROOT / "docs").glob("*.md")}
    built = {p.parent.relative_to(site) for p in site.glob("*/index.html")} | {Path("index")}
    assert pages <= built, f"pages not built: {sorted(map(str, pages - built))}"


def test_configuration_reference_lists_every_accepted_key_with_a_description(site: Path) -> None:
    rows = {
        cells[0]: cells
        for line in (site / "configuration" / "index.html").read_text().split("<tr>")
        if (cells := [_strip(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", line, re.S)])
    }
    keys = accepted_keys()
    assert "harvest.limits.rowTimeout" in keys and "logging.level" in keys  # the probe itself works
    missing = [k for k in keys if k not in rows]
    assert not missing, f"keys the config accepts but the reference lacks: {missing}"
    undocumented = [k for k in keys if k.startswith("harvest.") and not rows[k][-1]]
    assert not undocumented, (
        f"keys without a description: {undocumented}; add a #: comment above the key's dataclass field "
        f"(producer/config/_harvest.py, or the module of the section's config class)"
    )
    assert not set(rows) - set(keys), f"the reference lists keys the config refuses: {set(rows) - set(keys)}"


def _strip(cell: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", cell)).strip()


def test_cli_reference_shows_every_command(site: Path) -> None:
    from harvest_outbox.producer.ops.cli import build_parser

    text = _text(site / "cli" / "index.html")
    for command in _command_names(build_parser()):
        assert f"usage: {command}" in text, command
    assert "--uuid-sequencing" in text and "--skip-topic-check" in text


def _command_names(parser: argparse.ArgumentParser, prefix: str = "harvest") -> list[str]:
    names = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for entry in action._choices_actions:
                names += _command_names(action.choices[entry.dest], f"{prefix} {entry.dest}")
    return names


def _ids(page: Path) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', page.read_text()))


def test_readme_relative_links_resolve(site: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    local = [link for link in links if not re.match(r"^(https?:|mailto:)", link)]
    assert local, "the README links into the docs"
    broken = []
    for link in local:
        target, _, anchor = link.partition("#")
        path = ROOT / target if target else ROOT / "README.md"
        if not path.exists():
            broken.append(link)
            continue
        if anchor and target.startswith("docs/") and target.endswith(".md"):
            name = Path(target).relative_to("docs").with_suffix("")
            page = site / "index.html" if str(name) == "index" else site / name / "index.html"
            if anchor not in _ids(page):
                broken.append(link)
        elif anchor and target in ("", "README.md"):
            slugs = {_slug(h) for h in re.findall(r"^#+ (.+)$", readme, re.M)}
            if anchor not in slugs:
                broken.append(link)
    assert not broken, f"README links that lead nowhere: {broken}"


def _slug(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_benchmark_figures_are_the_benchmark_pages() -> None:
    """Every figure the README quotes is in docs/benchmarks.md, whose table ``./dev bench`` writes: after a
    new run, the README's figures are updated or this fails."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Benchmarks\n", 1)[1].split("\n## ", 1)[0]
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    table = page.split("<!-- BENCH:BEGIN -->", 1)[1].split("<!-- BENCH:END -->", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| what")]
    figures = [f for row in rows for f in re.findall(r"(?<![\w.])\d[\d,]*\.\d+|(?<![\w.])\d{1,3}(?:,\d{3})+", row)]
    assert len(figures) > 20, figures
    stale = [f for f in figures if f not in table]
    assert not stale, f"README benchmark figures not in docs/benchmarks.md's table (update them): {stale}"


_CODE_PATH = re.compile(
    r"(?<![\w./-])((?:producer|consumer|sequencer|spark_reader|harvest_local|bench|scripts|tests|docs)/[\w./*-]+)"
)


def test_repository_paths_the_docs_name_exist() -> None:
    """A module, test or script the README or a page names (``producer/relay/admission.py``) exists: a renamed or
    split file fails here rather than leaving the docs pointing at nothing."""
    missing = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for match in _CODE_PATH.finditer(page.read_text()):
            path = match.group(1).rstrip(".,")
            found = list(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()
            if not found:
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert not missing, f"paths named in the docs that do not exist: {missing}"


def _with_references_filled(text: str) -> str:
    """A YAML example's ``${…}`` references replaced by plausible values (the example's own defaults)."""
    text = re.sub(r"\$\{file:[^}]*\}", "host=db dbname=app", text)
    text = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)
    return re.sub(r"\$\{\w+\}", "x", text)


def test_configuration_examples_are_accepted_by_the_loader() -> None:
    """Every ``harvest:`` YAML example of the README and the pages is a configuration the relay accepts."""
    from harvest_outbox.producer.fleet.spec import fleet_from_document, is_fleet_document

    checked, refused = 0, []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S):
            data = yaml.safe_load(_with_references_filled(block))
            if not (isinstance(data, dict) and "harvest" in data):
                continue
            checked += 1
            try:
                if is_fleet_document(data):  # a fleet file: every outbox it lists, validated as a relay's
                    fleet_from_document(data, env={})
                else:
                    from_mapping(data, env={})
            except ConfigError as exc:
                refused.append(f"{page.relative_to(ROOT)}: {exc}")
    assert checked >= 5 and not refused, refused


def test_the_architecture_page_names_every_room_of_producer_and_no_other() -> None:
    """docs/architecture.md's layout table has one row per package of producer/ (issue #46: its module
    table had gone stale, naming modules that had moved and omitting whole features)."""
    import re

    page = (ROOT / "docs" / "architecture.md").read_text()
    listed = set(re.findall(r"^\| `producer/([a-z_]+)/` \|", page, flags=re.M))
    on_disk = {p.parent.name for p in (ROOT / "producer").glob("*/__init__.py")}
    assert listed == on_disk, (
        f"rooms missing from the page: {sorted(on_disk - listed)}; gone: {sorted(listed - on_disk)}"
    )
