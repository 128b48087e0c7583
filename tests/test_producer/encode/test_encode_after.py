"""RowEncoder.after (producer/encode/serialization.py): a mark's rows are encoded on the encoder's own thread
while the mark worker runs the next mark; marks come out in the order they were marked, each with its
own rows; a mark's error (a DatabaseError) reaches the relay unchanged; close() stops the thread and
the next mark starts it again. Pure logic: the marks and the encoding are stand-ins with delays."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from harvest_outbox.producer.config.serialization import SerializationConfig
from harvest_outbox.producer.encode.serialization import RowEncoder
from harvest_outbox.producer.errors import DatabaseError

CONFIG = SerializationConfig.from_mapping({"registry": {"url": "http://registry:8081"}, "topics": []})


class _Timeline:
    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def add(self, what: str, n: int) -> None:
        with self.lock:
            self.events.append((what, n))


def test_marks_are_encoded_in_order_while_the_next_mark_runs() -> None:
    timeline = _Timeline()
    encoder = RowEncoder(CONFIG)

    def encode(rows: list[Any]) -> list[Any]:
        timeline.add("encode-start", rows[0])
        time.sleep(0.05)
        timeline.add("encode-end", rows[0])
        return [("encoded", r) for r in rows]

    def mark(n: int) -> tuple[list[Any], dict[int, Any]]:
        timeline.add("mark-start", n)
        time.sleep(0.02)
        return [n, n + 100], {n: (0, None)}

    encoder.encode = encode  # type: ignore[method-assign]
    marks = ThreadPoolExecutor(1)  # the relay's one mark worker
    try:
        futures = [encoder.after(marks.submit(mark, n)) for n in range(4)]
        results = [f.result(timeout=10) for f in futures]
    finally:
        marks.shutdown()
        encoder.close()
    assert results == [([("encoded", n), ("encoded", n + 100)], {n: (0, None)}) for n in range(4)]
    events = timeline.events
    # the second mark ran while the first mark's rows were being encoded
    assert events.index(("mark-start", 1)) < events.index(("encode-end", 0)), events
    assert [n for what, n in events if what == "encode-start"] == [0, 1, 2, 3]


def test_a_marks_error_passes_through_and_close_then_reuse_works() -> None:
    encoder = RowEncoder(CONFIG)
    marks = ThreadPoolExecutor(1)

    def failing() -> tuple[list[Any], dict[int, Any]]:
        raise DatabaseError("mark failed: connection lost")

    try:
        with pytest.raises(DatabaseError, match="connection lost"):
            encoder.after(marks.submit(failing)).result(timeout=10)
        encoder.close()
        rows = [(1, "not-configured", b"k", b"v", None, None, None, None, None, None, 0.0)]
        assert encoder.after(marks.submit(lambda: (rows, {}))).result(timeout=10) == (rows, {})
    finally:
        marks.shutdown()
        encoder.close()
