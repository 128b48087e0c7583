"""The streaming pipeline (:mod:`spark_reader.pipeline`) as a real process, for the demo, tests and bench.

A :class:`PipelineProcess` is one ``python -m harvest_outbox.harvest_local.pipeline_local`` driver in its
own process group, so :meth:`PipelineProcess.kill` takes down the Python driver, its JVM and (on
``local-cluster``) the executor JVMs at once with SIGKILL: a driver crash, as a node loss or an OOM
kill does it, with no shutdown hook running. Its log goes to a file.

Progress is observed in the tables themselves: :meth:`committed_batches` counts the event table's
committed micro-batches (the file sink's metadata log, or with ``format="delta"`` the Delta log's batch
commits), which is what a restart resumes after. With ``format="delta"`` the event table is read through
polars, an engine that reads Delta tables on its own (the verdict's independent reader).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from harvest_outbox.harvest_local.verify import Verdict, verify


@dataclass(frozen=True)
class CommittedFile:
    path: str
    modified: float  # wall-clock seconds: when the micro-batch wrote it (just before its commit)
    rows: int


def committed_files(events_path: Path) -> list[CommittedFile]:
    """Files of a local file-sink table per its ``_spark_metadata`` log (batch files and compactions:
    the newest compaction holds every earlier entry; Spark may delete older batch files after one)."""
    import pyarrow.parquet as pq

    log = events_path / "_spark_metadata"
    try:
        entries = sorted((int(p.name.split(".")[0]), p) for p in log.iterdir() if p.name.split(".")[0].isdigit())
    except FileNotFoundError:
        return []
    files: dict[str, float] = {}
    for _, entry in entries:
        for line in entry.read_text().splitlines()[1:]:  # the first line is the log's version
            if not line.strip():
                continue
            item = json.loads(line)
            if item.get("action") == "delete":
                files.pop(item["path"], None)
            else:
                files[item["path"]] = item["modificationTime"] / 1000.0
    out = []
    for uri, modified in files.items():
        local = unquote(urlparse(uri).path)
        out.append(CommittedFile(local, modified, pq.read_metadata(local).num_rows))
    return out


def table_verdict(pipeline: PipelineProcess, truth: dict[str, int], exactly_once: bool = True) -> Verdict:
    """The event table as its readers see it (the files its metadata log lists; a Delta table through polars),
    in delivery order, against the committed versions ``truth`` (:func:`harvest_local.verify.verify`)."""
    cols = ["key", "value", "partition", "offset", "ack_offset"]
    rows: list[tuple[int, int, int, bytes, bytes]] = []
    if pipeline.format == "delta":
        import polars as pl

        if delta_commits(pipeline.events_path):
            t = pl.read_delta(str(pipeline.events_path), columns=cols).to_dict(as_series=False)
            rows = list(zip(t["partition"], t["ack_offset"], t["offset"], t["key"], t["value"], strict=True))
        label = "Spark pipeline -> Delta table (polars)"
    else:
        import pyarrow.parquet as pq

        for f in pipeline.committed_files():
            t = pq.read_table(f.path, columns=cols).to_pydict()
            rows += zip(t["partition"], t["ack_offset"], t["offset"], t["key"], t["value"], strict=True)
        label = "Spark pipeline -> Parquet table"
    rows.sort(key=lambda r: r[:3])
    delivered = [(k.decode(), int(json.loads(v)["version"])) for _, _, _, k, v in rows]
    return verify(label, truth, delivered, exactly_once=exactly_once)


def delta_commits(table: Path) -> list[CommittedFile]:
    """A local Delta table's micro-batch commits (appends carrying the pipeline's batch id), oldest first, as
    :class:`CommittedFile` entries: the table at that version, the commit's time and the rows it added. Upkeep
    commits (OPTIMIZE, VACUUM) add no rows and are left out. [] before the table exists."""
    if not (table / "_delta_log").is_dir():
        return []
    from deltalake import DeltaTable

    try:
        history = DeltaTable(str(table)).history()
    except Exception:  # created by another process a moment ago, its first commit not yet readable
        return []
    out = []
    for h in sorted(history, key=lambda h: h["version"]):
        if "harvest.batch" not in h:
            continue
        rows = int((h.get("operationMetrics") or {}).get("num_added_rows", 0))
        out.append(CommittedFile(f"{table}@v{h['version']}", h["timestamp"] / 1000, rows))
    return out


class PipelineProcess:
    def __init__(
        self,
        *,
        topic: str,
        bootstrap: str,
        root: Path,
        logdir: Path,
        name: str = "pipeline",
        master: str = "local[2]",
        trigger_seconds: float = 1.0,
        max_offsets_per_trigger: int | None = None,
        format: str = "parquet",
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.topic, self.bootstrap, self.root, self.master = topic, bootstrap, root, master
        self.trigger_seconds, self.max_offsets_per_trigger = trigger_seconds, max_offsets_per_trigger
        self.format, self.extra_args = format, extra_args
        self.log = logdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def events_path(self) -> Path:
        return self.root / "events"

    @property
    def latest_path(self) -> Path:
        return self.root / "latest"

    def command(self, available_now: bool = False) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "harvest_outbox.harvest_local.pipeline_local",
            "--topic",
            self.topic,
            "--bootstrap",
            self.bootstrap,
            "--root",
            str(self.root),
            "--master",
            self.master,
            "--trigger-seconds",
            str(self.trigger_seconds),
            "--format",
            self.format,
            *self.extra_args,
        ]
        if self.max_offsets_per_trigger:
            cmd += ["--max-offsets-per-trigger", str(self.max_offsets_per_trigger)]
        return [*cmd, "--available-now"] if available_now else cmd

    def start(self, available_now: bool = False, env: dict[str, str] | None = None) -> PipelineProcess:
        """Start the driver; ``env`` adds to its environment (the Delta sink's test-only kill hook)."""
        if self.alive:
            raise RuntimeError(f"pipeline already running (pid {self.pid})")
        with self.log.open("a") as log:
            log.write(f"---- start {self.starts + 1}{' (available-now)' if available_now else ''}\n")
            log.flush()
            self.proc = subprocess.Popen(
                self.command(available_now),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                start_new_session=True,  # its own process group: kill() reaches the JVMs too
            )
        self.starts += 1
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the driver's whole process group (Python, its JVM, local-cluster executors)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._await_group_gone(self.proc.pid)

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (the driver stops its queries), then SIGKILL of the group after ``timeout``."""
        if self.proc is None:
            return None
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        return self.proc.returncode

    def wait(self, timeout: float) -> int:
        """Wait for a run to end by itself (``available_now``); its exit code."""
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise TimeoutError(f"pipeline run did not end within {timeout:.0f}s; log: {self.log}") from None
        self.kill()  # the JVM may outlive its Python parent for a moment: no orphan writes after this
        return code

    def committed_batches(self) -> int:
        """Micro-batches the event table's file sink has committed (its metadata log's newest id + 1; Delta:
        the batch commits in its log)."""
        if self.format == "delta":
            return len(delta_commits(self.events_path))
        log = self.events_path / "_spark_metadata"
        try:
            ids = [int(p.name.split(".")[0]) for p in log.iterdir() if p.name.split(".")[0].isdigit()]
        except FileNotFoundError:
            return 0
        return max(ids) + 1 if ids else 0

    def committed_files(self) -> list[CommittedFile]:
        """The event table's files as its metadata log lists them (what readers see), with their row
        counts from the Parquet footers: the table's size and ingest over time without a Spark session.
        Delta: one entry per micro-batch commit (:func:`delta_commits`)."""
        if self.format == "delta":
            return delta_commits(self.events_path)
        return committed_files(self.events_path)

    def latest_versions(self) -> dict[str, int] | None:
        """The latest-state table's newest committed version as {key: its ``version`` field}; None before a
        commit. Delta: read through polars."""
        if self.format == "delta":
            if not delta_commits(self.latest_path):
                return None
            import polars as pl

            t = pl.read_delta(str(self.latest_path), columns=["key", "value"]).to_dict(as_series=False)
            return {k.decode(): int(json.loads(v)["version"]) for k, v in zip(t["key"], t["value"], strict=True)}
        from harvest_outbox.spark_reader.latest_table import read_local_snapshot

        snapshot = read_local_snapshot(str(self.latest_path), columns=["key", "value"])
        if snapshot is None:
            return None
        table = snapshot.to_pydict()
        return {k.decode(): int(json.loads(v)["version"]) for k, v in zip(table["key"], table["value"], strict=True)}

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    @staticmethod
    def _await_group_gone(pgid: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            except PermissionError:
                return
            time.sleep(0.1)
