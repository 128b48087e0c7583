"""The demo (``./dev demo``), small, on the suite's services, and its backlog phase's building block.

- ``stash_backlog`` continues every key's versions in one transaction, so backlog rows fall under
  the same ground truth (``accounts``) as the live writers' rows;
- the demo's whole job (live writers, kill -9 of the leader, backlog phase, the consumer and the
  Spark pipeline, whose driver is killed once too) ends with every row, backlog included, delivered
  exactly once and in per-key order to the consumer's table and the pipeline's Parquet table, the
  latest-state table equal to the outbox's versions, and the per-phase table reports the backlog's
  drain rate.
"""

from __future__ import annotations

import json

import psycopg
import pytest
from psycopg import sql

from harvest_outbox.harvest_local._lanes import char_seconds
from harvest_outbox.harvest_local.demo import (
    BacklogPhase,
    DemoOptions,
    DemoResult,
    PipelineRun,
    Run,
    _plot,
    mark_layout,
    phase_table,
    rate_series,
    run_demo,
    table_series,
)
from harvest_outbox.harvest_local.pipeline_process import CommittedFile
from harvest_outbox.harvest_local.workload import WriterStats, committed_versions, create_accounts, stash_backlog
from harvest_outbox.producer.schema.ddl import init_db

# The backlog phase's rows in the end-to-end run: enough for both drain rates to be measured over a few
# of the sampler's ticks (./dev demo commits 100,000); 20,000 took ~100 s of the suite on two cores.
BACKLOG = 5_000


def _result(backlog: BacklogPhase | None, run: Run | None = None) -> DemoResult:
    """A synthetic run: 3,000 live rows at 300 rows/s, then (optionally) the backlog. Pass the ``run``
    the backlog's times were taken from: the synthetic times are offsets from its clocks, so a slow
    moment between the two (a loaded machine) cannot reorder them."""
    run = run if run is not None else Run()
    now, mono = run.wall, run.started
    stats = WriterStats(committed=3000, commit_times=[mono + i / 300 for i in range(3000)])
    applied: list[tuple[str, int, float | None, float]] = [
        (f"key-{i % 7}", i // 7 + 1, now + i / 300, now + i / 300 + 0.05) for i in range(3000)
    ]
    if backlog is not None:
        applied += [
            (f"key-{i % 7}", 1000 + i, None, backlog.committed_at + 0.5 + i / 12_500) for i in range(backlog.rows)
        ]
    return DemoResult(run, [], 3000 + (backlog.rows if backlog else 0), 0, stats, 10.0, None, applied, backlog)


def test_phase_table_reports_each_phase_rate_and_the_plot_draws(tmp_path) -> None:
    run = Run()
    committed = run.wall + 12
    samples = [(committed + 0.1 * j, max(50_000 - 3000 * j, 0)) for j in range(1, 18)]
    result = _result(BacklogPhase(50_000, committed, relay_seconds=2.0, consumer_seconds=4.0, samples=samples), run)
    lines = phase_table(result).splitlines()
    assert lines[0].split() == ["phase", "rows", "seconds", "rows/s"]
    assert lines[2].split()[-3:] == ["3000", "10.0", "300"]
    assert lines[4].split()[-3:] == ["50000", "2.0", "25,000"]
    assert lines[5].split()[-3:] == ["50000", "4.0", "12,500"]
    assert _plot(result, tmp_path / "with-backlog.png") == tmp_path / "with-backlog.png"
    assert (tmp_path / "with-backlog.png").stat().st_size > 10_000
    # Without a backlog: no backlog rows in the table, and the plot still draws.
    assert "backlog" not in phase_table(_result(None))
    assert _plot(_result(None), tmp_path / "live.png") == tmp_path / "live.png"


def test_each_reader_is_a_continuous_series_and_every_fault_is_marked(tmp_path) -> None:
    """The plot's series (issue #45): rows in each table over time, one unbroken non-decreasing line from 0
    to the table's final count, extended to the run's end; the Spark table's rate is a step per micro-batch
    with no gap between batches; every fault the run marked is on the plot with its label."""
    run = Run()
    committed = run.wall + 12
    samples = [(committed + 0.1 * j, max(20_000 - 3000 * j, 0)) for j in range(1, 9)]
    result = _result(BacklogPhase(20_000, committed, relay_seconds=1.0, consumer_seconds=2.0, samples=samples), run)
    wall = run.wall
    files = [CommittedFile(f"f{i}", wall + 2 + 2.5 * i, 500) for i in range(6)]  # ten seconds of live batches
    files += [CommittedFile(f"g{i}", committed + 3.2 + i, 4000) for i in range(5)]  # the backlog's batches
    files += [CommittedFile("g0-part2", committed + 3.4, 1000)]  # a second file of one micro-batch
    result.pipeline = PipelineRun(files, 4.3, 2, True)
    for t, label, group in [
        (4.0, "kill -9 relay-0 (leader)", "relay"),
        (4.2, "kill -9 Spark driver", "spark"),
        (4.4, "kill -9 Kafka node 2", "kafka"),
        (9.0, "relay-1 leads (5.0 s)", "relay"),
    ]:
        run.marks.append((t, label, group))
        run.events.append((t, label))

    tables = table_series(result)
    expected_end = {
        "committed to the outbox (writers, then the backlog)": 3000 + 20_000,
        "in the consumer's table (ReadCommittedIter)": 3000 + 20_000,
        "in the Spark pipeline's table (Parquet)": 6 * 500 + 5 * 4000 + 1000,
    }
    assert set(tables) == set(expected_end)
    end = max(xs[-1] for xs, _ in tables.values())
    for name, (xs, ys) in tables.items():
        assert xs == sorted(xs) and ys == sorted(ys), name  # one unbroken, non-decreasing line
        assert (ys[0], ys[-1]) == (0, expected_end[name]) and xs[-1] == end, name
        assert all(y == y for y in ys), name  # no NaN: no gap
    xs, ys = rate_series(result)["into the Spark pipeline's table (per micro-batch)"]
    assert xs == sorted(xs) and all(y == y for y in ys)
    # eleven micro-batches (the two files written 0.2 s apart are one), each a step over its interval
    assert len(xs) == len(ys) == 12 and ys[-1] == 0  # contiguous intervals, back to 0 after the last
    assert ys[0] == pytest.approx(500 / 1.0)  # the first batch over the second before it (no start mark)
    assert ys[5] == pytest.approx(500 / 2.5) and ys[7] == pytest.approx(4000 / 1.0)
    xs, ys = rate_series(result)["backlog drained by the relay"]
    # each drop of the outbox's count over the 0.1 s since the previous one (wall-clock floats: ~1e-6 s apart)
    assert xs == sorted(xs) and len(xs) == 1 + 7
    assert ys == pytest.approx([3000 / 0.1] * 6 + [2000 / 0.1, 0.0], rel=1e-3)

    run.marks.append((end - 0.1, "Spark pipeline: every row in its table", "phase"))  # at the right edge
    layout = mark_layout(run, end)
    assert sorted(m[1] for m in layout) == sorted(label for _, label, _ in run.marks)
    char = char_seconds(end * 1.02, 11.0 * 0.85, 7.5)
    placed = [
        (t, t + char * len(label), lane) if after else (t - char * len(label), t, lane)
        for t, label, _, lane, after in layout
    ]
    for i, (a0, a1, lane_a) in enumerate(placed):  # the three kills 0.2 s apart: no label over another
        for b0, b1, lane_b in placed[i + 1 :]:
            assert lane_a != lane_b or a1 <= b0 or b1 <= a0
        assert 0 <= a0 and a1 <= end * 1.02  # inside the axis
    assert len({m[3] for m in layout[:3]}) == 3
    assert [m[4] for m in layout][-1] is False  # the last label sits before its mark, not past the axis
    path = _plot(result, tmp_path / "timeline.png")
    assert path is not None and path.stat().st_size > 20_000


@pytest.mark.integration
def test_stash_backlog_continues_each_keys_versions(pg_dsn: str, pg_schema: str) -> None:
    outbox = f"{pg_schema}.outbox"
    create_accounts(pg_dsn, pg_schema, 7)
    init_db(pg_dsn, outbox)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # as if live writers had committed these
        conn.execute(
            sql.SQL("UPDATE {} SET version = 3 WHERE key IN ('key-1', 'key-4')").format(
                sql.Identifier(pg_schema, "accounts")
            )
        )

    backlog = stash_backlog(pg_dsn, pg_schema, outbox, "topic-a", keys=7, rows=100)

    assert backlog.rows == 100
    # 100 rows over 7 keys: 14 each, the first two keys in sorted order one more.
    share = {"key-0": 15, "key-1": 15, "key-2": 14, "key-3": 14, "key-4": 14, "key-5": 14, "key-6": 14}
    truth = committed_versions(pg_dsn, pg_schema)
    assert truth == {k: n + (3 if k in ("key-1", "key-4") else 0) for k, n in share.items()}
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values FROM {} ORDER BY id"
            ).format(sql.Identifier(pg_schema, "outbox"))
        ).fetchall()
    assert len(rows) == 100
    by_key: dict[str, list[int]] = {}
    for topic, key, value, hkeys, hvalues in rows:
        body = json.loads(value)
        assert (topic, body["key"], body["ts"], hkeys, hvalues) == ("topic-a", key, None, ["phase"], ["backlog"])
        by_key.setdefault(key, []).append(body["version"])
    for key, versions in by_key.items():  # id order is commit order: versions ascend from the last live one
        first = 4 if key in ("key-1", "key-4") else 1
        assert versions == list(range(first, truth[key] + 1)), key
    # Keys interleave round-robin (many aggregates), not one key's block after another's.
    assert [r[1] for r in rows[:7]] == sorted(share)
    # Analyzed in the same transaction: the planner knows the backlog is there (see stash_backlog).
    with psycopg.connect(pg_dsn) as conn:
        reltuples = conn.execute(
            "SELECT reltuples FROM pg_class WHERE oid = %s::regclass", (f"{pg_schema}.outbox",)
        ).fetchone()[0]  # type: ignore[index]
    assert reltuples == 100


@pytest.mark.integration
def test_stash_backlog_rejects_bad_input(pg_dsn: str, pg_schema: str) -> None:
    outbox = f"{pg_schema}.outbox"
    create_accounts(pg_dsn, pg_schema, 3)
    init_db(pg_dsn, outbox)
    with pytest.raises(ValueError, match="rows=0"):
        stash_backlog(pg_dsn, pg_schema, outbox, "t", keys=3, rows=0)
    with pytest.raises(ValueError, match="'key-3' is not in"):
        stash_backlog(pg_dsn, pg_schema, outbox, "t", keys=4, rows=10)
    assert committed_versions(pg_dsn, pg_schema) == {}  # the failed transaction left nothing behind


def test_demo_options_name_the_bad_field() -> None:
    with pytest.raises(ValueError, match="backlog: -1"):
        DemoOptions(backlog=-1)
    with pytest.raises(ValueError, match="keys: 0"):
        DemoOptions(keys=0)
    with pytest.raises(ValueError, match=r"spark_master: 'yarn': pass local\[N\] or local-cluster"):
        DemoOptions(spark_master="yarn")
    with pytest.raises(ValueError, match="pipeline_format: 'iceberg': pass parquet or delta"):
        DemoOptions(pipeline_format="iceberg")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.spark
def test_demo_backlog_phase_is_verified_by_both_readers(services, pg_schema: str, tmp_path) -> None:
    """The demo end to end: writers committing and rolling back, the relay leader killed -9, the Spark
    pipeline's driver killed -9 while rows flow and restarted from its checkpoints, a backlog; both readers'
    tables verified row by row. The driver runs on local-cluster with one executor JVM, which the kill
    takes with it (the pipeline's scenario of its own, merged here: both ran the same relays, writers and
    verification). The pipeline's checkpoint and latest-state table are test_pipeline.py's."""
    opts = DemoOptions(
        rows=600,
        keys=30,
        partitions=3,
        writers=3,
        rate=600.0,
        backlog=BACKLOG,
        schema=pg_schema,
        spark_master="local-cluster[1,1,1024]",
    )

    result = run_demo(services.endpoints, opts, tmp_path)

    backlog = result.backlog
    assert backlog is not None and backlog.rows == BACKLOG
    assert result.takeover is not None, "the leader was not killed"
    assert result.expected == result.stats.committed + BACKLOG
    assert [v.reader for v in result.verdicts] == ["ReadCommittedIter -> Postgres", "Spark pipeline -> Parquet table"]
    for verdict in result.verdicts:
        assert verdict.ok, f"{verdict} (logs in {tmp_path})"
        assert verdict.delivered == verdict.expected == result.expected
    # The Spark stage streamed through both phases, its driver killed once and restarted from its checkpoint.
    pipeline = result.pipeline
    assert pipeline is not None and pipeline.killed_at is not None and pipeline.starts == 2
    assert pipeline.latest_matches is True, f"latest-state table differs from the outbox (logs in {tmp_path})"
    assert sum(f.rows for f in pipeline.files) == result.expected
    # The backlog rows themselves reached the consumer's table, once each, after the live rows of their key.
    backlog_rows = [(k, v) for k, v, written, _ in result.applied if written is None]
    assert len(backlog_rows) == len(set(backlog_rows)) == BACKLOG
    live_max: dict[str, int] = {}
    for k, v, written, _ in result.applied:
        if written is not None:
            live_max[k] = max(live_max.get(k, 0), v)
    assert all(v > live_max.get(k, 0) for k, v in backlog_rows)
    # Both drain rates are measured and shown in the per-phase table.
    assert backlog.relay_rate is not None and backlog.relay_rate > 0
    assert backlog.consumer_rate is not None and backlog.consumer_rate > 0
    assert backlog.samples[-1][1] == 0
    table = phase_table(result)
    print("\n" + table)
    assert "backlog: drained by the relay" in table and f"{backlog.relay_rate:,.0f}" in table
    assert "backlog: applied by the consumer" in table and f"{backlog.consumer_rate:,.0f}" in table
