"""harvest and Debezium side by side (issue #31 item 3; a benchmark, not a test): the same workload
relayed by harvest (at-least-once and ``--uuid-sequencing``, ``tableMapping: debezium``; and both modes on
``outboxLayout: cursor``, issue #37) and by the real Debezium 3.6.1 (Postgres connector + outbox EventRouter on Kafka Connect: harvest_local/debezium.py),
one after the other, each on its own outbox table and topics, on one Postgres (``wal_level = logical``)
and one Kafka broker for the whole run.

    .venv/bin/python -m bench.bench_debezium [--rows 1000000] [--runs 2] [--fault-rows 200000]

Services: started by the bench (``EmbeddedPostgres(logical_replication=True)``, ``EmbeddedKafka``), or
``HARVEST_PG_DSN`` (must have ``wal_level = logical``) / ``HARVEST_KAFKA_BOOTSTRAP``. Every outbox is
Debezium's table (``id uuid``, ``aggregatetype``, ``aggregateid``, ``type``, ``payload jsonb``); harvest's
two on the mark layout gain the relay's columns through ``init_db``, as in a migration (docs/debezium.md); the
two on the cursor layout relay the partitioned Debezium table ``init-db`` makes (Debezium's columns plus the
relay's ``harvest_seq``, ``txid``, ``harvest_created``, ``harvest_leader``; init-db's defaults: partitions of a
million ids, two ahead), written with the same statements. Rows: ~100-byte
jsonb payloads, ``--keys`` aggregate ids, one aggregate type per phase, so one 8-partition topic per
contestant and phase, all created up front. Event ids encode the row's number (:func:`event_id`), so
every record read back is checked against what was written. Measured, per contestant:

- burst: ``--rows`` rows in one transaction (COPY; after a ``CHECKPOINT``, as bench_relay.py explains)
  while the contestant idles (harvest leading, Debezium streaming), after an untimed warm-up burst.
  ``rows_per_s``: rows / seconds from just before the COMMIT to the last record in Kafka (harvest: its
  delivered counter, i.e. acknowledged by the broker, and for the sequenced relay, its fenced commit;
  Debezium: the topic's watermarks). Repeated ``--runs`` times: medians. The relaying phase ends when
  the contestant's work for the rows is done: Debezium's last record in Kafka (the slot's
  confirmation afterwards writes no WAL), harvest's last row deleted. Over that phase: Postgres CPU
  seconds (utime + stime of the postmaster and every child, reaped children included, from /proc),
  the relay's own CPU (harvest's process; Connect's JVM) and the broker's, WAL bytes
  (``pg_current_wal_insert_lsn()`` deltas: ``pg_current_wal_lsn()``, the write position, lags the
  relay's asynchronous commits), all per 100k rows; the writing phase's WAL and Postgres CPU on their own
  (Debezium's walsender decodes the rows while they are written, into its reorder buffer); the checkpoints
  begun while writing and relaying (the bench's ``CHECKPOINT`` before each burst puts every contestant's
  writes at the start of a checkpoint cycle; ``max_wal_size`` and ``checkpoint_timeout`` are Postgres'
  defaults, so a burst that writes enough WAL spans another). The cursor layout's work is done once the
  committed cursor passed the burst's last row (its rows stay until their partition retires). After it: the
  table's size, its growth over the burst and live / dead tuples (``pgstattuple``), and for Debezium the slot's lag
  (``pg_current_wal_lsn() - confirmed_flush_lsn``) and retained WAL (``- restart_lsn``), at the last
  record and after an offset flush. Autovacuum is off on the bench's tables: each burst is followed
  by a ``VACUUM``, measured on its own (seconds, WAL, Postgres CPU: the dead tuples' deferred cost,
  which autovacuum would otherwise pay at a moment of its choosing, maybe inside another contestant's
  timed phase). Debezium also runs the insert-then-delete pattern its users often have (the rows
  deleted in the inserting transaction), once. Every burst is read back: a lost row fails the run;
- latency, after the other phases, as users run both (bench/bench_latency.py on these services): each harvest
  contestant's layout and mode as a ``harvest`` process (a new user's config, on a table of its own: the
  Stasher's), Debezium as a Connect worker of its own with ``poll.interval.ms`` ``--debezium-poll-ms`` (10: the
  issue #51 comparison; its default, 500, waits that long for events), writers (one row per transaction at
  ``--rate``) and consumers in processes of their own, ``--latency-repeats`` rounds of ``--latency-seconds``
  after ``--latency-warmup``, each round with Kafka alone; its report under ``latency`` (p50 / p99 / p99.9 /
  max, the ratios with their ranges, the timelines of the slowest rows);
- faults: a ``--fault-rows`` burst; once ~40 % of it is in Kafka, ``kill -9`` of harvest's leader (two
  relay processes, the ``harvest`` CLI, default limits; the standby takes over) or of Debezium's
  Connect worker (restarted: it resumes from its slot and offsets file; the harness flushes offsets
  every second, Connect's default is a minute). Duplicates and losses seen by a plain consumer, and
  for the sequenced relay by ``ReadCommittedIter``, which must see 0 / 0 (the run fails otherwise).

The contestants run one after another (harvest first), never two at once: a running connector's
walsender decodes all of the database's WAL, which would bill harvest's rows to Postgres' CPU. The
slot is created when Debezium's turn starts and dropped at the end. Caveats: the broker is warmer
for later contestants (each gets an untimed warm-up burst); harvest's WAL is measured at
``wal_level = logical``, which logs more for its updates and deletes than ``replica`` does.
Prints one JSON document (``cursor_layout``: issue #37's targets, per mode, from the same run: relay-side WAL
against the mark layout's, total WAL against Debezium's insert-then-delete path, Postgres CPU per relayed row
against Debezium's); ``--contestants`` runs some of them (Debezium always). Exits 1 if a contestant lost a row outside the fault runs or the sequenced
relay's committed read saw a duplicate or a loss (after printing it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition
from psycopg import sql

from bench.bench_relay import checkpoint
from harvest_outbox.harvest_local.debezium import DebeziumOutbox, OutboxConnector
from harvest_outbox.harvest_local.kafka import create_topic, read_to_end
from harvest_outbox.harvest_local.relays import RelayProcess, current_leader, wait_for
from harvest_outbox.producer.config import HarvestConfig, Limits
from harvest_outbox.producer.harvest import Harvest, State
from harvest_outbox.producer.mapping.table import table_mapping
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db

PARTITIONS = 8
KINDS = ("Warm", "Burst", "BurstDel", "Fault")  # one aggregate type, so one topic, per phase
COPY_CHUNK = 50_000
FAULT_AT = 0.4  # of the fault burst in Kafka when the kill comes
HEARTBEAT_TIMEOUT = 5.0  # what a new user writes (bench_relay.DEFAULT_LIMITS)
_CLK = os.sysconf("SC_CLK_TCK")
OUTBOX_DDL = (
    "CREATE TABLE {} (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, "
    "aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb)"
)


class DebeziumBenchError(RuntimeError):
    """The comparison could not run, or a contestant lost rows where none may be lost."""


# -- rows and their ids ------------------------------------------------------------------------


def event_id(tag: str, i: int) -> str:
    """Row ``i``'s event id: a UUID whose first group scatters the rows over the primary key's index
    (as random ids do), ``tag`` (4 hex digits) names the burst and the last group is ``i``."""
    return f"{(i * 2654435761) & 0xFFFFFFFF:08x}-{tag}-4000-8000-{i:012x}"


def row_of(eid: bytes, tag: bytes) -> int | None:
    """The row number of an ``id`` header from the burst ``tag``; None for another burst's."""
    if len(eid) != 36 or eid[9:13] != tag:
        return None
    return int(eid[24:], 16)


def payload(i: int) -> str:
    """~100 bytes of JSON."""
    return (
        f'{{"order": {i}, "customer": "c-{i % 5000:05d}", "amount": {i % 100_000 / 100:.2f}, '
        f'"currency": "EUR", "lines": {1 + i % 9}, "channel": "web"}}'
    )


def tally(ids: Iterable[bytes], tag: str, rows: int) -> dict[str, int]:
    """Records of burst ``tag`` (rows 0..rows-1) among ``ids``: duplicates and losses."""
    seen = bytearray(rows)
    mine = 0
    btag = tag.encode()
    for eid in ids:
        i = row_of(eid, btag)
        if i is None or i >= rows:
            continue
        mine += 1
        if seen[i] < 255:
            seen[i] += 1
    losses = seen.count(0)
    return {"records": mine, "duplicates": mine - (rows - losses), "losses": losses}


def new_tag() -> str:
    return uuid.uuid4().hex[:4]


@dataclass
class Written:
    lsn_before: int
    lsn_after: int
    write_s: float
    committed: float  # perf_counter just before COMMIT


def insert_lsn(conn: psycopg.Connection) -> int:
    return int(conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()[0])  # type: ignore[index]


class Shape:
    """How a contestant's table takes a row: Debezium's columns (``aggregatetype`` routes the row to
    ``<prefix>.<kind>``, the event router adds the ``id`` header), written by COPY."""

    columns = "id, aggregatetype, aggregateid, type, payload"

    def line(self, kind: str, tag: str, i: int, keys: int) -> str:
        """Row ``i`` of a burst as a COPY text line."""
        return f"{event_id(tag, i)}\t{kind}\tagg-{i % keys}\tOrderPlaced\t{payload(i)}\n"


def write_burst(
    dsn: str,
    table: str,
    aggregate: str,
    tag: str,
    rows: int,
    keys: int,
    before_commit: Callable[[], None] = lambda: None,
    delete: bool = False,
    shape: Shape | None = None,
) -> Written:
    """``rows`` rows in one transaction (COPY in chunks); ``delete``: deleted again in it, the
    pattern of Debezium users who keep no rows (Debezium's table only). ``before_commit`` runs just
    before the COMMIT."""
    shape = shape or Shape()
    target = sql.Identifier(*table.split("."))
    copy = sql.SQL("COPY {} ({}) FROM STDIN").format(target, sql.SQL(shape.columns))
    with psycopg.connect(dsn) as conn, psycopg.connect(dsn, autocommit=True) as mon:
        lsn0, t0 = insert_lsn(mon), time.perf_counter()
        with conn.cursor().copy(copy) as cp:
            for start in range(0, rows, COPY_CHUNK):
                cp.write(
                    "".join(shape.line(aggregate, tag, i, keys) for i in range(start, min(rows, start + COPY_CHUNK)))
                )
        if delete:
            conn.execute(sql.SQL("DELETE FROM {} WHERE aggregatetype = %s").format(target), (aggregate,))
        before_commit()
        committed = time.perf_counter()
        conn.commit()
        lsn1 = insert_lsn(mon)
    return Written(lsn0, lsn1, committed - t0, committed)


# -- reading back ------------------------------------------------------------------------------


def _id_header(headers: list[tuple[str, bytes | None]] | None) -> bytes | None:
    for name, value in headers or ():
        if name == "id":
            return value
    return None


def read_ids(bootstrap: str, topic: str) -> list[bytes]:
    """Every ``id`` header of the topic up to its high watermarks, by a plain consumer (harvest's ACK
    records carry none)."""
    try:
        records = read_to_end(bootstrap, [topic], timeout=300)
    except TimeoutError as exc:
        raise DebeziumBenchError(str(exc)) from exc
    return [eid for r in records if (eid := _id_header(r.headers)) is not None]


def read_committed_ids(bootstrap: str, topic: str) -> list[bytes]:
    """The ``id`` headers ``ReadCommittedIter`` yields from the whole topic (until 5 s without one)."""
    from harvest_outbox.consumer import ReadCommittedIter

    out: list[bytes] = []
    with ReadCommittedIter({"bootstrap.servers": bootstrap}, topics=[topic], idle_timeout=5) as it:
        for rec in it:
            eid = _id_header(rec.headers)
            if eid is not None:
                out.append(eid)
    return out


class Watermarks:
    """Records a topic holds (high watermarks summed), asked of one long-lived consumer."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bdz-wm-{uuid.uuid4()}"})
        self.parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]

    def total(self) -> int:
        return sum(self.consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1] for tp in self.parts)

    def close(self) -> None:
        self.consumer.close()


# -- CPU from /proc ----------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_cpu_s(pid: int | None) -> float | None:
    """utime + stime of ``pid`` (fields 14, 15 of /proc/<pid>/stat)."""
    f = _stat(pid) if pid else None
    return (int(f[11]) + int(f[12])) / _CLK if f else None


def postgres_cpu_s(postmaster: int | None) -> float | None:
    """CPU seconds of a Postgres instance: the postmaster's own and its reaped children's (cutime,
    cstime), plus every live child's (backends, walsenders, checkpointer, autovacuum ...)."""
    f = _stat(postmaster) if postmaster else None
    if not f:
        return None
    ticks = sum(int(x) for x in f[11:15])
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            child = _stat(int(entry.name))
            if child and int(child[1]) == postmaster:
                ticks += int(child[11]) + int(child[12])
    return ticks / _CLK


def pid_with_arg(arg: str) -> int | None:
    """The process whose command line holds ``arg`` (a JVM's ``-D…dir=<its folder>``)."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if arg.encode() in Path(entry.path, "cmdline").read_bytes().split(b"\0"):
                    return int(entry.name)
            except OSError:
                continue
    return None


# -- services ----------------------------------------------------------------------------------


class Services:
    """One Postgres with ``wal_level = logical`` and one Kafka broker for the whole run."""

    def __init__(self) -> None:
        from harvest_outbox.harvest_local import EmbeddedKafka, EmbeddedPostgres

        self.postgres: EmbeddedPostgres | None = None
        self.kafka: EmbeddedKafka | None = None
        dsn, bootstrap = os.environ.get("HARVEST_PG_DSN"), os.environ.get("HARVEST_KAFKA_BOOTSTRAP")
        try:
            if dsn:
                with psycopg.connect(dsn) as conn:
                    level = conn.execute("SHOW wal_level").fetchone()[0]  # type: ignore[index]
                if level != "logical":
                    raise DebeziumBenchError(
                        f"HARVEST_PG_DSN: wal_level is {level!r}, Debezium needs 'logical': set "
                        "wal_level = logical and restart that server, or unset HARVEST_PG_DSN "
                        "and the bench starts its own"
                    )
            else:
                self.postgres = EmbeddedPostgres(logical_replication=True).start()
                dsn = self.postgres.dsn
            if not bootstrap:
                self.kafka = EmbeddedKafka().start()
                bootstrap = self.kafka.bootstrap
        except BaseException:
            self.stop()
            raise
        self.dsn, self.bootstrap = dsn, bootstrap
        # One connection for every look during a timed phase: a new one forks a backend, whose CPU
        # would count as the contestant's.
        self.mon = psycopg.connect(dsn, autocommit=True)
        self.postmaster = self._postmaster()
        self.broker = pid_with_arg(f"-Dkafka.logs.dir={self.kafka.root}") if self.kafka else None

    def _postmaster(self) -> int | None:
        try:
            with psycopg.connect(self.dsn) as conn:
                folder = conn.execute("SHOW data_directory").fetchone()[0]  # type: ignore[index]
            pid = int((Path(folder) / "postmaster.pid").read_text().split()[0])
        except (psycopg.Error, OSError, ValueError, IndexError) as exc:
            print(
                f"[bench debezium] Postgres CPU not measured (its postmaster.pid is not readable here: {exc})",
                file=sys.stderr,
            )
            return None
        return pid if _stat(pid) else None

    def cpu(self) -> dict[str, float | None]:
        return {"postgres": postgres_cpu_s(self.postmaster), "broker": process_cpu_s(self.broker)}

    def stop(self) -> None:
        if getattr(self, "mon", None) is not None:
            self.mon.close()
        for service in (self.kafka, self.postgres):
            if service is not None:
                service.destroy()


# -- contestants -------------------------------------------------------------------------------


class Contestant(ABC):
    """One relay of one outbox table, routing phase ``kind``'s rows into ``<prefix>.<kind>``."""

    name = ""

    def __init__(self, svc: Services, schema: str, tag: str) -> None:
        self.svc = svc
        self.table = f"{schema}.{self.name}"
        self.prefix = f"bdz-{tag}-{self.name.replace('_', '-')}"
        self.router = {"route.topic.replacement": f"{self.prefix}.${{routedByValue}}"}
        self.shape = Shape()

    def topic(self, kind: str) -> str:
        return f"{self.prefix}.{kind}"

    def create(self) -> None:
        ident = sql.Identifier(*self.table.split("."))
        with psycopg.connect(self.svc.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL(OUTBOX_DDL).format(ident))
            # The bench vacuums after each burst and measures it (see vacuum()): an autovacuum run
            # inside a timed phase would bill its WAL and CPU to whoever was being timed.
            conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(ident))
        for kind in KINDS:
            create_topic(self.svc.bootstrap, self.topic(kind), PARTITIONS)

    @abstractmethod
    def start(self) -> None:
        """Start relaying; return once idle and ready (harvest leading, Debezium streaming)."""

    @abstractmethod
    def delivered(self, topic: str) -> int:
        """Records of this contestant in ``topic`` so far, as it counts them."""

    def done(self) -> bool:
        """Its work for the rows delivered so far is finished."""
        return True

    @abstractmethod
    def cpu_s(self) -> float | None:
        """CPU seconds its relay process(es) used so far (None: not measurable)."""

    def check(self) -> None:  # noqa: B027 - optional hook: a contestant with no process to watch keeps it
        """Raise if the relay died."""

    poll_interval = 0.005


class HarvestContestant(Contestant):
    """harvest on Debezium's table (``tableMapping: debezium``): the mark layout's gains the relay's columns,
    the ``cursor`` layout's is the partitioned one ``init-db`` makes (Debezium's columns plus the relay's, with
    init-db's defaults: partitions of a million ids, two ahead)."""

    def __init__(self, svc: Services, schema: str, tag: str, sequenced: bool, layout: str = "mark") -> None:
        self.name = ("cursor_" if layout == "cursor" else "") + ("sequenced" if sequenced else "at_least_once")
        super().__init__(svc, schema, tag)
        self.sequenced, self.layout = sequenced, layout
        self.mapping = table_mapping("debezium", self.router)
        self.relay: Harvest | None = None
        self.names: OutboxNames | None = None
        self._passed: sql.Composed | None = None
        self._empty = sql.SQL("SELECT NOT EXISTS (SELECT FROM {})").format(sql.Identifier(*self.table.split(".")))

    def create(self) -> None:
        if self.layout == "cursor":  # init-db makes the table: partitioned, the cursor row, the sequence
            self.names = names = init_db(self.svc.dsn, self.table, mapping=self.mapping, layout="cursor")
            # The committed cursor passed the last row (its index's last entry): every row of a burst then,
            # as a burst is one transaction (cursor_backlog's count would scan the rows from low on, a
            # Postgres CPU cost the bench would bill to the relay).
            seq = sql.Identifier(self.mapping.id_column)
            self._passed = sql.SQL(
                "SELECT coalesce((SELECT pg_visible_in_snapshot(o.txid, c.lo) OR (c.hi IS NOT NULL AND "
                "pg_visible_in_snapshot(o.txid, c.hi) AND o.seq <= c.pos) FROM {} AS c, "
                "(SELECT {} AS seq, txid FROM {} ORDER BY {} DESC LIMIT 1) AS o WHERE c.shard = 0), true)"
            ).format(names.cursor, seq, names.outbox, seq)
            # Autovacuum stays on during its own turn, as a new user has it (its rows never die: it analyzes
            # and freezes); off after it (no_autovacuum)
            for kind in KINDS:
                create_topic(self.svc.bootstrap, self.topic(kind), PARTITIONS)
            return
        super().create()
        init_db(self.svc.dsn, self.table, mapping=self.mapping)  # the relay's columns, as in a migration

    def no_autovacuum(self) -> None:
        """Autovacuum off on the cursor table's partitions once its turn is over: an insert-only partition's
        autovacuum (its freeze and visibility map) would bill its WAL and CPU to whoever is timed then."""
        with psycopg.connect(self.svc.dsn, autocommit=True) as conn:
            for (leaf,) in conn.execute(
                "SELECT relid::regclass::text FROM pg_partition_tree(%s::regclass) WHERE isleaf", (self.table,)
            ).fetchall():
                conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(sql.SQL(leaf)))

    def start(self) -> None:
        cfg = HarvestConfig(
            data_source=self.svc.dsn,
            outbox_table=self.table,
            base_kafka_config={"bootstrap.servers": self.svc.bootstrap},
            leader_group_id=f"bdz-{uuid.uuid4().hex[:8]}",
            name=f"bench-{self.name}",
            limits=Limits(heartbeat_timeout=HEARTBEAT_TIMEOUT),
            uuid_sequencing=self.sequenced,
            table_mapping=self.mapping,
            outbox_layout=self.layout,
        )
        self.relay = Harvest(cfg).start()
        wait_for(lambda: self.relay is not None and self.relay.is_leader, 120, f"{self.name} to lead")

    def stop(self) -> None:
        if self.relay is not None:
            relay, self.relay = self.relay, None
            relay.stop()
            if not relay.wait(60):
                raise DebeziumBenchError(f"harvest {self.name} did not stop within 60 s")

    def delivered(self, topic: str) -> int:
        assert self.relay is not None
        return self.relay.metrics.delivered

    def done(self) -> bool:
        """mark: every row deleted; cursor: the committed cursor past every row (rows stay until their
        partition is retired)."""
        if self._passed is not None:
            return bool(self.svc.mon.execute(self._passed).fetchone()[0])  # type: ignore[index]
        return bool(self.svc.mon.execute(self._empty).fetchone()[0])  # type: ignore[index]

    def cpu_s(self) -> float | None:
        return time.process_time()  # the relay runs in this process (the watcher's share is small)

    def check(self) -> None:
        if self.relay is not None and self.relay.state is State.STOPPED:
            self.relay.wait(0)  # re-raises what stopped it
            raise DebeziumBenchError(f"harvest {self.name} stopped")

    def yaml(self, path: Path, group: str) -> Path:
        """The relay processes' config for the fault run: what a user writes, nothing tuned."""
        lines = [
            "harvest:",
            "  baseKafkaConfig:",
            f'    bootstrap.servers: "{self.svc.bootstrap}"',
            f'  dataSource: "{self.svc.dsn}"',
            f"  outboxTable: {self.table}",
            f"  leaderGroupID: {group}",
            f"  uuidSequencing: {'true' if self.sequenced else 'false'}",
            *(["  outboxLayout: cursor"] if self.layout == "cursor" else []),
            "  tableMapping: debezium",
            "  eventRouter:",
            f'    route.topic.replacement: "{self.router["route.topic.replacement"]}"',
            "  limits:",
            f"    heartbeatTimeout: {HEARTBEAT_TIMEOUT:g}s",
            "logging:",
            "  level: Info",
            "",
        ]
        path.write_text("\n".join(lines))
        os.chmod(path, 0o600)  # it holds the DSN
        return path


class DebeziumContestant(Contestant):
    name = "debezium"
    poll_interval = 0.02  # each look asks the broker for eight watermarks

    def __init__(self, svc: Services, schema: str, tag: str) -> None:
        super().__init__(svc, schema, tag)
        self.connector = OutboxConnector(f"bdz_{tag}", self.table, self.router, topic_partitions=PARTITIONS)
        self.worker: DebeziumOutbox | None = None
        self.jvm: int | None = None
        self._marks: dict[str, Watermarks] = {}
        self._checked = 0.0

    def start(self) -> None:
        if self.worker is None:
            self.worker = DebeziumOutbox(self.svc.dsn, self.svc.bootstrap, connectors=[self.connector])
        self.worker.start()
        self.jvm = pid_with_arg(f"-Dconnect.logs.dir={self.worker.root}")

    def kill(self) -> None:
        assert self.worker is not None
        self.worker.kill()

    def destroy(self) -> None:
        for marks in self._marks.values():
            marks.close()
        if self.worker is not None:
            self.worker.destroy()  # drops the slot and publication too

    def delivered(self, topic: str) -> int:
        if topic not in self._marks:
            self._marks[topic] = Watermarks(self.svc.bootstrap, topic)
        return self._marks[topic].total()

    def cpu_s(self) -> float | None:
        return process_cpu_s(self.jvm)

    def check(self) -> None:
        # once a second: a dead worker or a failed task is reported at once (0 records: returns at once)
        if self.worker is not None and time.monotonic() - self._checked > 1.0:
            self._checked = time.monotonic()
            self.worker.wait_for_records([], 0, timeout=5)

    def slot(self) -> dict[str, int | None]:
        row = self.svc.mon.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) FROM pg_replication_slots WHERE slot_name = %s",
            (self.connector.slot_name,),
        ).fetchone()
        if row is None:
            return {"lag_bytes": None, "retained_wal_bytes": None}
        return {"lag_bytes": int(row[0]), "retained_wal_bytes": int(row[1])}


# -- phases ------------------------------------------------------------------------------------


# A partitioned table (the cursor layout's) has no storage of its own: its leaves are summed (a plain
# table is its own leaf).
_LEAVES = (
    "SELECT relid FROM pg_partition_tree(%(t)s::regclass) WHERE isleaf "
    "UNION SELECT %(t)s::regclass WHERE NOT EXISTS (SELECT FROM pg_partition_tree(%(t)s::regclass))"
)


def table_stats(dsn: str, table: str) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        size, len_, live, dead = conn.execute(
            "SELECT sum(pg_total_relation_size(t.relid)), sum(s.table_len), sum(s.tuple_count), "
            f"sum(s.dead_tuple_count) FROM ({_LEAVES}) AS t, LATERAL pgstattuple(t.relid) AS s",
            {"t": table},
        ).fetchone()  # type: ignore[misc]
    return {"total_bytes": int(size), "heap_bytes": int(len_), "live_tuples": int(live), "dead_tuples": int(dead)}


def table_bytes(conn: psycopg.Connection, table: str) -> int:
    row = conn.execute(f"SELECT sum(pg_total_relation_size(relid)) FROM ({_LEAVES}) AS t", {"t": table}).fetchone()
    return int(row[0])  # type: ignore[index]


def checkpoints(conn: psycopg.Connection) -> int:
    """Checkpoints the server has begun (timed and requested): a burst's count says whether it spanned one."""
    view = "pg_stat_checkpointer" if conn.info.server_version >= 170000 else "pg_stat_bgwriter"
    cols = "num_timed + num_requested" if view == "pg_stat_checkpointer" else "checkpoints_timed + checkpoints_req"
    return int(conn.execute(f"SELECT {cols} FROM {view}").fetchone()[0])  # type: ignore[index]


def _per_100k(value: float | None, rows: int) -> float | None:
    return None if value is None else round(value / rows * 100_000, 4)


def vacuum(svc: Services, table: str, rows: int) -> dict[str, Any]:
    """``VACUUM`` of the table after a burst: the deferred cost of its dead tuples (autovacuum's work)."""
    cpu0, lsn0, t0 = svc.cpu()["postgres"], insert_lsn(svc.mon), time.perf_counter()
    svc.mon.execute(sql.SQL("VACUUM {}").format(sql.Identifier(*table.split("."))))
    elapsed, lsn1, cpu1 = time.perf_counter() - t0, insert_lsn(svc.mon), svc.cpu()["postgres"]
    return {
        "s": round(elapsed, 3),
        "wal_bytes_per_100k": _per_100k(lsn1 - lsn0, rows),
        "postgres_cpu_s_per_100k": _per_100k(cpu1 - cpu0, rows) if cpu0 is not None and cpu1 is not None else None,
    }


def burst(
    svc: Services, c: Contestant, rows: int, keys: int, kind: str = "Burst", delete: bool = False
) -> dict[str, Any]:
    """One burst (module doc): drain rate, the relaying phase's costs, the table after; read back."""
    topic, tag = c.topic(kind), new_tag()
    checkpoint(svc.dsn)
    base = c.delivered(topic)
    size0 = table_bytes(svc.mon, c.table)
    cpu0: dict[str, float | None] = {}

    def sample() -> None:
        cpu0.update(svc.cpu(), relay=c.cpu_s())

    ckpt0 = checkpoints(svc.mon)
    pg_write0 = svc.cpu()["postgres"]
    written = write_burst(svc.dsn, c.table, kind, tag, rows, keys, sample, delete, c.shape)
    deadline = time.monotonic() + 300 + rows / 1000
    while c.delivered(topic) - base < rows:
        c.check()
        if time.monotonic() > deadline:
            raise DebeziumBenchError(
                f"{c.name}: {c.delivered(topic) - base} of {rows} records in Kafka after "
                f"{time.perf_counter() - written.committed:.0f}s"
            )
        time.sleep(c.poll_interval)
    drained = time.perf_counter()
    slot_at_last = c.slot() if isinstance(c, DebeziumContestant) else None
    while not c.done():
        c.check()
        if time.monotonic() > deadline:
            raise DebeziumBenchError(f"{c.name}: rows left in {c.table} after {time.perf_counter() - drained:.0f}s")
        time.sleep(0.02)
    finished = time.perf_counter()
    cpu1 = {**svc.cpu(), "relay": c.cpu_s()}
    lsn2 = insert_lsn(svc.mon)
    ckpt1 = checkpoints(svc.mon)
    drain_s = drained - written.committed
    out: dict[str, Any] = {
        "rows": rows,
        "write_s": round(written.write_s, 2),
        "drain_s": round(drain_s, 3),
        "rows_per_s": round(rows / drain_s),
        "work_done_s": round(finished - written.committed, 3),
        "wal_write_bytes_per_100k": _per_100k(written.lsn_after - written.lsn_before, rows),
        "wal_relay_bytes_per_100k": _per_100k(lsn2 - written.lsn_after, rows),
        "checkpoints": ckpt1 - ckpt0,  # begun while writing and relaying (the CHECKPOINT before excluded)
    }
    for what in ("postgres", "relay", "broker"):
        a, b = cpu0.get(what), cpu1.get(what)
        out[f"{what}_cpu_s_per_100k"] = _per_100k(b - a, rows) if a is not None and b is not None else None
    # While the rows are written Debezium's walsender already decodes them (into its reorder buffer, spilled
    # to disk past logical_decoding_work_mem): work the relaying phase does not see, so the writing phase's
    # Postgres CPU is reported too (writers' backends + whatever runs beside them)
    pg_c = cpu0.get("postgres")
    out["postgres_cpu_write_s_per_100k"] = (
        _per_100k(pg_c - pg_write0, rows) if pg_c is not None and pg_write0 is not None else None
    )
    out["table_after"] = table_stats(svc.dsn, c.table)
    # The tables outlive the bursts (a kept row stays, a VACUUMed page is reused): growth is per burst.
    out["table_growth_bytes_per_100k"] = _per_100k(out["table_after"]["total_bytes"] - size0, rows)
    if isinstance(c, DebeziumContestant):
        time.sleep(2.5)  # Connect flushes offsets (and Debezium confirms the slot) every second here
        out["slot"] = {"at_last_record": slot_at_last, "after_offset_flush": c.slot()}
    counts = tally(read_ids(svc.bootstrap, topic), tag, rows)
    out["duplicates"] = counts["duplicates"]
    if counts["losses"]:
        raise DebeziumBenchError(f"{c.name} lost {counts['losses']} of {rows} rows of a {kind} burst (no fault)")
    out["vacuum_after"] = vacuum(svc, c.table, rows)
    print(f"[bench debezium] {c.name} {kind} {rows}: {out['rows_per_s']} rows/s", file=sys.stderr, flush=True)
    return out


#: bench_latency's configuration per harvest contestant: the relay as users run it, on its own table
LATENCY_CONFIGS = {
    "at_least_once": "mark/at_least_once/1",
    "sequenced": "mark/sequenced/1",
    "cursor_at_least_once": "cursor/at_least_once/1",
    "cursor_sequenced": "cursor/sequenced/1",
}


def latency_side_by_side(svc: Services, contestants: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Commit -> consumer latency of harvest and Debezium as users run them (bench/bench_latency.py, on this
    bench's services, after the other phases): each harvest contestant's mode and layout as a ``harvest``
    process on its own outbox, Debezium's Connect worker with ``poll.interval.ms`` ``--debezium-poll-ms``,
    writers and consumers in processes of their own, ``--latency-repeats`` rounds alternating with Kafka
    alone. Its whole JSON report."""
    configs = [LATENCY_CONFIGS[c] for c in contestants if c in LATENCY_CONFIGS] + ["debezium"]
    argv = [
        *("--rates", f"{args.rate:g}", "--configs", ",".join(configs)),
        *("--repeats", str(args.latency_repeats), "--seconds", f"{args.latency_seconds:g}"),
        *("--warmup", f"{args.latency_warmup:g}", "--debezium-poll-ms", str(args.debezium_poll_ms)),
        *("--warm-records", "0"),  # the bursts before warmed the broker
    ]
    print(f"[bench debezium] latency as users run it: bench_latency {' '.join(argv)}", file=sys.stderr, flush=True)
    env = {**os.environ, "HARVEST_PG_DSN": svc.dsn, "HARVEST_KAFKA_BOOTSTRAP": svc.bootstrap}  # never argv: a password
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_latency", *argv], env=env, stdout=subprocess.PIPE, text=True, check=False
    )
    if done.returncode != 0:
        raise DebeziumBenchError(f"the latency comparison (bench_latency) failed with exit code {done.returncode}")
    return dict(json.loads(done.stdout))


def latency_of(report: dict[str, Any], contestant: str) -> dict[str, Any]:
    """A contestant's plain-consumer figures (the repeat of median p99) in the latency comparison; {} without."""
    rates = (report.get("latency") or {}).get("rates") or {}
    if not rates:
        return {}
    config = "debezium" if contestant == "debezium" else LATENCY_CONFIGS.get(contestant, "")
    run = next(iter(rates.values())).get(config) or {}
    return dict(run.get("plain") or {})


def _until(
    cond: Callable[[], bool], timeout: float, what: str, check: Callable[[], None] = lambda: None, poll: float = 0.01
) -> float:
    """Seconds until ``cond()``; ``check()`` between looks; DebeziumBenchError after ``timeout``."""
    start = time.monotonic()
    while not cond():
        check()
        if time.monotonic() - start > timeout:
            raise DebeziumBenchError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(poll)
    return time.monotonic() - start


def harvest_fault(svc: Services, c: HarvestContestant, rows: int, keys: int, workdir: Path) -> dict[str, Any]:
    """kill -9 of the leader of two relay processes mid-burst (module doc)."""
    topic, tag = c.topic("Fault"), new_tag()
    cfg = c.yaml(workdir / f"{c.name}.yaml", f"bdz-fault-{uuid.uuid4().hex[:8]}")
    relays = [RelayProcess(cfg, f"{c.name}-{i}", workdir).start() for i in range(2)]
    marks = Watermarks(svc.bootstrap, topic)
    try:
        wait_for(lambda: current_leader(relays) is not None, 120, f"{c.name}: a leader", poll=0.1)
        leader = current_leader(relays)
        standby = next(r for r in relays if r is not leader)
        assert leader is not None
        time.sleep(1.0)  # idle, as in the bursts
        written = write_burst(svc.dsn, c.table, "Fault", tag, rows, keys, shape=c.shape)
        _until(lambda: marks.total() >= FAULT_AT * rows, 300, f"{c.name}: {FAULT_AT:.0%} of the burst in Kafka")
        in_kafka = marks.total()
        leader.kill()
        killed = time.perf_counter()
        takeover = _until(lambda: standby.elections() > 0, 120, f"{c.name}: the standby to take over", poll=0.05)
        _until(c.done, 300, f"{c.name}: the outbox to empty", poll=0.2)
        finished = time.perf_counter()
    finally:
        marks.close()
        for relay in relays:
            relay.stop(60)
    out: dict[str, Any] = {
        "rows": rows,
        "killed_at_records": in_kafka,
        "takeover_s": round(takeover, 2),
        "kill_to_done_s": round(finished - killed, 2),
        "commit_to_done_s": round(finished - written.committed, 2),
        "plain_consumer": tally(read_ids(svc.bootstrap, topic), tag, rows),
    }
    if c.sequenced:
        out["read_committed"] = tally(read_committed_ids(svc.bootstrap, topic), tag, rows)
    print(f"[bench debezium] {c.name} fault: {out}", file=sys.stderr, flush=True)
    return out


def debezium_fault(svc: Services, c: DebeziumContestant, rows: int, keys: int) -> dict[str, Any]:
    """kill -9 of the Connect worker mid-burst, then a restart (module doc)."""
    topic, tag = c.topic("Fault"), new_tag()
    marks = Watermarks(svc.bootstrap, topic)
    try:
        time.sleep(1.0)
        written = write_burst(svc.dsn, c.table, "Fault", tag, rows, keys, shape=c.shape)
        _until(
            lambda: marks.total() >= FAULT_AT * rows, 300, f"{c.name}: {FAULT_AT:.0%} of the burst in Kafka", c.check
        )
        in_kafka = marks.total()
        c.kill()
        killed = time.perf_counter()
        c.start()  # a new JVM; the connector resumes from its slot and offsets file
        restarted = time.perf_counter() - killed
        _until(lambda: marks.total() >= rows, 300 + rows / 1000, f"{c.name}: the whole burst in Kafka", c.check)
        last, stable = marks.total(), time.monotonic()
        while time.monotonic() - stable < 3.0:  # until nothing more arrives
            time.sleep(0.2)
            now = marks.total()
            if now != last:
                last, stable = now, time.monotonic()
        finished = time.perf_counter()
    finally:
        marks.close()
    out = {
        "rows": rows,
        "killed_at_records": in_kafka,
        "restart_s": round(restarted, 2),
        "kill_to_done_s": round(finished - killed - 3.0, 2),
        "commit_to_done_s": round(finished - written.committed - 3.0, 2),
        "plain_consumer": tally(read_ids(svc.bootstrap, topic), tag, rows),
    }
    print(f"[bench debezium] {c.name} fault: {out}", file=sys.stderr, flush=True)
    return out


# -- the run -----------------------------------------------------------------------------------


def _medians(runs: list[Any]) -> Any:
    """Medians of the numbers of repeated bursts' figures, key by key (nested too)."""
    last = runs[-1]
    if isinstance(last, dict):
        return {key: _medians([r[key] for r in runs if isinstance(r, dict) and key in r]) for key in last}
    numbers = [r for r in runs if isinstance(r, (int, float))]
    if not (isinstance(last, (int, float)) and numbers):
        return last
    median = statistics.median(numbers)
    return round(median) if all(isinstance(n, int) for n in numbers) else median


def _median_burst(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of repeated bursts, but the table and the slot as the last run left them (a
    Debezium outbox that keeps its rows grows with every burst); every run's rate."""
    out: dict[str, Any] = _medians(runs)
    out.update(table_after=runs[-1]["table_after"], runs_rows_per_s=[r["rows_per_s"] for r in runs])
    if "slot" in runs[-1]:
        out["slot"] = runs[-1]["slot"]
    return out


def contest(svc: Services, c: Contestant, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Every phase of one contestant (module doc), alone on the machine."""
    out: dict[str, Any] = {}
    if args.warmup_rows:
        burst(svc, c, args.warmup_rows, args.keys, kind="Warm")
    out["burst"] = _median_burst([burst(svc, c, args.rows, args.keys) for _ in range(args.runs)])
    if isinstance(c, DebeziumContestant):
        out["burst_insert_delete"] = burst(svc, c, args.rows, args.keys, kind="BurstDel", delete=True)
    if isinstance(c, HarvestContestant):
        c.stop()  # the fault run's relays are processes of their own
        out["fault"] = harvest_fault(svc, c, args.fault_rows, args.keys, workdir)
    else:
        assert isinstance(c, DebeziumContestant)
        out["fault"] = debezium_fault(svc, c, args.fault_rows, args.keys)
        out["slot_at_end"] = c.slot()
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def wal_total(b: dict[str, Any]) -> float:
    """WAL bytes per 100k rows of a burst: writing + relaying + the VACUUM after."""
    return float(
        b["wal_write_bytes_per_100k"] + b["wal_relay_bytes_per_100k"] + b["vacuum_after"]["wal_bytes_per_100k"]
    )


def pg_cpu_total(b: dict[str, Any]) -> float | None:
    """Postgres CPU seconds per 100k rows of a burst's relaying phase + the VACUUM after."""
    a, v = b["postgres_cpu_s_per_100k"], b["vacuum_after"]["postgres_cpu_s_per_100k"]
    return None if a is None or v is None else a + v


HARVEST = ("at_least_once", "sequenced", "cursor_at_least_once", "cursor_sequenced")


def wal_relay_side(b: dict[str, Any]) -> float:
    """WAL bytes per 100k rows the relaying costs: the relaying phase + the VACUUM after."""
    return float(b["wal_relay_bytes_per_100k"] + b["vacuum_after"]["wal_bytes_per_100k"])


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """harvest / Debezium ratios of the headline figures (lower is better for all but rows/s), per
    harvest contestant; and the cursor layout's against the mark layout's, per mode."""
    dbz = report["debezium"]
    out: dict[str, Any] = {}
    for mode in HARVEST:
        if mode not in report:
            continue
        hv = report[mode]
        hb, db, dd = hv["burst"], dbz["burst"], dbz["burst_insert_delete"]
        wal = wal_total(hb)
        out[mode] = {
            "rows_per_s": _ratio(hb["rows_per_s"], db["rows_per_s"]),
            "trickle_p50": _ratio(latency_of(report, mode).get("p50_ms"), latency_of(report, "debezium").get("p50_ms")),
            "trickle_p99": _ratio(latency_of(report, mode).get("p99_ms"), latency_of(report, "debezium").get("p99_ms")),
            "wal_total_to_keep_rows": _ratio(wal, wal_total(db)),
            "wal_total_to_insert_delete": _ratio(wal, wal_total(dd)),
            "postgres_cpu": _ratio(hb["postgres_cpu_s_per_100k"], db["postgres_cpu_s_per_100k"]),
            "postgres_cpu_with_vacuum_to_insert_delete": _ratio(pg_cpu_total(hb), pg_cpu_total(dd)),
            "relay_cpu": _ratio(hb["relay_cpu_s_per_100k"], db["relay_cpu_s_per_100k"]),
        }
    return out


def cursor_summary(report: dict[str, Any]) -> dict[str, Any]:
    """Issue #37's targets for the cursor layout, per mode, from this run: relay-side WAL per row (relaying
    + the VACUUM after) against the mark layout's (target <= 0.5), total WAL per row (writers + relay side)
    against Debezium's insert-then-delete path (target <= 1), Postgres CPU per relayed row against
    Debezium's (keeping rows, relaying phase; and with the VACUUM after, insert-then-delete; target <= 1)."""
    dbz, dd = report["debezium"]["burst"], report["debezium"]["burst_insert_delete"]
    out: dict[str, Any] = {}
    for mode in ("at_least_once", "sequenced"):
        if f"cursor_{mode}" not in report:
            continue
        cb, mb = report[f"cursor_{mode}"]["burst"], (report.get(mode) or {}).get("burst")
        out[mode] = {
            "relay_wal_to_mark": _ratio(wal_relay_side(cb), wal_relay_side(mb)) if mb else None,
            "total_wal_to_mark": _ratio(wal_total(cb), wal_total(mb)) if mb else None,
            "total_wal_to_debezium_insert_delete": _ratio(wal_total(cb), wal_total(dd)),
            "total_wal_to_debezium_keep_rows": _ratio(wal_total(cb), wal_total(dbz)),
            "postgres_cpu_to_debezium": _ratio(cb["postgres_cpu_s_per_100k"], dbz["postgres_cpu_s_per_100k"]),
            "postgres_cpu_with_vacuum_to_debezium_insert_delete": _ratio(pg_cpu_total(cb), pg_cpu_total(dd)),
            "postgres_cpu_write_and_relay_to_debezium": _ratio(pg_cpu_all(cb), pg_cpu_all(dbz)),
            "postgres_cpu_write_and_relay_to_debezium_insert_delete": _ratio(pg_cpu_all(cb), pg_cpu_all(dd)),
            "postgres_cpu_to_mark": _ratio(cb["postgres_cpu_s_per_100k"], (mb or {}).get("postgres_cpu_s_per_100k")),
            "rows_per_s_to_mark": _ratio(cb["rows_per_s"], (mb or {}).get("rows_per_s")),
            "rows_per_s_to_debezium": _ratio(cb["rows_per_s"], dbz["rows_per_s"]),
        }
        out[mode]["targets_met"] = {
            "relay_wal_to_mark <= 0.5": _le(out[mode]["relay_wal_to_mark"], 0.5),
            "total_wal_to_debezium_insert_delete <= 1": _le(out[mode]["total_wal_to_debezium_insert_delete"], 1),
            "postgres_cpu_to_debezium <= 1": _le(out[mode]["postgres_cpu_to_debezium"], 1),
        }
    return out


def pg_cpu_all(b: dict[str, Any]) -> float | None:
    """Postgres CPU seconds per 100k rows of a burst, writing + relaying + the VACUUM after."""
    w, rest = b.get("postgres_cpu_write_s_per_100k"), pg_cpu_total(b)
    return None if w is None or rest is None else w + rest


def _le(v: float | None, bound: float) -> bool | None:
    return None if v is None else v <= bound


def violations(report: dict[str, Any]) -> list[str]:
    rc = report.get("sequenced", {}).get("fault", {}).get("read_committed") or {}
    if rc and (rc["duplicates"] or rc["losses"]):
        return [
            f"sequenced relay, leader killed: ReadCommittedIter saw {rc['duplicates']} duplicate(s) and "
            f"{rc['losses']} loss(es); must be 0 / 0"
        ]
    return []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of each timed burst")
    ap.add_argument("--runs", type=int, default=2, help="timed bursts per contestant (medians)")
    ap.add_argument("--warmup-rows", type=int, default=300_000, help="the untimed burst before them (0: none)")
    ap.add_argument("--fault-rows", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=1000, help="distinct aggregate ids (record keys)")
    ap.add_argument("--rate", type=float, default=500.0, help="the latency comparison's rows/s")
    ap.add_argument("--latency-seconds", type=float, default=60.0, help="its measured window, after the warm-up")
    ap.add_argument("--latency-warmup", type=float, default=10.0)
    ap.add_argument("--latency-repeats", type=int, default=5, help="its rounds (0: no latency comparison)")
    ap.add_argument("--debezium-poll-ms", type=int, default=10, help="Debezium's poll.interval.ms in it (default 500)")
    ap.add_argument(
        "--contestants",
        type=lambda v: [x.strip() for x in v.split(",") if x.strip()],
        default=[*HARVEST, "debezium"],
        help=f"comma-separated, of {','.join([*HARVEST, 'debezium'])} (default: all; the ratios need debezium)",
    )
    args = ap.parse_args()
    unknown = [c for c in args.contestants if c not in (*HARVEST, "debezium")]
    if unknown or "debezium" not in args.contestants:
        ap.error(
            f"--contestants: {','.join(unknown) or 'debezium missing'}: name contestants of "
            f"{','.join([*HARVEST, 'debezium'])}, debezium among them (every ratio is against it)"
        )
    for name in ("rows", "runs", "fault_rows", "keys"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    tag = uuid.uuid4().hex[:6]
    schema = f"bdz_{tag}"
    svc = Services()
    report: dict[str, Any] = {
        "setup": {
            "rows": args.rows,
            "runs": args.runs,
            "warmup_rows": args.warmup_rows,
            "fault_rows": args.fault_rows,
            "keys": args.keys,
            "partitions": PARTITIONS,
            "payload_bytes": len(payload(123_456)),
            "cpus": os.cpu_count(),
            "harvest_limits": {"heartbeatTimeout": f"{HEARTBEAT_TIMEOUT:g}s"},
            "contestants": args.contestants,
            "postgres": {
                name: svc.mon.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
                for name in ("server_version", "wal_level", "max_wal_size", "checkpoint_timeout", "wal_compression")
            },
            "debezium": "3.6.1, defaults (poll.interval.ms 500, max.batch.size 2048); Connect offset.flush.interval.ms "
            "1000 (its default: 60000)",
        }
    }
    contestants: list[Contestant] = [
        HarvestContestant(svc, schema, tag, False),
        HarvestContestant(svc, schema, tag, True),
        HarvestContestant(svc, schema, tag, False, layout="cursor"),
        HarvestContestant(svc, schema, tag, True, layout="cursor"),
        DebeziumContestant(svc, schema, tag),
    ]
    contestants = [c for c in contestants if c.name in args.contestants]
    try:
        with psycopg.connect(svc.dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        for c in contestants:
            c.create()
        with tempfile.TemporaryDirectory(prefix="bench-debezium-") as tmp:
            for c in contestants:
                print(f"[bench debezium] {c.name}", file=sys.stderr, flush=True)
                c.start()
                try:
                    report[c.name] = contest(svc, c, args, Path(tmp))
                finally:
                    if isinstance(c, HarvestContestant):
                        c.stop()
                        if c.layout == "cursor":  # partitions its relay made: quiet during the next ones' turns
                            c.no_autovacuum()
                    elif isinstance(c, DebeziumContestant):
                        c.destroy()
        if args.latency_repeats:
            report["latency"] = latency_side_by_side(svc, args.contestants, args)
    finally:
        try:
            with psycopg.connect(svc.dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        finally:
            svc.stop()
    report["harvest_to_debezium"] = summary(report)
    report["cursor_layout"] = cursor_summary(report)
    report["violations"] = violations(report)
    print(json.dumps(report, indent=2))
    for problem in report["violations"]:
        print(f"[bench debezium] FAILED: {problem}", file=sys.stderr)
    return 1 if report["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
