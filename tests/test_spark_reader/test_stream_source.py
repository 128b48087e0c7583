"""readCommittedStream(state_location=...): the state files (stream_state's invariants), the
argument's errors, bounded micro-batches, pruning, and a clear failure when state files are lost.
Exactly-once across restarts and checkpoint interchange run in test_stream.py for both ways of
keeping state."""

from __future__ import annotations

import shutil

import pytest
from sequenced_log import write_log

from harvest_outbox.sequencer import ProducerState
from harvest_outbox.spark_reader import ReaderConfigError, StreamStateError, readCommittedStream
from harvest_outbox.spark_reader.stream_state import StreamStateFiles, check_state_location


def _states(topic: str, partition: int) -> list[ProducerState]:
    journal = f"{topic}/{partition}"
    return [
        ProducerState(journal, b"\x01\x02\x03\x04\x05\x07", 123456789, -1),
        ProducerState(journal, b"\xaa\xbb\xcc\xdd\xee\xff", 987654321, 42),
    ]


@pytest.mark.parametrize("uri", [False, True], ids=["path", "file-uri"])
def test_state_files_round_trip_overwrite_and_prune(tmp_path, uri: bool) -> None:
    location = f"file://{tmp_path}" if uri else str(tmp_path)
    files = StreamStateFiles(location, StreamStateFiles.new_run())
    for offset in (0, 10, 25):
        files.put(3, offset, _states("t", 3))
    files.put(3, 25, _states("t", 3))  # a retried task writes the same states again: harmless
    assert files.get("t", 3, 25) == _states("t", 3)
    assert files.prune(3, 25) == 2  # only below the committed offset
    assert files.get("t", 3, 25) == _states("t", 3)
    with pytest.raises(StreamStateError, match=r"no sequencing state for t/3 at offset 10 .*Fix:"):
        files.get("t", 3, 10)
    assert not [p for p in tmp_path.rglob(".*")]  # no temporary file left behind
    other = StreamStateFiles(location, StreamStateFiles.new_run())  # another query's run: its own files
    with pytest.raises(StreamStateError):
        other.get("t", 3, 25)


def test_state_location_that_cannot_be_opened_names_the_fix(tmp_path) -> None:
    with pytest.raises(ReaderConfigError, match=r"state_location='nosuch://x/y' cannot be opened.*Fix:"):
        StreamStateFiles("nosuch://x/y", "run").put(0, 0, [])


def _state_location_cases(tmp_path):  # type: ignore[no-untyped-def]
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    return {
        "empty": ("", r"state_location='': not a folder path or URI"),
        "int": (5, r"state_location=5: not a folder path or URI"),
        "a-file": (str(a_file), rf"state_location='{a_file}': '{a_file}' is a file\. Fix: pass a folder"),
        "dev-null": ("/dev/null", r"'/dev/null' is not a folder \(a device"),
        "under-a-file": (str(a_file / "state"), rf"'{a_file / 'state'}' cannot be created: '{a_file}' is a file"),
        "file-uri-to-a-file": (f"file://{a_file}", rf"state_location='file://{a_file}': '{a_file}' is a file"),
        "unknown-scheme": (
            "nosuch://x/y",
            r"the scheme 'nosuch' is not one the state files can be written to\. "
            r"Fix: .*file://, hdfs://, viewfs://, s3://, gs://, gcs://, abfs://",
        ),
        "hadoop-s3a": ("s3a://bucket/state", r"the scheme 's3a' \(Hadoop's name for S3: write s3:// here\)"),
    }


@pytest.mark.parametrize(
    "case", ["empty", "int", "a-file", "dev-null", "under-a-file", "file-uri-to-a-file", "unknown-scheme", "hadoop-s3a"]
)
def test_state_location_is_checked_where_it_is_given(tmp_path, case: str) -> None:
    value, match = _state_location_cases(tmp_path)[case]
    with pytest.raises(ReaderConfigError, match=match):
        check_state_location(value)


def test_usable_state_locations_are_accepted(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert check_state_location(str(tmp_path)) == str(tmp_path)
    assert check_state_location("new/deeper/state") == str(tmp_path / "new/deeper/state")  # absolute, not created
    assert not (tmp_path / "new").exists()
    for uri in (
        f"file://{tmp_path}/state",
        "s3://bucket/state",
        "gs://bucket/state",
        "hdfs://nn:8020/state",
        "abfss://c@account.dfs.core.windows.net/state",
    ):
        assert check_state_location(uri) == uri


@pytest.mark.integration
@pytest.mark.spark
@pytest.mark.parametrize("bad", ["", "   ", 5, "/dev/null"], ids=["empty", "blank", "int", "dev-null"])
def test_bad_state_location_argument(spark, kafka_bootstrap, topic_factory, bad) -> None:
    with pytest.raises(ReaderConfigError, match="state_location="):
        readCommittedStream(
            spark, topic_factory(partitions=1), {"kafka.bootstrap.servers": kafka_bootstrap}, state_location=bad
        )


@pytest.mark.integration
@pytest.mark.spark
def test_state_location_needs_no_rocksdb_state_store(spark, kafka_bootstrap, topic_factory, tmp_path) -> None:
    conf = "spark.sql.streaming.stateStore.providerClass"
    before = spark.conf.get(conf, None)
    spark.conf.set(conf, "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider")
    try:
        sdf = readCommittedStream(
            spark,
            topic_factory(partitions=1),
            {"kafka.bootstrap.servers": kafka_bootstrap},
            state_location=str(tmp_path / "state"),
        )
        assert sdf.isStreaming
    finally:
        if before is None:
            spark.conf.unset(conf)
        else:
            spark.conf.set(conf, before)


def _run(spark, topic, bootstrap, tmp_path, max_offsets):  # type: ignore[no-untyped-def]
    sdf = readCommittedStream(
        spark,
        topic,
        {"kafka.bootstrap.servers": bootstrap},
        max_offsets_per_trigger=max_offsets,
        state_location=str(tmp_path / "state"),
    )
    query = (
        sdf.writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(300)
    except Exception:
        pass
    return query


@pytest.mark.integration
@pytest.mark.spark
def test_micro_batches_are_bounded_and_old_state_files_pruned(spark, kafka_bootstrap, topic_factory, tmp_path) -> None:
    topic = topic_factory(partitions=3)
    write_log(kafka_bootstrap, topic, 3, seed=50, steps=40)
    query = _run(spark, topic, kafka_bootstrap, tmp_path, 60)
    assert query.exception() is None, query.exception()
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert len(sizes) >= 3 and max(sizes) <= 60, sizes
    folders = [d for d in (tmp_path / "state").glob("*/*") if d.is_dir()]
    assert sorted(d.name for d in folders) == ["0", "1", "2"]  # one run, one folder per partition
    for folder in folders:  # the states at the last committed offset, and at the last batch's end
        assert 1 <= len(list(folder.iterdir())) <= 2, sorted(f.name for f in folder.iterdir())


@pytest.mark.integration
@pytest.mark.spark
def test_lost_state_files_fail_the_query_clearly(spark, kafka_bootstrap, topic_factory, tmp_path) -> None:
    """Without its state files a restarted query cannot tell committed rows from duplicates: it
    fails and says what is missing, instead of delivering rows twice or losing them."""
    topic = topic_factory(partitions=2)
    write_log(kafka_bootstrap, topic, 2, seed=51, steps=20)
    first = _run(spark, topic, kafka_bootstrap, tmp_path, 40)
    assert first.exception() is None, first.exception()
    write_log(kafka_bootstrap, topic, 2, seed=52, steps=10)
    shutil.rmtree(tmp_path / "state")
    second = _run(spark, topic, kafka_bootstrap, tmp_path, 40)
    assert second.exception() is not None
    assert "no sequencing state for" in str(second.exception()) and "Fix:" in str(second.exception())


@pytest.mark.integration
@pytest.mark.spark
def test_kafka_secrets_stay_out_of_the_plan(spark, tmp_path) -> None:
    """The Kafka options reach the data source under their own names, so Spark redacts the secret
    ones in plans (``explain``, the UI) as it does for its own Kafka source."""
    from harvest_outbox.spark_reader.stream_source import SourceSettings

    sdf = readCommittedStream(
        spark,
        "t",
        {"kafka.bootstrap.servers": "localhost:1", "kafka.sasl.password": "hunter2"},
        state_location=str(tmp_path / "state"),
    )
    plan = sdf._jdf.queryExecution().toString()
    assert "kafka.sasl.password=" in plan and "hunter2" not in plan
    settings = SourceSettings.parse(
        {
            "kafka.sasl.password": "hunter2",
            "harvest.settings": '{"topic": "t", '
            '"state_location": "/x", "uuid_policy": "deliver", "include_acks": false, '
            '"ring_size": 8, "prune_horizon_ns": 0, "max_offsets_per_trigger": null, '
            '"starting": null}',
        }
    )
    assert settings.kafka == {"kafka.sasl.password": "hunter2"} and "hunter2" not in repr(settings)


@pytest.mark.integration
@pytest.mark.spark
def test_checkpoint_of_the_state_store_way_is_refused_clearly(spark, kafka_bootstrap, topic_factory, tmp_path) -> None:
    """A query's checkpoint cannot switch sources: started without state_location (Spark's Kafka
    source's offsets), restarted with it, the query fails naming the fix."""
    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    )
    topic = topic_factory(partitions=1)
    write_log(kafka_bootstrap, topic, 1, seed=53, steps=10)
    opts = {"kafka.bootstrap.servers": kafka_bootstrap}
    first = (
        readCommittedStream(spark, topic, opts)
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    first.awaitTermination(300)
    assert first.exception() is None, first.exception()
    write_log(kafka_bootstrap, topic, 1, seed=54, steps=5)
    second = _run(spark, topic, kafka_bootstrap, tmp_path, None)
    assert second.exception() is not None
    assert "cannot change its source" in str(second.exception()), second.exception()


def test_a_micro_batch_is_read_in_at_most_tasks_groups_of_whole_partitions() -> None:
    """group_ranges: every partition range lands in exactly one group, at most ``tasks`` groups of
    about equal records (largest first into the least loaded), partitions in order within a group;
    None or more tasks than partitions: a group per partition."""
    from harvest_outbox.spark_reader.stream_source import group_ranges

    ranges = [(p, 100 * p if p % 3 else None, 100 * p + 10 * (p + 1), None) for p in range(8)]
    assert group_ranges(ranges, None) == [[r] for r in ranges]
    assert group_ranges(ranges, 8) == group_ranges(ranges, 20) == [[r] for r in ranges]
    for tasks in (1, 2, 3, 5):
        groups = group_ranges(ranges, tasks)
        assert len(groups) == tasks
        assert sorted(r for g in groups for r in g) == sorted(ranges)
        assert all(g == sorted(g) for g in groups)
        assert [g[0][0] for g in groups] == sorted(g[0][0] for g in groups)
        loads = [sum(r[2] - (r[1] or 0) for r in g) for g in groups]
        biggest = max(r[2] - (r[1] or 0) for r in ranges)
        assert max(loads) - min(loads) <= biggest, (tasks, loads)


@pytest.mark.parametrize("longer", range(8))
def test_a_partition_keeps_its_task_index_while_the_shares_stay_about_equal(longer: int) -> None:
    """Equal shares, or one partition's a record longer (Spark's limit spread over 8 partitions):
    the same groups in the same order, so each task index reads the same partitions every
    micro-batch (its Python worker's kept consumers go on). Skewed shares are balanced instead."""
    from harvest_outbox.spark_reader.stream_source import group_ranges

    def batch(sizes: list[int]) -> list[tuple[int, int | None, int, str | None]]:
        return [(p, 1000, 1000 + n, None) for p, n in enumerate(sizes)]

    def partitions(groups: list[list[tuple[int, int | None, int, str | None]]]) -> list[list[int]]:
        return [[r[0] for r in g] for g in groups]

    even = partitions(group_ranges(batch([12_600] * 8), 2))
    assert even == [[0, 2, 4, 6], [1, 3, 5, 7]]
    sizes = [12_600] * 8
    sizes[longer] += 1
    assert partitions(group_ranges(batch(sizes), 2)) == even
    skewed = group_ranges(batch([90_000, 100, 90_000, 100, 100, 100, 100, 100]), 2)
    assert partitions(skewed) == [[0, 1, 4, 6], [2, 3, 5, 7]]
