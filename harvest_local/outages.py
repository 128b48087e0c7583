"""The outage matrix: one fault against a relay group while writers commit, verified end to end.

One run (:func:`run_outage`): 2 relay processes (same leader group, NELI election) in one mode
(``--uuid-sequencing`` or at-least-once) relay an outbox that 3 application writers fill (10% of
their transactions roll back, a few run long); the relays reach Postgres and Kafka through a
:class:`~harvest_local.netfault.NetFault` proxy each (Kafka through the broker's ``PROXIED``
listener, so metadata keeps them on the proxy), the writers and the checker go direct. Once the
writers are warmed up (~4 s), one fault is applied for ``duration`` seconds, then healed; a run can
apply several faults one after another (``Outage.then``): each next one once the backlog the one
before built up is gone and rows have flowed normally for ``STEADY_SECONDS``, so each fault hits
caught-up relays under load, as the first does:

==================  =============================================================================
broker_pause        SIGSTOP the broker, SIGCONT after ``duration``
broker_kill         SIGKILL the broker, start it again on the same data dir (it is down while it
                    starts: ~5-15 s)
pg_restart          ``pg_ctl stop -m fast`` then start (every session is ended)
pg_down             Postgres stopped for ``duration``
pg_blackhole        relay <-> Postgres: connections stay open, nothing gets through, for ``duration``
pg_reset            relay <-> Postgres: every connection reset (RST), new ones too, for 1 s
pg_latency          relay <-> Postgres: +200 ms each way for ``duration``
kafka_blackhole     relay <-> Kafka, as above
kafka_reset         relay <-> Kafka, as above
kafka_latency       relay <-> Kafka, as above
==================  =============================================================================

Measured: **recovery** = seconds from the heal until every row committed before the heal has left
the outbox (delivered, or committed in ``--uuid-sequencing`` mode), i.e. the backlog the fault
built up is gone — including a probe row (to a topic of its own) committed right at the heal, so
faults during which the writers could not commit either (Postgres down) still measure how long the
relay takes to move again (one figure per fault). The writers stop ``STEADY_SECONDS`` after the last
fault's recovery. Verified (:mod:`harvest_local.verify`, ground truth = the versions the writers
committed): in ``--uuid-sequencing`` mode a ``ReadCommittedIter`` read of the topic holds every
committed version exactly once, in per-key order, nothing rolled back; in at-least-once mode the raw
topic holds every committed version, first arrivals in per-key order (duplicates are counted, they
are allowed there). Both relays must still be running once the outbox has drained (the faults all heal:
no manual action); they are stopped then, so the topic is final and the check reads it to its end. ``Outage.layout`` runs it on ``outboxLayout: cursor`` (issue #37): the relay deletes no row there,
so "left the outbox" reads "passed by the committed cursor".

Used by ``tests/test_e2e/test_outages.py`` (short durations in CI) and ``scripts/outages.py``
(docs/reliability.md's table, 60 s faults).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from confluent_kafka import Consumer, TopicPartition
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from harvest_outbox.harvest_local.kafka import create_topic, topic_ends
from harvest_outbox.harvest_local.launcher import LocalServices
from harvest_outbox.harvest_local.netfault import NetFault
from harvest_outbox.harvest_local.relays import RelayProcess, current_leader, wait_for, write_config
from harvest_outbox.harvest_local.verify import Verdict, verify
from harvest_outbox.harvest_local.workload import Writers, committed_versions, create_accounts

if TYPE_CHECKING:
    from harvest_outbox.producer.schema import OutboxNames

log = logging.getLogger(__name__)

FAULTS = (
    "broker_pause",
    "broker_kill",
    "pg_restart",
    "pg_down",
    "pg_blackhole",
    "pg_reset",
    "pg_latency",
    "kafka_blackhole",
    "kafka_reset",
    "kafka_latency",
)
LATENCY_MS = 200
RESET_SECONDS = 1.0
#: seconds of normal flow after a fault's recovery, before the next fault (or the writers' end)
STEADY_SECONDS = 2.0


@dataclass(frozen=True)
class Outage:
    fault: str
    sequenced: bool
    duration: float = 12.0
    relays: int = 2
    keys: int = 30
    partitions: int = 3
    rate: float = 120.0  # rows/s the writers aim at (all threads together)
    seed: int = 1
    #: the relays' ``limits.rowTimeout`` (None: the default, 30 s). Shorter than the fault, records
    #: time out during it: none may be dead-lettered for it (an outage is not poison).
    row_timeout: str | None = None
    #: faults applied after ``fault`` in the same run, in order, each once the one before has healed
    #: and its backlog is gone (one relay group, one topic, one end-to-end verification)
    then: tuple[str, ...] = ()
    #: the outbox's layout (``outboxLayout``): ``mark`` or ``cursor`` (partitioned, issue #37)
    layout: str = "mark"

    @property
    def faults(self) -> tuple[str, ...]:
        return (self.fault, *self.then)

    @property
    def mode(self) -> str:
        return "uuid-sequencing" if self.sequenced else "at-least-once"

    @property
    def rows(self) -> int:
        # an upper bound: the writers are stopped STEADY_SECONDS after the last fault's recovery
        return int(self.rate * (len(self.faults) * (self.duration + 60) + 60))


@dataclass
class OutageResult:
    outage: Outage
    verdict: Verdict | None = None
    committed: int = 0
    rolled_back: int = 0
    recovery: float | None = None  # seconds from heal to the pre-heal backlog gone (the slowest fault's)
    recoveries: list[tuple[str, float | None]] = field(default_factory=list)  # per fault, in order
    relays_alive: bool = False
    dead_letters: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        v = self.verdict
        if v is None or not self.relays_alive or self.recovery is None or self.dead_letters:
            return False
        if self.outage.sequenced:
            return v.ok
        return v.lost == v.order_violations == v.phantoms == 0


def _via(dsn: str, port: int) -> str:
    params = conninfo_to_dict(dsn)
    params.update(host="127.0.0.1", port=str(port))
    return make_conninfo(**params)  # type: ignore[arg-type]


def run_outage(services: LocalServices, outage: Outage, workdir: Path) -> OutageResult:
    for fault in outage.faults:
        if fault not in FAULTS:
            raise ValueError(f"fault {fault!r}: use one of {', '.join(FAULTS)}")
        needs_kafka = fault.startswith(("broker_", "kafka_"))
        needs_pg = fault.startswith("pg_")
        if (needs_kafka and services.kafka is None) or (needs_pg and services.postgres is None):
            raise RuntimeError(
                f"{fault} needs the locally launched services (not HARVEST_PG_DSN / "
                f"HARVEST_KAFKA_BOOTSTRAP / testcontainers)"
            )
    started = time.monotonic()
    ends = services.endpoints
    tag = uuid.uuid4().hex[:6]
    schema, topic = f"outage_{outage.fault}_{tag}", f"outage-{outage.fault}-{tag}"
    outbox = f"{schema}.outbox"
    workdir.mkdir(parents=True, exist_ok=True)
    from harvest_outbox.producer.schema import OutboxNames
    from harvest_outbox.producer.schema.ddl import init_db

    create_accounts(ends.pg_dsn, schema, outage.keys)
    init_db(ends.pg_dsn, outbox, layout=outage.layout, partition_ids=1000)
    create_topic(ends.kafka_bootstrap, topic, outage.partitions)
    create_topic(ends.kafka_bootstrap, f"{topic}-probe", 1)
    pg_params = conninfo_to_dict(ends.pg_dsn)
    pg_proxy = NetFault(
        (str(pg_params.get("host", "127.0.0.1")), int(pg_params.get("port") or 5432)), name="pg-proxy"
    ).start()
    kafka_proxy: NetFault | None = None
    bootstrap = ends.kafka_bootstrap
    if services.kafka is not None:
        kafka_proxy = NetFault(
            ("127.0.0.1", services.kafka.proxied_listener_port), port=services.kafka.proxy_port, name="kafka-proxy"
        ).start()
        bootstrap = services.kafka.proxied_bootstrap
    cfg = write_config(
        workdir / "harvest.yaml",
        dsn=_via(ends.pg_dsn, pg_proxy.port),
        bootstrap=bootstrap,
        outbox_table=outbox,
        group=f"outage-{tag}",
        uuid_sequencing=outage.sequenced,
        extra_limits={"rowTimeout": outage.row_timeout} if outage.row_timeout else None,
        outbox_layout=outage.layout,
    )
    relays = [RelayProcess(cfg, f"relay-{i}", workdir).start() for i in range(outage.relays)]
    result = OutageResult(outage)
    names = OutboxNames.parse(outbox)
    try:
        wait_for(lambda: current_leader(relays) is not None, 90, "a leader")
        writers = Writers(
            ends.pg_dsn,
            schema,
            outbox,
            topic,
            outage.keys,
            outage.rows,
            threads=3,
            rate_per_s=outage.rate,
            seed=outage.seed,
        ).start()
        wait_for(lambda: writers.stats.committed >= outage.rate * 4 or writers.done, 120, "writers warmed up", poll=0.1)
        for fault in outage.faults:
            _apply(outage, fault, services, pg_proxy, kafka_proxy, result)
            healed = time.monotonic()
            max_id = _probe(ends.pg_dsn, outbox, f"{topic}-probe")
            recovery = _recovery(ends.pg_dsn, names, outage.layout, max_id, healed, timeout=180)
            result.recoveries.append((fault, recovery))
            if recovery is None:
                result.notes.append(f"the backlog of {fault} was not delivered within 180s")
                break
            time.sleep(STEADY_SECONDS)  # rows flow normally again before the next fault (or the end)
        times = [t for _, t in result.recoveries if t is not None]
        if len(times) == len(outage.faults):
            result.recovery = max(times)
        writers.stop()
        writers.join()
        result.committed, result.rolled_back = writers.stats.committed, writers.stats.rolled_back
        wait_for(lambda: _backlog(ends.pg_dsn, names, outage.layout, None) == 0, 180, "the outbox drains", poll=0.2)
        result.relays_alive = all(r.alive for r in relays)
        if not result.relays_alive:
            result.notes.append("relay(s) exited: " + ", ".join(r.name for r in relays if not r.alive))
        for relay in relays:  # the log is final from here on: the read below goes to its end, not to an idle tail
            relay.stop(15)
        truth = committed_versions(ends.pg_dsn, schema)
        delivered = (
            _read_committed(ends.kafka_bootstrap, topic)
            if outage.sequenced
            else _read_raw(ends.kafka_bootstrap, topic, outage.partitions)
        )
        result.verdict = verify("ReadCommittedIter" if outage.sequenced else "raw topic", truth, delivered)
        with psycopg.connect(ends.pg_dsn, connect_timeout=5) as conn:
            result.dead_letters = int(
                conn.execute(sql.SQL("SELECT count(*) FROM {}").format(names.dead_letters)).fetchone()[0]  # type: ignore[index]
            )
        if result.dead_letters:
            result.notes.append(f"{result.dead_letters} row(s) dead-lettered")
    finally:
        for relay in relays:
            relay.stop(15)
        pg_proxy.stop()
        if kafka_proxy is not None:
            kafka_proxy.stop()
        result.seconds = time.monotonic() - started
    return result


def _apply(
    outage: Outage,
    fault: str,
    services: LocalServices,
    pg_proxy: NetFault,
    kafka_proxy: NetFault | None,
    result: OutageResult,
) -> None:
    d = outage.duration
    kafka, pg = services.kafka, services.postgres
    log.info("outage %s (%s) for %.0fs", fault, outage.mode, d)
    if fault == "broker_pause":
        assert kafka is not None
        kafka.pause()
        try:
            time.sleep(d)
        finally:
            kafka.resume()
    elif fault == "broker_kill":
        assert kafka is not None
        kafka.kill()
        t = time.monotonic()
        kafka.start()
        result.notes.append(f"broker down {time.monotonic() - t:.1f}s")
    elif fault == "pg_restart":
        assert pg is not None
        pg.stop("fast")
        pg.start()
    elif fault == "pg_down":
        assert pg is not None
        pg.stop("fast")
        try:
            time.sleep(d)
        finally:
            pg.start()
    else:
        proxy = pg_proxy if fault.startswith("pg_") else kafka_proxy
        assert proxy is not None
        kind = fault.split("_", 1)[1]
        if kind == "blackhole":
            proxy.blackhole()
        elif kind == "reset":
            proxy.reset()
        else:
            proxy.latency(LATENCY_MS)
        try:
            time.sleep(RESET_SECONDS if kind == "reset" else d)
        finally:
            proxy.heal()


def _probe(dsn: str, outbox: str, topic: str) -> int:
    """Commit one probe row (the database may still be coming up); its id is above every row
    committed before it."""
    from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

    deadline = time.monotonic() + 60
    while True:
        try:
            with psycopg.connect(dsn, connect_timeout=5) as conn:
                return Stasher(outbox).stash(conn, OutboxRecord(topic, "probe", "probe"))
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _backlog(dsn: str, names: OutboxNames, layout: str, max_id: int | None) -> int:
    """Committed rows not relayed yet (ids up to ``max_id``): the rows left in the outbox on the mark
    layout, the rows the committed cursor has not passed on the cursor layout (it deletes none)."""
    from harvest_outbox.producer.layouts.choice import layout_for

    with psycopg.connect(dsn, connect_timeout=5) as conn:
        return layout_for(layout).backlog(conn, names, max_id)


def _recovery(dsn: str, names: OutboxNames, layout: str, max_id: int, healed: float, timeout: float) -> float | None:
    while time.monotonic() - healed < timeout:
        try:
            if _backlog(dsn, names, layout, max_id) == 0:
                return time.monotonic() - healed
        except psycopg.Error:
            pass
        time.sleep(0.1)
    return None


def _read_committed(bootstrap: str, topic: str) -> list[tuple[str, int]]:
    """The topic, read committed from its start through the high watermarks taken first (the relays have
    stopped: the log is final), then until nothing more is ready: every record in it, a duplicate or a
    rolled-back row included, without waiting out an idle tail."""
    from harvest_outbox.consumer import ReadCommittedIter
    from harvest_outbox.sequencer import decode_checkpoint

    ends = topic_ends(bootstrap, [topic])
    out: list[tuple[str, int]] = []
    deadline = time.monotonic() + 120
    with ReadCommittedIter({"bootstrap.servers": bootstrap}, topics=[topic]) as it:
        while True:
            rec = it.poll(0.2)
            if rec is not None:
                key, value = rec.key, rec.value
                assert key is not None and value is not None  # the writers' records have both
                out.append((key.decode(), int(json.loads(value)["version"])))
                continue
            read = decode_checkpoint(it.checkpoint())[0]
            if all(read.get(journal, 0) >= end for journal, end in ends.items()):
                while (rec := it.poll(0.2)) is not None:  # anything made ready by the last records read
                    assert rec.key is not None and rec.value is not None
                    out.append((rec.key.decode(), int(json.loads(rec.value)["version"])))
                return out
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {len(out)} records of {topic} in 120s, not through {ends}")


def _read_raw(bootstrap: str, topic: str, partitions: int) -> list[tuple[str, int]]:
    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"outage-check-{uuid.uuid4()}", "enable.auto.commit": False}
    )
    out: list[tuple[str, int]] = []
    try:
        for p in range(partitions):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if hi <= lo:
                continue
            c.assign([TopicPartition(topic, p, lo)])
            last = lo - 1
            deadline = time.monotonic() + 60
            while last < hi - 1 and time.monotonic() < deadline:
                msg = c.poll(1.0)
                if msg is None or msg.error():
                    continue
                offset, key, value = msg.offset(), msg.key(), msg.value()
                assert offset is not None and key is not None and value is not None  # the writers' records have all
                last = offset
                out.append((key.decode(), int(json.loads(value)["version"])))
    finally:
        c.close()
    return out


def table(results: list[OutageResult]) -> str:
    """A Markdown table: fault x mode -> lost / duplicated / reordered, recovery time (a run of several
    faults: one row, its faults joined by ``+``, a recovery time per fault)."""
    lines = [
        "| fault | mode | duration | rows | lost | duplicated | reordered | recovery | relays |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        v = r.verdict
        o = r.outage
        dur = "+".join(
            "1s" if f.endswith("_reset") else "restart" if f in ("broker_kill", "pg_restart") else f"{o.duration:g}s"
            for f in o.faults
        )
        recovered = dict(r.recoveries)
        recovery = "+".join(f"{recovered[f]:.1f}s" if recovered.get(f) is not None else "none" for f in o.faults)
        lines.append(
            f"| {'+'.join(o.faults)} | {o.mode} | {dur} | {r.committed} | {v.lost if v else '?'} | "
            f"{v.duplicates if v else '?'} | {v.order_violations if v else '?'} | "
            f"{recovery} | {'running' if r.relays_alive else 'EXITED'} |"
        )
    return "\n".join(lines)
