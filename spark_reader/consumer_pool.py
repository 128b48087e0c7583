"""Kafka consumers a Spark Python worker keeps between a stream's micro-batches, one per topic-partition.

Spark's own Kafka source keeps a consumer per topic-partition in each executor and goes on reading where
the previous micro-batch stopped: the next micro-batch's records are often fetched already. A consumer
made per read costs a connection, a first fetch and a close (~20-50 ms), and throws away what it
prefetched past its range's end, which is the next micro-batch's start. ``readCommittedStream(state_location=...)``
reads through this pool (:func:`spark_reader.kafka_arrow.iter_ranges`' ``pool``): a read of
``[read_from, end)`` takes the partition's consumer if one is kept at ``position`` with
``read_from <= position``, is served ``[read_from, position)`` from the kept *tail* (the last records the
previous read returned: a stream re-reads its open spans from their begin, a little before the previous
end) and consumes on from ``position``. A kept consumer anywhere else (another worker read the
partition since, or the read starts before the tail) is moved to ``read_from`` by a seek, which costs a
fetch but no connection (librdkafka purges what it fetched ahead, and drops what arrives for the old
position). With no consumer kept the read makes a new one, as before the pool.

Which Python worker runs which task of a micro-batch is Spark's choice (the worker idle longest), so a
worker's kept consumers are as often those of the partitions the *other* task read. A task therefore
also :meth:`ConsumerPool.advance` s its worker's consumers of the micro-batch's other partitions to a
little before where that micro-batch ends them (:data:`ADVANCE_BEHIND`), as soon as its own reading is
done: they fetch the next micro-batch's records while Spark finishes this one, and a next read that
starts at most :data:`SKIP_RECORDS` past such a consumer's position reads on from it, dropping the
records before its start, instead of seeking.

Spark reuses a Python worker for the next task (``spark.python.worker.reuse``, default on) and ends it
after a minute idle, which closes whatever it kept; the pool also closes a consumer idle for
:data:`IDLE_SECONDS` and keeps at most :data:`MAX_KEPT` (the least recently used closed first).

Invariants (``tests/test_spark_reader/test_consumer_pool.py``):
- a kept consumer is lent to one read at a time, and taken back only from a read that ended cleanly:
  the next record it returns is the first after ``end`` (none past ``end`` was consumed and dropped); a
  read that fails or is abandoned closes its consumer;
- the tail is a copy of the last records (at most :data:`TAIL_RECORDS` and about :data:`TAIL_BYTES`)
  of the range ``[read_from, end)`` exactly as read, in offset order, ending at ``end``;
- a lease serves exactly the records of ``[read_from, position)`` from the tail, then the consumer
  (sought to ``read_from`` when the tail cannot serve it, or, when it is at most :data:`SKIP_RECORDS`
  before ``read_from``, read from where it is with the records before ``read_from`` dropped by the read;
  a consumer whose seek fails is closed), so a read through the pool returns the same records as a read
  by a new consumer;
- an advanced consumer's position is where it was sought to, and it keeps no tail (its last read's
  records are no longer just before its position); a consumer is advanced at most :data:`MAX_ADVANCES`
  times between two reads;
- keys hold the reader's Kafka options, which may hold secrets: the pool's repr never shows them.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

#: A consumer left unused this long is closed at the next take or give.
IDLE_SECONDS = 60.0
#: Consumers kept per worker at most (a topic of many partitions read by few workers keeps the most
#: used): a kept consumer holds ~20-30 MB of the worker's memory (its threads' buffers and the records
#: it fetched ahead), measured with 8 kept.
MAX_KEPT = 16
#: Records of a read's end kept with its consumer, to serve a next read that starts a little earlier.
TAIL_RECORDS = 4096
#: ... and about this many bytes of them at most (the tail is cut to fit, so large records keep fewer).
TAIL_BYTES = 4 << 20
#: A consumer advanced to a partition's end in another task's micro-batch is sought this many records
#: before it: the next read starts at that end, or at an open span's begin shortly before it.
ADVANCE_BEHIND = 1024
#: A read starting at most this many records past a kept consumer's position reads on from it (dropping
#: them) instead of seeking: dropping ~2,000 fetched records costs ~1 ms, a seek waits for new fetches.
SKIP_RECORDS = 2 * ADVANCE_BEHIND
#: A kept consumer is advanced at most this many times in a row without a read. Each advance makes it
#: fetch its partition's next records again (up to ``queued.min.messages``, 16,384 here), so a worker
#: does it for the partitions it read lately, not for every partition it ever read: at most this many
#: refetches of a partition's share per read of it, whatever the cluster's size. Two workers handed the
#: same tasks 3 micro-batches in a row were common (3 was too few: such a run ended in seeks).
MAX_ADVANCES = 8


@dataclass
class Lease:
    """A consumer for a read: positioned at ``position`` (its next record is the first at or after it),
    and the records ``[read_from, position)`` the read gets first (``head``, from the last read's tail)."""

    client: Any
    position: int
    head: list[pa.RecordBatch]


class LastBatches:
    """A read's last batches as it goes, enough of them for the tail :meth:`ConsumerPool.give` keeps."""

    def __init__(self) -> None:
        self.batches: deque[pa.RecordBatch] = deque()
        self.records = 0

    def append(self, batch: pa.RecordBatch) -> None:
        self.batches.append(batch)
        self.records += batch.num_rows
        while self.records - self.batches[0].num_rows >= TAIL_RECORDS:
            self.records -= self.batches.popleft().num_rows


@dataclass
class _Kept:
    client: Any
    position: int
    tail: pa.RecordBatch | None
    since: float
    advanced: int = 0  # advances since its last read


_Key = tuple[str, int, tuple[tuple[str, str], ...]]


class ConsumerPool:
    """The worker's kept consumers (thread-safe; a worker runs one task at a time, but a task may read
    on another thread)."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._kept: OrderedDict[_Key, _Kept] = OrderedDict()
        self._lock = threading.Lock()
        self._clock = clock
        #: Reads that went on with a kept consumer / moved one by a seek / found none (for the phase log).
        self.reused = self.sought = self.missed = 0
        #: Kept consumers advanced to another task's end (for the phase log).
        self.advanced = 0

    def __repr__(self) -> str:  # never the keys: they hold the Kafka options
        return f"ConsumerPool(kept={len(self._kept)}, reused={self.reused}, sought={self.sought}, missed={self.missed})"

    def __len__(self) -> int:
        return len(self._kept)

    def counts(self) -> tuple[int, int, int]:
        """``(reused, sought, missed)`` reads so far."""
        return self.reused, self.sought, self.missed

    def take(self, kafka: Mapping[str, str], topic: str, partition: int, read_from: int) -> Lease | None:
        """The partition's kept consumer for a read from ``read_from``, or None (the caller makes one).
        A kept consumer that cannot serve the read is closed."""
        key = _key(kafka, topic, partition)
        with self._lock:
            kept = self._kept.pop(key, None)
            stale = self._expire()
        _close_all(stale)
        if kept is None:
            self.missed += 1
            return None
        head = _head(kept, read_from)
        if head is not None:
            self.reused += 1
            return Lease(kept.client, kept.position, head)
        if kept.position < read_from <= kept.position + SKIP_RECORDS:
            self.reused += 1  # the read drops the records before read_from
            return Lease(kept.client, read_from, [])
        if _seek(kept.client, topic, partition, read_from):
            self.sought += 1
            return Lease(kept.client, read_from, [])
        kept.client.close()
        self.missed += 1
        return None

    def give(
        self,
        kafka: Mapping[str, str],
        topic: str,
        partition: int,
        client: Any,
        end: int,
        last: list[pa.RecordBatch],
    ) -> None:
        """Keep ``client`` after a clean read ending at ``end``, with the tail of the read's last
        batches ``last`` (offset order; the read's records, ending at ``end``)."""
        kept = _Kept(client, end, _tail(last), self._clock())
        with self._lock:
            old = self._kept.pop(_key(kafka, topic, partition), None)
            self._kept[_key(kafka, topic, partition)] = kept
            stale = self._expire()
            while len(self._kept) > MAX_KEPT:
                stale.append(self._kept.popitem(last=False)[1])
        _close_all([old, *stale] if old is not None else stale)

    def advance(self, kafka: Mapping[str, str], topic: str, partition: int, to: int) -> bool:
        """Seek the partition's kept consumer, if one is kept before ``to``, to ``to`` (where the next
        micro-batch's read of it probably starts) so that it fetches from there; False if none was
        moved. A consumer whose seek fails, or that returns anything but a record at or past ``to``
        when it is polled once after the seek, is closed."""
        key = _key(kafka, topic, partition)
        with self._lock:
            kept = self._kept.get(key)
            if kept is None or kept.position >= to or kept.advanced >= MAX_ADVANCES:
                return False
            del self._kept[key]  # lent to this call: no read takes it meanwhile
        position = _moved(kept.client, topic, partition, to)
        if position is None:
            kept.client.close()
            return False
        kept.position, kept.tail, kept.since = position, None, self._clock()
        kept.advanced += 1
        with self._lock:
            newer = self._kept.pop(key, None)  # given back by a read on another thread meanwhile: it stays
            self._kept[key] = newer if newer is not None else kept
        if newer is not None:
            kept.client.close()
            return False
        self.advanced += 1
        return True

    def close(self) -> None:
        with self._lock:
            kept, self._kept = list(self._kept.values()), OrderedDict()
        _close_all(kept)

    def _expire(self) -> list[_Kept]:
        now = self._clock()
        stale = [k for k, v in self._kept.items() if now - v.since > IDLE_SECONDS]
        return [self._kept.pop(k) for k in stale]


def _key(kafka: Mapping[str, str], topic: str, partition: int) -> _Key:
    return topic, partition, tuple(sorted(kafka.items()))


def _seek(client: Any, topic: str, partition: int, offset: int) -> bool:
    """Move ``client`` (assigned ``topic``/``partition``, fetching) to ``offset``; False if it refused."""
    from confluent_kafka import KafkaException, TopicPartition

    try:
        client.seek(TopicPartition(topic, partition, offset))
    except KafkaException:
        return False
    return True


def _moved(client: Any, topic: str, partition: int, offset: int) -> int | None:
    """Seek ``client`` to ``offset`` and poll it once, without waiting: its position after that (None if
    the seek or the poll went wrong). The poll drops what the consumer had queued for its old position:
    librdkafka counts those records against its prefetch bound until the application polls, so without it
    the consumer would fetch nothing from ``offset`` until the next read (measured: a read of 12,600
    records after such a seek took as long as one after a seek at its start, ~55 ms against ~20 ms)."""
    if not _seek(client, topic, partition, offset):
        return None
    try:  # an advance only saves a later read's wait: a consumer that fails here is closed, not the task
        got = client.consume(1, 0.0)
    except Exception:  # KafkaException, RuntimeError (closed): either way, not kept
        return None
    if not got:
        return offset
    msg = got[0]
    if msg.error() is not None or msg.partition() != partition or msg.offset() < offset:
        return None
    return int(msg.offset()) + 1  # the record is dropped: a read from before it seeks back


def _close_all(kept: list[_Kept]) -> None:
    for k in kept:
        k.client.close()


def _head(kept: _Kept, read_from: int) -> list[pa.RecordBatch] | None:
    """``[read_from, kept.position)`` from the tail, or None when the tail does not hold all of it."""
    if read_from == kept.position:
        return []
    tail = kept.tail
    if tail is None or read_from > kept.position:
        return None
    offsets = tail.column("offset").to_numpy()
    if read_from < offsets[0]:
        return None
    return [tail.slice(int(np.searchsorted(offsets, read_from)))]


def _tail(last: list[pa.RecordBatch]) -> pa.RecordBatch | None:
    """A compact copy of the last records of ``last``: at most TAIL_RECORDS, about TAIL_BYTES."""
    picked: list[pa.RecordBatch] = []
    records = nbytes = 0
    for batch in reversed(last):
        if not batch.num_rows:
            continue
        room = TAIL_RECORDS - records
        per_record = batch.nbytes / batch.num_rows
        room = min(room, int((TAIL_BYTES - nbytes) / per_record) if per_record else room)
        if room <= 0:
            break
        part = batch.slice(max(0, batch.num_rows - room))
        picked.append(part)
        records += part.num_rows
        nbytes += int(part.num_rows * per_record)
    if not picked:
        return None
    # concat_batches copies (even one batch): a slice would keep the read's whole batches alive
    return pa.concat_batches(picked[::-1])


#: The worker's pool (Spark's Python worker is one process per task at a time, reused across tasks).
WORKER_POOL = ConsumerPool()
