"""Read-committed, effectively-once Spark DataFrames of topics written by ``harvest --uuid-sequencing``.

``readCommitted(spark, topic, kafka_options)`` returns the committed records of a snapshot
(batch); ``read_committed`` also returns the read's checkpoint, for incremental reads;
``readCommittedStream`` is the streaming source. See docs/design.md §6.
"""

from harvest_outbox.spark_reader.batch import CommittedRead, read_committed, readCommitted
from harvest_outbox.spark_reader.errors import MissingUUIDError, ReaderConfigError, SparkReaderError, StreamStateError
from harvest_outbox.spark_reader.stream import readCommittedStream

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
