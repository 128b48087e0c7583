"""A child process that encodes a batch's Avro values for the relay (``serialization.encodeWorker: true``).

Why: the relay is one Python interpreter. Encoding in its mark worker thread (producer/encode/serialization.py)
takes the interpreter lock from the relay thread that produces and acknowledges, for ~2 µs a row (~4.7
before each schema was compiled, producer/encode/_avro_compiled.py); in a child process the JSON parse, the
validation and the Avro write run on another core, and the relay pays the pipe: pickling the batch's
stored values out and the encoded ones back (~0.3 µs a row, measured by bench/bench_registry.py's
``avro_worker`` variant). Worth it when a core is free for the child;
on a machine whose cores the database and the broker already keep busy it only moves the work.

The child runs :func:`~producer.encode._avro_batch.encode_values`, the function the relay runs in process,
and keeps a parsed schema per schema id; the relay resolves schemas (registry client, its caches and
latestTtl) and checks each schema id's first row against confluent-kafka's serializer itself, so the
child never talks to the registry and holds no credentials.

Invariants (tests/test_producer/encode/test_encode_worker.py):
- the child's answer equals ``encode_values`` in process: the same bytes, the same refusal reasons;
- a child that dies or hangs (killed, out of memory, :data:`REPLY_TIMEOUT`) fails the batch with
  :class:`EncodeWorkerLost`, a :class:`DatabaseError`: the relay backs off and re-marks, rows wait,
  nothing is dead-lettered; the next batch starts a new child;
- the child exits when the relay's end of the pipe closes (:meth:`EncodeWorker.close`, the encoder
  garbage-collected, or the relay process gone): it never outlives the relay.
"""

from __future__ import annotations

import logging
import pickle
import socket
import subprocess
import sys
import threading
import weakref
from multiprocessing.connection import Connection
from typing import Any

from harvest_outbox.producer.encode._avro_batch import AvroWriter, encode_values
from harvest_outbox.producer.errors import DatabaseError

__all__ = ["REPLY_TIMEOUT", "EncodeWorker", "EncodeWorkerLost"]

log = logging.getLogger(__name__)

#: Seconds a batch may take in the child before it is taken for hung (killed, rows re-marked): far
#: above a mark's worth of rows (10,000 rows take ~50 ms).
REPLY_TIMEOUT = 60.0


class EncodeWorkerLost(DatabaseError):
    """The encode worker process died or hung while it encoded a batch: the batch waits (re-marked)."""


def _serve(conn: Connection) -> None:
    """The child: answer (schema id, schema text, values) with encode_values' list, until the pipe closes."""
    writers: dict[tuple[int, str], AvroWriter] = {}
    while True:
        try:
            request = conn.recv_bytes()
        except (EOFError, OSError):
            return  # the relay closed its end, or is gone
        try:
            schema_id, schema_str, values = pickle.loads(request)
            writer = writers.get((schema_id, schema_str))
            if writer is None:
                writer = writers[schema_id, schema_str] = AvroWriter(schema_id, schema_str)
            reply: Any = encode_values(writer, values)
        except Exception as exc:  # not a row's fault (each row's is in the list): the relay re-marks
            reply = f"{type(exc).__name__}: {exc}"
        conn.send_bytes(pickle.dumps(reply, protocol=5))


def _close(conn: Connection, process: subprocess.Popen[bytes]) -> None:
    conn.close()  # the child sees EOF and returns
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


class EncodeWorker:
    """The relay's end of one encode child, started by :meth:`start` or the first batch, replaced after
    it is lost. The child is ``python -m harvest_outbox.producer.encode.worker`` on one end of a socket
    pair: no fork of a threaded relay, and unlike multiprocessing's spawn it does not import the relay's
    ``__main__`` again (an application script without a ``__main__`` guard would run twice). One batch at a time (the relay's one mark worker calls it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[..., EncodeWorker] | None = None
        self.started = 0  # children started (1 unless one was lost)

    def __repr__(self) -> str:
        pid = self._process.pid if self._process is not None else None
        return f"EncodeWorker(pid={pid}, started={self.started})"

    def start(self) -> None:
        """Start the child now (it imports for ~0.5 s), so the first batch does not wait for it."""
        with self._lock:
            if self._conn is None:
                self._start()

    def _start(self) -> Connection:
        ours, theirs = socket.socketpair()
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno())], pass_fds=(theirs.fileno(),), close_fds=True
            )
        finally:
            theirs.close()
        conn = Connection(ours.detach())
        self._conn, self._process = conn, process
        self._finalizer = weakref.finalize(self, _close, conn, process)
        self.started += 1
        return conn

    def encode(self, writer: AvroWriter, values: list[bytes]) -> list[bytes | str]:
        """``encode_values(writer, values)``, computed in the child; raises :class:`EncodeWorkerLost`."""
        with self._lock:
            conn = self._conn if self._conn is not None else self._start()
            try:
                conn.send_bytes(pickle.dumps((writer.schema_id, writer.schema_str, values), protocol=5))
                if not conn.poll(REPLY_TIMEOUT):
                    raise TimeoutError(f"no answer in {REPLY_TIMEOUT:g} s")
                reply = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError, TimeoutError) as exc:
                code = self._process.poll() if self._process is not None else None
                self._drop()
                raise EncodeWorkerLost(
                    f"the encode worker process was lost ({type(exc).__name__}: {exc}; exit code {code}); "
                    f"the batch waits in the outbox and a new worker starts"
                ) from exc
            if isinstance(reply, str):
                self._drop()
                raise EncodeWorkerLost(f"the encode worker failed on a batch ({reply}); the batch waits in the outbox")
            if not isinstance(reply, list):
                self._drop()
                raise EncodeWorkerLost(
                    f"the encode worker answered a {type(reply).__name__}, not a list; the batch waits in the outbox"
                )
            return reply

    def _drop(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # closes the pipe, joins (or kills) the child
        self._conn = self._process = self._finalizer = None

    def close(self) -> None:
        """Stop the child (it exits on EOF)."""
        with self._lock:
            self._drop()


if __name__ == "__main__":  # the child: python -m harvest_outbox.producer.encode.worker <socket fd>
    _serve(Connection(int(sys.argv[1])))
