"""The Delta sink (spark_reader.delta_tables) on local Arrow tables, no Spark: each micro-batch committed
once per table by its app transaction, the latest-state MERGE's per-key maximum, a writing process SIGKILLed
at each kill point and replayed, upkeep racing the writer, and the tables read back by delta-rs and by
polars, at the newest and an earlier version.

The sink under a Spark driver's kill, end to end, is test_delta_pipeline.py.
"""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from harvest_outbox.spark_reader.delta_tables import (
    COMMIT_ATTEMPTS,
    KILL_ENV,
    DeltaOptions,
    DeltaTables,
    events_schema,
    kill_point,
    latest_per_key,
    upkeep,
)
from harvest_outbox.spark_reader.errors import ReaderConfigError, SparkReaderError
from harvest_outbox.spark_reader.pipeline import PipelineConfig

_T0 = dt.datetime(2026, 11, 29, tzinfo=dt.timezone.utc)


def _rows(spec: list[tuple[bytes | None, bytes | None, int, int]]) -> pa.Table:
    """(key, value, offset, ack_offset) -> rows of the event table's schema (partition 0)."""
    schema = events_schema()
    cols: dict[str, list[object]] = {n: [] for n in schema.names}
    for key, value, offset, ack in spec:
        row = {
            "key": key,
            "value": value,
            "headers": [{"key": "uuid", "value": b"u"}],
            "topic": "orders",
            "partition": 0,
            "offset": offset,
            "timestamp": _T0 + dt.timedelta(seconds=offset),
            "uuid": f"u-{offset}",
            "producer": b"pppppp",
            "clock": offset + 1,
            "ack_offset": ack,
        }
        for n in schema.names:
            cols[n].append(row[n])
    return pa.table(cols, schema=schema)


def _latest(uri: str) -> dict[bytes, tuple[bytes | None, int]]:
    from deltalake import DeltaTable

    t = DeltaTable(uri).to_pyarrow_table(columns=["key", "value", "offset"]).to_pylist()
    return {r["key"]: (r["value"], r["offset"]) for r in t}


def _batches_in_history(uri: str) -> list[tuple[str, int]]:
    from deltalake import DeltaTable

    meta = [h for h in DeltaTable(uri).history() if "harvest.batch" in h]
    return sorted((h["harvest.app_id"], int(h["harvest.batch"])) for h in meta)


def test_each_batch_is_committed_once_per_table_and_latest_keeps_the_max(tmp_path: Path) -> None:
    events, latest = str(tmp_path / "events"), str(tmp_path / "latest")
    tables = DeltaTables(events, latest, DeltaOptions(optimize_every=0))
    first = _rows([(b"a", b"a1", 0, 1), (b"b", b"b1", 2, 3), (b"a", b"a2", 4, 5), (None, b"x", 6, 6)])
    assert tables.write_batch(first, "app-1", 0).events_committed
    assert _latest(latest) == {b"a": (b"a2", 4), b"b": (b"b1", 2)}  # null keys are not in latest

    # A replay of batch 0 (the driver died after the commits, before Spark's checkpoint commit): no commit.
    replay = tables.write_batch(_rows([(b"a", b"REPLAY", 99, 99)]), "app-1", 0)
    assert (replay.events_committed, replay.latest_committed) == (False, False)
    # An older row (a backfill, a late partition) never replaces a newer one; a tombstone is a row.
    tables.write_batch(_rows([(b"a", b"a0", 0, 1), (b"b", b"b2", 7, 8), (b"c", None, 9, 9)]), "app-1", 1)
    assert _latest(latest) == {b"a": (b"a2", 4), b"b": (b"b2", 7), b"c": (None, 9)}
    # Same ack_offset: the greater offset wins (rows of one harvest transaction).
    tables.write_batch(_rows([(b"c", b"c1", 10, 9)]), "app-1", 2)
    assert _latest(latest)[b"c"] == (b"c1", 10)
    # A new checkpoint (a new query id) starts again at batch 0: not mistaken for a replay.
    assert tables.write_batch(_rows([(b"d", b"d1", 11, 11)]), "app-2", 0).events_committed
    # An empty micro-batch commits nothing.
    assert not tables.write_batch(_rows([]), "app-2", 1).events_committed

    from deltalake import DeltaTable

    assert DeltaTable(events).transaction_version("app-1") == 2
    assert DeltaTable(latest).transaction_version("app-2") == 0
    assert DeltaTable(events).to_pyarrow_table().num_rows == 4 + 3 + 1 + 1
    expected = [("app-1", 0), ("app-1", 1), ("app-1", 2), ("app-2", 0)]
    assert _batches_in_history(events) == _batches_in_history(latest) == expected


def test_a_replay_after_the_event_tables_commit_alone_merges_the_latest_state_once(tmp_path: Path) -> None:
    """The driver died between the two tables' commits (the ``between-tables`` kill point): the replay of the
    batch skips the event table and merges the latest-state table, each commit once."""
    from deltalake import DeltaTable

    events, latest = str(tmp_path / "events"), str(tmp_path / "latest")
    tables = DeltaTables(events, latest, DeltaOptions(optimize_every=0))
    tables.write_batch(_rows([(b"a", b"a1", 0, 0)]), "app", 0)
    batch = _rows([(b"a", b"a2", 1, 1), (b"b", b"b1", 2, 2)])
    assert tables._append(batch, "app", 1)  # the event table's commit of batch 1, then the kill
    assert _latest(latest) == {b"a": (b"a1", 0)}
    replay = tables.write_batch(batch, "app", 1)
    assert (replay.events_committed, replay.latest_committed) == (False, True)
    assert _latest(latest) == {b"a": (b"a2", 1), b"b": (b"b1", 2)}
    assert DeltaTable(events).to_pyarrow_table().num_rows == 3
    assert _batches_in_history(events) == _batches_in_history(latest) == [("app", 0), ("app", 1)]


def test_read_back_by_polars_at_the_newest_and_an_earlier_version(tmp_path: Path) -> None:
    """polars reads the Parquet files itself (its own reader and engine) from the snapshot delta-rs's log
    replay lists; time travel to version 0 shows the first batch only, as delta-rs does."""
    import polars as pl
    from deltalake import DeltaTable

    events = str(tmp_path / "events")
    tables = DeltaTables(events, str(tmp_path / "latest"), DeltaOptions(optimize_every=0))
    tables.write_batch(_rows([(b"a", b"1", 0, 0), (b"b", b"1", 1, 1)]), "app", 0)
    tables.write_batch(_rows([(b"a", b"2", 2, 2)]), "app", 1)

    now = pl.read_delta(events).sort("offset")
    assert now["value"].to_list() == [b"1", b"1", b"2"]
    assert now.schema["timestamp"] == pl.Datetime("us", "UTC") and now.schema["partition"] == pl.Int32
    then = pl.scan_delta(events, version=0).select("key", "offset").sort("offset").collect()
    assert then.rows() == [(b"a", 0), (b"b", 1)]
    assert DeltaTable(events, version=0).to_pyarrow_table().num_rows == 2


def test_latest_per_key_takes_the_max_by_ack_offset_then_offset() -> None:
    rows = _rows([(b"k", b"1", 5, 9), (b"k", b"2", 7, 9), (b"j", b"1", 8, 8), (b"k", b"0", 9, 3), (None, b"n", 1, 1)])
    out = latest_per_key(rows).to_pylist()
    assert sorted((r["key"], r["value"]) for r in out) == [(b"j", b"1"), (b"k", b"2")]
    assert latest_per_key(_rows([])).num_rows == 0


def test_upkeep_racing_the_writer_loses_no_row(tmp_path: Path) -> None:
    """OPTIMIZE and VACUUM (retention 0: the removed files go at once) in a loop in another thread while
    30 micro-batches are written: the MERGE rewrites the files OPTIMIZE compacts, so their commits
    conflict; each loser is retried on the newer version. Every row stays, once; a log checkpoint is made."""
    events, latest = str(tmp_path / "events"), str(tmp_path / "latest")
    tables = DeltaTables(events, latest, DeltaOptions(optimize_every=0))
    tables.write_batch(_rows([(b"k0", b"0", 0, 0)]), "app", 0)
    opts = DeltaOptions(vacuum_retention_hours=0)
    done = threading.Event()
    runs: list[dict[str, object]] = []
    errors: list[BaseException] = []

    gave_up: list[str] = []

    def keep_up() -> None:
        while not done.is_set():
            for uri in (events, latest):
                try:
                    runs.append(upkeep(uri, opts))
                except SparkReaderError as exc:
                    # A step that lost COMMIT_ATTEMPTS races in a row gives up, naming the fix: what upkeep in a
                    # loop against a MERGE per batch can come to on a loaded machine (the VACUUM's conflict is
                    # real: with retention 0 it would delete the files a MERGE just added). Rows must not care.
                    if f"failed {COMMIT_ATTEMPTS} times in a row" not in str(exc):
                        errors.append(exc)
                    gave_up.append(str(exc)[:60])
                except BaseException as exc:
                    errors.append(exc)
                    return

    worker = threading.Thread(target=keep_up)
    worker.start()
    try:
        for b in range(1, 31):
            tables.write_batch(_rows([(f"k{b % 4}".encode(), str(b).encode(), b, b)]), "app", b)
    finally:
        done.set()
        worker.join()
    assert not errors, errors
    assert len(runs) + len(gave_up) >= 2, "the upkeep never raced the writer"
    runs.extend(upkeep(uri, opts) for uri in (events, latest))
    from deltalake import DeltaTable

    offsets = DeltaTable(events).to_pyarrow_table(columns=["offset"])["offset"].to_pylist()
    assert sorted(offsets) == list(range(31))
    assert _latest(latest) == {f"k{k}".encode(): (str(b).encode(), b) for k, b in ((1, 29), (2, 30), (3, 27), (0, 28))}
    assert sum(int(r["files_removed"] or 0) for r in runs) > 0  # the upkeep did compact
    assert len(list((tmp_path / "events" / "_delta_log").glob("*.checkpoint.parquet"))) >= 1
    assert _batches_in_history(events) == _batches_in_history(latest) == [("app", b) for b in range(31)]


def test_the_upkeep_command_compacts_a_table(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    from harvest_outbox.spark_reader.delta_tables import main

    events = str(tmp_path / "events")
    tables = DeltaTables(events, str(tmp_path / "latest"), DeltaOptions(optimize_every=3))
    for b in range(3):  # the third batch runs the pipeline's own upkeep (optimize_every=3)
        tables.write_batch(_rows([(b"k", str(b).encode(), b, b)]), "app", b)
    assert len(DeltaTable(events).file_uris()) == 1
    tables.write_batch(_rows([(b"k", b"3", 3, 3)]), "app", 3)
    assert len(DeltaTable(events).file_uris()) == 2
    assert main([events, "--vacuum-retention-hours", "0"]) == 0
    assert len(DeltaTable(events).file_uris()) == 1
    assert len(list((tmp_path / "events").glob("*.parquet"))) == 1  # VACUUM deleted the compacted files
    assert main([events, "--target-file-size-mib", "0"]) == 2


@pytest.mark.parametrize(
    ("spec", "point", "batch", "fires"),
    [
        ("before-commit:3", "before-commit", 2, False),
        ("before-commit:3", "before-commit", 3, True),
        ("before-commit:3", "before-commit", 4, True),  # batch 3 was empty: the next one with rows
        ("before-commit:3", "after-commit", 3, False),
        ("between-tables:0", "between-tables", 0, True),
    ],
)
def test_the_kill_hook_fires_only_at_its_point(
    monkeypatch: pytest.MonkeyPatch, spec: str, point: str, batch: int, fires: bool
) -> None:
    import os

    killed: list[tuple[str, int, int]] = []
    monkeypatch.setenv(KILL_ENV, spec)
    monkeypatch.setattr(os, "killpg", lambda pid, sig: killed.append(("group", pid, sig)))
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append(("process", pid, sig)))
    kill_point(point, batch)
    assert bool(killed) == fires
    if fires:
        assert killed[-1] == ("process", os.getpid(), 9)


def test_a_bad_kill_hook_or_option_names_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KILL_ENV, "sometime:3")
    with pytest.raises(ReaderConfigError, match=f"{KILL_ENV}='sometime:3'"):
        kill_point("before-commit", 3)
    with pytest.raises(ReaderConfigError, match="optimize_every=-1"):
        DeltaOptions(optimize_every=-1)
    kafka = {"kafka.bootstrap.servers": "b:9092"}
    with pytest.raises(ReaderConfigError, match="format='orc'"):
        PipelineConfig.under("/p", "t", kafka, format="orc")
    with pytest.raises(ReaderConfigError, match=r"events_path='s3a://b/p/events'.*Fix: write s3://"):
        PipelineConfig.under("s3a://b/p", "t", kafka, format="delta")
    # Delta collects micro-batches to the driver: bounded by default; Parquet's stay unbounded.
    assert PipelineConfig.under("/p", "t", kafka, format="delta").micro_batch_bound == 200_000
    assert PipelineConfig.under("/p", "t", kafka).micro_batch_bound is None


def test_a_table_of_another_schema_is_refused_with_the_fix(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    from harvest_outbox.spark_reader.errors import SparkReaderError

    events = str(tmp_path / "events")
    write_deltalake(events, pa.table({"id": [1]}))
    tables = DeltaTables(events, str(tmp_path / "latest"), DeltaOptions(optimize_every=0))
    with pytest.raises(SparkReaderError, match=r"not the readers' schema.*Fix: write to a new table path"):
        tables.write_batch(_rows([(b"a", b"1", 0, 0)]), "app", 0)


# A writer process: batches <first>..<last> of a fixed sequence (batch b: keys k0..k3, offsets 4b..4b+3),
# each through DeltaTables.write_batch under one app id, as a driver replaying from its checkpoint would.
_WRITER = """
import sys
from pathlib import Path
sys.path.insert(0, {here!r})
from test_delta_tables import _batch
from harvest_outbox.spark_reader.delta_tables import DeltaOptions, DeltaTables
events, latest, first, last = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
tables = DeltaTables(events, latest, DeltaOptions(optimize_every=0))
for b in range(first, last + 1):
    tables.write_batch(_batch(b), "harvest-pipeline:q", b)
"""


def _batch(b: int) -> pa.Table:
    return _rows([(f"k{i}".encode(), f"v{b}".encode(), 4 * b + i, 4 * b + 3) for i in range(4)])


@pytest.mark.parametrize("point", ["before-commit", "between-tables", "after-commit"])
def test_a_writer_killed_at_each_point_and_replayed_writes_each_batch_once(point: str, tmp_path: Path) -> None:
    """A real SIGKILL of the writing process at the kill point of batch 2, then a new process replaying from
    batch 2 (Spark re-runs the batch whose checkpoint commit did not happen) through batch 4: every batch's
    rows in the event table once, the latest-state table at batch 4's values, each (app id, batch) in one
    commit per table. The same sink under a Spark driver killed at ``after-commit`` on local-cluster is
    test_delta_pipeline.py's."""
    import os
    import subprocess
    import sys

    from deltalake import DeltaTable

    events, latest = str(tmp_path / "events"), str(tmp_path / "latest")
    script = tmp_path / "writer.py"
    script.write_text(_WRITER.format(here=str(Path(__file__).parent)))
    env = {k: v for k, v in os.environ.items() if k != KILL_ENV}

    def writer(first: int, last: int, kill: str | None) -> int:
        run_env = {**env, **({KILL_ENV: kill} if kill else {})}
        proc = subprocess.run(
            [sys.executable, str(script), events, latest, str(first), str(last)],
            env=run_env,
            capture_output=True,
            text=True,
            timeout=120,
            start_new_session=True,  # the hook kills its process group: this process's alone
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc.returncode

    assert writer(0, 4, f"{point}:2") == -9
    committed = {h["harvest.batch"] for h in DeltaTable(events).history() if "harvest.batch" in h}
    assert committed == ({"0", "1"} if point == "before-commit" else {"0", "1", "2"})
    assert writer(2, 4, None) == 0

    rows = DeltaTable(events).to_pyarrow_table(columns=["offset"])["offset"].to_pylist()
    assert sorted(rows) == list(range(20)), "a batch missing or written twice"
    assert _latest(latest) == {f"k{i}".encode(): (b"v4", 16 + i) for i in range(4)}
    expected = [("harvest-pipeline:q", b) for b in range(5)]
    assert _batches_in_history(events) == _batches_in_history(latest) == expected
