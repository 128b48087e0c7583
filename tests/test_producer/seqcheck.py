"""Helpers for the ``--uuid-sequencing`` tests: writing outbox traffic, running sequenced relays as
processes, and the exactly-once checker (whole topic read-uncommitted -> ``sequencer.Sequencer``)."""

from __future__ import annotations

import logging
import os
import random
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql

from harvest_outbox.harvest_local.relays import (
    RelayProcess,
    wait_for,  # noqa: F401  (re-exported for the sequencing tests)
    write_config,
)
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher
from harvest_outbox.sequencer import Flags, clock_of, flags_of, parse_uuid, producer_of

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sequenced_log import RawRecord, read_raw, reference_read


@dataclass
class Expected:
    """What the app committed: per key, values in commit (= id) order; and rolled-back values."""

    by_key: dict[str, list[bytes]] = field(default_factory=dict)
    rolled_back: set[bytes] = field(default_factory=set)
    headers: dict[bytes, list[tuple[str, bytes]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.by_key.values())


@dataclass
class Gate:
    """Holds ``writers`` :func:`write_traffic` writers between transactions while closed, so a test can
    change the outbox with no transaction in flight (e.g. a sequence restarted lower: ids stop following
    commit order for rows that straddle it, which no relay can undo)."""

    writers: int
    closed: bool = False
    parked: int = 0  # writers waiting at the gate, or finished
    cond: threading.Condition = field(default_factory=threading.Condition)

    def through(self) -> None:
        with self.cond:
            while self.closed:
                self.parked += 1
                self.cond.notify_all()
                self.cond.wait()
                self.parked -= 1

    def done(self) -> None:
        with self.cond:
            self.parked += 1
            self.cond.notify_all()

    def close(self, timeout: float = 30.0) -> None:
        """Close, and return once every writer waits at the gate or has finished."""
        with self.cond:
            self.closed = True
            if not self.cond.wait_for(lambda: self.parked >= self.writers, timeout):
                raise TimeoutError(f"{self.writers - self.parked} writers still in a transaction after {timeout}s")

    def open(self) -> None:
        with self.cond:
            self.closed = False
            self.cond.notify_all()


def write_traffic(
    dsn: str,
    table: str,
    topic: str,
    exp: Expected,
    writer: int,
    txs: int,
    keys: int = 20,
    rollback_rate: float = 0.2,
    max_batch: int = 40,
    seed: int = 0,
    pause: float = 0.0,
    gate: Gate | None = None,
) -> None:
    """One writer: ``txs`` app transactions of 1..max_batch rows; some rolled back. Each writer owns its
    keys, so per key, commit order = id order = the order the checker expects. ``gate``: waited at before
    each transaction (the caller tells it when the writer is done: :meth:`Gate.done`)."""
    rnd = random.Random(seed * 1000 + writer)
    st = Stasher(table)
    seq = 0
    with psycopg.connect(dsn) as conn:
        for _ in range(txs):
            if gate is not None:
                gate.through()
            batch = []
            for _ in range(rnd.randint(1, max_batch)):
                key = f"w{writer}-k{rnd.randrange(keys)}"
                value = f"w{writer}-{seq}"
                batch.append(OutboxRecord(topic, key, value, [("seq", str(seq))]))
                seq += 1
            if stash_or_roll_back(conn, st, batch, rnd.random() < rollback_rate, exp, headers=True) and pause:
                time.sleep(pause)


def stash_or_roll_back(
    conn: psycopg.Connection,
    st: Stasher,
    batch: list[OutboxRecord],
    rollback: bool,
    exp: Expected,
    headers: bool = False,
) -> bool:
    """``batch`` stashed in one transaction, committed or (``rollback``) rolled back, and what the checker
    expects of it recorded in ``exp`` (values as bytes; ``headers``: each record's headers too). Whether
    it committed."""
    try:
        with conn.transaction():
            st.stash_many(conn, batch)
            if rollback:
                raise KeyError("rollback")
    except KeyError:
        with exp.lock:
            exp.rolled_back.update(str(r.value).encode() for r in batch)
        return False
    with exp.lock:
        for r in batch:
            v = str(r.value).encode()
            exp.by_key.setdefault(str(r.key), []).append(v)
            if headers:
                exp.headers[v] = [(k, str(x).encode()) for k, x in r.headers]
    return True


@dataclass
class CheckResult:
    raw: list[RawRecord]
    committed: int
    continues: int
    acks: int


class Anomalies(logging.Handler):
    """Collects the reader's WARNING lines (sequencing anomalies)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def check_exactly_once(bootstrap: str, topic: str, partitions: int, exp: Expected) -> CheckResult:
    """Read the whole topic read-uncommitted, sequence it, and check: every committed outbox row exactly
    once, per-key order == commit order, nothing rolled back (app or harvest) visible, user data intact."""
    raw = read_raw(bootstrap, topic, partitions)
    at = {(r.partition, r.offset): r for r in raw}
    anomalies = Anomalies()
    seq_log = logging.getLogger("harvest_outbox.sequencer.sequencer")
    seq_log.addHandler(anomalies)
    try:
        committed = reference_read(raw, topic)
    finally:
        seq_log.removeHandler(anomalies)
    # A healthy relay never makes a reader log an anomaly (e.g. a rollback ACK below the last ACK).
    assert not anomalies.messages, f"the reader logged sequencing anomalies: {anomalies.messages[:3]}"
    got: dict[str, list[bytes]] = {}
    for p, off, _ack in committed:
        r = at[(p, off)]
        assert r.uuid is not None, f"record at {p}/{off} has no uuid header"
        assert r.value is not None
        got.setdefault(r.key.decode(), []).append(r.value)  # type: ignore[union-attr]
    continues = sum(1 for r in raw if r.uuid and flags_of(parse_uuid(r.uuid)) == Flags.CONTINUE_TXN)
    acks = sum(1 for r in raw if r.uuid and flags_of(parse_uuid(r.uuid)) == Flags.ACK_TXN)
    all_got = [v for vs in got.values() for v in vs]
    dups = len(all_got) - len(set(all_got))
    leaked = set(all_got) & exp.rolled_back
    assert not leaked, f"{len(leaked)} rolled-back app rows are visible, e.g. {sorted(leaked)[:3]}"
    missing = {k: [v for v in vs if v not in set(got.get(k, []))] for k, vs in exp.by_key.items()}
    missing = {k: v for k, v in missing.items() if v}
    if missing and os.environ.get("SEQCHECK_DEBUG"):
        lost = {v for vs in missing.values() for v in vs}
        for r in raw:
            if r.value in lost:
                u = parse_uuid(r.uuid)
                print("LOST", r.partition, r.offset, r.value, producer_of(u).hex(), clock_of(u))
                prods = {(r.partition, producer_of(u))}
        for r in raw:
            if r.uuid and (r.partition, producer_of(parse_uuid(r.uuid))) in prods:
                u = parse_uuid(r.uuid)
                print("  ", r.partition, r.offset, r.value, flags_of(u), clock_of(u))
    assert not missing, f"lost rows: {sum(map(len, missing.values()))}, e.g. {list(missing.items())[:2]}"
    assert dups == 0, f"{dups} duplicate committed rows"
    assert set(got) == set(exp.by_key), f"unexpected keys {set(got) - set(exp.by_key)}"
    for k, want in exp.by_key.items():
        assert got[k] == want, f"key {k}: committed order differs from commit order: {got[k][:8]} vs {want[:8]}"
    return CheckResult(raw, len(committed), continues, acks)


def recovered_before_new_view(
    raw: list[RawRecord], intents: list[tuple[bytes, int, int]], new_producers: set[bytes]
) -> int:
    """Each recovered ACK intent ``(producer, clock, partition)``'s last copy in the log precedes the
    first CONTINUE of the new view's producers in that partition. Returns how many were checked."""
    last_ack: dict[tuple[bytes, int, int], int] = {}
    first_new: dict[int, int] = {}
    for r in raw:
        if not r.uuid:
            continue
        u = parse_uuid(r.uuid)
        f, prod = flags_of(u), producer_of(u)
        if f == Flags.ACK_TXN:
            last_ack[(prod, clock_of(u), r.partition)] = r.offset
        elif f == Flags.CONTINUE_TXN and prod in new_producers:
            first_new.setdefault(r.partition, r.offset)
    for prod, clock, part in intents:
        off = last_ack.get((prod, clock, part))
        assert off is not None, f"recovered ACK intent {prod.hex()}@{clock} never reached partition {part}"
        if part in first_new:
            assert off < first_new[part], (
                f"partition {part}: recovered ACK at offset {off} after the new view's "
                f"first CONTINUE at {first_new[part]}"
            )
    return len(intents)


def read_intents(dsn: str, table: str) -> list[tuple[bytes, int, int]]:
    names = OutboxNames.parse(table)
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT producer, clock, kafka_partition FROM {} ORDER BY epoch, clock").format(names.ack_intents)
        ).fetchall()
    return [(bytes(p), int(c), int(pt)) for p, c, pt in rows]


def count_rows(dsn: str, table: str) -> int:
    names = OutboxNames.parse(table)
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql.SQL("SELECT count(*) FROM {}").format(names.outbox)).fetchone()[0]  # type: ignore


def seq_yaml(
    path: Path,
    dsn: str,
    bootstrap: str,
    table: str,
    group: str,
    txn_records: int = 200,
    leader_election: str = "neli",
    shards: int | None = None,
    outbox_layout: str | None = None,
) -> Path:
    """A sequencing relay's YAML with small transactions and fast failure handling."""
    return write_config(
        path,
        dsn=dsn,
        bootstrap=bootstrap,
        outbox_table=table,
        group=group,
        leader_election=leader_election,
        leader_lock_check_interval="500ms",
        shards=shards,
        outbox_layout=outbox_layout,
        extra_limits={
            "idlePollInterval": "300ms",
            "ioErrorBackoff": "100ms",
            "markQueryRecords": "300",
            "txnMaxRecords": str(txn_records),
            "txnMaxDuration": "20ms",
            "producerRing": "4",
        },
    )


_VIEW = re.compile(r"view epoch=(\d+) leader_id=\S+ producers=(\S+) recovered_acks=(\d+)")


class SeqRelay(RelayProcess):
    """A sequenced relay process (the ``harvest`` CLI), started at once, with an optional crash/pause test hook."""

    def __init__(
        self, cfg: Path, name: str, logdir: Path, crash_at: str | None = None, pause_at: str | None = None
    ) -> None:
        hooks = {"HARVEST_TEST_CRASH_AT": crash_at, "HARVEST_TEST_PAUSE_AT": pause_at}
        super().__init__(cfg, name, logdir, env={k: v for k, v in hooks.items() if v})
        self.start()

    def views(self) -> list[tuple[int, list[bytes], int]]:
        return [(int(e), [bytes.fromhex(p) for p in ps.split(",")], int(n)) for e, ps, n in _VIEW.findall(self.text())]

    def producers(self) -> set[bytes]:
        return {p for _e, ps, _n in self.views() for p in ps}

    def stop(self, timeout: float = 30) -> int | None:
        return super().stop(timeout)
