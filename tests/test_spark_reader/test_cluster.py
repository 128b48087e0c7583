"""The local-cluster session really is a cluster: tasks and their Python workers run in two executor
JVMs, not in the driver's process. The readers' tests that take ``spark_any`` run on it."""

from __future__ import annotations

import os

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.cluster]


def test_tasks_run_in_two_executor_processes(spark_cluster) -> None:
    def where(_: object) -> list[tuple[str, int, int]]:
        # Defined here, so pickled by value: executors cannot import this test module.
        import re

        from harvest_outbox import spark_reader  # the project is importable by executors' Python workers

        match = re.search(r"executorId=(\w+)", os.environ.get("SPARK_LOG_URL_STDERR", ""))
        return [(match.group(1) if match else "?", os.getpid(), len(spark_reader.__all__))]

    sc = spark_cluster.sparkContext
    assert sc.master == "local-cluster[2,1,1024]"
    assert sc._jsc.sc().getExecutorMemoryStatus().size() == 3  # the driver's block manager and two executors'
    seen = sc.parallelize(range(16), 16).mapPartitions(where).collect()
    assert {executor for executor, _, _ in seen} == {"0", "1"}
    assert os.getpid() not in {pid for _, pid, _ in seen}
