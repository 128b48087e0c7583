"""Read-committed, effectively-once Spark DataFrames of topics written by ``harvest --uuid-sequencing``.

``readCommitted(spark, topic, kafka_options)`` returns the committed records of a snapshot
(batch); ``read_committed`` also returns the read's checkpoint, for incremental reads;
``readCommittedStream`` is the streaming source. See docs/design.md §6.

The names load their modules when first used: Spark starts a fresh Python process for a streaming
data source's driver side at every query start (and forks workers that unpickle the source), and
those import only the modules the source itself needs, not the batch reader's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harvest_outbox._lazy import exports

if TYPE_CHECKING:
    from harvest_outbox.spark_reader.batch import CommittedRead, read_committed, readCommitted
    from harvest_outbox.spark_reader.errors import (
        MissingUUIDError,
        ReaderConfigError,
        SparkReaderError,
        StreamStateError,
    )
    from harvest_outbox.spark_reader.stream import readCommittedStream

_WHERE = {
    "CommittedRead": "batch",
    "read_committed": "batch",
    "readCommitted": "batch",
    "MissingUUIDError": "errors",
    "ReaderConfigError": "errors",
    "SparkReaderError": "errors",
    "StreamStateError": "errors",
    "readCommittedStream": "stream",
}

__all__ = [
    "CommittedRead",
    "MissingUUIDError",
    "ReaderConfigError",
    "SparkReaderError",
    "StreamStateError",
    "readCommitted",
    "readCommittedStream",
    "read_committed",
]


__getattr__, __dir__ = exports(__name__, _WHERE)
