"""An in-memory outbox database with the semantics the ``--uuid-sequencing`` relay relies on
(:class:`producer.relay.sequenced._store.SequencedStore`), for the protocol's model test (test_protocol_model.py).

:class:`ModelDB` is the database (it outlives relays: crashes drop a relay, never the database);
:class:`ModelStore` is one relay's connection to it: every call first asks ``chaos(op)`` what
happens — ``"ok"``; ``"fail"`` (DatabaseError, nothing changed); ``"lost_reply"`` (the change is
made, then DatabaseError: the connection died between COMMIT and its reply); or ``chaos`` raises
the model's crash, before or after the change (``"crash_after"``). Each call is one transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from harvest_outbox.producer.db import MarkedAttempts, MarkedRow, TxnCommit
from harvest_outbox.producer.errors import DatabaseError, FenceError

Chaos = Callable[[str], str]


class Crash(BaseException):
    """The relay process dies here (a BaseException: no relay code catches it)."""


@dataclass
class ModelDB:
    """Outbox rows, fence, ACK intents, dead letters and attempt counts of one outbox."""

    rows: dict[int, list] = field(default_factory=dict)  # id -> [topic, key, value, leader_id]
    epoch: int = 0
    last_clock: int = 0
    # (producer, topic, partition) -> (epoch, clock), as the intent table's unique key
    intents: dict[tuple[bytes, str, int], tuple[int, int]] = field(default_factory=dict)
    dead: dict[int, tuple[str, int]] = field(default_factory=dict)
    attempts: dict[int, tuple[int, str]] = field(default_factory=dict)
    committed: set[int] = field(default_factory=set)  # ids deleted by a fenced commit
    refused: int = 0  # commits the fence refused
    #: deadLetterPolicy: haltKey -- the mark leaves rows of a (topic, key) with a dead letter (producer.relay.key_halt)
    halt_keys: bool = False
    #: (topic, key) -> the commit step that dead-lettered its first row; id -> the commit step that
    #: committed it (one step per harvest transaction, in the order the fenced commit applies them)
    dead_keys: dict[tuple[str, bytes], int] = field(default_factory=dict)
    committed_at: dict[int, int] = field(default_factory=dict)
    steps: int = 0

    def insert(self, rid: int, topic: str, key: bytes, value: bytes) -> None:
        """A writer's committed row (visible from now on)."""
        self.rows[rid] = [topic, key, value, None]

    # ---------------------------------------------------------------- the statements (SequencedStore)
    def start_view_with_floor(
        self, leader_id: uuid.UUID, name: str
    ) -> tuple[int, list[tuple[int, bytes, int, str, int]], int]:
        self.epoch += 1
        intents = sorted(
            ((e, p, c, t, pt) for (p, t, pt), (e, c) in self.intents.items()), key=lambda i: (i[0], i[2], i[3], i[4])
        )  # ORDER BY epoch, clock, topic, partition
        return self.epoch, intents, max([self.last_clock] + [c for _e, _p, c, _t, _pt in intents])

    def commit_txns(self, epoch: int, leader_id: uuid.UUID, txns: Sequence[TxnCommit]) -> None:
        if epoch != self.epoch:
            self.refused += 1
            raise FenceError(f"commit refused by the fence: epoch is {self.epoch}, this view's is {epoch}")
        ids = [i for t in txns for i in t.ids]
        dead = [d for t in txns for d in t.dead]
        # As the statements count: DELETE … WHERE id = ANY(ids) AND leader_id = $leader deletes each
        # owned row once (an id given twice -- a row re-marked by the same view after a zombie took
        # it -- leaves the count short), and the dead-lettering runs after it.
        owned = {i for i in ids if i in self.rows and self.rows[i][3] == leader_id}
        dead_ids = [i for i, _e, _a in dead]
        owned_dead = {i for i in dead_ids if i in self.rows and self.rows[i][3] == leader_id and i not in owned}
        for what, given, n in (("row", ids, len(owned)), ("dead row", dead_ids, len(owned_dead))):
            if n != len(given):
                self.refused += 1
                raise FenceError(
                    f"commit refused: {len(given) - n} of {len(given)} {what}(s) no longer owned by "
                    f"leader view {leader_id}"
                )
        for t in txns:
            self.steps += 1
            for i in t.ids:
                del self.rows[i]
                self.committed.add(i)
                self.committed_at[i] = self.steps
            for i, error, attempts in t.dead:
                self.dead_keys.setdefault((self.rows[i][0], self.rows[i][1]), self.steps)
                del self.rows[i]
                self.dead[i] = (error, attempts)
                self.attempts.pop(i, None)
        for t in txns:
            for i in t.forget:
                self.attempts.pop(i, None)
            for topic, part in t.journals:
                self.intents[(t.producer, topic, part)] = (epoch, t.ack_clock)
        self.last_clock = max([self.last_clock] + [t.ack_clock for t in txns])

    def confirm_acks(self, items: Sequence[tuple[bytes, int]]) -> int:
        gone = [k for k, (_e, c) in self.intents.items() if (k[0], c) in set(items)]
        for k in gone:
            del self.intents[k]
        return len(gone)

    def record_attempts(self, items: Sequence[tuple[int, int, str]]) -> int:
        for i, n, error in items:
            self.attempts[i] = (max(self.attempts.get(i, (0, ""))[0], n), error)
        return len(items)

    def mark_with_attempts(self, leader_id: uuid.UUID, limit: int) -> tuple[list[MarkedRow], MarkedAttempts]:
        rows: list[MarkedRow] = []
        for i in sorted(self.rows):
            if len(rows) >= limit:
                break
            row = self.rows[i]
            if row[3] == leader_id or (self.halt_keys and (row[0], row[1]) in self.dead_keys):
                continue
            row[3] = leader_id
            n, error = self.attempts.get(i, (None, None))
            rows.append((i, row[0], row[1], row[2], None, None, None, n, error, None, 0.0))
        return rows, {r[0]: (r[7], r[8]) for r in rows if r[7] is not None}  # type: ignore[misc]


class ModelStore:
    """One relay's connection to a :class:`ModelDB`, with faults decided by ``chaos`` (module doc)."""

    def __init__(self, db: ModelDB, chaos: Chaos) -> None:
        self.db = db
        self.chaos = chaos

    def _call(self, op: str, fn: Callable, *args: object) -> object:
        fate = self.chaos(op)
        if fate == "fail":
            raise DatabaseError(f"{op} failed: server closed the connection unexpectedly")
        result = fn(*args)
        if fate == "lost_reply":
            raise DatabaseError(f"{op} failed: server closed the connection unexpectedly")
        if fate == "crash_after":
            raise Crash(op)
        return result

    def start_view_with_floor(
        self, leader_id: uuid.UUID, name: str
    ) -> tuple[int, list[tuple[int, bytes, int, str, int]], int]:
        return self._call("start_view", self.db.start_view_with_floor, leader_id, name)  # type: ignore[return-value]

    def commit_txns(self, epoch: int, leader_id: uuid.UUID, txns: Sequence[TxnCommit]) -> None:
        self._call("commit", self.db.commit_txns, epoch, leader_id, txns)

    def confirm_acks(self, items: Sequence[tuple[bytes, int]]) -> int:
        return self._call("confirm", self.db.confirm_acks, items)  # type: ignore[return-value]

    def record_attempts(self, items: Sequence[tuple[int, int, str]]) -> int:
        return self._call("attempts", self.db.record_attempts, items)  # type: ignore[return-value]

    def mark_with_attempts(self, leader_id: uuid.UUID, limit: int) -> tuple[list[MarkedRow], MarkedAttempts]:
        return self._call("mark", self.db.mark_with_attempts, leader_id, limit)  # type: ignore[return-value]
