"""Topic-partitions' offset ranges read with confluent-kafka inside a Spark task, as Arrow.

The reading half of harvest's own data sources (the batch reader, :mod:`spark_reader.batch_source`,
and the stream, :mod:`spark_reader.stream_source`): no Spark Kafka source, records cross from
Python to the JVM once, as Arrow, after sequencing.

Invariants:
- :func:`iter_ranges` yields, for each partition of the read in turn, its records with
  ``read_from <= offset < end`` in offset order, in record batches of at most ``chunk`` records
  (:data:`RAW_SCHEMA`, Spark's Kafka source columns less ``topic``). A range that cannot be read
  to its end fails with the offset it stopped at, never ends early; :func:`iter_range` is the
  one-partition case;
- Python holds at most one batch's records as Python objects at a time;
- a consumer serves one partition's range and is closed after it, or given back to the caller's pool
  (:func:`iter_ranges` opens the next partition's new consumer while reading the current one: at most
  two new ones at a time; the pool's kept consumers of a read are all taken at its start).

A consumer is never reassigned to another partition: one unassigned and assigned to the next task's
range made a stream of 1M records read at 0.40 of Spark's raw stream against 0.68-0.72 with a
consumer per read. A stream's reads keep one per partition instead (:mod:`spark_reader.consumer_pool`),
which goes on from where its last read ended, with the records it fetched ahead: 1M records read as ten
micro-batches of 8 partitions in 1.7-2.5 s against 3.9-5.7 s with a consumer per read (the same
window). A consumer costs ~20-25 ms (connection, first fetch, close), hidden behind the
previous partition's read when a task reads several. Fetches are bounded (1 MiB per partition,
16 MiB and at most 16,384 records, or the range's if fewer, queued ahead, fetched again 10 ms after
the queue drains): a task reads a bounded range, and whatever is fetched beyond its end is thrown
away (docs/reading-spark.md has the measurements).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from harvest_outbox.kafka_access import AccessWatch, KafkaAccessError, topic_metadata
from harvest_outbox.spark_reader import offsets as offsets_mod
from harvest_outbox.spark_reader.consumer_pool import ConsumerPool, LastBatches, Lease
from harvest_outbox.spark_reader.errors import ReaderConfigError, SparkReaderError

_GROUP = "harvest-spark-reader"  # never joined: partitions are assigned and offsets never committed
CHUNK = 65536  # records per Arrow batch while reading (bounds the Python lists)
_QUEUED_AHEAD = 16384  # records librdkafka keeps queued ahead of a read (about one 1 MiB fetch of small records)
_STALL_SECONDS = 60.0  # no record and no position change for this long: fail the task, say where
_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
_TIMESTAMP = pa.timestamp("us", tz="UTC")

RAW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", _HEADERS),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", _TIMESTAMP),
    ]
)


def consumer(kafka: Mapping[str, str], wanted: int | None = None, watch: AccessWatch | None = None) -> Any:
    """A confluent-kafka consumer from Spark-style ``kafka.*`` options, for assigned reads;
    ``wanted``: the records the read needs, if known (librdkafka then queues about that many ahead,
    not its default 100,000); ``watch``: its ``error_cb``, for :func:`watermarks`."""
    from confluent_kafka import Consumer

    conf: dict[str, Any] = {
        "isolation.level": "read_uncommitted",  # as Spark's Kafka source
        **offsets_mod.client_config(kafka),
        "group.id": _GROUP,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    # A task reads a bounded range, and whatever librdkafka fetches beyond its end is read from the
    # broker, decompressed and thrown away: fetches of librdkafka's default 1 MiB per partition, a
    # prefetch queue of at most 16 MiB, and a short long-poll.
    conf.setdefault("max.partition.fetch.bytes", 1 << 20)
    conf.setdefault("queued.max.messages.kbytes", 16 << 10)
    conf.setdefault("fetch.wait.max.ms", 10)
    # librdkafka keeps fetching a partition while fewer than queued.min.messages (default 100,000)
    # are queued, at a few hundred bytes of its own per message: two consumers (a task opens the next
    # partition's while reading one) queued 100,000 each, ~100 MiB more RSS per task.
    # A partition whose queue is full is fetched again only after fetch.queue.backoff.ms (default
    # 1 s): with a queue this short the reader emptied it long before, and waited (4 x 126,000
    # records: 3.6-3.9 s with the default, 1.7-2.3 s with 10 ms).
    conf.setdefault("queued.min.messages", max(1, min(_QUEUED_AHEAD, wanted if wanted is not None else _QUEUED_AHEAD)))
    conf.setdefault("fetch.queue.backoff.ms", 10)
    if watch is not None:
        conf["error_cb"] = watch
    return Consumer(conf)


@contextmanager
def read_consumer(kafka: Mapping[str, str]) -> Iterator[Any]:
    """A new consumer for ``kafka``, closed when the block ends (cleanly or not)."""
    client = consumer(kafka)
    try:
        yield client
    finally:
        client.close()


def watermarks(
    topic: str, kafka: Mapping[str, str], client: Any = None, watch: AccessWatch | None = None
) -> dict[int, tuple[int, int]]:
    """``{partition: (low, high)}`` of ``topic``, asked with ``client`` (a :func:`consumer` the caller
    keeps, e.g. a stream's driver across micro-batches, made with ``watch``) or a consumer made for the
    call. A refused login or TLS handshake is a :class:`ReaderConfigError` saying why, at once."""
    from confluent_kafka import TopicPartition

    if client is None:
        own_watch = AccessWatch()
        own = consumer(kafka, watch=own_watch)
        try:
            return watermarks(topic, kafka, own, own_watch)
        finally:
            own.close()
    try:
        if watch is None:
            listed = client.list_topics(topic, timeout=30)
        else:
            listed = topic_metadata(client, topic, 30, watch, offsets_mod.client_config(kafka))
    except KafkaAccessError as exc:
        raise ReaderConfigError(f"topic {topic!r}: {exc}") from None
    meta = listed.topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise ReaderConfigError(
            f"topic {topic!r} does not exist or has no partitions ({meta.error if meta else 'unknown'}); "
            "check the name and kafka.bootstrap.servers"
        )
    return {p: client.get_watermark_offsets(TopicPartition(topic, p), timeout=30) for p in sorted(meta.partitions)}


def iter_range(
    topic: str, kafka: Mapping[str, str], partition: int, read_from: int | None, end: int, chunk: int = CHUNK
) -> Iterator[pa.RecordBatch]:
    """The partition's records from ``read_from`` (None: its first) up to ``end``, as Arrow batches."""
    for _, batch in iter_ranges(topic, kafka, {partition: (read_from, end)}, chunk):
        yield batch


def iter_ranges(
    topic: str,
    kafka: Mapping[str, str],
    ranges: Mapping[int, tuple[int | None, int]],
    chunk: int = CHUNK,
    pool: ConsumerPool | None = None,
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Several partitions' ranges ``{partition: (read_from, end)}`` read one after the other (in
    partition order): ``(partition, batch)`` pairs.

    A consumer per partition, the next one opened (connected, assigned, fetching) while the
    current one is read, so its ~20 ms of set-up overlaps the reading. Not one consumer for all:
    assigned several partitions at once, librdkafka prefetched each far beyond a short range's end
    (a batch of messages held 2.5 times the records wanted, for 4 ranges of 12,700 records); and
    reassigned from one partition to the next, a ``consume()`` every other time waited its whole
    timeout (1 s) for records that came at once on the next call.

    ``pool`` (a stream's reads, :mod:`spark_reader.consumer_pool`): each partition's consumer is taken
    from it when one is kept where this read can go on from, and given back after a clean read with
    the read's last records."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    todo = [(p, r) for p, r in sorted(ranges.items()) if r[0] is None or r[0] < r[1]]
    opened: list[Any] = []
    # The pool's consumers for every partition of the read, taken (and sought where they must be) at
    # once: each goes on fetching its range while the partitions before it are read. They are alive
    # already, so this holds no more memory than keeping them did; new consumers are still opened one
    # ahead of the read.
    leased: dict[int, Lease] = {}

    def open_for(i: int) -> Lease:
        p, (read_from, end) = todo[i]
        lease = leased.pop(p, None)
        if lease is not None:
            return lease
        # a consumer for the pool queues its full share ahead: the stream's next micro-batch reads on
        client = consumer(kafka, end - read_from if read_from is not None and pool is None else None)
        opened.append(client)
        client.assign([TopicPartition(topic, p, read_from if read_from is not None else OFFSET_BEGINNING)])
        return Lease(client, read_from if read_from is not None else -1, [])

    try:
        if pool is not None:
            for p, (read_from, _) in todo:
                if read_from is not None and (lease := pool.take(kafka, topic, p, read_from)) is not None:
                    opened.append(lease.client)
                    leased[p] = lease
        upcoming: Lease | None = open_for(0) if todo else None
        for i, (partition, (_, end)) in enumerate(todo):
            assert upcoming is not None
            lease, upcoming = upcoming, open_for(i + 1) if i + 1 < len(todo) else None
            last = LastBatches()
            for batch in _head_within(lease.head, end, chunk):
                last.append(batch)
                yield partition, batch
            read = _Read()
            if lease.position < end:
                for batch in _read_one(lease.client, topic, partition, lease.position, end, chunk, read):
                    last.append(batch)
                    yield partition, batch
            opened.remove(lease.client)
            if pool is not None and not read.overshot and lease.position <= end:
                pool.give(kafka, topic, partition, lease.client, end, list(last.batches))
            else:
                lease.client.close()
    finally:
        for client in opened:
            client.close()


@dataclass
class _Read:
    """What :func:`_read_one` saw: ``overshot``, a record at or past the range's end was consumed (and
    dropped), so the consumer's next record is not the first after the end."""

    overshot: bool = False


def _head_within(head: list[pa.RecordBatch], end: int, chunk: int) -> list[pa.RecordBatch]:
    """The pool's head records below ``end``, in batches of at most ``chunk``."""
    out = []
    for batch in head:
        n = int(np.searchsorted(batch.column("offset").to_numpy(), end))
        out += [batch.slice(i, min(chunk, n - i)) for i in range(0, n, chunk)]
    return out


def _read_one(
    client: Any, topic: str, partition: int, read_from: int, end: int, chunk: int, read: _Read | None = None
) -> Iterator[pa.RecordBatch]:
    """The records ``[read_from, end)`` (``read_from`` -1: from the first the consumer returns)."""
    from confluent_kafka import KafkaError, TopicPartition

    position = read_from
    keys: list[Any] = []
    values: list[Any] = []
    headers: list[Any] = []
    offsets: list[int] = []
    stamps: list[int] = []
    stalled_since = time.monotonic()
    while position < end:
        want = min(chunk - len(offsets), end - position) if position >= 0 else chunk - len(offsets)
        got = False
        full: pa.RecordBatch | None = None
        with _cyclic_gc_paused():
            msgs = client.consume(max(1, want), 1.0)
            if msgs and position >= 0:
                msgs = _from_position(msgs, partition, position)
            if msgs and _in_range_run(msgs, partition, position, end):
                # The common case, column by column (a list comprehension per field costs less
                # than one loop over the records doing them all).
                keys += [m.key() for m in msgs]
                values += [m.value() for m in msgs]
                headers += [m.headers() for m in msgs]
                first = msgs[0].offset()
                offsets += range(first, first + len(msgs))
                stamps += [m.timestamp()[1] for m in msgs]
                position, got, msgs = first + len(msgs), True, []
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise SparkReaderError(f"reading {topic}/{partition} at offset {position}: {err.str()}")
                offset = msg.offset()
                if msg.partition() != partition or offset < position:
                    continue  # fetched for the consumer's previous assignment: not this read's
                if offset >= end:
                    position = end
                    if read is not None:
                        read.overshot = True
                    break
                keys.append(msg.key())
                values.append(msg.value())
                headers.append(msg.headers())
                offsets.append(offset)
                stamps.append(msg.timestamp()[1])
                position, got = offset + 1, True
            msgs = []  # the Message objects go before the collector runs again
            if len(offsets) >= chunk:
                full = _batch(partition, keys, values, headers, offsets, stamps)
                keys, values, headers, offsets, stamps = [], [], [], [], []
        if full is not None:
            yield full
        if got:
            stalled_since = time.monotonic()
            continue
        # Nothing returned: past the end already (control records, compaction gaps)?
        now_at = client.position([TopicPartition(topic, partition)])[0].offset
        if now_at >= 0 and now_at >= end:
            break
        if time.monotonic() - stalled_since > _STALL_SECONDS:
            raise SparkReaderError(
                f"reading {topic}/{partition}: no record for {_STALL_SECONDS:.0f}s at offset {position} "
                f"(range ends at {end}); the broker is unreachable or the records were deleted "
                "(retention, or an unclean leader election truncated the partition)"
            )
    if offsets:
        with _cyclic_gc_paused():
            last = _batch(partition, keys, values, headers, offsets, stamps)
        yield last


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a batch of records becomes Python objects (never
    across a ``yield``: other code runs then). Each record is a Message, a headers list and a tuple,
    all tracked by the collector, and every few hundred new ones start a collection, which now and
    then walks the whole heap (a Spark Python worker's holds pyspark, pyarrow, pandas): with it on,
    reading cost ~5-6 µs of CPU per record, ~75% of it the collector; off, ~1.4 µs. These objects
    hold no reference cycles (reference counting frees them), so nothing waits for the collector."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _from_position(msgs: list[Any], partition: int, position: int) -> list[Any]:
    """``msgs`` less a leading run of this partition's records at consecutive offsets below ``position``
    (a kept consumer read on from before the read's start, :mod:`spark_reader.consumer_pool`), cut in
    one slice; anything else is left to the record-by-record loop."""
    first = msgs[0]
    skip = position - first.offset()
    if skip <= 0 or skip > len(msgs) or first.partition() != partition or first.error() is not None:
        return msgs
    dropped = msgs[:skip]
    if dropped[-1].offset() != position - 1 or any(
        m.error() is not None or m.partition() != partition for m in dropped
    ):
        return msgs
    return msgs[skip:]


def _in_range_run(msgs: list[Any], partition: int, position: int, end: int) -> bool:
    """Whether ``msgs`` are all records of ``partition`` at consecutive offsets from ``position`` (or
    anywhere, when it is not known yet) to below ``end``: no error, no stale or past-the-end
    record, so they can be taken whole. Otherwise the record-by-record loop sorts them out."""
    first, last = msgs[0], msgs[-1]
    lo, hi = first.offset(), last.offset()
    if hi - lo + 1 != len(msgs) or hi >= end or (position >= 0 and lo != position):
        return False
    if first.partition() != partition or last.partition() != partition:
        return False
    return not [m for m in msgs if m.error() is not None or m.partition() != partition]


def _batch(
    partition: int, keys: list[Any], values: list[Any], headers: list[Any], offsets: list[int], stamps: list[int]
) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array(headers, _HEADERS),
            pa.array([partition] * len(offsets), pa.int32()),
            pa.array(offsets, pa.int64()),
            pa.array(stamps, pa.int64()).cast(pa.timestamp("ms")).cast(_TIMESTAMP),
        ],
        schema=RAW_SCHEMA,
    )
