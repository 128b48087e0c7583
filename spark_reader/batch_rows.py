"""The rows a batch read's task returns: committed rows, then its journal's end states.

A batch read's checkpoint is made of what its tasks computed: each task that sequenced a
topic-partition appends, after the partition's committed rows (``_kind`` 0), one row per producer
state at the end of the read (``_kind`` 1) and a sentinel (``_kind`` 2: "this partition was read",
so its starting states, possibly all pruned, are not carried over). The read's DataFrame keeps
``_kind = 0``; :meth:`batch.CommittedRead.checkpoint` collects the others and
:func:`assemble_checkpoint` turns them into the bytes ``ReadCommittedIter.checkpoint()`` makes.
Both batch paths (harvest's data source and Spark's Kafka source) use these rows.

Invariant: the checkpoint's offsets are the read's ``end`` for every partition; its producer
states are the end states of every journal a task read, and the starting states of the others.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from harvest_outbox.sequencer import ProducerState, encode_checkpoint
from harvest_outbox.spark_reader.offsets import ReadRange
from harvest_outbox.spark_reader.schema import SEQUENCED

STATE_FIELDS = ("_kind", "_state_producer", "_state_last_ack", "_state_begin")
_STATE_ARROW = [
    pa.field("_kind", pa.int8()),
    pa.field("_state_producer", pa.binary()),
    pa.field("_state_last_ack", pa.int64()),
    pa.field("_state_begin", pa.int64()),
]


def full_schema() -> Any:
    """The Spark schema of a task's rows: :data:`SEQUENCED` plus the state columns."""
    from pyspark.sql.types import BinaryType, ByteType, LongType, StructField, StructType

    return StructType(
        [
            *SEQUENCED.fields,
            StructField("_kind", ByteType()),
            StructField("_state_producer", BinaryType()),
            *(StructField(n, LongType()) for n in STATE_FIELDS[2:]),
        ]
    )


def with_state_fields(schema: pa.Schema) -> pa.Schema:
    """The Arrow schema of a task's rows, given its committed rows' schema."""
    return pa.schema([*schema, *_STATE_ARROW])


def committed_rows(rows: pa.Table) -> pa.Table:
    """Committed rows with ``_kind`` 0 and null state columns."""
    n = rows.num_rows
    rows = rows.append_column(_STATE_ARROW[0], pa.array(np.zeros(n, np.int8)))
    for f in _STATE_ARROW[1:]:
        rows = rows.append_column(f, pa.nulls(n, f.type))
    return rows


def end_rows(partition: int, states: list[ProducerState], schema: pa.Schema) -> pa.Table:
    """The journal's end states (``_kind`` 1) and the sentinel (``_kind`` 2), in ``schema`` (a task's
    rows' Arrow schema: :func:`with_state_fields`)."""
    n = len(states) + 1
    columns: dict[str, Any] = {f.name: pa.nulls(n, f.type) for f in schema}
    columns["partition"] = pa.array([partition] * n, schema.field("partition").type)
    columns["_kind"] = pa.array([1] * len(states) + [2], pa.int8())
    columns["_state_producer"] = pa.array([st.producer for st in states] + [None], pa.binary())
    columns["_state_last_ack"] = pa.array([st.last_ack for st in states] + [None], pa.int64())
    columns["_state_begin"] = pa.array([st.begin for st in states] + [None], pa.int64())
    return pa.table([columns[f.name] for f in schema], schema=schema)


def assemble_checkpoint(rng: ReadRange, rows: list[Any]) -> bytes:
    """The read's checkpoint from its tasks' state rows (``_kind > 0``, as collected Spark Rows; the
    tasks' Sequencers pruned the states already)."""
    read = {int(row["partition"]) for row in rows if row["_kind"] == 2}
    states: dict[tuple[int, bytes], ProducerState] = {
        key: st
        for key, st in rng.states.items()
        if key[0] not in read  # journals with nothing to read
    }
    for row in rows:
        if row["_kind"] == 1:
            key = (int(row["partition"]), bytes(row["_state_producer"]))
            states[key] = ProducerState(
                f"{rng.topic}/{key[0]}", key[1], int(row["_state_last_ack"]), int(row["_state_begin"])
            )
    kept = [st for _, st in sorted(states.items())]
    offsets = {f"{rng.topic}/{p}": o for p, o in rng.end.items()}
    offsets.update(rng.foreign_offsets)
    return encode_checkpoint(offsets, kept + list(rng.foreign_states))
