"""The cursor layout's id source, watched while the relay runs (issue #44; A1 of producer/layouts/cursor/_watermark.py).

A batch's probe lets ``low`` pass every id up to the head it saw, on the strength of A1: ids come from the
outbox's own sequence, increasing, ``CACHE 1``, drawn by a default that takes the writer's xid first. An
owner can change any of that under a running relay (``ALTER SEQUENCE … CACHE 20``, ``RESTART``, ``setval``,
``ALTER TABLE … SET DEFAULT``); a check at connect only is not enough: cached ids below a later probe's head
were passed by the cursor and lost. So every batch start reads the id source (:class:`IdSource`, in the
same statement and snapshot as the batch's, :func:`id_source_sql`) and :func:`guard` decides, before the
cursor can move:

- the source is broken (:meth:`IdSource.fault`): no probe is taken or resolved: ``low`` is *held* (rows
  still flow, every batch re-reads from ``low``), and the relay says why and how to fix it;
- the source changed since this relay's last look (a new sequence file: every ``ALTER SEQUENCE`` that
  changes a parameter gives one, RESTART included; a new default), or the sequence is behind the cursor
  (``setval`` down): ids below ``low`` may be drawn now, so the batch starts from id 0 (a *rescan*) and
  the pending probe, taken under the old source, is dropped;
- ``txid``'s default is not the writer's transaction: the batches' snapshots would not see its rows as
  they commit: the read *stops* (the cursor does not move) until it is fixed.

Why a valid source makes cached ids harmless again: on Postgres 13+ every ``ALTER SEQUENCE`` that changes a
parameter writes a new sequence file, and a session drops its cached values at its next ``nextval`` when the
file changed (sequence.c, ``init_sequence``). So once the source reads ``CACHE 1`` no session can hand out
an id cached before, and a block cached after a probe's snapshot starts above its head. What a change of
default leaves behind is a transaction that drew its id before its xid and is still open; probes resume
only once every transaction open at the first valid look has ended (``pg_locks``' virtualxid entries,
what ``CREATE INDEX CONCURRENTLY`` waits for): :class:`Watch`.

Invariants (tests/test_producer/layouts/cursor/test_cursor_id_source.py, the decisions and on Postgres and Kafka):
- G1: no probe is taken while the source is broken, nor while transactions open at a change remain;
- G2: a probe resolves only if the source did not change between its batch and the resolving one;
- G3: after a change, or with the sequence behind ``low``, the next batch of every shard reads from id 0;
- G4: with a broken ``txid`` default no batch starts.

Not covered (docs/limitations.md): writers that set the id themselves; ``setval`` down and back up again
between two batch starts; changes made while no relay runs (the connect check sees only the result).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from psycopg import sql

from harvest_outbox.producer.layouts.cursor._watermark import Cursor
from harvest_outbox.producer.mapping.names import OutboxNames

#: ``txid``'s default as Postgres prints it (A2: the writer's top-level transaction).
TXID_DEFAULT = "pg_current_xact_id()"
_XID = re.compile(r"\bpg_current_xact_id\(\)")
_NEXTVAL = re.compile(r"\bnextval\(")


@dataclass(frozen=True)
class IdSource:
    """What the relay reads of the outbox's ids at a batch start (None: missing).

    ``default``/``default_key``: the id column's default (its text; ``oid:xmin`` of its ``pg_attrdef`` row,
    new with every ``SET DEFAULT``); ``own_sequence``: the default draws from the outbox's id sequence and
    no other; ``sequence_file``, ``cache``, ``increment``, ``cycle``, ``last_value``: that sequence's
    relfilenode, parameters and last value drawn (None before the first ``nextval`` and after RESTART);
    ``txid_default``: ``txid``'s default."""

    default: str | None
    default_key: str | None
    own_sequence: bool
    sequence_file: int | None
    cache: int | None
    increment: int | None
    cycle: bool | None
    last_value: int | None
    txid_default: str | None

    def key(self) -> tuple[str | None, int | None]:
        """Changes when the default is set again or the sequence is altered (any parameter, RESTART)."""
        return self.default_key, self.sequence_file

    def fault(self, names: OutboxNames | None = None) -> str | None:
        """Why A1 does not hold now, with the fix; None when it does (every batch start asks: the message
        is only built for a fault)."""
        default = self.default
        if default is None:
            return _say(names, "the {col} column has no default. Fix: {fix}")
        xid, nextval = _XID.search(default), _NEXTVAL.search(default)
        if xid is None or nextval is None or xid.start() > nextval.start():
            return _say(
                names,
                f"the {{col}} column's default is {_braced(repr(default))}, which does not take the writer's transaction id "
                "before the id (assumption A1: a row could be passed unread). Fix: {fix}",
            )
        if not self.own_sequence or self.sequence_file is None:
            return _say(names, "the {col} column's default does not draw from {seq} alone. Fix: {fix}")
        if self.cache != 1:
            return _say(
                names,
                f"sequence {{seq}} has CACHE {self.cache}: sessions hand out ids out of commit order, so the "
                "cursor's low cannot pass them safely. Fix: ALTER SEQUENCE {seq} CACHE 1",
            )
        if self.increment is None or self.increment < 1:
            return _say(
                names,
                f"sequence {{seq}} has INCREMENT {self.increment}: ids must increase. Fix: ALTER SEQUENCE {{seq}} INCREMENT 1",
            )
        if self.cycle:
            return _say(
                names,
                "sequence {seq} is CYCLE: ids would start again from the bottom. Fix: ALTER SEQUENCE {seq} NO CYCLE",
            )
        return None

    def txid_fault(self, names: OutboxNames | None = None) -> str | None:
        if self.txid_default is not None and self.txid_default.strip() == TXID_DEFAULT:
            return None
        what = names.display if names is not None else "the outbox"
        return (
            f"{what}: the txid column's default is {self.txid_default!r}, not {TXID_DEFAULT}: the relay compares "
            f"it with its snapshots to find committed rows, and would pass rows unread. Reading stops (the cursor "
            f"stays) until it is fixed: ALTER TABLE … ALTER COLUMN txid SET DEFAULT {TXID_DEFAULT}"
        )


def _braced(text: str) -> str:
    """``text`` kept as is by :func:`_say`'s ``str.format``."""
    return text.replace("{", "{{").replace("}", "}}")


def _say(names: OutboxNames | None, message: str) -> str:
    """``message`` about the outbox, its ``{col}``, ``{seq}`` and the ``{fix}`` of its id default filled in."""
    col = names.mapping.id_column if names is not None else "id"
    seq = names.id_sequence.as_string(None) if names is not None else "its id sequence"
    fix = (
        f"ALTER TABLE … ALTER COLUMN {col} SET DEFAULT CASE WHEN pg_current_xact_id() IS NOT NULL "
        f"THEN nextval('{seq}'::regclass) END (what `harvest init-db` makes), and let writers leave {col} to it"
    )
    what = names.display if names is not None else "the outbox"
    return f"{what}: " + message.format(col=col, seq=seq, fix=fix)


@dataclass(frozen=True)
class Guarded:
    """:func:`guard`'s decision: the cursor the batch starts from, whether it may take a probe, whether it
    rescans from id 0, why A1 does not hold (``fault``), why no batch may start (``stop``)."""

    cursor: Cursor
    may_probe: bool
    rescan: bool
    fault: str | None
    stop: str | None


def guard(
    cursor: Cursor, before: IdSource | None, now: IdSource, head: int | None, names: OutboxNames | None = None
) -> Guarded:
    """Decide a batch start from the source read with its snapshot (``now``), the one read at this relay's
    last batch start of the shard (``before``; None: its first, after the connect check) and ``head`` (the
    largest id the snapshot sees). Module doc: G1-G4 (G1's wait for open transactions is :class:`Watch`'s)."""
    stop = now.txid_fault(names)
    fault = now.fault(names)
    last = now.last_value
    changed = before is not None and before.key() != now.key()
    behind = last is not None and last < cursor.low - 1
    probe = cursor.probe
    probe_above = probe is not None and (last is None or last < probe.head)
    rescan = changed or behind or probe_above
    if rescan:
        cursor = replace(cursor, low=0, probe=None)
    elif fault is not None and probe is not None:
        cursor = replace(cursor, probe=None)
    may_probe = stop is None and fault is None and last is not None and (head is None or last >= head)
    return Guarded(cursor, may_probe, rescan, fault, stop)


@dataclass
class Watch:
    """One shard's look at the id source between batch starts (mutable; the relay's read thread only):
    the last source read, and the transactions still to end before probes resume after a change or a
    fault (virtualxids; None: none to wait for)."""

    before: IdSource | None = None
    unsettled: bool = False
    waiting: frozenset[str] | None = None

    def note(self, decision: Guarded, now: IdSource) -> None:
        """Record the look; a change or a fault unsettles the source (probes wait: :meth:`settle`)."""
        self.before = now
        if decision.rescan or decision.fault is not None:
            self.unsettled, self.waiting = True, None

    def settle(self, open_now: frozenset[str]) -> bool:
        """With the transactions open now (a valid look): may probes resume? Every transaction open at the
        first valid look after the change has ended."""
        if not self.unsettled:
            return True
        if self.waiting is None:
            self.waiting = open_now
        if self.waiting & open_now:
            return False
        self.unsettled, self.waiting = False, None
        return True


def id_source_sql(names: OutboxNames) -> sql.Composed:
    """Columns of :class:`IdSource`, in its field order, as a one-row subquery (a catalog look-up of a few
    index scans, run in the batch start's statement and snapshot)."""
    m = names.mapping
    outbox = sql.Literal(names.outbox.as_string(None))
    seq = sql.Literal(names.id_sequence.as_string(None))
    return sql.SQL("""
        SELECT d.def, d.def_key, coalesce(d.deps = ARRAY[s.seqrelid], false), k.relfilenode::bigint,
               s.seqcache, s.seqincrement, s.seqcycle,
               CASE WHEN s.seqrelid IS NOT NULL THEN pg_sequence_last_value(s.seqrelid) END,
               (SELECT pg_get_expr(t.adbin, t.adrelid) FROM pg_attrdef t JOIN pg_attribute ta
                  ON ta.attrelid = t.adrelid AND ta.attnum = t.adnum
                WHERE t.adrelid = to_regclass({outbox}) AND ta.attname = 'txid')
        FROM (SELECT 1) AS one
        LEFT JOIN pg_sequence AS s ON s.seqrelid = to_regclass({seq})
        LEFT JOIN pg_class AS k ON k.oid = s.seqrelid
        LEFT JOIN LATERAL (
          SELECT pg_get_expr(a.adbin, a.adrelid) AS def, a.oid::text || ':' || a.xmin::text AS def_key,
                 ARRAY(SELECT p.refobjid FROM pg_depend p JOIN pg_class r ON r.oid = p.refobjid AND r.relkind = 'S'
                       WHERE p.classid = 'pg_attrdef'::regclass AND p.objid = a.oid
                         AND p.refclassid = 'pg_class'::regclass ORDER BY p.refobjid) AS deps
          FROM pg_attrdef a JOIN pg_attribute c ON c.attrelid = a.adrelid AND c.attnum = a.adnum
          WHERE a.adrelid = to_regclass({outbox}) AND c.attname = {col}) AS d ON true""").format(
        outbox=outbox, seq=seq, col=sql.Literal(m.id_column)
    )


#: The transactions in progress now (each holds a lock on its own virtualxid), but this statement's.
OPEN_TRANSACTIONS_SQL = sql.SQL(
    "SELECT coalesce(array_agg(virtualxid), '{}') FROM pg_locks WHERE locktype = 'virtualxid' AND granted "
    "AND pid <> pg_backend_pid()"
)


def id_source_of(row: tuple[object, ...]) -> IdSource:
    """:class:`IdSource` from :func:`id_source_sql`'s columns."""
    d, key, own, file, cache, inc, cycle, last, txid = row
    return IdSource(
        default=None if d is None else str(d),
        default_key=None if key is None else str(key),
        own_sequence=bool(own),
        sequence_file=None if file is None else int(str(file)),
        cache=None if cache is None else int(str(cache)),
        increment=None if inc is None else int(str(inc)),
        cycle=None if cycle is None else bool(cycle),
        last_value=None if last is None else int(str(last)),
        txid_default=None if txid is None else str(txid),
    )
