"""The fenced commit of the ``--uuid-sequencing`` relay (docs/design.md §5, step 4).

Invariants:
- transactions are committed strictly in order, one commit job at a time: transactions delivered
  while a commit runs are committed together by the next job (one DB transaction, each with its own
  intents: the same as committing them one after another with nothing in between);
- once a commit of a view failed, no later commit of that view is attempted (``View.failed``): the
  view is being abandoned, and its later transactions are re-sent by the next one;
- a commit that failed with anything but a :class:`~producer.errors.FenceError` (which rolled back)
  has an unknown outcome: it may have committed (the reply was lost), so its producer gets no
  rollback ACK (:func:`outcome_unknown`): the next view's recovery ACKs it if it did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from harvest_outbox.producer.db import TxnCommit
from harvest_outbox.producer.errors import FenceError
from harvest_outbox.producer.relay.sequenced._store import SequencedStore
from harvest_outbox.producer.relay.sequenced._txn import Txn


def commit_job(store: SequencedStore, batch: Sequence[Txn], attempts: dict[int, int]) -> Callable[[], None]:
    """The DB job committing ``batch`` (consecutive delivered transactions of one view). Takes the
    stored attempt counts of their rows out of ``attempts``: the commit deletes them with the rows."""
    assert batch
    view = batch[0].view
    parts = []
    for t in batch:
        forget: list[int] = []
        if attempts:  # rows that failed before: their stored counts go with the commit
            forget = [i for i in t.ids if attempts.pop(i, None) is not None]
        parts.append(TxnCommit(t.ids, t.dead, t.producer, t.ack_clock, sorted(t.journals), forget, t.held))
    first, last = batch[0].k, batch[-1].k

    def job() -> None:
        if view.failed:
            span = f"{first}" if first == last else f"{first}-{last}"
            raise FenceError(f"harvest transaction(s) {span} not committed: an earlier commit of its view failed")
        try:
            store.commit_txns(view.epoch, view.leader_id, parts)
        except BaseException:
            view.failed = True
            raise

    return job


def outcome_unknown(txns: Iterable[Txn]) -> set[bytes]:
    """Producers of transactions whose commit finished with an error other than a FenceError."""
    return {
        t.producer
        for t in txns
        if t.commit is not None
        and t.commit.done()
        and t.commit.exception() is not None
        and not isinstance(t.commit.exception(), FenceError)
    }
