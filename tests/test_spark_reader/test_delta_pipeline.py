"""The pipeline with ``--format delta`` (spark_reader.delta_tables) under a SIGKILL of its driver, on
``local-cluster`` and ``local[2]``, with writers committing and rolling back through a running relay: every
committed row in the Delta event table exactly once, no rolled-back row, the latest-state table equal to the
outbox's last committed versions, each (app id, batch) in one commit per table, and both tables read back by
delta-rs and by polars, also at an earlier version.

Two driver starts (each ~10 s to start and ~8 s for its first micro-batch on two idle cores; twice that at the
suite's load). The first, on ``local-cluster[1,1,1024]`` (its batches read by an executor JVM, which the kill
takes with the driver), commits batch 0 and dies after batch 1's two Delta commits, before Spark's checkpoint
commit: the point where a sink without idempotence writes twice. The second, on ``local[2]``, resumes from the
checkpoints: Spark re-runs batch 1 under the same query id and batch id, both tables skip it, and the run goes
on until the tables hold every committed row. The other kill points (before the Delta commits, between the two
tables' commits) leave states a replay handles without any skip or with one table's: test_delta_tables.py
SIGKILLs a writing process at each of the three points and replays it, without a Spark start per point. The
pipeline's driver killed from outside at an arbitrary moment, on local-cluster, is the demo's test
(tests/test_e2e/test_demo.py, Parquet).
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pytest

from harvest_outbox.harvest_local.pipeline_process import PipelineProcess, table_verdict
from harvest_outbox.harvest_local.relays import RelayProcess, current_leader, wait_for, write_config
from harvest_outbox.harvest_local.verify import verify
from harvest_outbox.harvest_local.workload import Writers, committed_versions, create_accounts
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.spark_reader.delta_tables import KILL_ENV

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

#: (point, batch, master): the driver dies there; the next start resumes from the checkpoints, replaying batch 1.
KILLS = [("after-commit", 1, "local-cluster[1,1,1024]")]
ROWS, KEYS = 400, 12


def _events(uri: str) -> list[tuple[int, int, int, str, int]]:
    """The event table through delta-rs: (partition, ack_offset, offset, key, version) in delivery order."""
    import json

    from deltalake import DeltaTable

    t = DeltaTable(uri).to_pyarrow_table(columns=["partition", "ack_offset", "offset", "key", "value"]).to_pydict()
    rows = [
        (p, a, o, k.decode(), int(json.loads(v)["version"]))
        for p, a, o, k, v in zip(t["partition"], t["ack_offset"], t["offset"], t["key"], t["value"], strict=True)
    ]
    return sorted(rows)


def _latest_polars(uri: str) -> dict[str, int]:
    import json

    import polars as pl

    df = pl.read_delta(uri, columns=["key", "value"])
    return {k.decode(): int(json.loads(v)["version"]) for k, v in df.iter_rows()}


def test_delta_pipeline_is_exactly_once_through_a_driver_kill_after_its_commits(
    services, pg_schema: str, tmp_path: Path
) -> None:
    ends = services.endpoints
    topic, outbox = f"delta-{uuid.uuid4().hex[:8]}", f"{pg_schema}.outbox"
    from harvest_outbox.harvest_local.kafka import create_topic

    create_accounts(ends.pg_dsn, pg_schema, KEYS)
    init_db(ends.pg_dsn, outbox)
    create_topic(ends.kafka_bootstrap, topic, 2)
    cfg = write_config(tmp_path / "harvest.yaml", dsn=ends.pg_dsn, bootstrap=ends.kafka_bootstrap, outbox_table=outbox)
    relay = RelayProcess(cfg, "relay-0", tmp_path).start()
    # Micro-batches of 100 records; no upkeep here
    # (test_delta_tables.py races it against the writer).
    pipeline = PipelineProcess(
        topic=topic,
        bootstrap=ends.kafka_bootstrap,
        root=tmp_path / "pipeline",
        logdir=tmp_path,
        trigger_seconds=0.5,
        max_offsets_per_trigger=100,
        format="delta",
        extra_args=("--optimize-every", "0"),
    )
    events, latest = str(pipeline.events_path), str(pipeline.latest_path)
    writers = None
    try:
        # The relay's election, the writers and the first driver's start overlap (each start is ~10 s).
        writers = Writers(ends.pg_dsn, pg_schema, outbox, topic, KEYS, ROWS, threads=3, rate_per_s=30.0).start()
        for n, (point, batch, master) in enumerate(KILLS, start=1):
            pipeline.master = master
            pipeline.start(env={KILL_ENV: f"{point}:{batch}"})
            if n == 1:
                wait_for(lambda: current_leader([relay]) is not None, 60, "the relay to be elected leader")
            assert pipeline.proc is not None
            code = pipeline.proc.wait(180)
            pipeline.kill()  # its JVM, had it outlived the Python driver for a moment
            text = pipeline.text()
            assert code == -9 and text.count("SIGKILL of the driver at") == n, (
                f"start {n}: exit {code}, see {pipeline.log}"
            )
            assert f"SIGKILL of the driver at {point} of batch" in text.rsplit("---- start", 1)[-1]
        pipeline.master = "local[2]"
        pipeline.start()
        stats = writers.join(120)
        truth = committed_versions(ends.pg_dsn, pg_schema)
        expected = sum(truth.values())
        assert stats.committed == expected and stats.rolled_back > 0

        def caught_up() -> bool:
            try:
                return len(_events(events)) >= expected and _latest_polars(latest) == truth
            except Exception:  # a table not created yet
                return False

        wait_for(
            caught_up,
            180,
            f"the Delta tables to hold every committed row (see {pipeline.log})",
            poll=1.0,
        )
    finally:
        if writers is not None:
            writers.stop()
        pipeline.stop()
        relay.kill()

    rows = _events(events)
    verdict = verify("Spark pipeline -> Delta table", truth, [(k, v) for *_, k, v in rows])
    assert verdict.ok and verdict.delivered == expected, verdict  # no loss, duplicate, phantom, reordering
    # The demo's reading of the same tables (./dev demo --pipeline-format delta): polars, the batch commits.
    by_demo = table_verdict(pipeline, truth)
    assert by_demo.ok and by_demo.delivered == expected and by_demo.reader.endswith("(polars)"), by_demo
    assert pipeline.latest_versions() == truth
    commits = pipeline.committed_files()
    assert sum(c.rows for c in commits) == expected and pipeline.committed_batches() == len(commits) >= 2

    import polars as pl
    from deltalake import DeltaTable

    # The independent reader sees the same rows, and the latest-state table per delta-rs too.
    by_polars = pl.read_delta(events, columns=["partition", "offset"]).sort("partition", "offset").rows()
    assert by_polars == sorted((p, o) for p, _, o, _, _ in rows)
    assert _latest_polars(latest) == truth
    assert {k.decode() for k in DeltaTable(latest).to_pyarrow_table(columns=["key"])["key"].to_pylist()} == set(truth)

    # Each (app id, micro-batch) in one commit per table: no table version from a replayed batch. One
    # app id: every start resumed the same checkpoint (the same query id). The batches killed before
    # Spark's checkpoint commit are there once, written by the start that replayed them.
    for uri in (events, latest):
        history = DeltaTable(uri).history()
        batches = Counter((h["harvest.app_id"], int(h["harvest.batch"])) for h in history if "harvest.batch" in h)
        assert batches and max(batches.values()) == 1, f"{uri}: a batch committed twice: {batches}"
        assert len({app for app, _ in batches}) == 1
        assert {0, 1} <= {b for _, b in batches}  # (batch 1: committed by the first start, skipped by the second)

    # Time travel: the event table at its second commit, per polars and per delta-rs, holds exactly the
    # rows its first two commits added (the log's own counts).
    history = sorted(DeltaTable(events).history(), key=lambda h: h["version"])
    added = sum(int(h.get("operationMetrics", {}).get("num_added_rows", 0)) for h in history if h["version"] <= 1)
    then = pl.scan_delta(events, version=1).select("partition", "offset").collect().sort("partition", "offset")
    assert 0 < then.height == added < expected
    assert then.rows() == sorted(
        zip(
            *DeltaTable(events, version=1).to_pyarrow_table(columns=["partition", "offset"]).to_pydict().values(),
            strict=True,
        )
    )
