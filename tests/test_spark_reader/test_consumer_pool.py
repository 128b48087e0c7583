"""consumer_pool: the stream's kept consumers (the module's invariants). The lending rules and the tail
on plain objects; a stream's successive reads through the pool on the embedded Kafka broker, record
for record against reads by new consumers."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from sequenced_log import offsets_by_partition, write_log

from harvest_outbox.spark_reader import consumer_pool
from harvest_outbox.spark_reader.consumer_pool import ConsumerPool
from harvest_outbox.spark_reader.kafka_arrow import iter_ranges


class _Client:
    """Stands in for a confluent-kafka consumer in the pool's own rules (the pool only seeks, polls once
    after an advance, and closes it); ``refuse``: its seek fails as librdkafka's does for a partition it is not fetching."""

    def __init__(self, refuse: bool = False) -> None:
        self.closed, self.refuse = False, refuse
        self.sought: list[int] = []

    def seek(self, tp: object) -> None:
        from confluent_kafka import KafkaError, KafkaException

        if self.refuse:
            raise KafkaException(KafkaError(KafkaError._STATE))
        self.sought.append(tp.offset)  # type: ignore[attr-defined]

    def consume(self, num_messages: int, timeout: float) -> list[object]:  # nothing fetched yet
        return []

    def close(self) -> None:
        assert not self.closed, "closed twice"
        self.closed = True


def _batch(first: int, n: int, size: int = 10) -> pa.RecordBatch:
    return pa.record_batch(
        {"offset": pa.array(np.arange(first, first + n), pa.int64()), "value": pa.array([b"x" * size] * n)}
    )


def _offsets(batches: list[pa.RecordBatch]) -> list[int]:
    return [o for b in batches for o in b.column("offset").to_pylist()]


KAFKA = {"kafka.bootstrap.servers": "b:1", "kafka.sasl.password": "s3cret"}
SKIP = consumer_pool.SKIP_RECORDS


@pytest.mark.parametrize(
    ("read_from", "refuse", "position", "head", "counts"),
    [
        (100, False, 100, list[int](), (1, 0, 0)),  # where the last read ended: it goes on, no tail records
        (95, False, 100, list(range(95, 100)), (1, 0, 0)),  # an open span's begin inside the tail
        (80, False, 100, list(range(80, 100)), (1, 0, 0)),  # the tail's first record
        (79, False, 79, [], (0, 1, 0)),  # before the tail: sought there
        (150, False, 150, [], (1, 0, 0)),  # a little past the kept position: read on, the read drops 100-149
        (100 + SKIP + 1, False, 100 + SKIP + 1, [], (0, 1, 0)),  # far past (another worker read on): sought
        (79, True, None, None, (0, 0, 1)),  # a seek refused: closed, the read makes a new consumer
    ],
    ids=["at-position", "inside-tail", "tail-start", "before-tail", "skip-ahead", "past-position", "seek-refused"],
)
def test_a_lease_serves_exactly_the_records_before_its_position(
    read_from: int, refuse: bool, position: int | None, head: list[int] | None, counts: tuple[int, int, int]
) -> None:
    pool, client = ConsumerPool(), _Client(refuse)
    pool.give(KAFKA, "t", 0, client, 100, [_batch(80, 10), _batch(90, 10)])
    lease = pool.take(KAFKA, "t", 0, read_from)
    assert pool.counts() == counts
    if head is None:
        assert lease is None and client.closed
    else:
        assert lease is not None and lease.client is client and not client.closed
        assert lease.position == position and _offsets(lease.head) == head
        assert client.sought == ([read_from] if counts[1] else [])
    assert len(pool) == 0  # lent (or closed): never to two reads at once
    assert pool.take(KAFKA, "t", 0, 100) is None


def test_advancing_moves_only_a_consumer_kept_before_the_target_and_drops_its_tail() -> None:
    """advance: a kept consumer behind the target is sought there, keeps no tail (a read from before it
    seeks back) and is lent from there; one at or past the target, or none, or one advanced
    MAX_ADVANCES times since its last read, is left alone; a refused seek closes it."""
    pool, client = ConsumerPool(), _Client()
    pool.give(KAFKA, "t", 0, client, 100, [_batch(80, 20)])
    assert not pool.advance(KAFKA, "t", 0, 100) and not pool.advance(KAFKA, "t", 1, 500)
    assert pool.advance(KAFKA, "t", 0, 400) and client.sought == [400] and pool.advanced == 1
    assert not pool.advance(KAFKA, "t", 0, 300)  # already past: stays at 400
    lease = pool.take(KAFKA, "t", 0, 410)  # the next read from an open span's begin just past it: read on
    assert lease is not None and lease.position == 410 and lease.head == [] and client.sought == [400]
    pool.give(KAFKA, "t", 0, client, 600, [_batch(580, 20)])
    assert pool.advance(KAFKA, "t", 0, 900)
    lease = pool.take(KAFKA, "t", 0, 590)  # before the advanced position: the old tail is gone, sought back
    assert lease is not None and lease.position == 590 and client.sought == [400, 900, 590]
    pool.give(KAFKA, "t", 0, client, 700, [])
    for n in range(consumer_pool.MAX_ADVANCES):  # advanced again and again while other workers read
        assert pool.advance(KAFKA, "t", 0, 1000 * (n + 1))
    assert not pool.advance(KAFKA, "t", 0, 9000)  # MAX_ADVANCES in a row without a read: left where it is
    lease = pool.take(KAFKA, "t", 0, 1000 * consumer_pool.MAX_ADVANCES)
    assert lease is not None
    pool.give(KAFKA, "t", 0, lease.client, 9000, [])
    assert pool.advance(KAFKA, "t", 0, 10_000)  # read again: advanced again
    failing = _Client()
    failing.consume = lambda n, t: (_ for _ in ()).throw(RuntimeError("closed"))  # type: ignore[method-assign]
    pool.give(KAFKA, "t", 2, failing, 10, [])
    assert not pool.advance(KAFKA, "t", 2, 20) and failing.closed  # a failed poll: closed, the task goes on
    refusing = _Client(refuse=True)
    pool.give(KAFKA, "t", 1, refusing, 10, [])
    assert not pool.advance(KAFKA, "t", 1, 20) and refusing.closed and len(pool) == 1  # partition 0 stays


def test_the_tail_is_a_bounded_copy_of_the_reads_last_records(monkeypatch) -> None:
    monkeypatch.setattr(consumer_pool, "TAIL_RECORDS", 12)
    last = [_batch(0, 10), _batch(10, 10)]
    tail = consumer_pool._tail(last)
    assert tail is not None and _offsets([tail]) == list(range(8, 20))
    assert tail.column("offset").buffers()[1].address != last[1].column("offset").buffers()[1].address
    monkeypatch.setattr(consumer_pool, "TAIL_BYTES", 5 * last[1].nbytes // 10)  # five records' worth
    tail = consumer_pool._tail(last)
    assert tail is not None and _offsets([tail]) == list(range(15, 20))
    assert consumer_pool._tail([]) is None and consumer_pool._tail([_batch(0, 0)]) is None


def test_kept_consumers_are_keyed_expired_bounded_and_hidden(monkeypatch) -> None:
    now = [0.0]
    pool = ConsumerPool(clock=lambda: now[0])
    a, b, other = _Client(), _Client(), _Client()
    pool.give(KAFKA, "t", 0, a, 10, [])
    pool.give({**KAFKA, "kafka.bootstrap.servers": "c:1"}, "t", 0, other, 10, [])  # another cluster: its own
    assert pool.take(KAFKA, "t", 1, 10) is None and pool.take(KAFKA, "u", 0, 10) is None
    pool.give(KAFKA, "t", 0, b, 20, [])  # a second consumer for the same key replaces (closes) the first
    assert a.closed and len(pool) == 2
    assert "s3cret" not in repr(pool) and "b:1" not in repr(pool)
    now[0] = consumer_pool.IDLE_SECONDS + 1
    assert pool.take(KAFKA, "t", 5, 0) is None  # any take closes what idled too long
    assert b.closed and other.closed and len(pool) == 0
    monkeypatch.setattr(consumer_pool, "MAX_KEPT", 3)
    clients = [_Client() for _ in range(5)]
    for p, c in enumerate(clients):
        pool.give(KAFKA, "t", p, c, 10, [])
    assert [c.closed for c in clients] == [True, True, False, False, False]  # least recently given first
    pool.close()
    assert all(c.closed for c in clients) and len(pool) == 0


@pytest.mark.integration
def test_a_streams_successive_reads_through_the_pool_equal_new_consumers_reads(kafka_bootstrap, topic_factory) -> None:
    """Ranges as a stream's micro-batches read them: each from the previous end, or a little before it
    (an open span's begin), one starting before the kept tail, one stopped early; whatever the pool
    did, every read returns exactly its range, and a consumer goes on from where it stopped."""
    topic = topic_factory(partitions=2)
    write_log(kafka_bootstrap, topic, 2, seed=64, steps=120)
    by = offsets_by_partition(kafka_bootstrap, topic, 2)
    opts = {"kafka.bootstrap.servers": kafka_bootstrap}
    ends = {p: offsets[-1] + 1 for p, offsets in by.items()}
    cut = {p: [e * k // 5 for k in range(6)] for p, e in ends.items()}
    pool = ConsumerPool()

    def read(ranges: dict[int, tuple[int, int]], chunk: int = 7) -> dict[int, list[int]]:
        got: dict[int, list[int]] = {}
        for p, batch in iter_ranges(topic, opts, ranges, chunk, pool):
            assert 0 < batch.num_rows <= chunk and set(batch.column("partition").to_pylist()) == {p}
            got.setdefault(p, []).extend(batch.column("offset").to_pylist())
        return got

    def expected(ranges: dict[int, tuple[int, int]]) -> dict[int, list[int]]:
        return {p: [o for o in by[p] if lo <= o < hi] for p, (lo, hi) in ranges.items() if lo < hi}

    steps = [  # (ranges, reads (reused, sought, missed))
        ({0: (0, cut[0][1]), 1: (0, cut[1][1])}, (0, 0, 2)),  # first reads: new consumers
        ({0: (cut[0][1], cut[0][2]), 1: (cut[1][1] - 3, cut[1][2])}, (2, 0, 0)),  # on from the end / the tail
        # 1 skips a micro-batch: fewer than SKIP_RECORDS on, it reads on and drops the records between
        ({0: (cut[0][2] - 1, cut[0][3]), 1: (cut[1][3], cut[1][4])}, (2, 0, 0)),
        ({0: (0, cut[0][4]), 1: (cut[1][2], cut[1][3])}, (0, 2, 0)),  # back before the tails: sought
        ({0: (cut[0][4], cut[0][4] + 2), 1: (cut[1][3] - 1, cut[1][4])}, (2, 0, 0)),
        ({0: (cut[0][4], cut[0][4] + 2), 1: (cut[1][4] - 20, cut[1][4])}, (2, 0, 0)),  # 20 from the tail: 3 batches
    ]
    for ranges, counts in steps:
        before = pool.counts()
        assert read(ranges) == expected(ranges), ranges
        assert tuple(n - b for n, b in zip(pool.counts(), before, strict=True)) == counts, ranges
        assert len(pool) == 2
    kept = pool._kept[(topic, 1, tuple(sorted(opts.items())))].client
    reader = iter_ranges(topic, opts, {1: (cut[1][4], ends[1])}, 3, pool)
    next(reader)
    reader.close()  # stopped early: its consumer is closed, not kept
    assert len(pool) == 1
    with pytest.raises(RuntimeError):
        kept.assignment()  # closed
    last = {0: (cut[0][4] + 2, ends[0]), 1: (cut[1][4], ends[1])}
    assert read(last, 100_000) == expected(last)
    # Another task read partition 0 on: this worker's consumer is advanced to a little before where that
    # read ended, and the next read, from an open span's begin just past that, reads on from it.
    assert pool.advance(opts, topic, 0, cut[0][1]) is False  # already past: left alone
    lent = pool.take(opts, topic, 0, cut[0][1])  # lent back at cut[0][1] (sought), then kept there
    assert lent is not None
    pool.give(opts, topic, 0, lent.client, cut[0][1], [])
    assert pool.advance(opts, topic, 0, cut[0][3])
    for ranges, counts in (
        ({0: (cut[0][3] + 3, cut[0][4])}, (1, 0, 0)),  # read on from the advanced position, 3 records dropped
        ({0: (cut[0][2], cut[0][3])}, (0, 1, 0)),  # before it: sought back
    ):
        before = pool.counts()
        assert read(ranges) == expected(ranges), ranges
        assert tuple(n - b for n, b in zip(pool.counts(), before, strict=True)) == counts, ranges
    pool.close()
