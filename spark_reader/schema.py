"""The columns of a read-committed DataFrame.

Spark's Kafka source columns (``key``, ``value``, ``headers``, ``topic``, ``partition``,
``offset``, ``timestamp``), then the message identity (``uuid`` as text, ``producer`` as 6 bytes,
``clock``), then ``ack_offset``: the offset of the message that committed the row (its ACK, or the
row itself for OUTSIDE messages). Ordering by ``(partition, ack_offset, offset)`` gives exactly the
order ReadCommittedIter delivers within a partition.
"""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))

# What the sequencing step works on: the Kafka source's columns the output needs (what Spark hands
# to mapInArrow), plus the raw uuid header, which the step picks out of the headers itself (topic
# and producer are added back after the step).
RAW = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("headers", HEADERS),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("uuid", BinaryType()),
    ]
)

SEQUENCED = StructType([*RAW.fields, StructField("ack_offset", LongType()), StructField("clock", LongType())])

OUTPUT_COLUMNS = [
    "key",
    "value",
    "headers",
    "topic",
    "partition",
    "offset",
    "timestamp",
    "uuid",
    "producer",
    "clock",
    "ack_offset",
]


def output_schema() -> StructType:
    """The reader's output columns (:data:`OUTPUT_COLUMNS`) with their Spark types."""
    types = {f.name: f for f in SEQUENCED.fields}
    extra = {
        "topic": StructField("topic", StringType()),
        "uuid": StructField("uuid", StringType()),  # as text: finish_columns
        "producer": StructField("producer", BinaryType()),
    }
    return StructType([extra.get(name) or types[name] for name in OUTPUT_COLUMNS])
