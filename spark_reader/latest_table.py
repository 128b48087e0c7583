"""The "latest state per key" table: a Parquet snapshot per version, made visible by a commit file.

Layout under the table's folder (any Hadoop filesystem URI Spark writes to: a local path,
``hdfs://``, ``s3a://``, ...)::

    version-00000000000000000007/   part-*.parquet: one row per key, the latest record of the key
    _commits/00000000000000000007   {"version": 7, "stream_batch": 41}

A version's folder is written first (``mode("overwrite")``: a half-written folder from a crash is
replaced when the version is written again) and becomes the table only when its commit file is
created, create-if-absent (one small object: atomic on HDFS, local disks and S3). Readers take the
highest committed version (:func:`read_latest`); reading the folder itself is not the table.

Why applying a micro-batch is idempotent by batch id (:meth:`LatestStateTable.apply_stream_batch`):
every commit records the last streaming batch id merged into it (``stream_batch``). Spark replays
a batch only when its commit to the query's checkpoint did not happen, with the same input (the
offset log fixed it). If the driver died after our commit file and before Spark's checkpoint
commit, the replayed batch id is <= the recorded one and is skipped; if it died before our commit
file, the version folder is rewritten and committed. Either way each batch is merged once.

The merge itself is a per-key maximum by ``(ack_offset, offset)`` (the read-committed delivery
order within a partition), so merging the same rows twice, or older rows after newer ones (a
backfill), never changes a key's row: the batch-id check saves the work and keeps versions
meaningful; correctness does not hang on it alone.

Invariants:
- the committed version ``v`` holds, per key, the row of greatest ``(ack_offset, offset)`` among
  all rows merged into versions ``<= v``; rows with a null key are not in the table;
- a version folder is deleted only when ``keep`` newer versions are committed, so a reader that
  picked a version a moment ago still finds it (a reader slower than ``keep`` commits retries on the
  newer version: :func:`read_local_snapshot`).

Assumes a key's records are in one topic-partition (Kafka's default key partitioning): offsets of
different partitions do not order anything. A record with a null value (a tombstone) is kept as
the key's latest row; filter ``value IS NOT NULL`` to read live keys only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harvest_outbox.spark_reader.errors import ReaderConfigError, SparkReaderError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

_WIDTH = 20
_COMMITS = "_commits"
_PREFIX = "version-"


@dataclass(frozen=True)
class Commit:
    version: int
    stream_batch: int | None  # the last streaming micro-batch merged into this version (None: none yet)


class LatestStateTable:
    """One latest-state table at ``path``; ``keep`` committed versions are kept (default 2, at least 1)."""

    def __init__(self, spark: SparkSession, path: str, keep: int = 2) -> None:
        if not isinstance(path, str) or not path.strip():
            raise ReaderConfigError(f"latest-state table path={path!r}: pass a folder path or URI")
        if not isinstance(keep, int) or keep < 1:
            raise ReaderConfigError(f"keep={keep!r}: pass an int >= 1 (committed versions kept for readers)")
        self.spark, self.path, self.keep = spark, path.rstrip("/"), keep
        self._Path = spark._jvm.org.apache.hadoop.fs.Path  # type: ignore[union-attr]  # None: Spark Connect
        self._fs = self._Path(self.path).getFileSystem(spark._jsc.hadoopConfiguration())

    # -- reading ---------------------------------------------------------------------------------

    def last_commit(self) -> Commit | None:
        """The highest committed version, or None for a table never committed."""
        commits = self._commit_versions()
        if not commits:
            return None
        raw = self._read_text(self._commit_path(commits[-1]))
        body = json.loads(raw)
        return Commit(int(body["version"]), body.get("stream_batch"))

    def version_path(self, version: int) -> str:
        return f"{self.path}/{_PREFIX}{version:0{_WIDTH}d}"

    def read(self) -> DataFrame | None:
        """The committed table (None before the first commit)."""
        last = self.last_commit()
        return None if last is None else self.spark.read.parquet(self.version_path(last.version))

    # -- writing ---------------------------------------------------------------------------------

    def apply_stream_batch(self, rows: DataFrame, batch_id: int) -> bool:
        """``foreachBatch`` body: merge micro-batch ``batch_id`` unless a commit already holds it.
        Returns whether it was merged (False: a replay of a batch merged before a driver crash)."""
        last = self.last_commit()
        if last is not None and last.stream_batch is not None and batch_id <= last.stream_batch:
            log.info("latest-state table %s: batch %d already merged (version %d)", self.path, batch_id, last.version)
            return False
        self._merge(rows, last, stream_batch=batch_id)
        return True

    def merge(self, rows: DataFrame) -> int:
        """Merge rows outside the stream (a backfill); returns the committed version. Stop the
        table's streaming query meanwhile: two writers race for the next version's commit file and
        the loser fails (nothing is lost; the streaming query replays its batch on restart)."""
        last = self.last_commit()
        return self._merge(rows, last, stream_batch=last.stream_batch if last else None)

    def _merge(self, rows: DataFrame, last: Commit | None, stream_batch: int | None) -> int:
        from pyspark.sql import functions as F

        fresh = rows.where(F.col("key").isNotNull())
        if last is not None:
            previous = self.spark.read.parquet(self.version_path(last.version))
            fresh = fresh.unionByName(previous.select(*fresh.columns))
        order = F.struct(F.col("ack_offset"), F.col("offset"))
        latest = (
            fresh.groupBy("key")
            .agg(F.max_by(F.struct(*[F.col(c) for c in fresh.columns]), order).alias("row"))
            .select("row.*")
        )
        version = 0 if last is None else last.version + 1
        latest.coalesce(1).write.mode("overwrite").parquet(self.version_path(version))
        self._create(self._commit_path(version), json.dumps({"version": version, "stream_batch": stream_batch}))
        self._clean(version)
        return version

    # -- files -----------------------------------------------------------------------------------

    def _commit_path(self, version: int) -> str:
        return f"{self.path}/{_COMMITS}/{version:0{_WIDTH}d}"

    def _commit_versions(self) -> list[int]:
        folder = self._Path(f"{self.path}/{_COMMITS}")
        if not self._fs.exists(folder):
            return []
        names = [st.getPath().getName() for st in self._fs.listStatus(folder)]
        return sorted(int(n) for n in names if n.isdigit())

    def _read_text(self, path: str) -> str:
        stream = self._fs.open(self._Path(path))
        try:
            io_utils = self.spark._jvm.org.apache.commons.io.IOUtils  # type: ignore[union-attr]  # None: Spark Connect
            return str(io_utils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def _create(self, path: str, text: str) -> None:
        """Create-if-absent: a second writer of the same version fails here rather than overwrite."""
        try:
            out = self._fs.create(self._Path(path), False)
        except Exception as exc:
            raise SparkReaderError(
                f"latest-state table {self.path}: commit {path} already exists: another writer committed "
                "this version (a backfill while the streaming query runs?). Fix: run one writer at a time; "
                "a streaming query failing here replays its batch on restart"
            ) from exc
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()

    def _clean(self, version: int) -> None:
        """Versions older than the ``keep`` newest committed ones: folders first, then commits."""
        below = version - self.keep + 1
        for old in [v for v in self._commit_versions() if v < below]:
            self._fs.delete(self._Path(self.version_path(old)), True)
            self._fs.delete(self._Path(self._commit_path(old)), False)


def local_snapshot(path: str) -> str | None:
    """The newest committed version's folder of a table on a local filesystem (for tools reading it
    without Spark, e.g. with pyarrow); None before the first commit."""
    import os

    commits = os.path.join(path, _COMMITS)
    names = sorted(n for n in os.listdir(commits) if n.isdigit()) if os.path.isdir(commits) else []
    return os.path.join(path, f"{_PREFIX}{names[-1]}") if names else None


def read_local_snapshot(
    path: str, columns: list[str] | None = None, read: Callable[..., Any] | None = None, attempts: int = 5
) -> Any | None:
    """The newest committed version of a table on a local filesystem as a ``pyarrow.Table`` (None
    before the first commit), for tools reading it without Spark.

    A version is kept until ``keep`` newer ones are committed, not for as long as a reader takes:
    a slow reader of a busy table (a catch-up commits a version per micro-batch) can find its
    version's files deleted under it. Then the newest commit has moved on, and this reads that one
    instead, up to ``attempts`` times. ``read`` is ``pyarrow.parquet.read_table`` (a parameter for tests)."""
    if read is None:
        import pyarrow.parquet as pq

        read = pq.read_table
    for attempt in range(1, attempts + 1):
        folder = local_snapshot(path)
        if folder is None:
            return None
        try:
            return read(folder, columns=columns)
        except FileNotFoundError:
            if local_snapshot(path) == folder or attempt == attempts:
                raise  # not the cleanup racing us: the folder of the newest commit is missing
            log.debug("latest-state version %s was cleaned up while being read; reading the newer one", folder)
    raise AssertionError("unreachable")  # the loop returns or raises


def read_latest(spark: SparkSession, path: str) -> DataFrame:
    """The latest-state table at ``path`` as a DataFrame; a clear error if nothing is committed yet."""
    df = LatestStateTable(spark, path).read()
    if df is None:
        raise ReaderConfigError(
            f"latest-state table {path!r}: no committed version yet (no {_COMMITS}/ files). Fix: check the "
            "path, or wait for the pipeline's first micro-batch"
        )
    return df
