"""tests/xdist_groups.py's order: the groups that share a session service stay whole, and the kinds that run
longest are handed out first (Spark, then fault runs and long model runs, then service tests, pure logic last)."""

from __future__ import annotations

from dataclasses import dataclass

import xdist_groups


@dataclass
class _Item:
    """What group_and_order reads of a pytest item."""

    nodeid: str
    fixturenames: tuple[str, ...] = ()
    marks: tuple[str, ...] = ()

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.marks else None


def test_groups_stay_whole_and_the_longest_kinds_go_first() -> None:
    items = [
        _Item("tests/a/test_logic.py::test_x"),
        _Item("tests/a/test_model.py::test_schedules", marks=("long",)),
        _Item("tests/b/test_pg.py::test_y", fixturenames=("services",)),
        _Item("tests/c/test_stream.py::test_z", fixturenames=("_spark_sessions",)),
        _Item("tests/d/test_faults.py::test_run", fixturenames=("services",), marks=("slow",)),
        _Item("tests/e/test_cluster.py::test_a", fixturenames=("kafka_cluster",)),
        _Item("tests/e/test_unclean.py::test_b", fixturenames=("kafka_cluster",), marks=("slow",)),
        _Item("tests/c/test_batch.py::test_w", fixturenames=("_spark_sessions",)),
    ]
    groups = xdist_groups.group_and_order(items)  # type: ignore[arg-type]
    order = [i.nodeid.split("::")[0].split("/")[-1] for i in items]
    assert groups["tests/c/test_stream.py::test_z"] == groups["tests/c/test_batch.py::test_w"] == "spark"
    assert groups["tests/e/test_cluster.py::test_a"] == groups["tests/e/test_unclean.py::test_b"] == "kafka-cluster"
    assert order[:2] == ["test_stream.py", "test_batch.py"]  # Spark first, its group whole
    # then the slow and long kinds (a group weighs what its heaviest test does), services, pure logic
    assert order[2:6] == ["test_model.py", "test_faults.py", "test_cluster.py", "test_unclean.py"]
    assert order[6:] == ["test_pg.py", "test_logic.py"]
