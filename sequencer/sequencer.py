"""Sequencer: turns read-uncommitted messages into read-committed sequences.

A port of the semantics of Gazette's ``message.Sequencer``. Feed every message
read from the journals, in read order, to :meth:`Sequencer.queue_uncommitted`.
When it returns a committing outcome (``QueueOutcome.commits``), call
:meth:`Sequencer.step` until it returns ``None``; each call returns the next
committed message of the sequence (replayed part first, then the ring), and
finally the committing ACK_TXN / OUTSIDE_TXN message itself. On
``ACK_COMMIT_REPLAY`` first re-read :meth:`Sequencer.replay_range` and pass the
envelopes to :meth:`Sequencer.start_replay`. :meth:`Sequencer.queue_batch`
queues a whole read batch in one call (exactly ``queue_uncommitted`` per entry,
stopping at each commit); :meth:`Sequencer.drop_journals` forgets journals
(e.g. revoked partitions).

Per (journal, producer) the Sequencer tracks a partial sequence: an exclusive
minimum clock (the last ACK), an inclusive maximum clock, the ``begin`` offset
of the open span and that span's entries in a fixed ring buffer (a linked list
threaded through ``_next``). Sequences are dequeued in the order their
committing messages are read, so one producer's open span never blocks another.

Invariants (each backed by a test in ``tests/test_sequencer/``):

1. ``queue_uncommitted`` raises :class:`SequencerStateError` while a committed
   sequence remains to dequeue.
2. Ignored, span and rollback outcomes advance ``offsets[journal]`` to the
   message's ``end`` at once; committing outcomes advance it only when
   ``step()`` returns ``None`` at the end of the sequence, so a checkpoint
   taken earlier makes a restored reader read the committing message again.
3. A message returned by ``step()`` counts as processed once ``step()`` is
   called again (Gazette's consumer likewise consumes, then steps);
   ``checkpoint()`` taken in between resumes exactly at that message, so a
   reader that checkpoints mid-sequence must call ``step()`` first.
4. Within a dequeued sequence clocks strictly increase, never exceed the
   committing clock, and never repeat across sequences of one producer
   (duplicates are dropped), except that zero-clock messages always commit.
5. ``has_pending()`` is true iff a span was opened since the last
   ``checkpoint()`` and is neither committed nor rolled back.
6. ``checkpoint(h)`` with ``h > 0`` drops producers whose maximum clock is more
   than ``h`` behind the largest last-ACK clock of their journal.
7. ``step()`` raises :class:`ReplayError` when a replay serves a message from
   another journal or outside ``replay_range()``, or its iterator raises.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from .envelope import Envelope
from .errors import CheckpointError, ReplayError, SequencerStateError
from .outcome import QueueOutcome
from .state import ProducerState
from .uuid_layout import CONTINUE_TXN as _CONTINUE
from .uuid_layout import COUNTER_MASK as _COUNTER_MASK
from .uuid_layout import COUNTER_SHIFT as _COUNTER
from .uuid_layout import FLAGS_MASK as _FLAGS_MASK
from .uuid_layout import FLAGS_SHIFT as _FLAGS
from .uuid_layout import PRODUCER_MASK as _PRODUCER_MASK
from .uuid_layout import TIME_HI_MASK as _TIME_HI_MASK
from .uuid_layout import TIME_HI_SHIFT as _TIME_HI
from .uuid_layout import TIME_LOW_SHIFT as _TIME_LOW
from .uuid_layout import TIME_MID_MASK as _TIME_MID_MASK
from .uuid_layout import TIME_MID_SHIFT as _TIME_MID
from .uuid_layout import clock_of_int

__all__ = ["DEFAULT_PRUNE_HORIZON_NS", "DEFAULT_RING_SIZE", "Sequencer"]

logger = logging.getLogger(__name__)

#: Gazette consumers prune producers idle for 24 h (``messageSequencerPruneHorizon``).
DEFAULT_PRUNE_HORIZON_NS = 24 * 3600 * 1_000_000_000
DEFAULT_RING_SIZE = 8192

# Distinct anomalies logged once per (reason, journal, producer); past this
# many, further ones go to DEBUG so a misbehaving writer cannot grow memory.
_MAX_LOGGED_ANOMALIES = 4096

_OUTSIDE_ALREADY_ACKED = QueueOutcome.OUTSIDE_ALREADY_ACKED
_OUTSIDE_COMMIT = QueueOutcome.OUTSIDE_COMMIT
_CONTINUE_ALREADY_ACKED = QueueOutcome.CONTINUE_ALREADY_ACKED
_CONTINUE_TXN_CLOCK_LARGER = QueueOutcome.CONTINUE_TXN_CLOCK_LARGER
_CONTINUE_BEGIN_SPAN = QueueOutcome.CONTINUE_BEGIN_SPAN
_CONTINUE_EXTEND_SPAN = QueueOutcome.CONTINUE_EXTEND_SPAN
_ACK_ROLLBACK = QueueOutcome.ACK_ROLLBACK
_ACK_EMPTY = QueueOutcome.ACK_EMPTY
_ACK_COMMIT_RING = QueueOutcome.ACK_COMMIT_RING
_ACK_COMMIT_REPLAY = QueueOutcome.ACK_COMMIT_REPLAY


class _Partial:
    """Partial, not yet acknowledged sequence of one (journal, producer).

    Hashes by identity: the pending set holds these objects themselves.
    """

    __slots__ = ("begin", "journal", "max_clock", "min_clock", "producer", "ring_start", "ring_stop")

    def __init__(self, journal: str, producer: int, min_clock: int, max_clock: int, begin: int) -> None:
        self.journal = journal
        self.producer = producer  # the 48-bit node as an int: cheaper to key and compare
        self.min_clock = min_clock  # exclusive: clock of the last ACK (or processed message)
        self.max_clock = max_clock  # inclusive: largest clock of the span (or the ACK's)
        self.begin = begin  # offset of the first unprocessed span message, or -1
        self.ring_start = -1  # ring index of the span's first entry still in the ring
        self.ring_stop = -1  # ring index of the span's last entry

    def __repr__(self) -> str:
        return (
            f"_Partial({self.journal!r}, {self.producer:012x}, min={self.min_clock}, "
            f"max={self.max_clock}, begin={self.begin}, ring={self.ring_start}..{self.ring_stop})"
        )


class Sequencer:
    """Sequences read-uncommitted messages into committed ones (see module doc)."""

    __slots__ = (
        "_dequeued",
        "_dequeued_clock",
        "_emit",
        "_emit_end",
        "_head",
        "_logged",
        "_next",
        "_offsets",
        "_offsets_view",
        "_partials",
        "_pending",
        "_rbegin",
        "_rclock",
        "_replay_it",
        "_ring",
        "_rpart",
        "_size",
    )

    def __init__(
        self,
        offsets: Mapping[str, int] | None = None,
        states: Iterable[ProducerState] | None = None,
        ring_size: int = DEFAULT_RING_SIZE,
    ) -> None:
        # Gazette clamps a non-positive buffer to one entry: the committing
        # message itself must always fit.
        size = ring_size if ring_size > 0 else 1
        self._offsets: dict[str, int] = dict(offsets) if offsets is not None else {}
        self._offsets_view = MappingProxyType(self._offsets)
        self._partials: dict[str, dict[int, _Partial]] = {}
        self._pending: set[_Partial] = set()
        self._emit: _Partial | None = None
        self._dequeued: Any = None  # the item step() returned last
        self._dequeued_clock = 0
        self._replay_it: Iterator[Envelope] | None = None
        # The ring, as parallel lists indexed by slot: the queued item (what
        # step() returns), its begin offset, its clock and its producer's
        # partial (for eviction). Keeping begin/clock beside the item spares
        # step() and the commit checks re-deriving them from the Envelope, and
        # lets queue_batch() store items that are not Envelopes.
        self._ring: list[Any] = [None] * size
        self._rbegin: list[int] = [0] * size
        self._rclock: list[int] = [0] * size
        self._rpart: list[_Partial | None] = [None] * size
        self._next: list[int] = [-1] * size
        self._emit_end = 0  # end offset of the committing message of _emit
        self._head = 0
        self._size = size
        self._logged: set[tuple[str, str, int]] = set()

        for st in states or ():
            if not isinstance(st, ProducerState):
                raise CheckpointError(f"states must hold ProducerState values, got {st!r}")
            if len(st.producer) != 6:
                raise CheckpointError(
                    f"ProducerState.producer must be 6 bytes, got {st.producer!r} "
                    f"(journal {st.journal!r}); the checkpoint is corrupt"
                )
            if st.last_ack < 0 or st.begin < -1:
                raise CheckpointError(
                    f"ProducerState of journal {st.journal!r} has last_ack={st.last_ack}, "
                    f"begin={st.begin}; expected last_ack >= 0 and begin >= -1"
                )
            if st.last_ack >= (1 << 64) or st.begin >= (1 << 63):
                raise CheckpointError(
                    f"ProducerState of journal {st.journal!r} has last_ack={st.last_ack}, "
                    f"begin={st.begin}; clocks are 64-bit and offsets signed 64-bit: the checkpoint is corrupt"
                )
            pid = int.from_bytes(st.producer, "big")
            # As in Gazette, a later state for the same producer replaces an earlier one.
            self._partials.setdefault(st.journal, {})[pid] = _Partial(
                st.journal, pid, st.last_ack, st.last_ack, st.begin
            )

    # -- queueing ---------------------------------------------------------

    def queue_uncommitted(self, env: Envelope) -> QueueOutcome:
        """Apply the next read-uncommitted message and return the decision."""
        if self._emit is not None:
            raise SequencerStateError(
                "committed messages remain to dequeue: call step() until it returns None before queue_uncommitted()"
            )
        return self._queue(env.journal, env.begin, env.end, env.uuid.int, env)

    def queue_batch(
        self, entries: Sequence[tuple[str, int, int, int, Any]], pos: int = 0
    ) -> tuple[int, QueueOutcome | None]:
        """Queue ``entries[pos:]`` in order, stopping after the first committing one.

        Each entry is ``(journal, begin, end, uuid_int, item)``: an Envelope's
        fields, with the UUID as its 128-bit int, and ``item`` the object that
        ``step()`` returns for it (where ``queue_uncommitted`` returns the
        Envelope itself). Returns ``(next_pos, outcome)``: ``outcome`` is the
        committing outcome of ``entries[next_pos - 1]`` (then dequeue it exactly
        as after ``queue_uncommitted``), or ``None`` when every entry was queued
        without a commit (``next_pos == len(entries)``).

        Equivalent to calling ``queue_uncommitted`` on each entry's Envelope
        (``tests/test_sequencer/test_seq_batch.py`` checks it on random logs),
        but one Python call per batch instead of per message: readers spend most
        of their time here, and in CPython the per-message call and attribute
        overhead dominate the actual work.
        """
        if self._emit is not None:
            raise SequencerStateError(
                "committed messages remain to dequeue: call step() until it returns None before queue_batch()"
            )
        ring, rbegin, rclock, rpart, nxt = self._ring, self._rbegin, self._rclock, self._rpart, self._next
        partials = self._partials
        offsets = self._offsets
        pending = self._pending
        size = self._size
        queue = self._queue
        head = self._head
        jname: str | None = None
        jparts: dict[int, _Partial] = {}
        n = len(entries)
        while pos < n:
            journal, begin, end, x, item = entries[pos]
            pos += 1
            if ring[head] is not None:
                self._evict_at_head(head)
            # Fast path, the common case: a CONTINUE_TXN with a clock above both
            # bounds of a known producer (CONTINUE_BEGIN_SPAN / _EXTEND_SPAN).
            # It is _queue()'s CONTINUE branch for exactly these conditions;
            # everything else goes through _queue() itself.
            if (x >> _FLAGS) & _FLAGS_MASK == _CONTINUE:
                if journal is not jname:
                    jname = journal
                    jparts = partials.get(journal) or {}
                partial = jparts.get(x & _PRODUCER_MASK)
                if partial is not None:
                    clock = (  # uuid_layout.clock_of_int, inlined
                        (x >> _TIME_LOW) << 4
                        | ((x >> _TIME_MID) & _TIME_MID_MASK) << 36
                        | ((x >> _TIME_HI) & _TIME_HI_MASK) << 52
                        | (x >> _COUNTER) & _COUNTER_MASK
                    )
                    if clock > partial.max_clock and clock > partial.min_clock:
                        if partial.begin == -1:
                            partial.begin = begin
                            pending.add(partial)
                        ring[head] = item
                        rbegin[head] = begin
                        rclock[head] = clock
                        rpart[head] = partial
                        nxt[head] = -1
                        if partial.ring_stop == -1:
                            partial.ring_start = head
                        else:
                            nxt[partial.ring_stop] = head
                        partial.ring_stop = head
                        head += 1
                        if head == size:
                            head = 0
                        partial.max_clock = clock
                        offsets[journal] = end
                        continue
            self._head = head
            outcome = queue(journal, begin, end, x, item)
            if jname == journal:
                jname = None  # _queue() may have created the journal's partials
            if self._emit is not None:
                return pos, outcome
            head = self._head
        self._head = head
        return pos, None

    def _queue(self, journal: str, begin: int, end: int, x: int, item: Any) -> QueueOutcome:
        """queue_uncommitted() on an Envelope's fields (``x`` is ``uuid.int``)."""
        ring = self._ring
        head = self._head
        if ring[head] is not None:
            self._evict_at_head(head)

        # uuid_layout's producer_of_int/clock_of_int/flags_of_int, inlined: function calls per
        # message are a large share of the hot path in CPython.
        producer = x & _PRODUCER_MASK
        clock = (  # uuid_layout.clock_of_int, inlined
            (x >> _TIME_LOW) << 4
            | ((x >> _TIME_MID) & _TIME_MID_MASK) << 36
            | ((x >> _TIME_HI) & _TIME_HI_MASK) << 52
            | (x >> _COUNTER) & _COUNTER_MASK
        )
        flags = (x >> _FLAGS) & _FLAGS_MASK
        raw_clock = clock  # what the ring keeps: 0 for an unsequenced message, which step() always returns

        jparts = self._partials.get(journal)
        if jparts is None:
            jparts = self._partials[journal] = {}
        partial = jparts.get(producer)

        if clock == 0:
            # Unsequenced message (e.g. the nil UUID): commits at once through a
            # throw-away partial, so its producer is never tracked.
            partial = _Partial(journal, producer, 0, 0, -1)
            flags = 0
            clock = 1
        elif partial is None:
            partial = jparts[producer] = _Partial(journal, producer, clock - 1, clock - 1, -1)

        if flags == 1:  # CONTINUE_TXN: the hot path.
            if clock <= partial.min_clock:
                self._offsets[journal] = end
                return _CONTINUE_ALREADY_ACKED
            if clock <= partial.max_clock:
                self._offsets[journal] = end
                return _CONTINUE_TXN_CLOCK_LARGER
            if partial.begin == -1:
                outcome = _CONTINUE_BEGIN_SPAN
                partial.begin = begin
                self._pending.add(partial)
            else:
                outcome = _CONTINUE_EXTEND_SPAN
            # Append to the ring and to this producer's linked list.
            ring[head] = item
            self._rbegin[head] = begin
            self._rclock[head] = clock
            self._rpart[head] = partial
            self._next[head] = -1
            if partial.ring_stop == -1:
                partial.ring_start = head
            else:
                self._next[partial.ring_stop] = head
            partial.ring_stop = head
            head += 1
            self._head = 0 if head == self._size else head
            partial.max_clock = clock
            self._offsets[journal] = end
            return outcome

        if flags == 2:  # ACK_TXN
            min_clock = partial.min_clock
            if clock < min_clock:
                # An upstream producer recovered an older checkpoint: accept the
                # earlier clock (at-least-once) rather than risk losing messages.
                self._log_anomaly(
                    "unexpected ACK_TXN which is less than last ACK (loss of exactly-once semantics)",
                    journal,
                    begin,
                    end,
                    partial,
                    clock,
                    flags,
                )
                outcome = _ACK_ROLLBACK
            elif clock == min_clock:
                outcome = _ACK_ROLLBACK
            elif partial.begin == -1:
                outcome = _ACK_EMPTY
            elif partial.ring_start == -1:
                outcome = _ACK_COMMIT_REPLAY  # no part of the span is in the ring
            elif partial.begin != self._rbegin[partial.ring_start]:
                outcome = _ACK_COMMIT_REPLAY  # only a trailing part is in the ring
            else:
                outcome = _ACK_COMMIT_RING

            if outcome is _ACK_ROLLBACK:
                partial.min_clock = partial.max_clock = clock
                partial.begin = partial.ring_start = partial.ring_stop = -1
                self._pending.discard(partial)
                self._offsets[journal] = end
                return outcome
        else:
            if flags != 0:
                self._log_anomaly(
                    "unexpected UUID flags (handled as OUTSIDE_TXN)", journal, begin, end, partial, clock, flags
                )
            if clock <= partial.min_clock:
                self._offsets[journal] = end
                return _OUTSIDE_ALREADY_ACKED
            if partial.begin != -1:
                self._log_anomaly(
                    "unexpected OUTSIDE_TXN with a preceding CONTINUE_TXN "
                    "(mixed committed and uncommitted publishing to one journal?); "
                    "the open span is rolled back",
                    journal,
                    begin,
                    end,
                    partial,
                    clock,
                    flags,
                )
            outcome = _OUTSIDE_COMMIT

        # A committing outcome. Offsets are *not* advanced here: only once the
        # sequence is fully stepped, so that a checkpoint taken before then
        # makes a restored reader see this committing message again.
        ring[head] = item
        self._rbegin[head] = begin
        self._rclock[head] = raw_clock
        self._rpart[head] = partial
        self._next[head] = -1
        if partial.ring_stop == -1:
            partial.ring_start = head
        else:
            self._next[partial.ring_stop] = head
        partial.ring_stop = head
        head += 1
        self._head = 0 if head == self._size else head

        if outcome is _ACK_EMPTY:
            partial.begin = begin
        elif outcome is _OUTSIDE_COMMIT:
            # Any open span is clobbered (an effective rollback): the sequence
            # is this one message.
            partial.begin = begin
            partial.ring_start = partial.ring_stop
        # Commit through this clock; larger span clocks are rolled back.
        partial.max_clock = clock
        self._emit = partial
        self._emit_end = end
        return outcome

    def _evict_at_head(self, head: int) -> None:
        """Drop the ring entry about to be overwritten, unlinking it from its span."""
        # The entry's partial is kept beside it. If that partial is no longer
        # tracked (pruned or dropped), it cannot be unlinked into live state,
        # and a live partial of the same producer never starts at the ring's
        # oldest slot: its entries are all newer.
        p = self._rpart[head]
        # Usually no span references it: it was already committed or rolled back.
        if p is not None and p.ring_start == head:
            nxt = self._next[head]
            if p.ring_start == p.ring_stop and nxt == -1:
                p.ring_start = p.ring_stop = -1
            elif p.ring_start != p.ring_stop and nxt != -1:
                p.ring_start = nxt
            else:  # pragma: no cover - would be a bug in the ring bookkeeping
                raise AssertionError("ring invariant violated: ring_start == ring_stop iff next[ring_start] == -1")
        self._ring[head] = None
        self._rpart[head] = None
        self._next[head] = -1

    # -- dequeueing -------------------------------------------------------

    def step(self) -> Any:
        """Return the next committed message, or None when the sequence is done.

        Calling ``step()`` marks the previously returned message as processed.
        It returns the Envelope given to ``queue_uncommitted`` (or served by a
        replay), or the item of a ``queue_batch`` entry.
        """
        emit = self._emit
        if emit is None:
            return None
        if self._dequeued is None:
            if self._replay_it is None and emit.begin != self._rbegin[emit.ring_start]:
                raise SequencerStateError(
                    "this sequence must be replayed: call replay_range() and start_replay() "
                    "before step() (queue_uncommitted returned ACK_COMMIT_REPLAY)"
                )
        else:
            # The previous message is processed: tighten the lower bound to it.
            emit.min_clock = self._dequeued_clock

        min_clock = emit.min_clock
        max_clock = emit.max_clock
        while emit.ring_start != -1:
            it = self._replay_it
            if it is None:
                idx = emit.ring_start
                item = self._ring[idx]
                clock = self._rclock[idx]
                begin = self._rbegin[idx]
                emit.ring_start = self._next[idx]  # one past the returned entry
                # Nothing reads a dequeued slot again (no queueing until the
                # sequence ends), so drop the references now to free memory early.
                self._ring[idx] = None
                self._rpart[idx] = None
            else:
                env = self._next_replayed(it, emit)
                if env is None:
                    continue
                item = env
                begin = env.begin
                clock = clock_of_int(env.uuid.int)
            self._dequeued = item
            self._dequeued_clock = clock
            if clock != 0 and clock <= min_clock:
                # A duplicate. Rare within the ring, common in replays, and
                # possible across a restored checkpoint (which keeps only the
                # last ACK, not the span's maximum clock).
                continue
            if clock > max_clock:
                continue  # rolled back by a smaller ACK clock
            emit.begin = begin
            return item

        # The committing message was the last one: only now is it read through.
        assert self._dequeued is not None
        self._offsets[emit.journal] = self._emit_end
        emit.max_clock = emit.min_clock
        emit.begin = emit.ring_start = emit.ring_stop = -1
        self._pending.discard(emit)
        self._dequeued = None
        self._dequeued_clock = 0
        self._emit = None
        return None

    def step_many(self, max_n: int) -> list[Any]:
        """Up to ``max_n`` results of ``step()``, in one call.

        Exactly ``step()`` called until it has returned ``max_n`` messages or
        returned ``None`` (which is not included): the returned list is what
        those calls returned, and the state afterwards is theirs. So when the
        list is shorter than ``max_n`` the sequence is done and every returned
        message is processed; otherwise the last one is dequeued but not yet
        processed (invariant 3: the next ``step()``/``step_many()`` marks it).
        ``tests/test_sequencer/test_seq_step_many.py`` checks the equivalence
        on random logs.

        The ring part of a sequence is dequeued in a tight loop (one Python call
        per batch rather than per message); replayed parts go through ``step()``.
        """
        out: list[Any] = []
        if max_n <= 0:
            return out
        step = self.step
        append = out.append
        k = 0
        while k < max_n:
            emit = self._emit
            if emit is None:
                return out
            if self._replay_it is not None or self._dequeued is None:
                item = step()
                if item is None:
                    return out
                append(item)
                k += 1
                continue
            # step() on the ring path, inlined: at each call min_clock becomes
            # the clock of the message returned last; duplicates (clock <=
            # min_clock, except zero clocks) and rolled-back clocks (> max_clock)
            # are dequeued and skipped.
            ring, rclock, rbegin, rpart, nxt = self._ring, self._rclock, self._rbegin, self._rpart, self._next
            max_clock = emit.max_clock
            last_item = self._dequeued
            last_clock = self._dequeued_clock
            min_clock = last_clock
            begin = emit.begin
            idx = emit.ring_start
            while k < max_n:
                min_clock = last_clock  # the previous message is processed
                while idx != -1:
                    item = ring[idx]
                    clock = rclock[idx]
                    b = rbegin[idx]
                    ring[idx] = None
                    rpart[idx] = None
                    idx = nxt[idx]
                    last_item = item
                    last_clock = clock
                    if clock != 0 and clock <= min_clock:
                        continue
                    if clock > max_clock:
                        continue
                    begin = b
                    append(item)
                    k += 1
                    break
                else:
                    # The committing message was the last one: the sequence is
                    # read through (step()'s epilogue).
                    self._offsets[emit.journal] = self._emit_end
                    emit.min_clock = emit.max_clock = min_clock
                    emit.begin = emit.ring_start = emit.ring_stop = -1
                    self._pending.discard(emit)
                    self._dequeued = None
                    self._dequeued_clock = 0
                    self._emit = None
                    return out
            emit.min_clock = min_clock
            emit.ring_start = idx
            emit.begin = begin
            self._dequeued = last_item
            self._dequeued_clock = last_clock
        return out

    def _next_replayed(self, it: Iterator[Envelope], emit: _Partial) -> Envelope | None:
        """Next replayed message of the emitting producer, or None to re-check the loop."""
        try:
            env = next(it)
        except StopIteration:
            self._replay_it = None  # replay done: continue from the ring
            return None
        except Exception as exc:
            raise ReplayError(f"replay reader: {exc}") from exc
        ring_begin = self._rbegin[emit.ring_start]
        if env.journal != emit.journal:
            raise ReplayError(
                f"replay of wrong journal ({env.journal}; expected {emit.journal}); "
                "serve exactly the journal and offsets of replay_range()"
            )
        if env.begin < emit.begin:
            raise ReplayError(
                f"replay has wrong Begin ({env.begin}; expected >= {emit.begin}); "
                "serve exactly the journal and offsets of replay_range()"
            )
        if env.end > ring_begin:
            raise ReplayError(
                f"replay has wrong End ({env.end}; expected <= {ring_begin}); "
                "serve exactly the journal and offsets of replay_range()"
            )
        if env.uuid.int & _PRODUCER_MASK != emit.producer:
            return None  # other producers' messages are interleaved in the range
        return env

    def replay_range(self) -> tuple[str, int, int]:
        """Journal and ``[begin, end)`` offsets to re-read for the current sequence."""
        emit = self._emit
        if emit is None:
            raise SequencerStateError("replay_range(): no committed sequence to dequeue")
        # The committing message is always in the ring, so ring_start is valid.
        return emit.journal, emit.begin, self._rbegin[emit.ring_start]

    def start_replay(self, envelopes: Iterable[Envelope]) -> None:
        """Supply the envelopes of ``replay_range()`` (all producers, in order)."""
        if self._emit is None:
            raise SequencerStateError("start_replay(): no committed sequence to dequeue")
        self._replay_it = iter(envelopes)

    # -- state ------------------------------------------------------------

    def has_pending(self) -> bool:
        """True if a span was opened since the last checkpoint and is still open.

        Assuming live producers, it hints that more messages are coming.
        """
        return bool(self._pending)

    @property
    def offsets(self) -> Mapping[str, int]:
        """Read-through offset per journal (a live, read-only view)."""
        return self._offsets_view

    def drop_journals(self, journals: Iterable[str]) -> None:
        """Forget the offsets and producer states of ``journals`` (e.g. revoked partitions).

        Pure state removal, as if the Sequencer had been restored from a
        checkpoint without them: a dropped journal's open spans no longer count
        for ``has_pending()``, and its messages still in the ring are never
        returned (their producers are no longer tracked, so nothing links to
        them); they are evicted as the ring wraps. Journals not tracked are
        ignored. Only between sequences: raises :class:`SequencerStateError`
        while a committed sequence remains to dequeue.
        """
        if self._emit is not None:
            raise SequencerStateError("drop_journals(): call step() until it returns None first")
        for journal in journals:
            self._offsets.pop(journal, None)
            jparts = self._partials.pop(journal, None)
            if jparts:
                for p in jparts.values():
                    self._pending.discard(p)

    def checkpoint(self, prune_horizon_ns: int = 0) -> tuple[dict[str, int], list[ProducerState]]:
        """Snapshot offsets and producer states, pruning idle producers.

        With ``prune_horizon_ns > 0``, a producer is dropped (here and from the
        Sequencer) when its maximum clock is more than the horizon behind the
        largest last-ACK clock within its journal. Also clears ``has_pending()``:
        spans that did not complete by now should not hold up the next one.
        """
        states: list[ProducerState] = []
        horizon = (prune_horizon_ns // 100) << 4 if prune_horizon_ns > 0 else 0
        for journal, jparts in list(self._partials.items()):
            if prune_horizon_ns > 0 and jparts:
                # Gazette computes this in unsigned arithmetic, which wraps for
                # horizons beyond the clock's age; signed is the intent.
                bound = max(p.min_clock for p in jparts.values()) - horizon
            else:
                bound = 0
            for pid, p in list(jparts.items()):
                if p.max_clock >= bound:
                    states.append(ProducerState(journal, pid.to_bytes(6, "big"), p.min_clock, p.begin))
                else:
                    del jparts[pid]
            if not jparts:
                del self._partials[journal]
        self._pending.clear()
        return dict(self._offsets), states

    # -- diagnostics ------------------------------------------------------

    def _log_anomaly(
        self, reason: str, journal: str, begin: int, end: int, partial: _Partial, clock: int, flags: int
    ) -> None:
        key = (reason, journal, partial.producer)
        if key in self._logged:
            return
        level = logging.WARNING
        if len(self._logged) < _MAX_LOGGED_ANOMALIES:
            self._logged.add(key)
        else:
            level = logging.DEBUG
        logger.log(
            level,
            "%s: journal=%s begin=%d end=%d producer=%012x clock=%d flags=%#x "
            "partial.min_clock=%d partial.max_clock=%d partial.begin=%d (logged once per producer)",
            reason,
            journal,
            begin,
            end,
            partial.producer,
            clock,
            flags,
            partial.min_clock,
            partial.max_clock,
            partial.begin,
        )
