"""The fleet: one process relaying many outboxes, each by a relay of its own (:mod:`producer.fleet.member`).

:class:`Fleet` keeps the set of running members equal to the outboxes the file lists plus those its
discoveries find. A reconciliation first decides (:class:`Change`: outboxes added, removed, changed),
then applies it: removed members are stopped (drained, their elections left, so another process of
the fleet takes them over at once), changed ones stopped and started with the new config, added ones
started. Discovery runs on the fleet's thread every ``discoveryInterval`` and on :meth:`Fleet.reload`
(the CLI calls it on SIGHUP, with the file read again); the same thread keeps the leaderships spread
over the fleet's processes every ``BALANCE_INTERVAL`` (:mod:`producer.fleet.balance`).

Why a relay per outbox: each outbox keeps everything its relay guarantees alone (its election and
fencing, per-key order, its dead-letter policy and mode), and its failures, waits and backlog stay on
its own threads: a lost database, a dropped schema or a poison row holds up that outbox only. What
it costs per outbox is measured in docs/fleet.md.

Invariants (``tests/test_producer/fleet/test_fleet_supervisor.py``):
- one member per outbox id; an outbox's member is stopped and joined before a member with another
  config for that id starts;
- a discovery that fails changes nothing: its entry's outboxes keep running (no flapping tenants
  on a database restart), and the other entries' results still apply;
- a listed outbox wins over a found one naming the same outbox; a found outbox that conflicts with
  another (same id) is skipped with a warning, never started twice;
- ``stop()`` stops every member in parallel and ``wait()`` returns once all stopped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from harvest_outbox.producer.db.shared_listener import ListenHubs
from harvest_outbox.producer.db.statement_pool import StatementPools
from harvest_outbox.producer.election.shared_postgres import ElectionSessions
from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.producer.fleet.balance import BALANCE_INTERVAL, Balance, balanced
from harvest_outbox.producer.fleet.discovery import DiscoveryError, discover
from harvest_outbox.producer.fleet.member import Member, MemberStatus, RelayFactory
from harvest_outbox.producer.fleet.spec import Discovery, FleetFile, Outbox, merged
from harvest_outbox.producer.kafka.shared_admin import SharedAdmins
from harvest_outbox.producer.kafka.shared_producer import SharedProducers
from harvest_outbox.producer.relay.layout_session import LayoutSessions

log = logging.getLogger(__name__)

Discover = Callable[[Discovery], list[tuple[str, str]]]
#: Seconds a reconciliation waits for a leaving outbox's relay before it says so (and waits on).
SLOW_STOP = 30.0


@dataclass(frozen=True)
class Change:
    """What a reconciliation does: ids to start, to stop, and to restart with a new config."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


def decide(running: Mapping[str, Outbox], wanted: Mapping[str, Outbox]) -> Change:
    return Change(
        added=tuple(sorted(set(wanted) - set(running))),
        removed=tuple(sorted(set(running) - set(wanted))),
        changed=tuple(sorted(i for i in set(wanted) & set(running) if wanted[i].config != running[i].config)),
    )


class Fleet:
    """``Fleet(file).start()``; ``reload(file)``; ``stop()``; ``wait()``."""

    def __init__(
        self,
        file: FleetFile,
        *,
        relay_factory: RelayFactory | None = None,
        discover_outboxes: Discover = discover,
    ) -> None:
        self.file = file
        self._factory = relay_factory or self._relay
        self._discover = discover_outboxes
        self._lock = threading.RLock()
        #: One reconciliation at a time (discovery's thread, a reload from a signal, start()).
        self._reconciling = threading.Lock()
        self._members: dict[str, Member] = {}
        #: Per discovery origin, what it found last (kept when a later look fails).
        self._found: dict[str, dict[str, Outbox]] = {}
        #: Conflicts between discoveries already logged (once each).
        self._said: set[tuple[str, str, str]] = set()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        #: Set once the first reconciliation ran: before it, the fleet has not looked for its outboxes.
        self.started = threading.Event()
        self.balance = Balance(self._balanced_leads, self._balanced_outboxes)
        #: One layout session per database for every unsharded outbox's relay (not one per outbox).
        self.layout_sessions = LayoutSessions(file.base_name)
        #: ... and one election session per database for every balanced outbox's Postgres election, and one
        #: LISTEN connection per database for the outboxes this process leads.
        self.election_sessions = ElectionSessions(file.base_name)
        self.listen_hubs = ListenHubs(file.base_name)
        #: One Kafka admin client per cluster (and principal) for every unsharded outbox's preflight.
        self.admins = SharedAdmins()
        #: ... and one pool of statement connections per database for the outboxes this process leads.
        self.statement_pools = StatementPools(file.base_name, file.options.statement_connections)
        #: With fleet.sharedProducer: one Kafka producer per cluster (and settings) for the at-least-once
        #: outboxes this process leads.
        self.producers = SharedProducers(f"harvest-{file.base_name}")

    # ------------------------------------------------------------------ public
    def start(self) -> Fleet:
        self.reload()
        self.started.set()
        self._thread = threading.Thread(target=self._discovery_loop, name="harvest-fleet-discovery", daemon=True)
        self._thread.start()
        log.info(
            "fleet started: %d outbox(es) (%d listed, %d discovery entr%s)",
            len(self._members),
            len(self.file.listed),
            len(self.file.discoveries),
            "y" if len(self.file.discoveries) == 1 else "ies",
        )
        return self

    def reload(self, file: FleetFile | None = None) -> Change:
        """Take a new file (or look again with the same one): discover, then reconcile."""
        with self._reconciling:
            if file is not None:
                self.statement_pools.resize(file.options.statement_connections)
                with self._lock:
                    self.file = file
                    origins = {d.origin for d in file.discoveries}
                    self._found = {k: v for k, v in self._found.items() if k in origins}
            self.discover_now()
            return self._apply()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        with self._lock:
            members = list(self._members.values())
        for member in members:
            member.stop()

    def wait(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
        with self._lock:
            members = list(self._members.values())
        stopped = all(member.join(timeout) for member in members)
        if stopped and self._stop.is_set():
            self.statement_pools.close()  # every relay has given its connections back
            self.admins.close()
            self.producers.close()
        return stopped

    def statuses(self) -> list[MemberStatus]:
        with self._lock:
            members = sorted(self._members.values(), key=lambda m: m.id)
        return [member.status() for member in members]

    def member(self, outbox_id: str) -> Member | None:
        with self._lock:
            return self._members.get(outbox_id)

    # ------------------------------------------------------------------ discovery and reconciliation
    def discover_now(self) -> None:
        """Look with every discovery entry; a failed entry keeps what it found before."""
        for entry in self.file.discoveries:
            try:
                rows = self._discover(entry)
            except DiscoveryError as exc:
                log.warning("%s", exc)
                continue
            found: dict[str, Outbox] = {}
            for dsn, table in rows:
                try:
                    outbox = self.file.outbox(
                        entry.origin, merged(entry.section, {"dataSource": dsn, "outboxTable": table})
                    )
                except ConfigError as exc:
                    log.error("%s: the outbox %s found here cannot be relayed: %s", entry.origin, table, exc)
                    continue
                found[outbox.id] = outbox
            with self._lock:
                before = self._found.get(entry.origin, {})
                if set(found) != set(before):
                    log.info(
                        "%s: %d outbox(es) found (+%d, -%d)",
                        entry.origin,
                        len(found),
                        len(set(found) - set(before)),
                        len(set(before) - set(found)),
                    )
                self._found[entry.origin] = found

    def wanted(self) -> dict[str, Outbox]:
        with self._lock:
            wanted = {o.id: o for o in self.file.listed}
            targets = {o.target: o for o in self.file.listed}
            for origin in sorted(self._found):
                for oid, outbox in sorted(self._found[origin].items()):
                    other = targets.get(outbox.target) or wanted.get(oid)
                    if other is not None:
                        said = (origin, oid, other.origin)
                        if (
                            other.origin.startswith("discover")
                            and other.origin != outbox.origin
                            and said not in self._said
                        ):
                            self._said.add(said)
                            log.warning(
                                "%s found outbox %s, which %s found first; relayed once, as %s's",
                                origin,
                                oid,
                                other.origin,
                                other.origin,
                            )
                        continue
                    wanted[oid] = outbox
                    targets[outbox.target] = outbox
            return wanted

    def apply(self) -> Change:
        """Make the running members what :meth:`wanted` says; returns what changed."""
        with self._reconciling:
            return self._apply()

    def _apply(self) -> Change:
        with self._lock:
            if self._stop.is_set():
                return Change()
            wanted = self.wanted()
            change = decide({i: m.outbox for i, m in self._members.items()}, wanted)
            leaving = [self._members.pop(i) for i in (*change.removed, *change.changed)]
        for member in leaving:
            member.stop()
        for member in leaving:  # in parallel: each stop drains on its own thread
            if not member.join(SLOW_STOP):
                log.warning("outbox %s: its relay is still stopping after %gs; waiting for it", member.id, SLOW_STOP)
                member.join()  # never two relays of one outbox in this process
        with self._lock:
            for oid in (*change.added, *change.changed):
                self._members[oid] = Member(wanted[oid], self.file.options, self._factory).start()
        if change:
            log.info(
                "fleet: %d outbox(es); started %s, stopped %s, restarted %s",
                len(self._members),
                list(change.added) or "none",
                list(change.removed) or "none",
                list(change.changed) or "none",
            )
        return change

    # ------------------------------------------------------------------ balance
    def _relay(self, config: Any) -> Any:
        """An outbox's relay: its layout lock on the database's shared layout session, its statements on the
        database's statement pool; a balanced one's election on the database's shared election session,
        holding back while this process leads its share."""
        from harvest_outbox.producer.relay.sharded import relay_for

        if config.shards > 1:
            return relay_for(config)
        shared = self.layout_sessions.for_dsn(config.data_source)
        listen, admins = self.listen_hubs.listener, self.admins.get
        pool = self.statement_pools.for_dsn(config.data_source)
        extra: dict[str, Any] = {}
        if self.file.options.shared_producer and not config.uuid_sequencing:
            extra["producer_factory"] = self.producers.for_relay(config.name)
        if not balanced(config):
            return relay_for(
                config,
                layout_session=shared,
                listener_factory=listen,
                statement_pool=pool,
                admin_factory=admins,
                **extra,
            )
        election = self.election_sessions.election(
            config.data_source,
            config.outbox_table,
            config.name,
            config.leader_lock_check_interval,
            self.balance.may_acquire,
        )
        return relay_for(
            config,
            election=election,
            layout_session=shared,
            listener_factory=listen,
            statement_pool=pool,
            admin_factory=admins,
            **extra,
        )

    def _balanced_outboxes(self) -> list[tuple[str, str, str]]:
        with self._lock:
            members = list(self._members.values())
        return [
            (m.id, m.outbox.config.data_source, m.outbox.config.outbox_table)
            for m in members
            if balanced(m.outbox.config)
        ]

    def _balanced_leads(self) -> list[str]:
        with self._lock:
            members = list(self._members.values())
        led = []
        for member in members:
            relay = member.status().relay
            if balanced(member.outbox.config) and relay is not None and getattr(relay, "is_leader", False):
                led.append(member.id)
        return led

    def rebalance(self) -> list[str]:
        """Count the fleet's processes and hand over this process's surplus; returns the ids handed over."""
        self.balance.count()
        handed = []
        for oid in self.balance.to_hand_over():
            member = self.member(oid)
            if member is not None and member.handover():
                handed.append(oid)
        if handed:
            log.info(
                "fleet balance: %d process(es), a share of %d; handing over %s",
                self.balance.processes,
                self.balance.share(),
                handed,
            )
        return handed

    def _discovery_loop(self) -> None:
        try:
            self._look_and_balance()
        finally:
            self.balance.close()

    def _look_and_balance(self) -> None:
        next_discovery = time.monotonic() + self.file.options.discovery_interval
        while not self._stop.is_set():
            self._wake.wait(BALANCE_INTERVAL)
            if self._stop.is_set():
                return
            try:
                if self._wake.is_set() or (self.file.discoveries and time.monotonic() >= next_discovery):
                    self._wake.clear()
                    next_discovery = time.monotonic() + self.file.options.discovery_interval
                    self.reload()
                self.rebalance()
            except Exception:  # a bug here must not end discovery for the rest of the process's life
                log.exception("fleet: discovery or balance failed")
