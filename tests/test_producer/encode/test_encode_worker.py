"""The Avro encode worker process (producer/encode/worker.py): its answer is ``encode_values``' in
process, bytes and refusal reasons alike; a child that is killed mid-run fails that batch with
EncodeWorkerLost (a DatabaseError: the relay re-marks, nothing is dead-lettered) and the next batch
gets a new child; the child exits when the relay closes it or drops the encoder."""

from __future__ import annotations

import gc
import json
import os
import signal
import time

import pytest

from harvest_outbox.producer.encode._avro_batch import AvroWriter, encode_values
from harvest_outbox.producer.encode.worker import EncodeWorker, EncodeWorkerLost
from harvest_outbox.producer.errors import DatabaseError

SCHEMA = {
    "type": "record",
    "name": "P",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}
VALUES = [
    json.dumps({"id": n, "note": None if n % 2 else f"n{n}", "at": 1_764_113_400_000 + n}).encode() for n in range(500)
]
VALUES[3] = b'{"id": 1.5, "at": 0}'  # does not fit: refused naming the field
VALUES[4] = b"{not json"
VALUES[5] = b'{"id": 12345678901234567890123, "at": 0}'  # beyond a long: refused, not truncated


def _gone(pid: int, timeout: float = 10.0) -> bool:
    """No process ``pid`` (nor a zombie: the worker reaps its child when it closes it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_the_child_answers_what_encode_values_answers_in_process() -> None:
    writer = AvroWriter(7, json.dumps(SCHEMA))
    worker = EncodeWorker()
    try:
        got = worker.encode(writer, VALUES)
    finally:
        worker.close()
    assert got == encode_values(writer, VALUES)
    assert got[0][:5] == b"\x00\x00\x00\x00\x07"
    assert isinstance(got[3], str) and "id" in got[3] and "does not match its schema" in got[3], got[3]
    assert isinstance(got[4], str) and got[4].startswith("value is not JSON"), got[4]
    assert isinstance(got[5], str) and "does not match its schema" in got[5], got[5]


def test_a_killed_child_fails_its_batch_as_an_outage_and_the_next_batch_gets_a_new_one() -> None:
    writer = AvroWriter(7, json.dumps(SCHEMA))
    worker = EncodeWorker()
    try:
        worker.encode(writer, VALUES[:10])
        process = worker._process
        assert process is not None
        pid = process.pid
        os.kill(pid, signal.SIGKILL)
        assert process.wait(10) == -signal.SIGKILL
        with pytest.raises(EncodeWorkerLost, match="the batch waits in the outbox") as info:
            worker.encode(writer, VALUES)
        assert isinstance(info.value, DatabaseError)  # the relay backs off and re-marks: rows wait
        assert worker.encode(writer, VALUES) == encode_values(writer, VALUES)
        assert worker.started == 2 and worker._process is not None and worker._process.pid != pid
    finally:
        worker.close()


@pytest.mark.parametrize("how", ["close", "garbage-collected"])
def test_the_child_exits_when_the_relay_closes_or_drops_it(how: str) -> None:
    worker = EncodeWorker()
    worker.start()
    assert worker._process is not None
    pid = worker._process.pid
    if how == "close":
        worker.close()
    else:
        del worker
        gc.collect()
    assert _gone(pid), f"encode worker {pid} still running after {how}"
