"""kafka_arrow on the embedded Kafka broker (no Spark): a range reads exactly its records, in order,
also right after reads of other partitions, offsets and topics in the same process, and a read that
stops early can be closed."""

from __future__ import annotations

import pytest
from sequenced_log import offsets_by_partition, read_raw, write_log

from harvest_outbox.spark_reader.kafka_arrow import iter_range

pytestmark = [pytest.mark.integration]


def _offsets(topic: str, opts: dict[str, str], partition: int, start: int | None, end: int, chunk: int) -> list:
    out = []
    for batch in iter_range(topic, opts, partition, start, end, chunk):
        assert batch.num_rows <= chunk
        out += list(zip(batch.column("partition").to_pylist(), batch.column("offset").to_pylist(), strict=True))
    return out


def test_reads_return_exactly_their_range(kafka_bootstrap, topic_factory) -> None:
    a, b = topic_factory(partitions=2), topic_factory(partitions=1)
    write_log(kafka_bootstrap, a, 2, seed=61, steps=60)
    write_log(kafka_bootstrap, b, 1, seed=62, steps=30)
    by: dict[tuple[str, int], list[int]] = {}
    for t, n in ((a, 2), (b, 1)):
        for r in read_raw(kafka_bootstrap, t, n):
            by.setdefault((t, r.partition), []).append(r.offset)
    opts = {"kafka.bootstrap.servers": kafka_bootstrap}
    cases = [  # (topic, partition, start, end as a share of the partition, chunk)
        (a, 0, 0, 1.0, 7),
        (a, 1, None, 0.5, 1000),
        (a, 0, 10, 0.3, 3),  # back to an earlier offset of a partition read before
        (b, 0, 5, 1.0, 11),
        (a, 1, 0, 1.0, 50),
    ]
    for topic, p, start, share, chunk in cases:
        offsets = by[(topic, p)]
        end = offsets[0] + int(len(offsets) * share)
        first = offsets[0] if start is None else start
        expected = [(p, o) for o in offsets if first <= o < end]
        assert _offsets(topic, opts, p, start, end, chunk) == expected, (topic, p, start, end)

    reader = iter_range(a, opts, 0, 0, by[(a, 0)][-1] + 1, 5)
    next(reader)
    reader.close()  # a read stopped early: its consumer is closed with it


def test_one_read_of_several_partitions_returns_each_range_exactly(kafka_bootstrap, topic_factory) -> None:
    """iter_ranges: one consumer, partitions fetched side by side; each partition's records come in
    offset order and exactly its range (a partition read from its first record, one from an
    offset, one ending early, one with nothing to read), whatever the chunk."""
    from harvest_outbox.spark_reader.kafka_arrow import iter_ranges

    topic = topic_factory(partitions=4)
    write_log(kafka_bootstrap, topic, 4, seed=63, steps=80)
    by = offsets_by_partition(kafka_bootstrap, topic, 4)
    opts = {"kafka.bootstrap.servers": kafka_bootstrap}
    ranges = {
        0: (None, by[0][-1] + 1),
        1: (by[1][len(by[1]) // 3], by[1][-1] + 1),
        2: (0, by[2][len(by[2]) // 2]),
        3: (by[3][-1] + 1, by[3][-1] + 1),  # nothing to read
    }
    for chunk in (1, 7, 100_000):
        got: dict[int, list[int]] = {}
        for p, batch in iter_ranges(topic, opts, ranges, chunk):
            assert 0 < batch.num_rows <= chunk
            assert set(batch.column("partition").to_pylist()) == {p}
            got.setdefault(p, []).extend(batch.column("offset").to_pylist())
        for p, (start, end) in ranges.items():
            first = by[p][0] if start is None else start
            assert got.get(p, []) == [o for o in by[p] if first <= o < end], (p, chunk)
