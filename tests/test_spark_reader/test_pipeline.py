"""The streaming pipeline's parts (spark_reader.pipeline): the latest-state table's idempotence across
crashes, its config, a checkpoint left by a driver killed mid-write.

The pipeline end to end (writers committing and rolling back, the relay leader and the driver killed -9,
the driver on local-cluster so that its executor JVMs die with it, both tables verified row by row) is the
demo's test, tests/test_e2e/test_demo.py.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import pytest

from harvest_outbox.spark_reader.errors import ReaderConfigError, SparkReaderError
from harvest_outbox.spark_reader.latest_table import LatestStateTable, read_latest
from harvest_outbox.spark_reader.pipeline import PipelineConfig

pytestmark = [pytest.mark.spark]

_SCHEMA = "key BINARY, value BINARY, partition INT, offset LONG, ack_offset LONG"


def _rows(spark, rows):
    return spark.createDataFrame(rows, _SCHEMA)


def _table(df) -> dict[bytes, tuple[bytes | None, int]]:
    return {bytes(r.key): (r.value and bytes(r.value), r.offset) for r in df.collect()}


def test_latest_state_table_merges_each_batch_once_across_crashes(spark, tmp_path: Path) -> None:
    table = LatestStateTable(spark, str(tmp_path / "latest"), keep=2)
    assert table.last_commit() is None
    first = _rows(
        spark, [(b"a", b"a1", 0, 0, 1), (b"b", b"b1", 0, 2, 3), (b"a", b"a2", 0, 4, 5), (None, b"x", 0, 6, 6)]
    )
    assert table.apply_stream_batch(first, 0)
    assert _table(table.read()) == {b"a": (b"a2", 4), b"b": (b"b1", 2)}  # null keys are not in the table

    # The driver died after our commit, before Spark's checkpoint commit: Spark replays batch 0.
    assert not table.apply_stream_batch(_rows(spark, [(b"a", b"REPLAY", 0, 99, 99)]), 0)
    assert _table(table.read()) == {b"a": (b"a2", 4), b"b": (b"b1", 2)}

    # The driver died after writing version 1's files, before its commit: the folder holds junk that
    # no reader sees, and the replay of batch 1 replaces it.
    _rows(spark, [(b"junk", b"junk", 0, 0, 0)]).write.parquet(table.version_path(1))
    assert _table(table.read()) == {b"a": (b"a2", 4), b"b": (b"b1", 2)}
    assert table.apply_stream_batch(_rows(spark, [(b"b", b"b2", 0, 7, 8), (b"c", None, 0, 9, 9)]), 1)
    assert _table(table.read()) == {b"a": (b"a2", 4), b"b": (b"b2", 7), b"c": (None, 9)}  # a tombstone is a row

    # A backfill of older rows changes no key (max by (ack_offset, offset)); it keeps the batch marker.
    version = table.merge(_rows(spark, [(b"a", b"a1", 0, 0, 1), (b"d", b"d1", 0, 1, 1)]))
    assert version == 2 and table.last_commit().stream_batch == 1
    assert _table(read_latest(spark, table.path)) == {
        b"a": (b"a2", 4),
        b"b": (b"b2", 7),
        b"c": (None, 9),
        b"d": (b"d1", 1),
    }
    # keep=2: versions 1 and 2 stay, version 0 is gone.
    assert sorted(p.name for p in (tmp_path / "latest").iterdir() if p.name.startswith("version-")) == [
        "version-00000000000000000001",
        "version-00000000000000000002",
    ]
    # A second writer of a committed version fails rather than overwrite it.
    with pytest.raises(SparkReaderError, match="already exists"):
        table._create(table._commit_path(2), "{}")


def test_read_latest_of_an_uncommitted_table_is_a_clear_error(spark, tmp_path: Path) -> None:
    with pytest.raises(ReaderConfigError, match="no committed version yet"):
        read_latest(spark, str(tmp_path / "nothing"))


_KAFKA = {"kafka.bootstrap.servers": "localhost:9092"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"topic": ""}, "topic=''"),
        ({"kafka": {}}, "'kafka.bootstrap.servers' is missing"),
        ({"events_path": " "}, "events_path=' '"),
        ({"latest_path": "/t/events"}, "must differ"),
        ({"trigger_seconds": 0}, "trigger_seconds=0"),
    ],
)
def test_pipeline_config_names_the_bad_field(change: dict, message: str) -> None:
    fields = {
        "topic": "t",
        "kafka": _KAFKA,
        "events_path": "/t/events",
        "latest_path": "/t/latest",
        "checkpoint_location": "/t/checkpoint",
        "state_location": "/t/state",
        **change,
    }
    with pytest.raises(ReaderConfigError, match=message):
        PipelineConfig(**fields)


def test_a_local_reader_of_the_latest_table_survives_the_cleanup_racing_it(tmp_path: Path) -> None:
    """A slow reader finds its version deleted (newer versions committed meanwhile): it reads the
    newest one instead; a missing folder of the newest commit itself is an error, not a retry."""
    from harvest_outbox.spark_reader.latest_table import read_local_snapshot

    def commit(version: int) -> str:
        folder = tmp_path / f"version-{version:020d}"
        folder.mkdir()
        (tmp_path / "_commits").mkdir(exist_ok=True)
        (tmp_path / "_commits" / f"{version:020d}").write_text(json.dumps({"version": version}))
        return str(folder)

    assert read_local_snapshot(str(tmp_path)) is None
    first = commit(3)
    reads: list[str] = []

    def read(folder: str, columns: list[str] | None = None) -> str:
        reads.append(folder)
        if folder == first:  # the writer commits 4 and 5 and cleans 3 while we read 3
            commit(4), commit(5)
            raise FileNotFoundError(folder)
        return folder

    assert read_local_snapshot(str(tmp_path), read=read) == str(tmp_path / f"version-{5:020d}")
    assert reads == [first, str(tmp_path / f"version-{5:020d}")]

    def gone(folder: str, columns: list[str] | None = None) -> str:
        raise FileNotFoundError(folder)

    with pytest.raises(FileNotFoundError):
        read_local_snapshot(str(tmp_path), read=gone)


def test_pipeline_config_under_one_root() -> None:
    cfg = PipelineConfig.under("s3a://bucket/p/", "orders", _KAFKA, trigger_seconds=5.0)
    assert (cfg.events_path, cfg.latest_path, cfg.checkpoint_location, cfg.state_location) == (
        "s3a://bucket/p/events",
        "s3a://bucket/p/latest",
        "s3a://bucket/p/checkpoint",
        "s3a://bucket/p/state",
    )


# -- end to end ----------------------------------------------------------------------------------------


def test_a_driver_killed_while_writing_its_first_offsets_starts_again(spark, tmp_path: Path) -> None:
    """A kill between Spark's write of ``.0.<uuid>.tmp`` and its rename leaves the temporary file in
    ``offsets/``; Spark then refuses batch 0 (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY) on every restart
    (seen: the pipeline gave up after 4 starts). :func:`drop_stale_log_files` deletes such files, only those."""
    from harvest_outbox.spark_reader.pipeline import drop_stale_log_files

    checkpoint = tmp_path / "checkpoint"
    offsets, commits = checkpoint / "offsets", checkpoint / "commits"
    offsets.mkdir(parents=True)
    commits.mkdir()
    stale = f".0.{uuid.uuid4()}.tmp"
    (offsets / stale).write_text('v1\n{"batchWatermarkMs":0}\n')
    (offsets / f".{stale}.crc").write_bytes(b"crc")

    def run_once() -> BaseException | None:
        query = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", 10)
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        try:
            deadline = time.monotonic() + 60
            while query.isActive and query.lastProgress is None and time.monotonic() < deadline:
                time.sleep(0.1)
            return query.exception() if not query.isActive else None
        finally:
            query.stop()

    refused = run_once()
    assert refused is not None and "should be empty on batch 0" in str(refused), refused
    assert drop_stale_log_files(spark, str(checkpoint)) == [f"offsets/{stale}"]  # its .crc goes with it
    assert not (offsets / stale).exists() and not (offsets / f".{stale}.crc").exists()
    assert run_once() is None  # it runs now, from batch 0
    kept = sorted(p.name for p in offsets.iterdir() if not p.name.startswith("."))
    assert kept and kept[0] == "0"
    # Real log entries are never touched; a stop that interrupted a write of its own (seen on a loaded
    # machine) may have left a temporary file, which goes as the first one did.
    dropped = drop_stale_log_files(spark, str(checkpoint))
    assert all(re.fullmatch(r"(offsets|commits)/\.\d+\.[0-9a-f-]{36}\.tmp", d) for d in dropped), dropped
    assert sorted(p.name for p in offsets.iterdir() if not p.name.startswith(".")) == kept
