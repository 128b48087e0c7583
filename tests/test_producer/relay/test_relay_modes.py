"""The relay's structure (producer/harvest.py, producer/relay/: core.py, at_least_once/, sequenced/), no
DB, no Kafka:
- exactly one mode per relay, chosen by the config at construction;
- no import cycle among the producer package's modules but a package's own (its ``__init__.py`` imports
  its modules, which Python runs after it), and only the relay process imports a mode;
  nothing outside a package of producer/ imports its ``_`` modules (library code; tests may), so the
  parts of the sequenced mode (relay/sequenced/_*.py) are the mode's, the at-least-once mode's records
  (relay/at_least_once/_records.py) that mode's, and crash_points.py only the sequenced mode's;
- the modes decide, the core mutates: no module but relay/core.py assigns a RelayCore field or
  changes its attempt counts, queued attempts or write-behind jobs in place;
- rows of a mark asked for by an abandoned view are never produced by the current one;
- held rows (missingTopicPolicy: hold) go back to the head of the ready queue in id order."""

from __future__ import annotations

import ast
import logging
import time
import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from fake_admin import FakeAdmin
from fake_producer import FakeProducer

from harvest_outbox.producer.config import HarvestConfig, Limits
from harvest_outbox.producer.election.neli import StaticElection
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.kafka import LIBRDKAFKA_LOG
from harvest_outbox.producer.ops.preflight import TopicGuard
from harvest_outbox.producer.relay.at_least_once.mode import AtLeastOnceMode
from harvest_outbox.producer.relay.core import PendingMark
from harvest_outbox.producer.relay.sequenced.mode import SequencedMode

PRODUCER = Path(__file__).resolve().parents[3] / "producer"
MODES = {"relay.at_least_once.mode", "relay.sequenced.mode"}
#: The library's folders: the privacy rule holds for their code (tests may import a private module).
LIBRARY = ("producer", "consumer", "spark_reader", "sequencer", "harvest_local", "harvest_outbox")


def _relay(admin: FakeAdmin | None = None, **config: Any) -> tuple[Harvest, list[FakeProducer]]:
    made: list[FakeProducer] = []

    def factory(conf: dict[str, Any], cb: Any) -> FakeProducer:
        made.append(FakeProducer(cb, conf))
        return made[-1]

    cfg = HarvestConfig(limits=Limits(), **config)
    guard = TopicGuard(
        {},
        cfg.producer_config(),
        missing_ttl=0.0,
        admin_factory=lambda conf: admin if admin is not None else FakeAdmin(),
    )
    return Harvest(cfg, producer_factory=factory, election=StaticElection(), topic_guard=guard), made


@pytest.mark.parametrize(
    "uuid_sequencing, mode, header_bytes, gapless",
    [
        (False, AtLeastOnceMode, 0, None),
        (True, SequencedMode, 30, True),
    ],
)
def test_the_config_chooses_one_mode(
    uuid_sequencing: bool, mode: type, header_bytes: int, gapless: bool | None
) -> None:
    relay, made = _relay(uuid_sequencing=uuid_sequencing)
    assert type(relay) is Harvest and type(relay.mode) is mode
    assert relay.mode.core is relay.core  # type: ignore[attr-defined]
    assert mode.HEADER_BYTES == header_bytes
    relay.mode.ensure_producer()
    relay.mode.ensure_producer()
    assert len(made) == 1, "one producer until the mode drops it"
    assert made[0].conf.get("enable.gapless.guarantee") == gapless
    assert ("uuid-sequencing" if uuid_sequencing else "at-least-once") in repr(relay)


def test_a_users_producer_setting_wins_over_the_modes() -> None:
    relay, made = _relay(uuid_sequencing=True, producer_kafka_config={"enable.gapless.guarantee": False})
    relay.mode.ensure_producer()
    assert made[0].conf["enable.gapless.guarantee"] is False


def test_librdkafka_logs_go_through_logging_and_the_chosen_gapless_warning_is_debug(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The relay's real confluent-kafka producer logs through ``harvest_outbox.librdkafka``, not raw
    lines on stderr; librdkafka's "experimental" warning for the gap-less setting the sequenced mode
    chose is kept at DEBUG, while a warning about a user's setting stays a warning."""
    cfg = HarvestConfig(
        limits=Limits(),
        uuid_sequencing=True,
        base_kafka_config={"bootstrap.servers": "127.0.0.1:1"},
        producer_kafka_config={"auto.offset.reset": "earliest"},
    )  # a consumer property: CONFWARN
    guard = TopicGuard({}, cfg.producer_config(), admin_factory=lambda conf: FakeAdmin())
    relay = Harvest(cfg, election=StaticElection(), topic_guard=guard)  # the real producer factory
    caplog.set_level(logging.DEBUG, logger=LIBRDKAFKA_LOG.name)
    producer = relay.mode.ensure_producer()
    try:
        deadline = time.monotonic() + 5
        while len([r for r in caplog.records if r.name == LIBRDKAFKA_LOG.name and "CONFWARN" in r.getMessage()]) < 2:
            assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
            producer.poll(0.05)  # confluent-kafka serves its log lines inside poll()
    finally:
        relay.core.close()
    confwarn = {
        ("gapless" if "enable.gapless.guarantee" in r.getMessage() else "user"): r.levelname
        for r in caplog.records
        if r.name == LIBRDKAFKA_LOG.name and "CONFWARN" in r.getMessage()
    }
    assert confwarn == {"gapless": "DEBUG", "user": "WARNING"}
    assert "CONFWARN" not in capfd.readouterr().err


def _module_name(path: Path) -> str:
    """``harvest.py`` -> ``harvest``; a sub-package's modules by their dotted names under producer
    (``relay/core.py`` -> ``relay.core``, ``relay/__init__.py`` -> ``relay``; the top one is ``__init__``)."""
    parts = path.relative_to(PRODUCER).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def _imported(path: Path, package: str) -> set[str]:
    """The modules under producer ``path`` imports, at any depth of its code (lazy imports count), by
    their dotted names under producer, each with its packages: importing ``a.b.c`` runs ``a`` and ``a.b``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom) and (node.module or node.level):
            if node.level:  # relative: from .neli import X, from . import neli
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if package else []
                target = ".".join([*filter(None, base), *([node.module] if node.module else [])])
            else:
                parts = (node.module or "").split(".")
                if parts[:2] != ["harvest_outbox", "producer"]:
                    continue
                target = ".".join(parts[2:])
            targets = [target, *(f"{target}.{a.name}".lstrip(".") for a in node.names)]
        elif isinstance(node, ast.Import):
            targets = [
                ".".join(a.name.split(".")[2:]) for a in node.names if a.name.startswith("harvest_outbox.producer.")
            ]
        for target in filter(None, targets):
            parts = target.split(".")
            found.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return found


def _producer_imports() -> dict[str, set[str]]:
    """module -> the producer modules it imports, plus its package (Python runs a package's
    ``__init__.py`` before its modules). The top package, ``__init__``, imports its exports lazily
    (PEP 562): it is left out."""
    paths = sorted(PRODUCER.rglob("*.py"))
    modules = {_module_name(p) for p in paths} - {"__init__"}
    graph: dict[str, set[str]] = {}
    for path in paths:
        name = _module_name(path)
        if name == "__init__":
            continue
        package = name if path.stem == "__init__" else name.rpartition(".")[0]
        deps = _imported(path, package) | {name.rpartition(".")[0]}
        graph[name] = (deps & modules) - {name}
    return graph


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_no_import_cycles_and_only_the_relay_process_imports_a_mode() -> None:
    graph = _producer_imports()
    assert {"harvest", "relay.core"} | MODES <= set(graph)

    def reachable(start: str) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for dep in graph.get(todo.pop(), ()):
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        return seen

    # A package whose __init__.py re-exports its modules (config, db, kafka, schema) is on a cycle with
    # them, which Python handles: the package runs first, whichever module is imported. A cycle leaving
    # the package is the one that breaks: a module of it imported first meets itself half-initialised.
    cyclic = sorted(
        f"{m} -> {d}"
        for m in graph
        for d in graph[m]
        if m in reachable(d) and not any(_in(m, p) and _in(d, p) and m in reachable(p) for p in graph)
    )
    assert cyclic == [], f"imports on an import cycle: {cyclic}"
    importers = sorted(m for m, deps in graph.items() if deps & MODES and not m.startswith("relay."))
    assert importers == ["harvest"], importers
    assert not graph["relay.core"] & (MODES | {"harvest"})
    # The sequenced mode's crash hooks belong to it (the test-only relay runner installs them).
    outside = sorted(m for m, deps in graph.items() if "relay.crash_points" in deps and not _in(m, "relay.sequenced"))
    assert outside == [], f"modules importing the sequenced mode's crash hooks: {outside}"
    assert {"relay.sequenced._view", "relay.sequenced._txn", "relay.at_least_once._records"} <= set(graph)


def _private_owner(module: str) -> str | None:
    """The package a private module (``relay.sequenced._txn``) belongs to, ``None`` for a public one."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def test_nothing_outside_a_package_imports_its_private_modules() -> None:
    root = PRODUCER.parent
    modules = {_module_name(p) for p in PRODUCER.rglob("*.py")}
    offenders = []
    for folder in LIBRARY:
        for path in sorted((root / folder).rglob("*.py")):
            inside = path.is_relative_to(PRODUCER)
            name = _module_name(path) if inside else ""
            package = (name if path.stem == "__init__" else name.rpartition(".")[0]) if inside else ""
            for dep in _imported(path, package) & modules:
                owner = _private_owner(dep)
                if owner is not None and not (inside and (owner == "" or _in(name, owner))):
                    offenders.append(f"{path.relative_to(root)} imports producer.{dep}")
    assert offenders == [], f"private modules imported from outside their package: {offenders}"
    assert _private_owner("relay.sequenced._txn") == "relay.sequenced" and _private_owner("relay.core") is None


def _mark(relay: Harvest, rows: list[tuple], view: uuid.UUID) -> None:
    done: Future = Future()
    done.set_result((rows, {}))
    core = relay.core
    core.marks.append(PendingMark(done, view, 100))


def row(i: int, key: str, topic: str = "t") -> tuple:
    return (i, topic, key.encode(), f"v{i}".encode(), None, None, None, None, None, None, 0.0)


#: RelayCore's containers that only its own methods change (next_attempt, store_attempt, add_db_job ...).
_CORE_CONTAINERS = {"attempts", "attempt_buf", "db_futures"}
_MUTATORS = {"append", "extend", "pop", "clear", "update", "setdefault", "remove", "insert", "popitem"}


def _is_core(node: ast.AST) -> bool:
    """``core`` or ``self.core``."""
    if isinstance(node, ast.Name):
        return node.id == "core"
    return isinstance(node, ast.Attribute) and node.attr == "core" and isinstance(node.value, ast.Name)


def core_writes(source: str) -> list[str]:
    """Where ``source`` assigns a field of the core, or changes one of its containers in place."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = [
                t for target in node.targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])
            ]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Subscript):
                t = t.value
            if isinstance(t, ast.Attribute) and _is_core(t.value):
                found.append(f"line {node.lineno}: core.{t.attr} assigned")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
            owner = node.func.value
            if isinstance(owner, ast.Attribute) and owner.attr in _CORE_CONTAINERS and _is_core(owner.value):
                found.append(f"line {node.lineno}: core.{owner.attr}.{node.func.attr}()")
    return found


def test_the_check_sees_a_mode_writing_the_cores_fields() -> None:
    assert core_writes("core.remark = True") == ["line 1: core.remark assigned"]
    assert core_writes("self.core.attempts[rid] = 3") == ["line 1: core.attempts assigned"]
    assert core_writes("a, self.core.attempt_buf = 1, []") == ["line 1: core.attempt_buf assigned"]
    assert core_writes("core.db_futures.append(f)") == ["line 1: core.db_futures.append()"]
    assert core_writes("core.request_remark()\nx = core.attempts.get(1)\ncore.halt.halt(row)") == []


def test_only_the_core_writes_its_fields() -> None:
    offenders = {
        path.name: writes
        for path in sorted(PRODUCER.rglob("*.py"))
        if path != PRODUCER / "relay" / "core.py" and (writes := core_writes(path.read_text(encoding="utf-8")))
    }
    assert not offenders, f"the modes decide, the core mutates (use RelayCore's methods): {offenders}"


def test_a_mark_for_an_abandoned_view_is_not_produced() -> None:
    relay, made = _relay()
    core = relay.core
    relay.on_acquired()
    relay.mode.ensure_producer()
    old_view = core.leader_id
    core.leader_id = uuid.uuid4()  # the view was refreshed while the mark ran
    _mark(relay, [row(1, "a"), row(2, "b")], old_view)  # type: ignore[arg-type]
    relay.mode.tick()
    assert made[0].sent == [] and not core.ready, "rows marked for an abandoned view were produced"
    _mark(relay, [row(1, "a"), row(2, "b")], core.leader_id)
    relay.mode.tick()
    assert [s[1] for s in made[0].sent] == [b"v1", b"v2"]


def test_held_rows_return_to_the_head_of_the_ready_queue_in_id_order() -> None:
    admin = FakeAdmin({"t": 1_048_588})
    relay, _made = _relay(admin, missing_topic_policy="hold")
    core = relay.core
    for topic in ("later", "never"):
        assert isinstance(core.guard.verdict(topic), str) and topic in core.guard.missing
    for i in (3, 5, 8):
        core.hold(row(i, f"k{i}", topic="later"))
    core.hold(row(4, "x", topic="never"))
    core.ready.extend([row(9, "z", topic="later")])
    assert core.held_count == 4
    admin.topics["later"] = 1_048_588  # created meanwhile
    core.guard.verdicts.pop("later")  # its "missing" verdict expired
    core.release_held(time.monotonic())
    assert [r[0] for r in core.ready] == [3, 5, 8, 9]
    assert list(core.held) == ["never"] and core.held_count == 1
