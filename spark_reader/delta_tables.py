"""The pipeline's Delta Lake tables, written with delta-rs (``deltalake``: no JVM, no delta-spark).

Two tables, each a Delta transaction log under its folder (``_delta_log/``), written by the driver:

- **events**: append-only, one row per committed record, the reader's columns
  (:func:`~spark_reader.schema.output_schema`), unpartitioned;
- **latest**: one row per non-null key, the row of greatest ``(ack_offset, offset)``, kept by ``MERGE``.

Each streaming micro-batch ``b`` of query ``q`` is collected to the driver as Arrow and written by
:meth:`DeltaTables.write_batch`: one append to ``events`` and one ``MERGE`` into ``latest``, each
commit carrying the Delta application transaction ``(app_id=harvest-pipeline:<q>, version=b)``
(the protocol's ``txn`` action, which delta-rs writes in the same atomic commit as the data).
Before writing, the table's recorded version for the app id is read; a batch at or below it is a
replay (Spark re-runs a batch whose checkpoint commit did not happen) and is skipped. Spark's query
id lives in the checkpoint, so a restart from the same checkpoint keeps the app id; a new checkpoint
starts a new query id whose batch ids start again at 0 without being mistaken for replays.

Invariants (tests/test_spark_reader/test_delta_tables.py without Spark, a writing process SIGKILLed at
each kill point and replayed included; under a SIGKILL of the driver after the commits, on local-cluster,
tests/test_spark_reader/test_delta_pipeline.py):

- a micro-batch's rows are in ``events`` exactly once, whatever the kill point: a kill before its
  commit leaves nothing (Delta ignores files no commit names), a kill after it makes the replay a no-op;
- ``latest`` holds, per key, the row of greatest ``(ack_offset, offset)`` among all rows written;
  a replayed or older row changes nothing (the MERGE's update condition), and a replayed batch makes
  no commit at all (the app transaction);
- each ``(app id, batch)`` appears in at most one commit of each table (``DeltaTable.history()``);
- a commit that loses a race with another writer of the table (``OPTIMIZE``/``VACUUM`` run by
  :func:`upkeep` from another process) is retried after re-reading the table, never dropped.

Test-only kill hook: with ``HARVEST_PIPELINE_KILL_AT=<point>:<batch>`` in the driver's environment,
:meth:`DeltaTables.write_batch` SIGKILLs the driver's process group (Python and its JVM) at
``before-commit`` (batch collected, nothing committed), ``between-tables`` (``events`` committed,
``latest`` not) or ``after-commit`` (both Delta commits done, Spark's checkpoint commit not) of the
first batch >= ``<batch>`` with rows. A kill after Spark's checkpoint commit of batch ``b`` leaves the
tables and the checkpoint as ``before-commit`` of batch ``b + 1`` does (nothing of ``b + 1`` written
yet): that point covers it. Never set it in production: it exists so that the tests can crash the
driver at an exact point.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from harvest_outbox.spark_reader.errors import ReaderConfigError, SparkReaderError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

log = logging.getLogger("harvest.pipeline.delta")

KILL_ENV = "HARVEST_PIPELINE_KILL_AT"
KILL_POINTS = ("before-commit", "between-tables", "after-commit")
APP_PREFIX = "harvest-pipeline:"
#: Commits retried after losing a race with another writer (a concurrent OPTIMIZE or VACUUM).
COMMIT_ATTEMPTS = 8
_MIB = 1024 * 1024

T = TypeVar("T")


@dataclass(frozen=True)
class DeltaOptions:
    """How the Delta tables are written and kept.

    ``target_file_size``: bytes per data file written and per file OPTIMIZE compacts to (128 MiB);
    ``optimize_every``: run :func:`upkeep` (OPTIMIZE, VACUUM, a log checkpoint) on both tables every
    N micro-batches that wrote rows (0: never; run the ``upkeep`` command instead);
    ``vacuum_retention_hours``: data files removed from the tables longer ago than this are deleted
    by VACUUM (168: Delta's default; time travel further back than this fails afterwards).
    """

    target_file_size: int = 128 * _MIB
    optimize_every: int = 100
    vacuum_retention_hours: int = 168

    def __post_init__(self) -> None:
        for name, low in (("target_file_size", _MIB), ("optimize_every", 0), ("vacuum_retention_hours", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ReaderConfigError(f"{name}={value!r}: pass an int >= {low}")


def events_schema() -> pa.Schema:
    """The event table's Arrow schema: the readers' output columns (timestamps in UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from harvest_outbox.spark_reader.schema import output_schema

    return to_arrow_schema(output_schema(), timezone="UTC")


def latest_per_key(rows: pa.Table) -> pa.Table:
    """Per non-null ``key``, the row of greatest ``(ack_offset, offset)`` (the key's last committed version)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = rows.filter(pc.is_valid(rows["key"]))
    if rows.num_rows <= 1:
        return rows
    order = pc.sort_indices(
        rows, sort_keys=[("key", "ascending"), ("ack_offset", "descending"), ("offset", "descending")]
    )
    rows = rows.take(order)
    keys = rows["key"].combine_chunks()
    first = pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1))
    return rows.filter(pa.concat_arrays([pa.array([True]), first]))


# Quoted: ``key``, ``offset``, ``partition`` and ``timestamp`` are SQL keywords to the MERGE's parser.
_NEWER = 's."ack_offset" > t."ack_offset" OR (s."ack_offset" = t."ack_offset" AND s."offset" > t."offset")'


def kill_point(point: str, batch_id: int) -> None:
    """The test-only kill hook (module docstring): SIGKILL the driver's process group at ``point``."""
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    name, _, at = spec.partition(":")
    if name not in KILL_POINTS or not at.isdigit():
        raise ReaderConfigError(f"{KILL_ENV}={spec!r}: pass <point>:<batch>, point one of {KILL_POINTS}")
    # The first batch at or after <batch> that gets there (an empty batch returns before any commit).
    if name != point or batch_id < int(at):
        return
    log.warning("%s=%s: SIGKILL of the driver at %s of batch %d", KILL_ENV, spec, point, batch_id)
    logging.shutdown()
    pid = os.getpid()
    if os.getpgid(0) == pid:  # the driver leads its process group: take its JVM down with it
        os.killpg(pid, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)


def with_retries(what: str, attempt: Callable[[], T], attempts: int = COMMIT_ATTEMPTS) -> T:
    """``attempt()`` again (it re-reads the table) while it fails: its commit lost to a concurrent
    writer, or a file of the snapshot it read was vacuumed meanwhile (a VACUUM retention shorter than
    the write). Retrying is always safe: every attempt first checks the table's app transaction, so an
    attempt that did commit before failing is not committed again."""
    from deltalake.exceptions import CommitFailedError, DeltaError, SchemaMismatchError

    for n in range(1, attempts + 1):
        try:
            return attempt()
        except SchemaMismatchError as exc:  # no retry makes the table's schema the readers' schema
            raise SparkReaderError(
                f"{what}: the table's schema is not the readers' schema: {exc}. Fix: write to a new table path "
                "(the pipeline writes spark_reader.schema.output_schema())"
            ) from exc
        except (CommitFailedError, DeltaError) as exc:
            if n == attempts:
                raise SparkReaderError(
                    f"{what}: failed {attempts} times in a row, the last time with: {exc}. Fix: for a commit "
                    "conflict, run table upkeep less often, or from the pipeline (optimize_every) instead of "
                    "alongside it; otherwise the error names the cause"
                ) from exc
            log.info("%s: %s; retrying on the newer table version", what, exc)
            time.sleep(0.05 * n)
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class BatchResult:
    events_committed: bool  # False: empty, or a replay already in the table
    latest_committed: bool


class DeltaTables:
    """The event and latest-state tables at ``events_uri`` and ``latest_uri`` (delta-rs URIs: a local
    path, ``s3://``, ``gs://``, ``abfss://``, with credentials from delta-rs's environment variables)."""

    def __init__(self, events_uri: str, latest_uri: str, options: DeltaOptions | None = None) -> None:
        for name, value in (("events_uri", events_uri), ("latest_uri", latest_uri)):
            if not isinstance(value, str) or not value.strip():
                raise ReaderConfigError(f"{name}={value!r}: pass a folder path or URI")
        self.events_uri, self.latest_uri = events_uri.rstrip("/"), latest_uri.rstrip("/")
        self.options = options or DeltaOptions()
        self.schema = events_schema()
        self._written = 0  # batches with rows written by this process (for optimize_every)
        # Open tables, brought up to date before each use: re-opening replays the log from its last
        # checkpoint every micro-batch (up to 100 JSON commits), which grew a batch's cost by ~80 %.
        self._open: dict[str, Any] = {}

    # -- the streaming sink ------------------------------------------------------------------------

    def foreach_batch(self, df: DataFrame, batch_id: int) -> None:
        """``foreachBatch`` body: the micro-batch to the driver as Arrow (bounded by the source's
        ``max_offsets_per_trigger``), then :meth:`write_batch` under the query's app id."""
        query_id = df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        if not query_id:
            raise SparkReaderError("foreachBatch without a streaming query id: the Delta sink runs only in a stream")
        self.write_batch(df.toArrow(), f"{APP_PREFIX}{query_id}", batch_id)

    def write_batch(self, rows: pa.Table, app_id: str, batch_id: int) -> BatchResult:
        """Micro-batch ``batch_id`` of ``app_id`` into both tables, each commit once (module docstring)."""
        rows = rows.select(self.schema.names).cast(self.schema)
        if rows.num_rows == 0:
            return BatchResult(False, False)  # nothing to commit; a replay of it is nothing too
        kill_point("before-commit", batch_id)
        events = with_retries(f"{self.events_uri} batch {batch_id}", lambda: self._append(rows, app_id, batch_id))
        kill_point("between-tables", batch_id)
        fresh = latest_per_key(rows)
        latest = with_retries(f"{self.latest_uri} batch {batch_id}", lambda: self._merge(fresh, app_id, batch_id))
        kill_point("after-commit", batch_id)
        self._written += 1
        every = self.options.optimize_every
        if every and self._written % every == 0:
            for uri in (self.events_uri, self.latest_uri):
                upkeep(uri, self.options)
        return BatchResult(events, latest)

    # -- commits -----------------------------------------------------------------------------------

    def _append(self, rows: pa.Table, app_id: str, batch_id: int) -> bool:
        from deltalake import write_deltalake

        table = self._table(self.events_uri)
        if _done(table, app_id, batch_id, self.events_uri):
            return False
        write_deltalake(
            table if table is not None else self.events_uri,
            rows,
            mode="append",
            target_file_size=self.options.target_file_size,
            commit_properties=_txn(app_id, batch_id),
        )
        return True

    def _merge(self, fresh: pa.Table, app_id: str, batch_id: int) -> bool:
        from deltalake import DeltaTable

        table = self._table(self.latest_uri)
        if table is None:
            table = self._open[self.latest_uri] = DeltaTable.create(self.latest_uri, self.schema, mode="ignore")
        if _done(table, app_id, batch_id, self.latest_uri):
            return False
        # An empty source still commits: the app transaction records the batch as merged.
        (
            table.merge(
                fresh,
                predicate='t."key" = s."key"',
                source_alias="s",
                target_alias="t",
                commit_properties=_txn(app_id, batch_id),
            )
            .when_matched_update_all(predicate=_NEWER)
            .when_not_matched_insert_all()
            .execute()
        )
        return True

    def _table(self, uri: str) -> Any:
        """The table at ``uri`` at its newest version (None before its first commit)."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        table = self._open.get(uri)
        if table is not None:
            table.update_incremental()  # the commits since: another writer's (upkeep), or our own
            return table
        try:
            table = self._open[uri] = DeltaTable(uri)
        except TableNotFoundError:
            return None
        return table


def _done(table: Any, app_id: str, batch_id: int, uri: str) -> bool:
    recorded = None if table is None else table.transaction_version(app_id)
    if recorded is not None and batch_id <= recorded:
        log.info("%s: batch %d of %s already committed (recorded %d): replay skipped", uri, batch_id, app_id, recorded)
        return True
    return False


def _txn(app_id: str, batch_id: int) -> Any:
    from deltalake import CommitProperties, Transaction

    # The txn action is what replays are checked against; the same pair in the commit's info makes each
    # commit's batch visible in DeltaTable.history() (and Spark's DESCRIBE HISTORY) for audits.
    return CommitProperties(
        app_transactions=[Transaction(app_id, batch_id)],
        custom_metadata={"harvest.app_id": app_id, "harvest.batch": str(batch_id)},
    )


# -- upkeep ---------------------------------------------------------------------------------------------


def upkeep(uri: str, options: DeltaOptions | None = None) -> dict[str, Any]:
    """OPTIMIZE (compact small files to ``target_file_size``), VACUUM (delete files removed more than
    ``vacuum_retention_hours`` ago) and a log checkpoint of the table at ``uri``. Safe while the
    pipeline writes: each step is an optimistic commit retried on conflict (a compaction that lost to
    a MERGE rewriting the same files is redone on the newer version; no row is lost or doubled)."""
    from deltalake import DeltaTable

    opts = options or DeltaOptions()
    compacted = with_retries(
        f"OPTIMIZE {uri}", lambda: DeltaTable(uri).optimize.compact(target_size=opts.target_file_size)
    )
    vacuumed = with_retries(
        f"VACUUM {uri}",
        lambda: DeltaTable(uri).vacuum(
            retention_hours=opts.vacuum_retention_hours, dry_run=False, enforce_retention_duration=False
        ),
    )
    table = DeltaTable(uri)
    table.create_checkpoint()
    table.cleanup_metadata()  # log entries older than the table's logRetentionDuration (30 days)
    summary = {
        "table": uri,
        "version": table.version(),
        "files_added": compacted.get("numFilesAdded"),
        "files_removed": compacted.get("numFilesRemoved"),
        "vacuumed": len(vacuumed),
    }
    log.info("upkeep %s", summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    """``python -m harvest_outbox.spark_reader.delta_tables <table>...``: upkeep of Delta tables."""
    parser = argparse.ArgumentParser(
        prog="python -m harvest_outbox.spark_reader.delta_tables",
        description="OPTIMIZE, VACUUM and checkpoint the pipeline's Delta tables (safe while it runs).",
    )
    parser.add_argument("tables", nargs="+", help="table paths or URIs (the pipeline's events/ and latest/)")
    parser.add_argument("--target-file-size-mib", type=int, default=128)
    parser.add_argument("--vacuum-retention-hours", type=int, default=168)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    try:
        opts = DeltaOptions(
            target_file_size=args.target_file_size_mib * _MIB, vacuum_retention_hours=args.vacuum_retention_hours
        )
    except ReaderConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for uri in args.tables:
        upkeep(uri, opts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
