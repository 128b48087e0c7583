"""A throw-away Postgres primary with a synchronous streaming standby, and fail-over between them (issue #45).

Clients connect with :attr:`ReplicatedPostgres.dsn`: both servers' ports and
``target_session_attrs=read-write``, so libpq connects to whichever accepts writes, and a client whose
connection dies reconnects to the new primary after a fail-over without being told.

:meth:`ReplicatedPostgres.failover` is what a fail-over manager (Patroni, a cloud's) does when the primary's
host is lost: the primary is killed (every server process, kill -9: nothing it had not flushed survives), the
standby promoted, and -- the old host being gone for good -- a new standby built from the new primary
(``pg_basebackup``, a fresh data folder) on the old primary's port, which commits then wait for again. So
the DSN never changes and the pair is ready for the next fail-over (a soak's next run). Rebuilding rather
than rewinding the old primary: ``pg_rewind`` needs ``wal_log_hints`` or checksums and a clean shutdown
first, and a fresh copy is what replaces a lost host anyway.

Invariants (tests/test_producer/cluster/test_pg_failover.py, tests/test_e2e/test_faults.py): after :meth:`start`
and after :meth:`failover`, a commit on the primary returns only once the standby has flushed it
(``synchronous_standby_names`` names it, ``synchronous_commit = on``), so a promoted standby holds every
commit a client saw return; :attr:`dsn` is the same before and after. Between the promotion and the new
standby's start (a few seconds, inside :meth:`failover`) the new primary runs alone.
"""

from __future__ import annotations

from harvest_outbox.harvest_local.postgres import SUPERUSER, EmbeddedPostgres


class ReplicatedPostgres:
    """A primary and its synchronous standby (:attr:`primary`, :attr:`standby`: they swap on a fail-over)."""

    def __init__(self) -> None:
        self.primary = EmbeddedPostgres()
        self._standby: EmbeddedPostgres | None = None
        self._ports = (self.primary.port, 0)
        self.failovers = 0

    @property
    def standby(self) -> EmbeddedPostgres:
        if self._standby is None:
            raise RuntimeError("ReplicatedPostgres has no standby: start() it (a failover() that failed leaves none)")
        return self._standby

    @property
    def dsn(self) -> str:
        """Both servers; libpq connects to the one that accepts writes."""
        p = self.primary
        return (
            f"host=127.0.0.1,127.0.0.1 port={self._ports[0]},{self._ports[1]} user={SUPERUSER} "
            f"password={p.password} dbname={p.database} connect_timeout=5 target_session_attrs=read-write"
        )

    def __repr__(self) -> str:  # never show the password
        return f"ReplicatedPostgres(primary={self.primary!r}, standby={self._standby!r})"

    def start(self) -> ReplicatedPostgres:
        try:
            self.primary.start()
            self._standby = self._new_standby(port=None)
            self._ports = (self.primary.port, self._standby.port)
        except BaseException:
            self.destroy()
            raise
        return self

    def failover(self) -> int:
        """Kill the primary, promote the standby, and build a new synchronous standby on the old primary's
        port (module doc); returns the new primary's port."""
        old, new = self.primary, self.standby
        old.kill()  # the host is lost: nothing it had not flushed survives
        new.promote()
        self.primary, self._standby = new, None
        old.destroy()  # its data folder and its port go; its port is reused for the new standby
        self._standby = self._new_standby(port=old.port)
        self.failovers += 1
        return new.port

    def destroy(self) -> None:
        for server in (self._standby, self.primary):
            if server is not None:
                server.destroy()

    def _new_standby(self, port: int | None) -> EmbeddedPostgres:
        """A streaming copy of the primary, then the primary's commits wait for it (set after the base backup,
        which would copy the setting into the standby, and so to the primary it may become)."""
        standby = EmbeddedPostgres(port=port, standby_of=self.primary).start()
        self.primary.wait_for_standby(standby)
        return standby
