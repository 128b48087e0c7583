"""Where :mod:`spark_reader.stream_source` keeps the Sequencer state between micro-batches.

A PySpark data source has no state store, and its offsets are planned on the driver before the
executors have read the records, so the state cannot travel in the offsets. Each task that
sequences a partition's offsets ``[start, end)`` stores the partition's producer states at
``end``; the next micro-batch's task for that partition loads them back at its ``start``. Files
live under ``<location>/<run>/<partition>/<offset>``: ``run`` is fixed when a query first starts
(it travels in the query's offsets, so a restarted query finds its own files and a new query with
a fresh checkpoint never reads an old query's), and ``location`` is any filesystem pyarrow opens
by URI (a local path, ``file://``, ``hdfs://``, ``s3://``, ``gs://``) that every executor and the
driver can reach.

Invariants:
- the states stored at ``(run, partition, offset)`` are a function of the run's starting
  checkpoint and the log before ``offset`` only, so a task that is retried, speculated or replayed
  after a failure writes the same bytes again: a file is written to a temporary name and moved
  into place, and overwriting it is harmless;
- a file is deleted only below an offset the query has committed for its partition (no later
  micro-batch can start before it).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Any

import msgpack

from harvest_outbox.sequencer import ProducerState
from harvest_outbox.spark_reader.errors import ReaderConfigError, StreamStateError

_WIDTH = 20  # offsets zero-padded, so names sort in offset order
#: URI schemes pyarrow's ``FileSystem.from_uri`` opens: the state files are written through pyarrow,
#: not through Spark's Hadoop filesystems (so ``s3a://`` is not one of them).
SCHEMES = ("file", "hdfs", "viewfs", "s3", "gs", "gcs", "abfs", "abfss")
_FIX = (
    "Fix: pass a folder (existing, or one that can be created) every executor and the driver can reach: "
    f"a path or a URI of {', '.join(s + '://' for s in SCHEMES)}"
)


def check_state_location(value: Any) -> str:
    """``state_location`` as the stream will use it (a local path made absolute), checked when the stream
    is defined rather than in its first micro-batch: a local path must be a folder or creatable (not a
    file, not under a file, not a device such as /dev/null, writable), a URI must have a scheme pyarrow
    opens. Raises :class:`ReaderConfigError` naming the value, what is wrong and the fix."""
    if not isinstance(value, str) or not value.strip():
        raise ReaderConfigError(f"state_location={value!r}: not a folder path or URI. {_FIX}, or None")
    scheme, sep, rest = value.partition("://")
    if sep and scheme.lower() not in SCHEMES:
        hint = " (Hadoop's name for S3: write s3:// here)" if scheme.lower() in ("s3a", "s3n") else ""
        raise ReaderConfigError(
            f"state_location={value!r}: the scheme {scheme!r}{hint} is not one the state "
            f"files can be written to. {_FIX}"
        )
    if sep and scheme.lower() != "file":
        return value
    path = os.path.abspath(rest if sep else value)
    problem = _local_folder_problem(path)
    if problem is not None:
        raise ReaderConfigError(f"state_location={value!r}: {problem}. {_FIX}")
    return value if sep else path


def _local_folder_problem(path: str) -> str | None:
    """Why the local folder ``path`` cannot hold the state files, or None."""
    existing = path
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        kind = "a file" if os.path.isfile(existing) else "not a folder (a device, socket or broken link)"
        if existing == path:
            return f"{path!r} is {kind}"
        return f"{path!r} cannot be created: {existing!r} is {kind}"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing!r} is not writable by this user, so the state files cannot be written"
    return None


def _filesystem(location: str) -> tuple[Any, str]:
    from pyarrow import fs

    if "://" not in location:
        location = os.path.abspath(location)
        try:
            os.makedirs(location, exist_ok=True)
        except OSError as exc:  # changed since the stream was defined (check_state_location)
            raise ReaderConfigError(f"state_location={location!r} cannot be used: {exc.strerror}. {_FIX}") from exc
        return fs.LocalFileSystem(), location
    try:
        return fs.FileSystem.from_uri(location)
    except Exception as exc:
        raise ReaderConfigError(
            f"state_location={location!r} cannot be opened: {exc}. Fix: pass a path or a "
            "URI pyarrow can open (file://, hdfs://, s3://, gs://) that every executor "
            "and the driver can reach"
        ) from exc


@dataclass(frozen=True)
class StreamStateFiles:
    """The state files of one query run (``run``) under ``location``."""

    location: str
    run: str

    @staticmethod
    def new_run() -> str:
        return uuid.uuid4().hex

    def _root(self) -> tuple[Any, str]:
        fs, base = _filesystem(self.location)
        return fs, f"{base.rstrip('/')}/{self.run}"

    def put(self, partition: int, offset: int, states: list[ProducerState]) -> None:
        fs, root = self._root()
        folder = f"{root}/{partition}"
        fs.create_dir(folder, recursive=True)
        final = f"{folder}/{offset:0{_WIDTH}d}"
        temporary = f"{folder}/.{offset:0{_WIDTH}d}.{uuid.uuid4().hex}"
        with fs.open_output_stream(temporary) as out:
            out.write(msgpack.packb([[st.producer, st.last_ack, st.begin] for st in states]))
        fs.move(temporary, final)

    def get(self, topic: str, partition: int, offset: int) -> list[ProducerState]:
        from pyarrow import fs as pafs

        fs, root = self._root()
        path = f"{root}/{partition}/{offset:0{_WIDTH}d}"
        if fs.get_file_info(path).type != pafs.FileType.File:
            raise StreamStateError(
                f"no sequencing state for {topic}/{partition} at offset {offset} in {self.location!r} (run "
                f"{self.run}): the state location lost files this query wrote (deleted, or not reachable from "
                "this executor). The rows committed from this offset on cannot be told apart from duplicates "
                "without it. Fix: restore the folder, or start a new query (fresh checkpoint) with starting= a "
                "checkpoint taken where the output ends"
            )
        with fs.open_input_stream(path) as f:
            data = f.read()
        journal = f"{topic}/{partition}"
        return [
            ProducerState(journal, bytes(p), int(last_ack), int(begin)) for p, last_ack, begin in msgpack.unpackb(data)
        ]

    def prune(self, partition: int, below: int) -> int:
        """Delete the partition's files for offsets below ``below``; returns how many."""
        from pyarrow import fs as pafs

        fs, root = self._root()
        selector = pafs.FileSelector(f"{root}/{partition}", allow_not_found=True)
        removed = 0
        for info in fs.get_file_info(selector):
            name = info.base_name
            if info.type == pafs.FileType.File and name.isdigit() and int(name) < below:
                fs.delete_file(info.path)
                removed += 1
        return removed
