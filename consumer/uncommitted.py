"""ReadUncommittedIter: every record of the assigned partitions, in log order, as Envelopes.

The Kafka counterpart of Gazette's ``message.ReadUncommittedIter``: it reads
with ``isolation.level=read_uncommitted`` and turns each record into a
``sequencer.Envelope`` (journal ``"topic/partition"``, Begin = offset,
End = offset + 1, the message UUID from the ``uuid`` header, and a
:class:`~consumer.record.Record` as the message). Nothing is filtered or
sequenced here; :class:`~consumer.committed.ReadCommittedIter` feeds these
envelopes to a ``Sequencer``.

Partitions come either from an explicit assignment (``partitions=`` or all
partitions of ``topics=`` when the config has no ``group.id``) or from a
consumer group (``group.id`` set: ``subscribe``). A partition starts at the
offset given for its journal in ``offsets`` or, when none is given, at the
configured ``auto.offset.reset`` position; Kafka's committed offsets are never
read or written.

Invariants (backed by ``tests/test_consumer/test_read_uncommitted.py`` and the
rebalance test):

* Envelopes of one partition come in strictly increasing offset order, each
  record at most once per assignment (a rebalance may restart a partition).
* ``poll(timeout)`` blocks at most ``timeout`` seconds (``None``: until a
  record arrives) inside librdkafka, never spinning; it returns ``None`` on
  timeout.
* After a rebalance, no record of a partition revoked by it is returned.
* Records with a missing or malformed ``uuid`` header follow the
  :class:`~consumer.uuid_header.UUIDPolicy`; none of them crash the reader.
"""

from __future__ import annotations

import logging
import time
import uuid as uuid_mod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from harvest_outbox.kafka_access import AccessWatch, KafkaAccessError, topic_metadata
from harvest_outbox.sequencer import NIL_UUID, EntryBatch, Envelope
from harvest_outbox.sequencer.uuid_layout import FLAGS_MASK as _FLAGS_MASK
from harvest_outbox.sequencer.uuid_layout import FLAGS_SHIFT as _FLAGS
from harvest_outbox.sequencer.uuid_layout import MAX_RELAY_FLAGS as _MAX_FLAGS
from harvest_outbox.sequencer.uuid_layout import RELAY_UUID_BITS as _RELAY_BITS
from harvest_outbox.sequencer.uuid_layout import RELAY_UUID_MASK as _RELAY_MASK

from .config import ReaderConfig, check_batch_size, check_idle_timeout, redact
from .errors import (
    ConfigError,
    ConsumerClosedError,
    KafkaReadError,
    MissingUUIDError,
    OffsetLostError,
)
from .record import Record, make_record
from .record import _native as _native_records
from .uuid_header import (
    RateLimitedLog,
    UUIDPolicy,
    describe_problem,
    parse_header_value,
)

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "AssignHook",
    "ReadUncommittedIter",
    "RevokeHook",
    "journal_of",
    "make_envelope",
    "message_uuid",
]

logger = logging.getLogger(__name__)

#: Called with newly assigned (topic, partition)s; returns start offsets by journal.
AssignHook = Callable[[list[tuple[str, int]]], Mapping[str, int]]
#: Called with revoked (topic, partition)s (``lost`` is True when they were lost, not revoked).
RevokeHook = Callable[[list[tuple[str, int]], bool], None]

_new = object.__new__
_env_fields = Envelope.__dict__
_set_journal = _env_fields["journal"].__set__
_set_begin = _env_fields["begin"].__set__
_set_end = _env_fields["end"].__set__
_set_uuid = _env_fields["uuid"].__set__
_set_message = _env_fields["message"].__set__
_parse = parse_header_value
_UUID = uuid_mod.UUID
_set_uuid_int = _UUID.__dict__["int"].__set__
_set_uuid_safe = _UUID.__dict__["is_safe"].__set__
_SAFE_UNKNOWN = uuid_mod.SafeUUID.unknown
#: The compiled converter (consumer/_native.pyx), or None: _convert_entries_py then does its work.
_native_convert: Callable[[list[Any], int, dict[tuple[str, int], str], Any], int] | None = (
    None if _native_records is None else _native_records.convert
)


def _index_of(items: list[Any], item: Any) -> int:
    for i, x in enumerate(items):
        if x is item:
            return i
    raise ValueError("item not in list")  # pragma: no cover


#: Records per consume() call. Small batches are faster here, not slower: every record is a few
#: GC-tracked objects (confluent's Message, its header list and tuple), and the fewer of them are
#: alive at once, the less the cyclic GC traverses (bench_consumer: 2000 -> 256 took the reader from
#: ~0.55M to ~0.85M records per CPU-second, and a plain consumer likewise gains).
DEFAULT_BATCH_SIZE = 256
_MAX_WAIT = 1.0  # seconds per consume() call, so close() from a signal handler is noticed


def _consume_batch(consumer: Any, size: int, wait: float) -> list[Any]:
    """Up to ``size`` messages: whatever is ready now, else block up to ``wait``
    seconds for the first one and take what is ready after it.

    (``Consumer.consume(n, t)`` alone waits the whole ``t`` unless ``n``
    messages arrive, which would add ``t`` of latency to every small batch.)
    """
    raw = consumer.consume(size, 0)
    if raw:
        return raw  # type: ignore[no-any-return]
    first = consumer.poll(wait)
    if first is None:
        return []
    rest = consumer.consume(size - 1, 0) if size > 1 else []
    return [first, *rest]


def _unconverted(raw: list[Any]) -> list[Any]:
    return raw


def journal_of(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def make_envelope(journal: str, offset: int, uuid: Any, message: Any) -> Envelope:
    """Envelope(journal, offset, offset + 1, uuid, message) without dataclass __init__ overhead."""
    env = _new(Envelope)
    _set_journal(env, journal)
    _set_begin(env, offset)
    _set_end(env, offset + 1)
    _set_uuid(env, uuid)
    _set_message(env, message)
    return env


def message_uuid(msg: Any) -> Any:
    """The parsed UUID of a confluent Message, or None (missing, malformed or nil)."""
    return uuid_in_headers(msg.headers())


def uuid_in_headers(headers: Any) -> Any:
    """The parsed UUID of the first ``uuid`` header in ``headers``, or None (missing, malformed or nil)."""
    if headers is not None:
        for k, v in headers:
            if k == "uuid":
                return _parse(v)
    return None


#: Seconds a subscribing reader waits at construction for the metadata that proves it can log in.
_ACCESS_CHECK_SECONDS = 3.0


class ReadUncommittedIter:
    """Reads every record of the assigned partitions as an Envelope (see module doc).

    ``kafka_config`` is an ordinary confluent-kafka config; see
    :mod:`consumer.config` for the keys the reader fixes. Give ``topics`` (all
    partitions, or a group subscription when ``group.id`` is set) or
    ``partitions`` (explicit ``(topic, partition)`` pairs).
    """

    def __init__(
        self,
        kafka_config: Mapping[str, Any],
        topics: Sequence[str] | None = None,
        *,
        partitions: Iterable[tuple[str, int]] | None = None,
        offsets: Mapping[str, int] | None = None,
        uuid_policy: UUIDPolicy | str = UUIDPolicy.DELIVER,
        batch_size: int = DEFAULT_BATCH_SIZE,
        idle_timeout: float | None = None,
        on_assign: AssignHook | None = None,
        on_revoke: RevokeHook | None = None,
    ) -> None:
        self._config = ReaderConfig(kafka_config)
        try:
            self._policy = UUIDPolicy(uuid_policy)
        except ValueError as exc:
            raise ConfigError(
                f"uuid_policy must be one of {[p.value for p in UUIDPolicy]}, got {uuid_policy!r}"
            ) from exc
        batch_size = check_batch_size(batch_size)
        idle_timeout = check_idle_timeout(idle_timeout)
        if topics is not None and isinstance(topics, str):
            topics = [topics]
        explicit = list(partitions) if partitions is not None else None
        if explicit is None and not topics:
            raise ConfigError("give topics=[...] or partitions=[(topic, partition), ...]")
        if explicit is not None and topics:
            raise ConfigError("give either topics= or partitions=, not both")
        if explicit is not None and self._config.group_id is not None:
            raise ConfigError("partitions= is an explicit assignment: remove 'group.id' from kafka_config")
        for tp in explicit or ():
            if not (isinstance(tp, tuple) and len(tp) == 2 and isinstance(tp[0], str) and isinstance(tp[1], int)):
                raise ConfigError(f"partitions must be (topic, partition) pairs, got {tp!r}")

        self._batch_size = batch_size
        self._idle_timeout = idle_timeout
        self._offsets: dict[str, int] = dict(offsets or {})
        self._assign_hook = on_assign
        self._revoke_hook = on_revoke
        self._journals: dict[tuple[str, int], str] = {}
        self._assigned: set[tuple[str, int]] = set()
        self._rebalanced = False
        self._callback_error: BaseException | None = None
        self._warn = RateLimitedLog(logger)
        self._buf: list[Envelope] = []
        self._pos = 0
        self._pending_raw: list[Any] = []
        self._pending_error: BaseException | None = None
        self._closed = False
        strategy = str(kafka_config.get("partition.assignment.strategy", "")).lower()
        self._cooperative = (
            "cooperative" in strategy or str(kafka_config.get("group.protocol", "")).lower() == "consumer"
        )

        main = self._config.main_config()
        # librdkafka tells a refused login or a failed TLS handshake only to error_cb (the application's
        # own still gets every error): the metadata read below then fails with the reason, at once
        self._access = AccessWatch(main.get("error_cb"))
        main["error_cb"] = self._access
        try:
            self._consumer = Consumer(main)
        except (KafkaException, ValueError, TypeError) as exc:
            raise ConfigError(f"invalid kafka config: {exc} (config: {redact(self._config.base)})") from exc
        try:
            if explicit is None and self._config.group_id is not None:
                self._check_access(list(topics or ()))
                self._consumer.subscribe(
                    list(topics or ()), on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
                )
            else:
                if explicit is None:
                    explicit = self._all_partitions(list(topics or ()))
                self._assign(explicit, incremental=False)
        except BaseException:
            self._consumer.close()
            raise

    # -- assignment ---------------------------------------------------------

    def _check_access(self, topics: list[str]) -> None:
        """Before a subscription: a refused login or a failed TLS handshake is an error now, not a group
        that never gets a record (librdkafka tells it only to error_cb). A broker that does not answer within
        :data:`_ACCESS_CHECK_SECONDS` is left to the subscription, which waits for it as before."""
        if not topics:
            return
        try:
            topic_metadata(self._consumer, topics[0], _ACCESS_CHECK_SECONDS, self._access, self._config.base)
        except KafkaAccessError as exc:
            raise KafkaReadError(f"cannot read topic {topics[0]!r}: {exc}") from None
        except KafkaException:
            pass  # no answer yet, or a pattern subscription's name: the subscription decides

    def _all_partitions(self, topics: list[str]) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        for topic in topics:
            try:
                meta = topic_metadata(self._consumer, topic, 30, self._access, self._config.base).topics.get(topic)
            except KafkaAccessError as exc:
                raise KafkaReadError(f"cannot read metadata of topic {topic!r}: {exc}") from None
            except KafkaException as exc:
                raise KafkaReadError(f"cannot read metadata of topic {topic!r}: {exc}") from exc
            if meta is None or meta.error is not None or not meta.partitions:
                why = meta.error if meta is not None else "not found"
                raise KafkaReadError(f"topic {topic!r} cannot be read ({why}); does it exist?")
            out.extend((topic, p) for p in sorted(meta.partitions))
        return out

    def _start_offset(self, journal: str, offsets: Mapping[str, int]) -> int:
        off = offsets.get(journal)
        if off is not None:
            return off
        start = self._config.start
        if start == "earliest":
            return OFFSET_BEGINNING
        if start == "latest":
            return OFFSET_END
        raise OffsetLostError(
            f"no checkpoint covers partition {journal} and auto.offset.reset is 'error'; "
            "give a checkpoint that covers it or set auto.offset.reset"
        )

    def _assign(self, tps: list[tuple[str, int]], incremental: bool) -> None:
        offsets: Mapping[str, int] = self._offsets
        if self._assign_hook is not None:
            got = self._assign_hook(list(tps))
            if got:
                offsets = {**self._offsets, **got}
        parts = []
        for topic, partition in tps:
            journal = self._journals.setdefault((topic, partition), journal_of(topic, partition))
            parts.append(TopicPartition(topic, partition, self._start_offset(journal, offsets)))
        logger.info(
            "assigning %d partition(s): %s",
            len(parts),
            ", ".join(f"{p.topic}/{p.partition}@{p.offset}" for p in parts[:20]) + (" ..." if len(parts) > 20 else ""),
        )
        if incremental:
            self._consumer.incremental_assign(parts)
        else:
            self._consumer.assign(parts)
        self._assigned.update(tps)

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        try:
            self._rebalanced = True
            self._assign([(p.topic, p.partition) for p in partitions], incremental=self._cooperative)
        except BaseException as exc:  # surfaced from poll(); librdkafka must not see it
            logger.error("on_assign failed: %s", exc)
            self._callback_error = exc

    def _revoked(self, partitions: list[TopicPartition], lost: bool) -> None:
        try:
            self._rebalanced = True
            tps = [(p.topic, p.partition) for p in partitions]
            logger.info("%s %d partition(s): %s", "lost" if lost else "revoked", len(tps), tps[:20])
            if self._revoke_hook is not None:
                self._revoke_hook(tps, lost)
            for tp in tps:
                self._assigned.discard(tp)
            if self._cooperative:
                self._consumer.incremental_unassign(partitions)
            else:
                self._consumer.unassign()
        except BaseException as exc:
            logger.error("on_revoke failed: %s", exc)
            self._callback_error = exc

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._revoked(partitions, lost=False)

    def _on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._revoked(partitions, lost=True)

    @property
    def assignment(self) -> list[tuple[str, int]]:
        """Currently assigned (topic, partition) pairs."""
        return sorted(self._assigned)

    # -- reading ------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> Envelope | None:
        """The next Envelope, or None if none arrived within ``timeout`` seconds."""
        if self._pos < len(self._buf):
            env = self._buf[self._pos]
            self._pos += 1
            return env
        batch: list[Envelope] = self._next_batch(timeout)
        if not batch:
            return None
        self._buf = batch
        self._pos = 1
        return batch[0]

    def __iter__(self) -> Iterator[Envelope]:
        """Envelopes until ``idle_timeout`` passes without one (forever when None)."""
        while True:
            env = self.poll(self._idle_timeout)
            if env is None:
                return
            yield env

    def _take_buffered(self) -> list[Envelope]:
        """Envelopes already read by poll() but not yet returned (ReadCommittedIter's hand-over)."""
        rest = self._buf[self._pos :]
        self._buf = []
        self._pos = 0
        return rest

    def _next_batch(self, timeout: float | None, entries: bool = False, unconverted: bool = False) -> list[Any]:
        """Read and convert the next batch of records; [] on timeout.

        Envelopes, or with ``entries=True`` ``Sequencer.queue_batch`` entries
        (ReadCommittedIter's hot path; see :meth:`_convert_entries`), or with
        ``unconverted=True`` the consumed messages themselves, unconverted (the fused
        batch path, ``consumer/_native.pyx`` ``sequence_raw``, converts them as
        it sequences, and hands what needs the UUID policy to
        :meth:`_convert_entries`).
        """
        convert: Callable[[list[Any]], Any]
        convert = _unconverted if unconverted else self._convert_entries if entries else self._convert
        if self._closed:
            raise ConsumerClosedError("the reader is closed")
        if self._pending_error is not None:
            err, self._pending_error = self._pending_error, None
            raise err
        if self._pending_raw:
            raw, self._pending_raw = self._pending_raw, []
            out = convert(raw)
            if out:
                return out
            if self._pending_error is not None:
                err, self._pending_error = self._pending_error, None
                raise err
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = _MAX_WAIT if deadline is None else min(_MAX_WAIT, max(0.0, deadline - time.monotonic()))
            self._rebalanced = False
            try:
                raw = _consume_batch(self._consumer, self._batch_size, wait)
            except KafkaException as exc:
                raise KafkaReadError(f"consume failed: {exc}") from exc
            if self._callback_error is not None:
                err, self._callback_error = self._callback_error, None
                raise err
            if self._closed:
                raise ConsumerClosedError("the reader was closed while polling")
            if raw:
                if self._rebalanced:
                    assigned = self._assigned
                    raw = [m for m in raw if m.error() is not None or (m.topic(), m.partition()) in assigned]
                out = convert(raw)
                if out:
                    return out
                if self._pending_error is not None:
                    err, self._pending_error = self._pending_error, None
                    raise err
            if deadline is not None and time.monotonic() >= deadline:
                return []

    def _convert(self, raw: list[Any]) -> list[Envelope]:
        # The hot path: everything is inlined (parse_header_value,
        # make_envelope); keep it equivalent to them.
        out: list[Envelope] = []
        append = out.append
        journals = self._journals
        new = _new
        from_bytes = int.from_bytes
        envelope, uuid_cls = Envelope, _UUID
        nil = NIL_UUID
        for msg in raw:
            if msg.error() is not None:
                self._on_error(msg)
                continue
            u = None
            headers = msg.headers()
            if headers is not None:
                for k, v in headers:
                    if k == "uuid":
                        if type(v) is bytes and len(v) == 16:
                            x = from_bytes(v, "big")
                            if x & _RELAY_MASK == _RELAY_BITS and (x >> _FLAGS) & _FLAGS_MASK <= _MAX_FLAGS:
                                u = new(uuid_cls)
                                _set_uuid_int(u, x)
                                _set_uuid_safe(u, _SAFE_UNKNOWN)
                        break
            topic = msg.topic()
            partition = msg.partition()
            journal = journals.get((topic, partition))
            if journal is None:
                journal = journals[(topic, partition)] = journal_of(topic, partition)
            offset = msg.offset()
            rec = make_record(msg, 0 if u is None else u.int)
            if u is None:
                if not self._unsequenced(msg, journal, offset, headers):
                    if self._pending_error is not None:
                        self._pending_raw = raw[_index_of(raw, msg) + 1 :]
                        return out
                    continue
                u = nil
            env = new(envelope)
            _set_journal(env, journal)
            _set_begin(env, offset)
            _set_end(env, offset + 1)
            _set_uuid(env, u)
            _set_message(env, rec)
            append(env)
        return out

    def _convert_entries(self, raw: list[Any]) -> Any:
        """_convert() for ReadCommittedIter: ``(journal, offset, offset + 1, uuid_int, record)``
        entries for ``Sequencer.queue_batch`` instead of Envelopes.

        The same records, journals, offsets, UUIDs and policy decisions as
        _convert() (``test_read_uncommitted.py`` compares them), without building
        a ``uuid.UUID`` and an Envelope per record: at some 10^5-10^6 records/s
        those allocations were a large share of the reader's CPU. With the
        native extensions the entries are an ``EntryBatch`` filled by compiled
        code, which hands back only the records that need this module's
        policy (Kafka errors, unusable ``uuid`` headers); else a list.
        """
        convert = _native_convert
        if convert is None:
            return self._convert_entries_py(raw)
        out = EntryBatch(len(raw))
        journals = self._journals
        n = len(raw)
        pos = 0
        while True:
            pos = convert(raw, pos, journals, out)
            if pos >= n:
                return out
            msg = raw[pos]
            pos += 1
            # What the compiled loop leaves to Python: exactly _convert_entries_py's steps.
            if msg.error() is not None:
                if self._error_deferred(msg):
                    self._pending_raw = raw[pos:]
                    return out
                continue
            headers = msg.headers()
            u = uuid_in_headers(headers)
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            journal = journals.get((topic, partition))
            if journal is None:
                journal = journals[(topic, partition)] = journal_of(topic, partition)
            x = 0 if u is None else u.int
            if not x and not self._unsequenced(msg, journal, offset, headers):
                if self._pending_error is not None:
                    self._pending_raw = raw[pos:]
                    return out
                continue
            out.append(journal, offset, offset + 1, x, make_record(msg, x))

    def _convert_entries_py(self, raw: list[Any]) -> list[tuple[str, int, int, int, Record]]:
        """_convert_entries() in pure Python (the reference for consumer/_native.pyx's ``convert``)."""
        out: list[tuple[str, int, int, int, Record]] = []
        append = out.append
        journals = self._journals
        from_bytes = int.from_bytes
        make = make_record
        last_topic: Any = None
        last_partition = -1
        journal = ""
        for msg in raw:
            if msg.error() is not None:
                if self._error_deferred(msg):
                    self._pending_raw = raw[_index_of(raw, msg) + 1 :]
                    return out
                continue
            x = 0
            headers = msg.headers()
            if headers is not None:
                for k, v in headers:
                    if k == "uuid":
                        if type(v) is bytes and len(v) == 16:
                            x = from_bytes(v, "big")
                            # parse_header_value's rule (version 1, RFC 4122 variant, multicast
                            # ProducerID, flags 0-2); else unusable.
                            if x & _RELAY_MASK != _RELAY_BITS or (x >> _FLAGS) & _FLAGS_MASK > _MAX_FLAGS:
                                x = 0
                        break
            topic = msg.topic()
            partition = msg.partition()
            # Consumed batches come in runs of one partition: skip the lookup within a run.
            if partition != last_partition or topic != last_topic:
                journal = journals.get((topic, partition))  # type: ignore[assignment]
                if journal is None:
                    journal = journals[(topic, partition)] = journal_of(topic, partition)
                last_topic, last_partition = topic, partition
            offset = msg.offset()
            rec = make(msg, x)
            if not x and not self._unsequenced(msg, journal, offset, headers):
                if self._pending_error is not None:
                    self._pending_raw = raw[_index_of(raw, msg) + 1 :]
                    return out
                continue
            append((journal, offset, offset + 1, x, rec))
        return out

    def _unsequenced(self, msg: Any, journal: str, offset: int, headers: Any) -> bool:
        """Apply the UUID policy; True to deliver the record as an unsequenced OUTSIDE message."""
        policy = self._policy
        problem = describe_problem(headers)
        if policy is UUIDPolicy.RAISE:
            self._pending_error = MissingUUIDError(
                f"record {journal}@{offset} has {problem}; uuid_policy='raise' (use 'deliver' or 'drop' to continue)"
            )
            return False
        action = "delivering it at-least-once as unsequenced" if policy is UUIDPolicy.DELIVER else "dropping it"
        self._warn.warning(journal, "record %s@%d has %s: %s", journal, offset, problem, action)
        return policy is UUIDPolicy.DELIVER

    def _error_deferred(self, msg: Any) -> bool:
        """:meth:`_on_error` for the entries converters: an error it raises is kept pending (raised
        by the next fetch, as for ``uuid_policy='raise'``) so the records before it in the batch are
        sequenced and delivered first rather than lost with the batch. True when one was kept."""
        try:
            self._on_error(msg)
        except (OffsetLostError, KafkaReadError) as exc:
            self._pending_error = exc
            return True
        return False

    def _on_error(self, msg: Any) -> None:
        err: KafkaError = msg.error()
        code = err.code()
        where = f"{msg.topic()}/{msg.partition()}" if msg.topic() else "consumer"
        if code == KafkaError._AUTO_OFFSET_RESET or code == KafkaError.OFFSET_OUT_OF_RANGE:
            raise OffsetLostError(
                f"{where}: the start offset is no longer in the log ({err.str()}); messages were deleted by "
                "retention before they were read. Restore a newer checkpoint or start without one"
            )
        if err.fatal():
            raise KafkaReadError(f"{where}: fatal Kafka error: {err.str()}")
        if code == KafkaError.UNKNOWN_TOPIC_OR_PART or code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            self._warn.warning(f"err:{where}:{code}", "%s: %s (will keep trying)", where, err.str())
            return
        self._warn.warning(
            f"err:{where}:{code}", "%s: Kafka error %s (retriable=%s)", where, err.str(), err.retriable()
        )

    # -- lifecycle ----------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Leave the group (if any) and release the Kafka client. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._consumer.close()
        except (KafkaException, RuntimeError) as exc:  # already closed, or broker gone
            logger.debug("consumer close: %s", exc)

    def __enter__(self) -> ReadUncommittedIter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._assigned)} partition(s)"
        return f"ReadUncommittedIter({state}, group={self._config.group_id!r}, policy={self._policy.value})"
