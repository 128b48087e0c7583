"""readCommittedStream's packing of records into Arrow IPC blobs (pure logic, no Spark): blobs stay
within their row and byte bounds, and unpacking gives back every record of each partition, in order."""

from __future__ import annotations

import pyarrow as pa

from harvest_outbox.sequencer import ProducerState
from harvest_outbox.spark_reader import stream


def _records(partitions: list[int], value_size: int) -> pa.Table:
    return pa.table(
        {
            "key": pa.array([b"k%d" % i for i in range(len(partitions))]),
            "value": pa.array([b"v" * value_size] * len(partitions)),
            "partition": pa.array(partitions, pa.int32()),
            "offset": pa.array(range(len(partitions)), pa.int64()),
        }
    )


def test_blobs_bounded_by_rows_and_bytes() -> None:
    small = _records([0] * (2 * stream._BLOB_ROWS + 5), 10).drop_columns(["partition"])
    assert [c.num_rows for c in stream._chunks(small)] == [stream._BLOB_ROWS, stream._BLOB_ROWS, 5]
    large = _records([0] * 400, 1 << 20).drop_columns(["partition"])  # 1 MiB values
    chunks = list(stream._chunks(large))
    assert len(chunks) > 1 and all(c.nbytes <= stream._BLOB_BYTES + (1 << 20) for c in chunks)
    assert sum(c.num_rows for c in chunks) == 400
    assert list(stream._chunks(large.slice(0, 0))) == []


def test_pack_then_unpack_gives_each_partitions_records_in_order() -> None:
    table = _records([0, 1, 0, 2, 1, 0], 3)
    packed = pa.Table.from_batches(list(stream._pack_table(table)))
    assert sorted(packed.column("partition").to_pylist()) == [0, 1, 2]
    for partition, first, blob in zip(
        *(packed.column(c).to_pylist() for c in ("partition", "first", "blob")), strict=True
    ):
        rows = stream._from_ipc(blob)
        want = [i for i, p in enumerate([0, 1, 0, 2, 1, 0]) if p == partition]
        assert rows.column("offset").to_pylist() == want and first == want[0]
        assert "partition" not in rows.column_names  # the grouping key carries it


def test_producer_states_round_trip() -> None:
    states = [
        ProducerState("t/3", b"\x01\x02\x03\x04\x05\x06", 123, -1),
        ProducerState("t/3", b"\xff" * 6, 1 << 62, 42),
    ]
    assert stream._unpack_states("t/3", stream._pack_states(states)) == states
