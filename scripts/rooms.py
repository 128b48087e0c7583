"""Move ``producer/``'s flat modules into subpackages ("rooms") at the real seams (issue #46, item 1).

Run from the repository root: ``python scripts/rooms.py`` (``--moves-only`` stops after step 1).
The script is the record of the move and is meant to be run again on a tree where more commits landed
on the flat layout (a merge): every step is idempotent, and a run on the moved tree changes nothing.

Step 1, the moves (pure: no module is split, merged or edited beyond its imports):

- ``git mv`` each module of :data:`ROOMS` to its room; the four re-export facades (``config.py``,
  ``db.py``, ``kafka.py``, ``schema.py``) become their package's ``__init__.py``, so
  ``from harvest_outbox.producer.config import HarvestConfig`` keeps working; a room without a facade
  gets an ``__init__.py`` holding only its docstring (:data:`PACKAGE_DOCS`);
- every reference to an old module path is rewritten, in every tracked text file of :data:`SCOPE`:
  dotted (``harvest_outbox.producer.relay_core``, ``producer.relay_core`` in docstrings and messages,
  ``"harvest_outbox.producer.relay_core.time"`` in a test's monkeypatch), slashed
  (``producer/relay_core.py``, ``harvest_outbox/producer/relay_core.py`` in the wheel's listing) and
  ``from harvest_outbox.producer import relay_core`` (the local name is kept with ``as``);
- pyproject.toml's ``packages`` lists every package on disk.

Step 2, privacy: each module of :data:`PRIVATE` (one that no library module outside its own package
imports) gets a leading ``_``, its references rewritten the same way. The script then checks the rule
itself, on the library code as it finds it: a module imported from outside its package under a ``_``
name stops it with the importers named.

It stops, changing nothing, on a module of ``producer/`` that the map does not place (one added on
the flat layout after the map was written): add it to :data:`ROOMS` and run it again. CHANGELOG.md is
left alone (its history names the modules as they were).
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path.cwd()
PRODUCER = ROOT / "producer"

#: Old module of producer/ -> its new import path under ``harvest_outbox``. A facade's new path is its
#: package (``producer.config``: ``producer/config/__init__.py``).
ROOMS: dict[str, str] = {
    # configuration: the typed config, its YAML file and environment
    "config": "producer.config",
    "config_election": "producer.config.election",
    "config_env": "producer.config.env",
    "config_file": "producer.config.file",
    "config_harvest": "producer.config.harvest",
    "config_kafka": "producer.config.kafka",
    "config_limits": "producer.config.limits",
    "config_values": "producer.config.values",
    "config_yaml": "producer.config.yaml",
    "serialization_config": "producer.config.serialization",
    # the outbox table's schema (names, DDL, checks)
    "schema": "producer.schema",
    "schema_checks": "producer.schema.checks",
    "schema_ddl": "producer.schema.ddl",
    "schema_reasons": "producer.schema.reasons",
    "schema_storage": "producer.schema.storage",
    # the relay's database binding
    "db": "producer.db",
    "db_fence": "producer.db.fence",
    "db_listener": "producer.db.listener",
    "db_session": "producer.db.session",
    "db_statements": "producer.db.statements",
    # the outbox layouts: goharvest's mark, and the cursor layout (outboxLayout)
    "db_mark": "producer.layouts.mark.marks",
    "marksize": "producer.layouts.mark.marksize",
    "db_cursor": "producer.layouts.cursor.database",
    "schema_cursor": "producer.layouts.cursor.schema",
    "cursor_held": "producer.layouts.cursor.held",
    "cursor_ids": "producer.layouts.cursor.ids",
    "cursor_partitions": "producer.layouts.cursor.partitions",
    "cursor_views": "producer.layouts.cursor.views",
    "watermark": "producer.layouts.cursor.watermark",
    "watermark_sql": "producer.layouts.cursor.watermark_sql",
    "migrate_cursor": "producer.layouts.cursor.migrate",
    # the outbox table's shape: the names of its objects, its columns (goharvest's, Debezium's event router)
    # (schema_names is here, not in schema/: the cursor layout's tables, which schema/'s DDL makes, need the
    # names; in schema/ importing them would run schema/__init__, whose DDL imports those tables: a cycle)
    "schema_names": "producer.mapping.names",
    "table_mapping": "producer.mapping.table",
    "event_router": "producer.mapping.event_router",
    "java_regex": "producer.mapping.java_regex",
    # the relay: its core, its modes and what they share
    "relay_core": "producer.relay.core",
    "relay_mode": "producer.relay.mode",
    "relay_spans": "producer.relay.spans",
    "sharded": "producer.relay.sharded",
    "shards": "producer.relay.shards",
    "lifecycle": "producer.relay.lifecycle",
    "signals": "producer.relay.signals",
    "waker": "producer.relay.waker",
    "crash_points": "producer.relay.crash_points",
    "key_halt": "producer.relay.key_halt",
    "two_phase": "producer.relay.two_phase",
    "events": "producer.relay.events",  # what the relay reports to the embedding application's handler
    # the admission guard (relays of two leadership topologies never on one outbox); "layout" is outboxLayout's word
    "layout": "producer.relay.admission",
    "at_least_once": "producer.relay.at_least_once.mode",
    "at_least_once_records": "producer.relay.at_least_once.records",
    "sequencing": "producer.relay.sequenced.mode",
    "seq_acks": "producer.relay.sequenced.acks",
    "seq_commit": "producer.relay.sequenced.commit",
    "seq_failure": "producer.relay.sequenced.failure",
    "seq_produce": "producer.relay.sequenced.produce",
    "seq_store": "producer.relay.sequenced.store",
    "seq_txn": "producer.relay.sequenced.txn",
    "seq_view": "producer.relay.sequenced.view",
    # registry encodings
    "avro_batch": "producer.encode.avro_batch",
    "avro_compiled": "producer.encode.avro_compiled",
    "protobuf_encoder": "producer.encode.protobuf_encoder",
    "serialization": "producer.encode.serialization",
    "encode_worker": "producer.encode.worker",
    # the Kafka producer seam
    "kafka": "producer.kafka",
    "kafka_faults": "producer.kafka.faults",
    "kafka_logs": "producer.kafka.logs",
    "kafka_producer": "producer.kafka.producer",
    # observability
    "health": "producer.observe.health",
    "histograms": "producer.observe.histograms",
    "http_server": "producer.observe.http_server",
    "metrics": "producer.observe.metrics",
    "tracing": "producer.observe.tracing",
    "shard_status": "producer.observe.shard_status",
    # operations: the CLI and its commands
    "check": "producer.ops.check",
    "cli": "producer.ops.cli",
    "cli_deadletters": "producer.ops.deadletters_cli",
    "deadletter_admin": "producer.ops.deadletter_admin",
    "deadletters": "producer.ops.deadletters",
    "preflight": "producer.ops.preflight",
    # the stashers (the application side)
    "stasher": "producer.stash.stasher",
    "stasher_async": "producer.stash.async_stasher",
    "stash_validation": "producer.stash.validation",
    "outbox_rows": "producer.stash.outbox_rows",  # what every stasher shares (record, validation, SQL)
    "sqlalchemy": "producer.stash.sqlalchemy",
    # shared by the relay and the readers: at the top of harvest_outbox, so readers import no producer
    "redact": "redact",
    "librdkafka_properties": "librdkafka_properties",
    "protobuf_schema": "protobuf_schema",
}

#: What stays at the top of producer/ (``election/`` too: a package already). ``kafka_names`` (the topic-name
#: rule) is imported by the config and the stashers: in kafka/ it would run kafka/__init__, which imports
#: confluent-kafka, so ``import ...stash.stasher`` and ``...config`` would load confluent-kafka, as they do not now.
STAY = {"__init__", "__main__", "errors", "harvest", "kafka_names"}

#: Step 2: the modules no library module outside their own package imports (by their step-1 path), so
#: they get a leading ``_``. Kept public although the rule would make them private: the paths the docs show
#: users (``stash.sqlalchemy``'s SessionStasher, ``stash.validation``'s StashValidator) and
#: ``encode.worker``, which runs as ``python -m`` (its name is the process's command line). ``election/``
#: is left as it is (not part of this move).
PRIVATE: list[str] = [
    "kafka_names",
    "config.election",
    "config.env",
    "config.file",
    "config.harvest",
    "config.kafka",
    "config.limits",
    "config.values",
    "config.yaml",
    "db.listener",
    "db.session",
    "db.statements",
    "encode.avro_batch",
    "encode.avro_compiled",
    "encode.protobuf_encoder",
    "kafka.faults",
    "kafka.logs",
    "kafka.producer",
    "layouts.cursor.ids",
    "layouts.cursor.watermark",
    "layouts.cursor.watermark_sql",
    "mapping.event_router",
    "mapping.java_regex",
    "observe.health",
    "observe.histograms",
    "observe.http_server",
    "ops.check",
    "ops.deadletter_admin",
    "ops.deadletters",
    "ops.deadletters_cli",
    "relay.mode",
    "relay.waker",
    "relay.at_least_once.records",
    "relay.sequenced.acks",
    "relay.sequenced.commit",
    "relay.sequenced.failure",
    "relay.sequenced.produce",
    "relay.sequenced.store",
    "relay.sequenced.txn",
    "relay.sequenced.view",
    "schema.storage",
    "stash.outbox_rows",
]

#: The docstring of each new package that has no facade to become its ``__init__.py``.
PACKAGE_DOCS = {
    "producer.layouts": "The outbox layouts (``outboxLayout``): goharvest's mark/purge (:mod:`.mark`) and the cursor (:mod:`.cursor`).",
    "producer.layouts.mark": "goharvest's layout: the mark statement and how many rows the next mark claims.",
    "producer.layouts.cursor": "The cursor layout: partitions, views, held rows, the watermark and the migration to it.",
    "producer.mapping": "The outbox table's shape: the names of its objects and which of its columns make a record (goharvest's, Debezium's event router).",
    "producer.relay": "The relay's parts below the process (``producer/harvest.py``): the core its modes share, the modes, sharding, lifecycle.",
    "producer.relay.at_least_once": "The at-least-once mode: goharvest's per-record purge.",
    "producer.relay.sequenced": "The ``--uuid-sequencing`` mode: fenced harvest transactions, one concern per module.",
    "producer.encode": "Registry encodings of outbox rows (Avro, Protobuf, JSON Schema) at the relay.",
    "producer.observe": "Observability: metrics, histograms, health, the HTTP endpoints, tracing, shard status.",
    "producer.ops": "Operations: the ``harvest`` CLI, its commands (check, dead letters) and the preflight checks.",
    "producer.stash": "The stashers: writing outbox rows in the application's transaction (psycopg, asyncio, SQLAlchemy).",
}

#: Module paths the text substitutions cannot see, put together in code: (file after the move, old, new).
LITERALS = [
    (
        "producer/stash/stasher.py",
        "{'stasher.Stasher' if asynchronous else 'stasher_async.AsyncStasher'}",
        "{'stash.stasher.Stasher' if asynchronous else 'stash.async_stasher.AsyncStasher'}",
    ),
]

#: Where references are rewritten (tracked files only). CHANGELOG.md is history: left alone.
SCOPE = [
    "producer",
    "consumer",
    "spark_reader",
    "harvest_local",
    "sequencer",
    "harvest_outbox",
    "bench",
    "tests",
    "scripts",
    "docs",
    "README.md",
    "mkdocs.yml",
    "pyproject.toml",
    "setup.py",
]
SELF = Path("scripts/rooms.py")


def die(msg: str) -> None:
    print(f"rooms: {msg}", file=sys.stderr)
    sys.exit(2)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def path_of(new: str, package: bool) -> Path:
    """``producer.config.env`` -> producer/config/env.py; a package's -> its __init__.py; top-level
    ones (``redact``) -> harvest_outbox/redact.py."""
    parts = new.split(".")
    if parts[0] != "producer":
        return Path("harvest_outbox", *parts[:-1], parts[-1] + ".py")
    return Path(*parts, "__init__.py") if package else Path(*parts[:-1], parts[-1] + ".py")


def is_package(new: str) -> bool:
    return new in {ROOMS[f] for f in ("config", "db", "kafka", "schema")}


# ------------------------------------------------------------------------------------- rewriting


class Renames:
    """Module renames (full dotted names under ``harvest_outbox``, as given: ``producer.relay_core``)
    and the text substitutions that apply them, all in one pass per file (no chaining)."""

    def __init__(self, renames: dict[str, str], packages: set[str]) -> None:
        self.renames = {old: new for old, new in renames.items() if old != new}
        self.packages = packages  # new names that are packages (their file is __init__.py)
        # A facade keeps its import name, but not its file: producer/config.py -> producer/config/__init__.py.
        self.paths = {old: new for old, new in renames.items() if path_of(old, False) != path_of(new, new in packages)}
        alt = "|".join(re.escape(o) for o in sorted(self.renames, key=len, reverse=True))
        # dotted: harvest_outbox.producer.x / producer.x, not inside a longer name
        self.dotted = re.compile(rf"(?<![\w.])(harvest_outbox\.)?({alt})(?![\w])")
        slashed_alt = "|".join(re.escape(o.replace(".", "/")) for o in sorted(self.paths, key=len, reverse=True))
        # slashed: (harvest_outbox/)producer/x.py, as a path of the repository or of the wheel
        self.slashed = re.compile(rf"(?<![\w.-])(harvest_outbox/)?({slashed_alt})\.py(?![\w])")
        # from harvest_outbox.producer[.pkg] import x [as y]: one line, one or more names
        self.from_import = re.compile(r"^([ \t]*)from harvest_outbox\.([\w.]+) import ([\w ,]+?)[ \t]*(#.*)?$", re.M)

    def dotted_new(self, prefix: str | None, old: str) -> str:
        new = self.renames[old]
        if prefix or not new.startswith("producer."):
            return "harvest_outbox." + new
        return new

    def slashed_new(self, prefix: str | None, old: str) -> str:
        new = self.paths[old]
        path = path_of(new, new in self.packages).as_posix()
        if path.startswith("harvest_outbox/"):  # a top-level module: the same path in the checkout and the wheel
            return path
        return (prefix or "") + path

    def _from_import(self, m: re.Match[str]) -> str:
        indent, package, names, comment = m.group(1), m.group(2), m.group(3), m.group(4)
        items = [n.strip() for n in names.split(",") if n.strip()]
        moved = [f"{package}.{i.split(' as ')[0].strip()}" in self.renames for i in items]
        if not any(moved):
            return m.group(0)
        if comment:
            die(f"cannot split an import with a comment: {m.group(0).strip()!r}; edit it by hand and run again")
        lines = []
        for item, is_moved in zip(items, moved, strict=True):
            name, _, alias = (p.strip() for p in item.partition(" as "))
            if not is_moved:
                lines.append(f"{indent}from harvest_outbox.{package} import {item}")
                continue
            new_package, _, new_name = self.renames[f"{package}.{name}"].rpartition(".")
            local = alias or name
            target = f"harvest_outbox.{new_package}" if new_package else "harvest_outbox"
            lines.append(f"{indent}from {target} import {new_name}" + (f" as {local}" if local != new_name else ""))
        return "\n".join(lines)

    def apply(self, text: str) -> str:
        text = self.from_import.sub(self._from_import, text)
        text = self.dotted.sub(lambda m: self.dotted_new(m.group(1), m.group(2)), text)
        text = self.slashed.sub(lambda m: self.slashed_new(m.group(1), m.group(2).replace("/", ".")), text)
        return text


def scope_files() -> list[Path]:
    files = [Path(p) for p in git("ls-files", "-z", "--", *SCOPE).split("\0") if p]
    return [f for f in files if f != SELF and (ROOT / f).is_file()]


def rewrite(renames: Renames, files: Iterable[Path]) -> list[Path]:
    changed = []
    for f in files:
        try:
            text = (ROOT / f).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary
        new = renames.apply(text)
        if f == Path("producer/__init__.py"):
            new = exports_rewritten(new, renames)
        if new != text:
            (ROOT / f).write_text(new, encoding="utf-8")
            changed.append(f)
    return changed


def exports_rewritten(text: str, renames: Renames) -> str:
    """producer/__init__.py's lazy ``_EXPORTS`` name their modules relative to the package."""

    def sub(m: re.Match[str]) -> str:
        old = f"producer.{m.group(1)}"
        if old not in renames.renames:
            return m.group(0)
        return f'"{renames.renames[old].removeprefix("producer.")}": ('

    return re.sub(r'"([\w.]+)": \(', sub, text)


# ------------------------------------------------------------------------------------- step 1


def check_map() -> None:
    """Every flat module of producer/ is placed (or stays); stop before changing anything otherwise."""
    unplaced = sorted(
        p.name
        for p in PRODUCER.glob("*.py")
        if p.stem not in ROOMS and p.stem not in STAY and not p.stem.startswith("_")
    )
    if unplaced:
        die(
            f"producer/ holds module(s) the room map does not place: {', '.join(unplaced)}. Add each to ROOMS in "
            f"scripts/rooms.py (old name -> room) and run it again; nothing was changed."
        )
    both = [
        old
        for old, new in ROOMS.items()
        if (PRODUCER / f"{old}.py").exists() and (ROOT / path_of(new, is_package(new))).exists()
    ]
    if both:
        die(f"both the old and the new file exist for: {', '.join(both)}; resolve by hand (a merge?) and run again")


def move(renames: dict[str, str], packages: set[str]) -> list[tuple[Path, Path]]:
    moves = []
    for old, new in renames.items():
        src = path_of(old, False)  # old names are modules: the flat ones, or step 1's new ones
        dst = path_of(new, new in packages)
        if src == dst or not (ROOT / src).exists():
            continue
        if (ROOT / dst).exists():
            die(f"{dst} exists and so does {src}: resolve by hand and run again")
        (ROOT / dst).parent.mkdir(parents=True, exist_ok=True)
        git("mv", src.as_posix(), dst.as_posix())
        moves.append((src, dst))
    return moves


def ensure_package_inits() -> list[Path]:
    """An ``__init__.py`` (its docstring only) for each new package without a facade."""
    made = []
    for package, doc in PACKAGE_DOCS.items():
        init = path_of(package, True)
        if not (ROOT / init).exists():
            (ROOT / init).parent.mkdir(parents=True, exist_ok=True)
            (ROOT / init).write_text(f'"""{doc}"""\n', encoding="utf-8")
            git("add", init.as_posix())
            made.append(init)
    return made


def update_pyproject() -> None:
    """``[tool.setuptools] packages``: every package of the checkout, producer's from the folders."""
    path = ROOT / "pyproject.toml"
    text = path.read_text(encoding="utf-8")
    m = re.search(r"^packages = \[\n(.*?)^\]", text, re.M | re.S)
    if m is None:
        die("pyproject.toml: no `packages = [` list under [tool.setuptools]")
    listed = re.findall(r'"([\w.]+)"', m.group(1))
    found = sorted(
        "harvest_outbox." + ".".join(p.parent.relative_to(ROOT).parts)
        for p in PRODUCER.rglob("__init__.py")
        if "__pycache__" not in p.parts
    )
    producer_at = listed.index("harvest_outbox.producer")
    keep = [p for p in listed if not p.startswith("harvest_outbox.producer")]
    packages = [*keep[:producer_at], *found, *keep[producer_at:]]
    body = "".join(f'    "{p}",\n' for p in packages)
    new = text[: m.start(1)] + body + text[m.end(1) :]
    # The modules moved to the top of harvest_outbox keep the strict type check they had under producer.
    top = sorted(f"harvest_outbox.{new}" for new in ROOMS.values() if not new.startswith("producer."))
    strict = '    "harvest_outbox.producer.*",\n'
    if strict not in new:
        die("pyproject.toml: no strict mypy override for harvest_outbox.producer.*")
    missing = "".join(f'    "{m}",\n' for m in top if f'"{m}"' not in new)
    new = new.replace(strict, strict + missing, 1)
    if new != text:
        path.write_text(new, encoding="utf-8")


def tidy(files: Iterable[Path]) -> None:
    """Import blocks re-sorted (a moved module sorts elsewhere) and reformatted, by the project's own ruff."""
    py = sorted({f.as_posix() for f in files if f.suffix == ".py" and (ROOT / f).exists()})
    if not py:
        return
    ruff = ROOT / ".venv" / "bin" / "ruff"
    cmd = str(ruff) if ruff.exists() else "ruff"
    subprocess.run([cmd, "check", "--quiet", "--select", "I", "--fix", *py], cwd=ROOT, check=False)
    subprocess.run([cmd, "format", "--quiet", *py], cwd=ROOT, check=True)


def step(renames: dict[str, str], packages: set[str], *, new_packages: bool) -> None:
    moves = move(renames, packages)
    made = ensure_package_inits() if new_packages else []
    changed = rewrite(Renames(renames, packages), scope_files())
    for name, old, new in LITERALS if new_packages else []:
        path = ROOT / name
        if path.exists() and old in (text := path.read_text(encoding="utf-8")):
            path.write_text(text.replace(old, new), encoding="utf-8")
            changed.append(Path(name))
    tidy([*changed, *(d for _, d in moves), *made])
    print(f"rooms: {len(moves)} module(s) moved, {len(changed)} file(s) rewritten")


# ------------------------------------------------------------------------------------- step 2


def private_name(new: str) -> str:
    package, _, name = new.rpartition(".")
    return f"{package}._{name}"


LIBRARY = ["producer", "consumer", "spark_reader", "harvest_local", "sequencer", "harvest_outbox"]


def check_privacy() -> None:
    """Nothing outside a package of producer/ imports its ``_`` modules (library code only: tests may)."""
    offenders = []
    for folder in LIBRARY:
        for path in sorted((ROOT / folder).rglob("*.py")):
            importer = ".".join(path.relative_to(ROOT).with_suffix("").parts) + "."
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                targets: list[str] = []
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                elif isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                for target in targets:
                    parts = target.split(".")[1:]  # without harvest_outbox
                    if parts[:1] != ["producer"]:
                        continue
                    for i, part in enumerate(parts):
                        if not part.startswith("_") or part.startswith("__"):
                            continue
                        if (ROOT / Path(*parts[: i + 1])).with_suffix(".py").is_file():  # a module, not a name
                            owner = ".".join(parts[:i]) + "."
                            if not importer.startswith(owner):
                                offenders.append(f"{path.relative_to(ROOT)} imports {target}")
                        break
    if offenders:
        die("private module(s) imported from outside their package: " + "; ".join(sorted(set(offenders))))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--moves-only", action="store_true", help="step 1 only (the moves, no `_` renames)")
    args = parser.parse_args(argv)
    if not (ROOT / "pyproject.toml").exists() or not PRODUCER.is_dir():
        die("run it from the repository root")
    check_map()
    packages = {new for new in ROOMS.values() if is_package(new)}
    step({f"producer.{old}": new for old, new in ROOMS.items()}, packages, new_packages=True)
    update_pyproject()
    if not args.moves_only:
        step({f"producer.{m}": private_name(f"producer.{m}") for m in PRIVATE}, set(), new_packages=False)
        check_privacy()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
