"""Replay: re-read exactly ``[begin, end)`` of one partition for the Sequencer.

When an ACK commits a span whose start has left the Sequencer's ring
(``QueueOutcome.ACK_COMMIT_REPLAY``), the reader re-reads the range the
Sequencer names with a separate, group-less, read-uncommitted consumer
(``assign`` at ``begin``, no subscription, no commits) and hands the
envelopes to ``Sequencer.start_replay``. The main consumer's position is not
touched.

Invariants (backed by ``tests/test_consumer/test_equivalence.py``):

* A replay yields envelopes of exactly the requested journal, in offset order,
  with ``begin <= offset < end``, and stops before ``end`` (offsets may have
  gaps: compaction, transaction markers).
* Envelopes carry the same UUIDs the main reader would parse; records without
  a usable header are served with the nil UUID (the Sequencer skips them, as
  they are never part of a producer's span).
* A replay that cannot make progress for ``timeout`` seconds, or meets a Kafka
  error, raises :class:`~consumer.errors.ReplayFailedError` (chained).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from harvest_outbox.sequencer import NIL_UUID, Envelope

from .config import ReaderConfig
from .errors import ReplayFailedError
from .record import make_record
from .uncommitted import _consume_batch, make_envelope, message_uuid

__all__ = ["ReplayReader"]

logger = logging.getLogger(__name__)


def split_journal(journal: str) -> tuple[str, int]:
    topic, _, partition = journal.rpartition("/")
    return topic, int(partition)


class ReplayReader:
    """Serves ``[begin, end)`` ranges of partitions (see module doc)."""

    __slots__ = ("_batch_size", "_config", "_consumer", "_timeout", "replay_seconds", "replayed_records", "replays")

    def __init__(self, config: ReaderConfig, timeout: float = 60.0, batch_size: int = 2000) -> None:
        self._config = config
        self._consumer: Any = None
        self._timeout = timeout
        self._batch_size = batch_size
        self.replays = 0
        self.replayed_records = 0
        self.replay_seconds = 0.0  # wall time spent inside replays (diagnostics)

    def read(self, journal: str, begin: int, end: int) -> Iterator[Envelope]:
        """Envelopes of ``journal`` with ``begin <= offset < end``, lazily."""
        self.replays += 1
        logger.debug("replaying %s [%d, %d)", journal, begin, end)
        if begin >= end:
            return
        topic, partition = split_journal(journal)
        if self._consumer is None:
            try:
                self._consumer = Consumer(self._config.replay_config())
            except KafkaException as exc:
                raise ReplayFailedError(f"cannot create the replay consumer: {exc}") from exc
        consumer = self._consumer
        t0 = time.monotonic()
        try:
            consumer.assign([TopicPartition(topic, partition, begin)])
        except KafkaException as exc:
            raise ReplayFailedError(f"replay of {journal} [{begin}, {end}): assign failed: {exc}") from exc
        try:
            deadline = time.monotonic() + self._timeout
            while True:
                batch = _consume_batch(consumer, self._batch_size, 0.5)
                if not batch:
                    if time.monotonic() > deadline:
                        raise ReplayFailedError(
                            f"replay of {journal} [{begin}, {end}) made no progress for {self._timeout:.0f}s"
                        )
                    continue
                deadline = time.monotonic() + self._timeout
                for msg in batch:
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            continue
                        raise ReplayFailedError(f"replay of {journal} [{begin}, {end}): {err.str()}")
                    offset = msg.offset()
                    if offset < begin:
                        continue
                    if offset >= end:
                        return
                    u = message_uuid(msg)
                    self.replayed_records += 1
                    yield make_envelope(
                        journal, offset, NIL_UUID if u is None else u, make_record(msg, 0 if u is None else u.int)
                    )
        finally:
            self.replay_seconds += time.monotonic() - t0
            try:
                consumer.unassign()
            except (KafkaException, RuntimeError):  # closed meanwhile: nothing to release
                pass

    def close(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close()
            except (KafkaException, RuntimeError) as exc:
                logger.debug("replay consumer close: %s", exc)
            self._consumer = None
