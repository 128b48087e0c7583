"""The streaming pipeline: a sequenced topic -> an append-only event table and a latest-state table.

Two formats (``PipelineConfig.format`` / ``--format``): ``parquet`` (the default) and ``delta``.

With ``parquet``, two Structured Streaming queries in one application (``spark-submit`` this module, or call
:func:`start_pipeline`):

1. ``events``: ``readCommittedStream(..., state_location=...)`` -> Spark's Parquet file sink at
   ``events_path``. The sink lists each micro-batch's files in ``<events_path>/_spark_metadata``
   under the batch id, and a replayed batch id is skipped: with the source's replayable offsets
   this is Spark's exactly-once file sink. Readers of the folder with ``spark.read.parquet`` see
   only files in that log (a killed batch's stray files are ignored).
2. ``latest``: a file stream source over the event table (it reads the sink's metadata log, so only
   committed files) -> ``foreachBatch`` -> :class:`~spark_reader.latest_table.LatestStateTable`,
   one row per key, idempotent by batch id (see that module for why a crash between its commit
   and Spark's checkpoint commit merges nothing twice).

Deriving ``latest`` from the event table reads and sequences Kafka once, and the two tables can
never disagree about which rows were committed. Each query has its own checkpoint under
``checkpoint_location``; the sequencing state of ``events`` lives at ``state_location``. All four
locations must be on storage every executor and the driver reach (HDFS, S3, ...) on a cluster.

With ``delta``, one query: ``readCommittedStream`` -> ``foreachBatch`` ->
:class:`~spark_reader.delta_tables.DeltaTables`, which collects each micro-batch to the driver as
Arrow and commits it with delta-rs (no JVM jar: no delta-spark release supports Spark 4.3; checked
2026-11-25: delta-spark 4.4.1 requires pyspark <= 4.2.0) to a Delta event table (append) and a Delta
latest-state table (MERGE), each commit carrying the application transaction (query id, batch id)
that makes a replayed batch a no-op. Its micro-batches are bounded
(:data:`DELTA_MAX_OFFSETS_PER_TRIGGER` records unless ``max_offsets_per_trigger`` says otherwise),
since the driver holds one in memory. Upkeep (OPTIMIZE, VACUUM, log checkpoints) runs every
``DeltaOptions.optimize_every`` batches, or as ``python -m harvest_outbox.spark_reader.delta_tables``.
Parquet stays the default: it writes from the executors, in parallel, where Delta's sink writes from
the driver (docs/pipeline.md, "Formats", has the measurements).

Invariants, both formats: the event table holds every committed record of the topic exactly once and
no rolled-back one; the latest-state table holds, per key, the event table's row of greatest
``(ack_offset, offset)``. Parquet: tests/test_e2e/test_demo.py (SIGKILLs of this process on
local-cluster and of the relay leader) and tests/test_spark_reader/test_pipeline.py; Delta:
tests/test_spark_reader/test_delta_pipeline.py (a SIGKILL of the driver after the sink's commits) and
tests/test_spark_reader/test_delta_tables.py (a writing process SIGKILLed at each kill point).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harvest_outbox.spark_reader.delta_tables import DeltaOptions, DeltaTables
from harvest_outbox.spark_reader.errors import ReaderConfigError
from harvest_outbox.spark_reader.latest_table import LatestStateTable
from harvest_outbox.spark_reader.stream import readCommittedStream

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger("harvest.pipeline")

FORMATS = ("parquet", "delta")
#: The Delta sink's default micro-batch bound: it collects a micro-batch to the driver as Arrow, about
#: 200,000 x the mean row size in memory (~60 MB at the demo's 300-byte rows), twice while the Arrow
#: table is conformed to the table's schema.
DELTA_MAX_OFFSETS_PER_TRIGGER = 200_000


@dataclass(frozen=True)
class PipelineConfig:
    """Where the pipeline reads and writes. Paths are local paths or URIs every node reaches.

    ``trigger_seconds``: the micro-batch interval (default 2 s); ``available_now``: process what the
    topic holds when the query starts, then stop (a catch-up or backfill run).
    ``max_offsets_per_trigger``: records per micro-batch over all partitions (None: no limit).
    ``keep_versions``: committed versions of the Parquet latest-state table kept for readers (default 2).
    ``format``: ``"parquet"`` (Spark's file sink and :mod:`~spark_reader.latest_table`) or ``"delta"``
    (:mod:`~spark_reader.delta_tables`, written as ``delta`` says; its micro-batches are collected to
    the driver, so ``max_offsets_per_trigger`` defaults to :data:`DELTA_MAX_OFFSETS_PER_TRIGGER` there).
    """

    topic: str
    kafka: Mapping[str, str]  # Spark-style options: kafka.bootstrap.servers, kafka.security.protocol, ...
    events_path: str
    latest_path: str
    checkpoint_location: str
    state_location: str
    trigger_seconds: float = 2.0
    available_now: bool = False
    max_offsets_per_trigger: int | None = None
    keep_versions: int = 2
    uuid_policy: str = "deliver"
    format: str = "parquet"
    delta: DeltaOptions = field(default_factory=DeltaOptions)

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not self.topic:
            raise ReaderConfigError(f"topic={self.topic!r}: pass the sequenced topic's name")
        if "kafka.bootstrap.servers" not in self.kafka:
            raise ReaderConfigError(
                f"kafka options {sorted(self.kafka)}: 'kafka.bootstrap.servers' is missing. "
                "Fix: pass the brokers (--bootstrap host:port)"
            )
        for name in ("events_path", "latest_path", "checkpoint_location", "state_location"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ReaderConfigError(f"{name}={value!r}: pass a folder path or URI")
        paths = [self.events_path, self.latest_path, self.checkpoint_location, self.state_location]
        if len({p.rstrip("/") for p in paths}) < 4:
            raise ReaderConfigError(
                f"events_path, latest_path, checkpoint_location and state_location must differ, got {paths}"
            )
        if not self.trigger_seconds > 0:
            raise ReaderConfigError(f"trigger_seconds={self.trigger_seconds!r}: pass a number of seconds > 0")
        if self.format not in FORMATS:
            raise ReaderConfigError(f"format={self.format!r}: pass one of {FORMATS}")
        if not isinstance(self.delta, DeltaOptions):
            raise ReaderConfigError(f"delta={self.delta!r}: pass a DeltaOptions")
        if self.format == "delta":
            for name in ("events_path", "latest_path"):
                value = getattr(self, name)
                if value.startswith(("s3a://", "s3n://")):
                    raise ReaderConfigError(
                        f"{name}={value!r}: delta-rs writes the Delta tables and knows no {value.split(':')[0]}://. "
                        "Fix: write s3:// (same bucket and key)"
                    )

    @property
    def micro_batch_bound(self) -> int | None:
        """Records per micro-batch (None: unbounded, the Parquet sink's default: its batches stay in executors)."""
        if self.max_offsets_per_trigger is None and self.format == "delta":
            return DELTA_MAX_OFFSETS_PER_TRIGGER
        return self.max_offsets_per_trigger

    @staticmethod
    def under(root: str, topic: str, kafka: Mapping[str, str], **options: Any) -> PipelineConfig:
        """Every location under one folder: ``events/``, ``latest/``, ``checkpoint/``, ``state/``."""
        base = root.rstrip("/")
        return PipelineConfig(
            topic=topic,
            kafka=dict(kafka),
            events_path=f"{base}/events",
            latest_path=f"{base}/latest",
            checkpoint_location=f"{base}/checkpoint",
            state_location=f"{base}/state",
            **options,
        )


@dataclass
class Pipeline:
    """The two running queries; ``lag`` measures the events query's lag for the progress lines."""

    events: StreamingQuery
    latest: StreamingQuery | None  # None: the Delta format writes both tables from the events query
    lag: TopicLag | None = None
    logged: dict[str, int] = field(default_factory=dict)  # last batch id logged per query

    @property
    def queries(self) -> list[StreamingQuery]:
        return [q for q in (self.events, self.latest) if q is not None]

    def stop(self) -> None:
        for q in self.queries:
            q.stop()
        if self.lag is not None:
            self.lag.close()

    def log_progress(self) -> None:
        """One JSON line per micro-batch not logged yet: Spark's progress, trimmed to what shows lag,
        and for the events query the records in the topic beyond its end offsets (``lag_records``:
        Spark's ``latestOffset`` stays null for a Python data source)."""
        for name, q in (("events", self.events), ("latest", self.latest)):
            if q is None:
                continue
            fresh = [p for p in q.recentProgress if p["batchId"] > self.logged.get(name, -1)]
            for i, p in enumerate(fresh):
                self.logged[name] = p["batchId"]
                src = p["sources"][0] if p.get("sources") else {}
                line = {
                    "query": name,
                    "batch": p["batchId"],
                    "rows": p["numInputRows"],
                    "rows_per_s": round(p.get("processedRowsPerSecond") or 0.0, 1),
                    "ms": p.get("durationMs", {}).get("triggerExecution"),
                    "end_offset": src.get("endOffset"),
                }
                if name == "events" and self.lag is not None and i == len(fresh) - 1:
                    line["lag_records"] = self.lag(_partition_offsets(src.get("endOffset")))
                log.info("progress %s", json.dumps(line, default=str))


def _partition_offsets(end_offset: Any) -> dict[int, int]:
    """The events source's end offset (``{"run": ..., "offsets": {partition: next}}``, as JSON text)."""
    try:
        body = json.loads(end_offset) if isinstance(end_offset, str) else end_offset
        return {int(p): int(o) for p, o in (body or {}).get("offsets", {}).items()}
    except (TypeError, ValueError, AttributeError):
        return {}


class TopicLag:
    """Records in ``topic`` beyond given next offsets, from the brokers' high watermarks (None when the
    brokers do not answer within 5 s: progress logging never fails the pipeline)."""

    def __init__(self, topic: str, kafka: Mapping[str, str]) -> None:
        from confluent_kafka import Consumer

        from harvest_outbox.spark_reader.offsets import client_config

        self.topic = topic
        self._consumer = Consumer(
            {**client_config(kafka), "group.id": "harvest-pipeline-lag", "enable.auto.commit": False}
        )

    def __call__(self, read: dict[int, int]) -> int | None:
        from confluent_kafka import TopicPartition

        if not read:
            return None
        try:
            high = {p: self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=5)[1] for p in read}
        except Exception:  # a broker away: no figure this time
            return None
        return sum(max(0, high[p] - o) for p, o in read.items())

    def close(self) -> None:
        self._consumer.close()


def start_pipeline(spark: SparkSession, cfg: PipelineConfig) -> Pipeline:
    """Start (or resume from the checkpoints) both queries; returns once both run."""
    for query in ("events", "latest"):
        drop_stale_log_files(spark, f"{cfg.checkpoint_location.rstrip('/')}/{query}")
    events_df = readCommittedStream(
        spark,
        cfg.topic,
        cfg.kafka,
        uuid_policy=cfg.uuid_policy,
        max_offsets_per_trigger=cfg.micro_batch_bound,
        state_location=cfg.state_location,
    )
    trigger: dict[str, Any] = (
        {"availableNow": True} if cfg.available_now else {"processingTime": f"{cfg.trigger_seconds} seconds"}
    )
    if cfg.format == "delta":
        return _start_delta(events_df, cfg, trigger)
    events = (
        events_df.writeStream.queryName(f"harvest-events-{cfg.topic}")
        .format("parquet")
        .option("path", cfg.events_path)
        .option("checkpointLocation", f"{cfg.checkpoint_location.rstrip('/')}/events")
        .trigger(**trigger)
        .start()
    )
    # The file source decides once whether its folder is a file sink's output (reads the metadata
    # log) or plain files: the sink creates _spark_metadata when it starts, before writing any file,
    # so start reading only after that folder exists.
    _await_metadata_log(spark, cfg.events_path, events)
    if cfg.available_now:
        events.awaitTermination()
        _raise_failed(events, "events")
    table = LatestStateTable(spark, cfg.latest_path, keep=cfg.keep_versions)

    def merge(rows: DataFrame, batch_id: int) -> None:
        table.apply_stream_batch(rows, batch_id)

    latest = (
        spark.readStream.schema(events_df.schema)
        .parquet(cfg.events_path)
        .writeStream.queryName(f"harvest-latest-{cfg.topic}")
        .foreachBatch(merge)
        .option("checkpointLocation", f"{cfg.checkpoint_location.rstrip('/')}/latest")
        .trigger(**trigger)
        .start()
    )
    return Pipeline(events, latest, lag=TopicLag(cfg.topic, cfg.kafka))


def _start_delta(events_df: DataFrame, cfg: PipelineConfig, trigger: dict[str, Any]) -> Pipeline:
    """One query: each micro-batch appended to the Delta event table and merged into the Delta
    latest-state table by :class:`~spark_reader.delta_tables.DeltaTables` (both idempotent by batch)."""
    tables = DeltaTables(cfg.events_path, cfg.latest_path, cfg.delta)
    events = (
        events_df.writeStream.queryName(f"harvest-events-{cfg.topic}")
        .foreachBatch(tables.foreach_batch)
        .option("checkpointLocation", f"{cfg.checkpoint_location.rstrip('/')}/events")
        .trigger(**trigger)
        .start()
    )
    if cfg.available_now:
        events.awaitTermination()
        _raise_failed(events, "events")
    return Pipeline(events, None, lag=TopicLag(cfg.topic, cfg.kafka))


def run(spark: SparkSession, cfg: PipelineConfig, max_restarts: int = 3, poll_seconds: float = 1.0) -> int:
    """Run until both queries end (``available_now``: exit 0), SIGTERM/SIGINT (queries stopped: 0),
    or a query fails more than ``max_restarts`` times in a row (1). A failed query (a Kafka broker
    gone, a Python worker that did not start in time on a loaded node) stops both, and both restart
    from their checkpoints after a pause growing from 2 s, as a scheduler restarting the driver would,
    without the JVM's start-up; a restart that completes a micro-batch resets the count."""
    stopping: list[int] = []

    def on_signal(signum: int, _: Any) -> None:
        stopping.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    failures = 0
    error: BaseException | None
    while True:
        try:
            pipeline = start_pipeline(spark, cfg)
        except (RuntimeError, TimeoutError) as exc:  # the events query failed while starting
            error = exc
        else:
            log.info("pipeline running: events -> %s, latest state -> %s", cfg.events_path, cfg.latest_path)
            error = _watch(pipeline, stopping, poll_seconds)
            if error is None:
                return 0
            if pipeline.logged.get("events", -1) >= 0:  # it got through a micro-batch
                failures = 0
        failures += 1
        if failures > max_restarts:
            log.error("giving up after %d failed starts in a row: %s", failures, error)
            return 1
        pause = 2.0 * 2 ** (failures - 1)
        log.warning("restarting both queries from their checkpoints in %.0fs (failure %d): %s", pause, failures, error)
        time.sleep(pause)
        if stopping:
            return 0


def _watch(pipeline: Pipeline, stopping: list[int], poll_seconds: float) -> BaseException | None:
    """Until the queries end or a signal: None when they ended well or were stopped, else the error."""
    while True:
        time.sleep(poll_seconds)
        pipeline.log_progress()
        if stopping:
            log.info("signal %d: stopping the queries", stopping[0])
            pipeline.stop()
            return None
        done = [q for q in pipeline.queries if not q.isActive]
        failed = [q for q in done if q.exception() is not None]
        if failed:
            error = failed[0].exception()
            log.error("query %s failed: %s", failed[0].name, error)
            pipeline.stop()
            return error
        if len(done) == len(pipeline.queries):
            pipeline.log_progress()
            log.info("pipeline done (available-now)")
            return None


def _await_metadata_log(spark: SparkSession, events_path: str, query: StreamingQuery, timeout: float = 120.0) -> None:
    hadoop_path = spark._jvm.org.apache.hadoop.fs.Path  # type: ignore[union-attr]  # None: Spark Connect
    path = hadoop_path(f"{events_path.rstrip('/')}/_spark_metadata")
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    deadline = time.monotonic() + timeout
    while not fs.exists(path):
        _raise_failed(query, "events")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the events query did not create {path} within {timeout:.0f}s")
        time.sleep(0.2)


def drop_stale_log_files(spark: SparkSession, checkpoint: str) -> list[str]:
    """Delete the temporary files a killed driver left in a query's ``offsets/`` and ``commits/`` logs;
    returns their names. Spark writes each log entry to ``.<batch>.<uuid>.tmp`` and renames it: a kill
    between the two leaves the temporary file, which Spark ignores except on batch 0, where it refuses to
    start (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``: the log "should be empty"), so a driver killed
    while writing its first batch's offsets never came back. Only the (stopped) driver writes these files,
    and no entry is made of a temporary one: deleting them loses nothing."""
    jvm = spark._jvm  # None: Spark Connect, which has no such driver-side files to clean
    if jvm is None:
        return []
    dropped: list[str] = []
    for log_name in ("offsets", "commits"):
        folder = jvm.org.apache.hadoop.fs.Path(f"{checkpoint.rstrip('/')}/{log_name}")
        fs = folder.getFileSystem(spark._jsc.hadoopConfiguration())
        if not fs.exists(folder):
            continue
        for status in fs.listStatus(folder):
            name = status.getPath().getName()
            if name.endswith(".tmp") or name.endswith(".tmp.crc"):
                fs.delete(status.getPath(), False)
                dropped.append(f"{log_name}/{name}")
    if dropped:
        log.warning("%s: dropped %d temporary log file(s) a killed driver left: %s", checkpoint, len(dropped), dropped)
    return dropped


def _raise_failed(query: StreamingQuery, name: str) -> None:
    if not query.isActive and query.exception() is not None:
        raise RuntimeError(f"the {name} query failed: {query.exception()}") from None


# -- command line ---------------------------------------------------------------------------------


def build_parser(prog: str = "python -m harvest_outbox.spark_reader.pipeline") -> argparse.ArgumentParser:
    """The command line's options; harvest_local/pipeline_local.py adds its development ones (a local Spark,
    the embedded services) to it."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Stream a --uuid-sequencing topic into an event table and a latest-state-per-key table (Parquet or Delta), "
        "exactly once across restarts (docs/pipeline.md).",
    )
    parser.add_argument("--topic", required=True, help="the sequenced topic")
    parser.add_argument("--bootstrap", help="Kafka brokers host:port[,...] (required)")
    parser.add_argument(
        "--kafka-options-file",
        type=Path,
        help="a JSON object of further Spark kafka.* options (security settings: keeps secrets off the command line)",
    )
    parser.add_argument("--root", help="one folder for events/, latest/, checkpoint/ and state/")
    for name in ("events", "latest", "checkpoint", "state"):
        parser.add_argument(f"--{name}", help=f"the {name} location (overrides --root)")
    parser.add_argument("--trigger-seconds", type=float, default=2.0, help="micro-batch interval (default 2)")
    parser.add_argument("--available-now", action="store_true", help="process what the topic holds, then exit")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None, help="records per micro-batch")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="parquet",
        help="the tables' format: parquet (Spark's file sink) or delta (delta-rs, written by the driver)",
    )
    parser.add_argument(
        "--optimize-every",
        type=int,
        default=DeltaOptions.optimize_every,
        help="delta: OPTIMIZE, VACUUM and checkpoint both tables every N micro-batches with rows (0: never)",
    )
    parser.add_argument(
        "--vacuum-retention-hours",
        type=int,
        default=DeltaOptions.vacuum_retention_hours,
        help="delta: VACUUM deletes files removed from the table longer ago than this (default 168)",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=3,
        help="failed starts in a row restarted in-process from the checkpoints before exiting 1 (default 3)",
    )
    return parser


def config_from_args(args: argparse.Namespace, bootstrap: str, root: str | None) -> PipelineConfig:
    """The :class:`PipelineConfig` of parsed options (``bootstrap`` and ``root`` as resolved by the caller)."""
    kafka = {"kafka.bootstrap.servers": bootstrap}
    if args.kafka_options_file:
        try:
            extra = json.loads(args.kafka_options_file.read_text())
        except (OSError, ValueError) as exc:
            raise ReaderConfigError(f"--kafka-options-file {args.kafka_options_file}: {exc}") from exc
        if not isinstance(extra, dict) or not all(isinstance(k, str) and k.startswith("kafka.") for k in extra):
            raise ReaderConfigError(
                f"--kafka-options-file {args.kafka_options_file}: pass a JSON object of 'kafka.*' options"
            )
        kafka.update({k: str(v) for k, v in extra.items()})
    base = root.rstrip("/") if root else None
    locations: dict[str, str] = {}
    for name, key in (
        ("events", "events_path"),
        ("latest", "latest_path"),
        ("checkpoint", "checkpoint_location"),
        ("state", "state_location"),
    ):
        value = getattr(args, name) or (f"{base}/{name}" if base else None)
        if value is None:
            raise ReaderConfigError(f"--{name}: missing. Fix: pass --{name} or --root")
        locations[key] = value
    return PipelineConfig(
        topic=args.topic,
        kafka=kafka,
        trigger_seconds=args.trigger_seconds,
        available_now=args.available_now,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        format=args.format,
        delta=DeltaOptions(optimize_every=args.optimize_every, vacuum_retention_hours=args.vacuum_retention_hours),
        events_path=locations["events_path"],
        latest_path=locations["latest_path"],
        checkpoint_location=locations["checkpoint_location"],
        state_location=locations["state_location"],
    )


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    """The pipeline under ``spark-submit`` (the session and its master come from it). A local Spark with
    the connector jars from Maven, or the embedded services, is dev tooling's:
    ``python -m harvest_outbox.harvest_local.pipeline_local`` (docs/pipeline.md)."""
    args = build_parser().parse_args(argv)
    configure_logging()
    try:
        if args.bootstrap is None:
            raise ReaderConfigError("--bootstrap: missing. Fix: pass the brokers as host:port[,...]")
        cfg = config_from_args(args, args.bootstrap, args.root)
        from pyspark.sql import SparkSession

        return run(SparkSession.builder.appName("harvest-pipeline").getOrCreate(), cfg, max_restarts=args.max_restarts)
    except ReaderConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
