"""The suite on pytest-xdist workers (``./dev test`` runs three): which tests share a worker, and the
order work is handed out in.

Invariants:
- the tests that use one session service share a worker, which starts it once: every Spark test
  (pyspark allows one SparkContext per process; the worker switches to ``local-cluster`` once, as
  the ``cluster`` tests come last in its group), the Debezium tests (their logical Postgres), the
  schema-registry tests (their Apicurio Registry), the replicated-cluster tests (their three Kafka
  nodes); any other test stays with its module (its module-scoped fixtures are built once, e.g.
  test_wheel.py's wheel);
- groups are handed out whole, longest-running kinds first (the Spark group, then modules with
  ``slow`` fault runs or ``long`` model runs, then modules on Postgres/Kafka, pure-logic modules last), so
  the workers finish close together (a 35 s model run handed out last left one worker 75 s behind the
  other); within a group the collection order stays.

Why a scheduler of our own: xdist's ``--dist loadgroup`` appends the group to each test's node id,
which pytest 9.2 no longer lets a plugin change (``Node.nodeid`` is derived from ``_id``), so its
groups are silently ignored. Here the workers compute each test's group as they collect (they have
the fixtures and marks, the controller only node ids) and write it to a file named in their
``workerinput``; the controller's scheduler, a :class:`LoadScopeScheduling` whose scope is the
group, reads it once every worker has reported its collection (which comes after the writing).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

_INPUT_KEY = "harvest_groups_file"

# A test using one of these fixtures runs in that group (first match wins).
SHARED_SESSIONS = (
    ("_spark_sessions", "spark"),
    ("logical_pg_dsn", "debezium"),
    ("schema_registry", "registry"),
    ("two_phase_pg_dsn", "two-phase"),
    ("kafka_cluster", "kafka-cluster"),
)


def group_and_order(items: list[pytest.Item]) -> dict[str, str]:
    """Each test's group (by node id), with ``items`` sorted as the groups are to be handed out."""
    group_of: dict[str, str] = {}
    weight: dict[str, int] = {}
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        group = next((g for fixture, g in SHARED_SESSIONS if fixture in names), item.nodeid.split("::")[0])
        heavy = item.get_closest_marker("slow") or item.get_closest_marker("long")
        item_weight = 3 if group == "spark" else 2 if heavy else int("services" in names)
        group_of[item.nodeid], weight[group] = group, max(item_weight, weight.get(group, 0))
    items.sort(key=lambda item: -weight[group_of[item.nodeid]])  # stable: the order within a group stays
    return group_of


def write_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker of our scheduler: order ``items`` and write their groups for the controller."""
    target = getattr(config, "workerinput", {}).get(_INPUT_KEY)
    if not target:
        return
    groups = group_and_order(items)
    partial = f"{target}.{config.workerinput['workerid']}"  # type: ignore[attr-defined]
    Path(partial).write_text(json.dumps(groups))
    os.replace(partial, target)  # every worker writes the same content; each write is whole


def _groups_file(config: pytest.Config) -> Path:
    folder = getattr(config, "_harvest_groups_dir", None)
    if folder is None:
        folder = tempfile.mkdtemp(prefix="harvest-xdist-")
        config._harvest_groups_dir = folder  # type: ignore[attr-defined]
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    return Path(folder) / "groups.json"


def configure_node(node: Any) -> None:
    """Controller, per worker: name the groups file when our scheduler runs (``--dist loadgroup``)."""
    if node.config.getoption("dist") == "loadgroup":
        node.workerinput[_INPUT_KEY] = str(_groups_file(node.config))


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: our scheduler (xdist's own ignores its groups under pytest 9.2)."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(config, log)
            self._groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                self._groups = json.loads(_groups_file(config).read_text())
            return self._groups.get(nodeid, nodeid)

    config.option.loadscopereorder = False  # hand groups out in the workers' order, not by size
    return GroupScheduling()
