"""ReadCommittedIter: committed records only, in order, exactly once across checkpoints.

The Kafka counterpart of Gazette's ``message.ReadCommittedIter``: records from
a :class:`~consumer.uncommitted.ReadUncommittedIter` go through a
``sequencer.Sequencer``; what it commits is yielded, ACK_TXN records filtered
out unless ``include_acks=True``. When the Sequencer asks for a replay
(``ACK_COMMIT_REPLAY``) the range is re-read with a separate consumer
(:mod:`consumer.replay`) and iteration continues.

Checkpoints (``checkpoint() -> bytes``, ``sequencer.encode_checkpoint``
format) hold read-through offsets and producer states of the assigned
partitions. A reader started with one reads each partition from its
read-through offset, exactly as Gazette does (``startReadingMessages`` reads
from ``ReadThrough``); spans still open at the checkpoint are completed by
replaying from their ``begin``, so nothing delivered before the checkpoint is
delivered again and nothing after it is skipped.

Invariants (each backed by a test in ``tests/test_consumer/``):

1. Output equals what a pure ``Sequencer`` with the same ring size yields for
   the same records in the same order (``test_equivalence.py``); poll_batch's
   fused native pass returns, raises and checkpoints exactly what the
   step-by-step and pure-Python paths do (``test_fused_batch.py``).
2. Every record returned by ``poll()``/iteration before ``checkpoint()`` is
   covered by that checkpoint: a reader restored from it never returns it
   again, and returns every later committed record (``test_checkpoint_resume.py``).
3. ``checkpoint()`` covers exactly the currently assigned partitions; on a
   rebalance, ``on_revoke`` is called *before* the revoked partitions' state
   is dropped (so it may still save a checkpoint covering them; this holds
   for the final revocation inside ``close()`` too), and newly
   assigned partitions start from ``on_assign``'s checkpoint, else from the
   last state this reader knew for them (constructor checkpoint or its own
   earlier ownership), else from ``auto.offset.reset`` (``test_rebalance.py``).
   A checkpoint (constructor or ``on_assign``) that is not this reader's -- it
   covers none of the partitions it reads, or partitions its topic does not
   have -- raises :class:`~consumer.errors.CheckpointMismatchError`; entries
   for partitions it does not read are logged as ignored, and read partitions
   it has no offset for as starting from ``auto.offset.reset``
   (``test_checkpoint_resume.py``).
4. ``poll(timeout)`` returns ``None`` after at most about ``timeout`` seconds
   without a committed record; it never busy-waits.
5. A failed replay closes the iterator and raises ``ReplayFailedError``;
   checkpoints taken before it remain valid (``test_read_uncommitted.py``).

Not thread-safe: use one iterator from one thread (rebalance callbacks run on
that thread, inside ``poll()`` and ``close()``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from harvest_outbox.sequencer import (
    DEFAULT_PRUNE_HORIZON_NS,
    DEFAULT_RING_SIZE,
    IMPLEMENTATION,
    CheckpointError,
    Envelope,
    ProducerState,
    QueueOutcome,
    ReplayError,
    Sequencer,
    SequencerError,
    check_checkpoint_scope,
    decode_checkpoint,
    encode_checkpoint,
)

from . import uncommitted as _uncommitted
from .config import ReaderConfig, check_batch_size, check_idle_timeout
from .errors import CheckpointMismatchError, ConfigError, ConsumerClosedError, ReplayFailedError
from .record import Record
from .record import _native as _native_records
from .registry_values import ValueDecoder
from .replay import ReplayReader
from .uncommitted import DEFAULT_BATCH_SIZE, ReadUncommittedIter, journal_of
from .uuid_header import UUIDPolicy

__all__ = ["ReadCommittedIter"]

logger = logging.getLogger(__name__)

_ACK_COMMIT_REPLAY = QueueOutcome.ACK_COMMIT_REPLAY
#: The fused batch path (consumer/_native.pyx ``sequence_raw``), or None: poll_batch then converts a
#: consumed batch into entries, queues them and dequeues (the same decisions, step by step). It
#: runs only on the native Sequencer, whose C methods it calls.
_sequence_raw: Callable[..., tuple[int, Any, int]] | None = (
    None if _native_records is None else _native_records.sequence_raw
)
_NEEDS_PYTHON = None if _native_records is None else _native_records.NEEDS_PYTHON
_REPLAY = None if _native_records is None else _native_records.REPLAY
#: The Sequencer class sequence_raw works on (a test may swap committed.Sequencer for the reference).
_FUSED_SEQUENCER: Any = Sequencer if IMPLEMENTATION == "native" else None

#: on_assign(partitions) -> checkpoint bytes covering them, or None.
OnAssign = Callable[[list[tuple[str, int]]], "bytes | None"]
#: on_revoke(partitions): called before their state is dropped.
OnRevoke = Callable[[list[tuple[str, int]]], None]


def _decode(checkpoint: bytes | None, what: str) -> tuple[dict[str, int], list[ProducerState]]:
    if checkpoint is None:
        return {}, []
    try:
        return decode_checkpoint(checkpoint)
    except CheckpointError as exc:
        raise ConfigError(f"{what} is not a valid checkpoint: {exc}") from exc


class ReadCommittedIter:
    """Committed records of the given topics/partitions, in order (see module doc).

    Parameters:
        kafka_config: confluent-kafka config (``bootstrap.servers`` required;
            with ``group.id`` the reader joins that group, else it assigns
            partitions itself).
        topics: topics to read (all partitions, or the group's share).
        checkpoint: bytes from an earlier ``checkpoint()`` (or a store).
        ring_size: Sequencer ring size (recent messages kept for commits).
        partitions: explicit ``(topic, partition)`` pairs instead of ``topics``.
        include_acks: also yield the ACK_TXN records that commit transactions.
        uuid_policy: ``"deliver"`` (default), ``"drop"`` or ``"raise"`` for
            records without a usable ``uuid`` header (see
            :mod:`consumer.uuid_header`).
        idle_timeout: iteration (``for r in it``) ends after this many seconds
            without a committed record; ``None`` (default) blocks forever.
        prune_horizon_ns: producers idle this long behind the newest commit of
            their partition are dropped at ``checkpoint()`` (Gazette: 24 h).
        on_assign / on_revoke: rebalance callbacks (see invariant 3).
        replay_timeout: seconds a replay may go without progress.
        batch_size: records per ``consume()`` call (``DEFAULT_BATCH_SIZE``, 256: see there).
        value_format: ``"raw"`` (default: values as bytes), ``"avro"``, ``"protobuf"`` or ``"jsonSchema"``: values
            decoded from the registry wire format (:mod:`consumer.registry_values`), with
            ``schema_registry`` the registry client's settings (``{"url": ...}``).
    """

    def __init__(
        self,
        kafka_config: Mapping[str, Any],
        topics: Sequence[str] | None = None,
        checkpoint: bytes | None = None,
        ring_size: int = DEFAULT_RING_SIZE,
        *,
        partitions: Iterable[tuple[str, int]] | None = None,
        include_acks: bool = False,
        uuid_policy: UUIDPolicy | str = UUIDPolicy.DELIVER,
        idle_timeout: float | None = None,
        prune_horizon_ns: int = DEFAULT_PRUNE_HORIZON_NS,
        on_assign: OnAssign | None = None,
        on_revoke: OnRevoke | None = None,
        replay_timeout: float = 60.0,
        batch_size: int = DEFAULT_BATCH_SIZE,
        value_format: str = "raw",
        schema_registry: Mapping[str, Any] | None = None,
    ) -> None:
        # value_format "avro" / "jsonSchema": records come back as DecodedRecord (consumer.registry_values)
        self._decoder = None if value_format == "raw" else ValueDecoder(value_format, schema_registry)
        group_id = ReaderConfig(kafka_config).group_id  # a bad config fails here, before anything uses it
        if not isinstance(ring_size, int) or ring_size < 1:
            raise ConfigError(f"ring_size must be an int >= 1, got {ring_size!r}")
        if isinstance(prune_horizon_ns, bool) or not isinstance(prune_horizon_ns, int) or prune_horizon_ns < 0:
            raise ConfigError(f"prune_horizon_ns must be an int >= 0 (0: never prune), got {prune_horizon_ns!r}")
        idle_timeout = check_idle_timeout(idle_timeout)
        batch_size = check_batch_size(batch_size)
        offsets, states = _decode(checkpoint, "checkpoint")
        if partitions is not None:
            partitions = list(partitions)
        subscribed = [topics] if isinstance(topics, str) else list(topics or ())
        self._subscribed = subscribed
        # The constructor checkpoint must be this reader's (check_checkpoint_scope): in a group now
        # (by topic), else at the first assignment, when the partitions are known.
        self._unchecked: tuple[dict[str, int], list[ProducerState]] | None = (offsets, states)
        if partitions is None and group_id is not None:
            self._check_scope(offsets, states, {t: None for t in subscribed}, False, "checkpoint")
            self._unchecked = None
        self._all_partitions = partitions is None
        self._one_topic = _reads_one_topic(subscribed, partitions)
        self._ring_size = ring_size
        self._include_acks = include_acks
        self._idle_timeout = idle_timeout
        self._prune_ns = prune_horizon_ns
        self._app_on_assign = on_assign
        self._app_on_revoke = on_revoke
        # State of journals not currently assigned: journal -> (offset or None, states).
        self._stash: dict[str, tuple[int | None, list[ProducerState]]] = {}
        self._stash_checkpoint(offsets, states)
        self._seq = Sequencer({}, [], ring_size)
        self._ahead: Any = None  # next committed item: a Record, or an Envelope from a replay
        self._buf: Any = []  # Sequencer.queue_batch entries: a list of tuples, or an EntryBatch
        self._pos = 0
        # A consumed batch not yet sequenced, as confluent Messages (the fused path's input; the
        # entries in _buf, if any, come first).
        self._raw: list[Any] = []
        self._raw_pos = 0
        self._raw_yielded = False  # an entry came from _raw already (see _convert_one)
        self._replaying = False  # the current sequence is (partly) served by a replay
        self._closed = False
        self._closing = False
        self.delivered = 0
        self._reader = ReadUncommittedIter(
            kafka_config,
            topics,
            partitions=partitions,
            uuid_policy=uuid_policy,
            batch_size=batch_size,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
        )
        self._replayer = ReplayReader(self._reader._config, timeout=replay_timeout, batch_size=batch_size)

    # -- rebalance ----------------------------------------------------------

    def _stash_checkpoint(self, offsets: Mapping[str, int], states: Iterable[ProducerState]) -> None:
        by_journal: dict[str, list[ProducerState]] = {}
        for st in states:
            by_journal.setdefault(st.journal, []).append(st)
        for journal in set(offsets) | set(by_journal):
            self._stash[journal] = (offsets.get(journal), by_journal.get(journal, []))

    def _rebuild(self, drop: set[str], add: Mapping[str, tuple[int | None, list[ProducerState]]]) -> None:
        """Replace the Sequencer by one without ``drop`` and with ``add`` (between sequences only).

        The ring is not carried over: spans open in it are completed by replay.
        """
        assert self._ahead is None, "rebalance while a sequence is being dequeued"
        offsets, states = self._seq.checkpoint(0)
        gone = drop | set(add)
        offsets = {j: o for j, o in offsets.items() if j not in gone}
        keep = [s for s in states if s.journal not in gone]
        for journal, (off, sts) in add.items():
            if off is not None:
                offsets[journal] = off
            keep.extend(sts)
        self._seq = Sequencer(offsets, keep, self._ring_size)

    def _check_scope(
        self,
        offsets: Mapping[str, int],
        states: list[ProducerState],
        reads: Mapping[str, set[int] | None],
        complete: bool,
        what: str,
    ) -> None:
        """Refuse a checkpoint of another reader; log what of it is ignored or not covered."""
        try:
            ignored, uncovered = check_checkpoint_scope(offsets, states, reads, complete)
        except CheckpointError as exc:
            raise CheckpointMismatchError(f"{what}: {exc}") from exc
        if ignored:
            logger.warning(
                "%s: ignoring its entries for %s: this reader does not read them (it reads %s), and "
                "its checkpoint() will not include them",
                what,
                ", ".join(ignored[:20]),
                ", ".join(sorted(reads)),
            )
        if uncovered:
            logger.warning(
                "%s covers no offset for %s: they start from auto.offset.reset (a new partition, or "
                "the checkpoint of another reader?)",
                what,
                ", ".join(uncovered[:20]),
            )

    def _on_assign(self, tps: list[tuple[str, int]]) -> Mapping[str, int]:
        journals = {journal_of(t, p) for t, p in tps}
        if self._unchecked is not None:  # the first assignment of a reader without a group
            reads: dict[str, set[int] | None] = {}
            for t, p in tps:
                reads.setdefault(t, set()).add(p)  # type: ignore[union-attr]
            offsets, states = self._unchecked
            self._unchecked = None
            self._check_scope(offsets, states, reads, self._all_partitions, "checkpoint")
        if self._app_on_assign is not None:
            got = self._app_on_assign(list(tps))
            if got is not None:
                offsets, states = _decode(got, "on_assign's return value")
                self._check_scope(offsets, states, {t: None for t in self._subscribed}, False, "on_assign's checkpoint")
                self._stash_checkpoint(
                    {j: o for j, o in offsets.items() if j in journals},
                    [s for s in states if s.journal in journals],
                )
        current = set(self._seq.offsets)
        add = {j: self._stash.pop(j, (None, [])) for j in journals if j not in current}
        if add:
            self._rebuild(set(), add)
        return dict(self._seq.offsets)

    def _on_revoke(self, tps: list[tuple[str, int]], lost: bool) -> None:
        if self._app_on_revoke is not None:
            self._app_on_revoke(list(tps))
        if self._closing:
            return  # leaving the group: the app saw its last chance to checkpoint
        journals = {journal_of(t, p) for t, p in tps}
        offsets, states = self._seq.checkpoint(0)
        self._stash_checkpoint(
            {j: o for j, o in offsets.items() if j in journals}, [s for s in states if s.journal in journals]
        )
        assert self._ahead is None, "rebalance while a sequence is being dequeued"
        self._seq.drop_journals(journals)
        # Records buffered from the revoked partitions must not be sequenced.
        if self._pos < len(self._buf):
            buf = self._buf  # a list of entries, or an EntryBatch: both index to entry tuples
            self._buf = [buf[i] for i in range(self._pos, len(buf)) if buf[i][0] not in journals]
            self._pos = 0
        if self._raw_pos < len(self._raw):
            self._raw = [
                m
                for m in self._raw[self._raw_pos :]
                if m.error() is not None or journal_of(m.topic(), m.partition()) not in journals
            ]
            self._raw_pos = 0

    # -- iteration ----------------------------------------------------------

    def poll(self, timeout: float | None = None) -> Record | None:
        """The next committed record, or None if none is committed within ``timeout`` s."""
        rec = self._poll(timeout)
        if self._decoder is None or rec is None:
            return rec
        return self._decoder.decode(rec)  # type: ignore[return-value]

    def _poll(self, timeout: float | None) -> Record | None:
        # Hot path, per record: step() the Sequencer (marking the record returned
        # last processed) and return the one before. Records are queued a whole
        # consumed batch per Sequencer.queue_batch() call, which stops at each
        # committing record so the sequence is stepped exactly as with
        # queue_uncommitted(): checkpoints see the same state either way.
        include_acks = self._include_acks
        deadline = None
        fetched = False
        while True:
            item = self._ahead
            if item is not None:
                try:
                    self._ahead = self._seq.step()  # marks item processed
                except ReplayError as exc:
                    self.close()
                    raise ReplayFailedError(f"replay failed; the reader is closed: {exc}") from exc
                if type(item) is Envelope:  # served by a replay
                    item = item.message
                if not include_acks and item.is_ack:
                    continue
                self.delivered += 1
                return item  # type: ignore[no-any-return]
            if self._pos < len(self._buf):
                self._queue_buffered()
                continue
            if self._raw_pos < len(self._raw):
                self._raw_to_entries()  # left by poll_batch's fused path
                continue
            if self._closed:
                raise ConsumerClosedError("the reader is closed")
            wait, deadline = _time_left(timeout, deadline)
            if wait is not None and wait <= 0:
                if fetched:
                    return None  # timeout spent sequencing uncommitted records
                wait = 0.0  # poll(0): still take what is ready
            fetched = True
            batch = self._reader._next_batch(wait, entries=True)
            if not batch:
                return None
            self._buf = batch
            self._pos = 0

    def poll_batch(self, max_records: int = 2000, timeout: float | None = None) -> list[Record]:
        """Up to ``max_records`` committed records (see :meth:`_poll_batch`), decoded with ``value_format``."""
        got = self._poll_batch(max_records, timeout)
        if self._decoder is None:
            return got
        decode = self._decoder.decode
        return [decode(rec) for rec in got]  # type: ignore[misc]

    def _poll_batch(self, max_records: int = 2000, timeout: float | None = None) -> list[Record]:
        """Up to ``max_records`` committed records, in order; ``[]`` if none is committed within ``timeout`` s.

        The same records, in the same order, as that many ``poll()`` calls, and
        every returned record counts as delivered: a ``checkpoint()`` taken after
        the call covers all of them. It returns what is committed by the time
        the first record is available (it does not wait to fill the batch): at
        most the rest of the buffered consumed batch is sequenced. The fast way
        to read: with the native extensions a consumed batch is converted,
        queued and dequeued in one compiled pass (``_sequence_raw``), else whole
        runs of a committed sequence leave the Sequencer per call
        (``Sequencer.step_many``); no per-record call overhead either way.
        """
        if max_records < 1:
            raise ConfigError(f"max_records must be >= 1, got {max_records!r}")
        include_acks = self._include_acks
        out: list[Any] = []
        seq = self._seq
        fused = self._fused()
        deadline = None
        fetched = False
        while True:
            item = self._ahead
            if item is not None:
                room = max_records - len(out)
                try:
                    if fused and not self._replaying and type(item) is not Envelope:
                        self._sequence_raw(out, max_records)  # dequeues, then sequences _raw on
                    elif self._replaying or type(item) is Envelope:
                        # A replay is being served: per record, as poll() does.
                        self._ahead = seq.step()
                        if type(item) is Envelope:
                            item = item.message
                        if include_acks or not item.is_ack:
                            out.append(item)
                        if self._ahead is None:
                            self._replaying = False
                    else:
                        # items: item, then the next room - 1; all but the last
                        # are processed by step_many, the last by the step() after.
                        got = seq.step_many(room - 1)
                        if len(got) == room - 1:
                            self._ahead = seq.step()
                        else:
                            self._ahead = None  # the sequence ended inside step_many
                        # No replay is active (_replaying is set by every
                        # start_replay), so these are all Records from the ring.
                        ended = self._ahead is None
                        out.append(item)
                        if got:
                            out += got
                        # Only a sequence's committing (last) record can be an ACK.
                        if ended and not include_acks and out[-1].is_ack:
                            out.pop()
                except ReplayError as exc:
                    self.close()
                    raise ReplayFailedError(f"replay failed; the reader is closed: {exc}") from exc
                if len(out) >= max_records:
                    break
                continue
            if self._pos < len(self._buf):
                self._queue_buffered()
                seq = self._seq
                continue
            if self._raw_pos < len(self._raw):
                if fused:
                    self._sequence_raw(out, max_records)
                else:
                    self._raw_to_entries()
                if len(out) >= max_records:
                    break
                continue
            if out:
                break  # deliver what is committed rather than wait for more
            if self._closed:
                raise ConsumerClosedError("the reader is closed")
            wait, deadline = _time_left(timeout, deadline)
            if wait is not None and wait <= 0:
                if fetched:
                    break
                wait = 0.0
            fetched = True
            batch = self._reader._next_batch(wait, entries=True, unconverted=fused)
            if not batch:
                break
            if fused:
                self._raw = batch
                self._raw_pos = 0
                self._raw_yielded = False
            else:
                self._buf = batch
                self._pos = 0
            seq = self._seq  # a rebalance inside _next_batch may replace it
            fused = self._fused()
        self.delivered += len(out)
        return out

    def _fused(self) -> bool:
        """True when poll_batch takes the fused batch path (see ``_sequence_raw``)."""
        return (
            _sequence_raw is not None
            and type(self._seq) is _FUSED_SEQUENCER
            and _uncommitted._native_convert is not None
        )

    def _sequence_raw(self, out: list[Any], max_records: int) -> None:
        """Dequeue the current sequence (``_ahead``) into ``out``, then sequence the buffered raw
        batch on, in one compiled pass (``consumer/_native.pyx`` ``sequence_raw``); entries still in
        ``_buf`` come first, so then only the dequeue runs. Hands back to Python the one message that
        needs the UUID policy or is a Kafka error (``_convert_one``), and a commit that needs a
        replay (as ``_queue_buffered``)."""
        assert _sequence_raw is not None
        raw = self._raw
        take_raw = self._pos >= len(self._buf)
        pos, self._ahead, why = _sequence_raw(
            self._seq,
            raw,
            self._raw_pos if take_raw else len(raw),
            self._reader._journals,
            out,
            max_records,
            self._include_acks,
            self._ahead,
            self._one_topic,
        )
        if not take_raw:
            return
        if pos > self._raw_pos:
            self._raw_yielded = True
        self._raw_pos = pos
        if why == _NEEDS_PYTHON:
            self._convert_one()
        elif why == _REPLAY:
            self._replay_and_step()
        if self._raw_pos >= len(raw):
            self._raw, self._raw_pos = [], 0

    def _convert_one(self) -> None:
        """Convert the raw message at ``_raw_pos`` as the entries path does (UUID policy, Kafka
        error) into ``_buf``; a pending error (``uuid_policy='raise'``, a Kafka error that raises)
        leaves the rest of the batch pending behind it, as ``_convert_entries`` does."""
        reader = self._reader
        raw, k = self._raw, self._raw_pos
        self._buf = reader._convert_entries(raw[k : k + 1])
        self._pos = 0
        if self._buf:
            self._raw_yielded = True
        if reader._pending_error is not None:
            reader._pending_raw = raw[k + 1 :]
            self._raw, self._raw_pos = [], 0
            if not self._raw_yielded:
                # Nothing of the batch came before it: _next_batch raises such an error at once.
                err, reader._pending_error = reader._pending_error, None
                raise err
        else:
            self._raw_pos = k + 1

    def _raw_to_entries(self) -> None:
        """The rest of the raw batch as entries (poll(), or poll_batch without the fused path)."""
        rest = self._raw[self._raw_pos :]
        self._raw, self._raw_pos = [], 0
        self._buf = self._reader._convert_entries(rest)
        self._pos = 0

    def _queue_buffered(self) -> None:
        """Queue buffered entries up to the next commit; start its dequeue (and replay) if any."""
        seq = self._seq
        self._pos, outcome = seq.queue_batch(self._buf, self._pos)
        if outcome is not None:
            if outcome is _ACK_COMMIT_REPLAY:
                self._replay_and_step()
            else:
                self._step()

    def _replay_and_step(self) -> None:
        """Start the replay the Sequencer asked for (its journal range, read again) and its dequeue."""
        seq = self._seq
        journal, begin, end = seq.replay_range()
        seq.start_replay(self._replayer.read(journal, begin, end))
        self._replaying = True
        self._step()

    def _step(self) -> None:
        try:
            self._ahead = self._seq.step()
        except ReplayError as exc:
            self.close()
            raise ReplayFailedError(f"replay failed; the reader is closed: {exc}") from exc

    def __iter__(self) -> Iterator[Record]:
        """Committed records until ``idle_timeout`` passes without one (forever when None)."""
        while True:
            rec = self.poll(self._idle_timeout)
            if rec is None:
                return
            yield rec

    # -- state --------------------------------------------------------------

    def checkpoint(self) -> bytes:
        """Read-through offsets and producer states of the assigned partitions.

        Covers every record returned so far; pass it back (constructor or
        ``on_assign``) to resume exactly after them. Store it atomically with
        the effects of those records (e.g. :class:`consumer.PostgresCheckpointStore`).
        """
        if self._closed:
            raise ConsumerClosedError("checkpoint() after close(): use the last checkpoint taken before")
        try:
            offsets, states = self._seq.checkpoint(self._prune_ns)
            return encode_checkpoint(offsets, states)
        except SequencerError as exc:  # pragma: no cover - would be a sequencer bug
            raise ConfigError(f"cannot encode checkpoint: {exc}") from exc

    def has_pending(self) -> bool:
        """True if some producer has an open (uncommitted) span: more may follow."""
        return self._seq.has_pending()

    @property
    def assignment(self) -> list[tuple[str, int]]:
        return self._reader.assignment

    @property
    def stats(self) -> dict[str, int]:
        return {
            "delivered": self.delivered,
            "replays": self._replayer.replays,
            "replayed_records": self._replayer.replayed_records,
            "replay_ms": round(self._replayer.replay_seconds * 1000),
        }

    # -- lifecycle ----------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close both Kafka consumers. Idempotent. Take the last checkpoint before."""
        if self._closed:
            return
        self._closing = True  # on_revoke may still run (and checkpoint) while the group is left
        try:
            self._reader.close()
        finally:
            self._closed = True
            self._replayer.close()

    def __enter__(self) -> ReadCommittedIter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ReadCommittedIter({self._reader!r}, ring_size={self._ring_size}, delivered={self.delivered})"


def _reads_one_topic(topics: Sequence[str], partitions: Sequence[tuple[str, int]] | None) -> bool:
    """True when every record the reader can get is of one topic: one topic name, not a pattern
    (a subscription to ``^...`` matches any number of topics)."""
    names = {t for t, _ in partitions} if partitions is not None else set(topics)
    return len(names) == 1 and not next(iter(names)).startswith("^")


def _time_left(timeout: float | None, deadline: float | None) -> tuple[float | None, float | None]:
    """Seconds left of a call's ``timeout`` (None: wait forever), and its deadline, fixed on first use."""
    if timeout is None:
        return None, None
    if deadline is None:
        deadline = time.monotonic() + timeout
    return deadline - time.monotonic(), deadline
