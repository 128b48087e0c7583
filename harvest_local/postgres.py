"""A throw-away PostgreSQL server: ``initdb`` + ``pg_ctl`` on a free loopback port.

initdb refuses to run as root, so under root the server runs as an unprivileged system user
(``HARVEST_PG_USER``, default ``harvestpg``, created when missing), and its folder (data, socket,
log) lives where that user can reach it, outside the checkout: :mod:`harvest_local.pgdirs` says
where, and sweeps the folders (and servers) of runs that were killed. Password authentication is
on (scram-sha-256 over TCP) so DSNs carry a real secret, as in production.

With ``tls`` (a :class:`~harvest_local.tls.TlsFiles`) the server is set up as docs/security.md, "TLS to
Postgres", tells production to be (``tests/test_security/test_postgres_tls.py``):

- ``ssl = on`` with the certificate and key copied into the data folder, owned by the server's OS user,
  mode 0600 (Postgres refuses a key others can read);
- TCP is ``hostssl`` only (scram-sha-256 from 127.0.0.1); a ``hostnossl`` connection is rejected; the
  Unix socket stays ``trust``, for the harness's own admin work (:attr:`EmbeddedPostgres.socket_dsn`);
- :attr:`EmbeddedPostgres.dsn` verifies the server: ``sslmode=verify-full sslrootcert=<the CA>``.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from harvest_outbox.harvest_local import pgdirs, prereqs
from harvest_outbox.harvest_local.errors import ServiceError
from harvest_outbox.harvest_local.workdir import free_port, tail

if TYPE_CHECKING:  # tls.py needs cryptography (the local extra); a plain server runs without it
    from harvest_outbox.harvest_local.tls import TlsFiles

log = logging.getLogger(__name__)

SUPERUSER = "harvest"
DEFAULT_DATABASE = "harvest"
#: The certificate and key a ``tls`` server serves, in its data folder (Postgres' default names).
CERT_FILE, KEY_FILE = "server.crt", "server.key"
#: A ``tls`` server's pg_hba.conf: the socket as initdb makes it, TCP over TLS only.
TLS_HBA = (
    "# harvest_local: TCP over TLS only (hostssl); the Unix socket for the harness's own admin work\n"
    "local all all trust\n"
    "local replication all trust\n"
    "hostnossl all all 0.0.0.0/0 reject\n"
    "hostnossl all all ::/0 reject\n"
    "hostssl all all 127.0.0.1/32 scram-sha-256\n"
)


class EmbeddedPostgres:
    def __init__(
        self,
        root: Path | None = None,
        port: int | None = None,
        password: str | None = None,
        logical_replication: bool = False,
        max_prepared_transactions: int = 0,
        *,
        standby_of: EmbeddedPostgres | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        """``root``: the server's folder; by default one claimed (and locked) by :func:`pgdirs.claim`
        after sweeping those of dead runs. A given ``root`` is used as is and never swept.
        ``logical_replication``: ``wal_level = logical`` (Debezium's pgoutput slots); off by default
        because it adds to the WAL every row writes, which the relay benchmarks measure.
        ``max_prepared_transactions``: > 0 lets sessions PREPARE TRANSACTION (two-phase-commit writers);
        0, Postgres' default, refuses it. ``standby_of``: a streaming replica of that (running) server, made
        by ``pg_basebackup`` (its password, its database), which :meth:`promote` turns into a primary
        (:meth:`wait_for_standby` makes a primary's commits wait for one). ``tls``: TCP over verified TLS
        only (the module docstring); not with ``standby_of``."""
        if tls is not None and standby_of is not None:
            raise ValueError("tls: a standby copies its primary's set-up; give tls to the primary only")
        self.tls = tls
        self.port = port or free_port()
        self.logical_replication = logical_replication
        self.max_prepared_transactions = max_prepared_transactions
        self.standby_of = standby_of
        self.application_name = f"standby_{self.port}"  # how a primary names this server as its standby
        self.password: str = standby_of.password if standby_of is not None else password or os.urandom(12).hex()
        self.database = DEFAULT_DATABASE
        self._bindir = prereqs.postgres_bindir()
        self._user = pgdirs.server_user()
        self._instance: pgdirs.Instance | None = None
        if root is None:
            pgdirs.sweep(stop_leftover)
            self._instance = pgdirs.claim(f"{pgdirs.PREFIX}{self.port}-{os.getpid()}", self._user)
            root = self._instance.path
        self.root = root
        self.data = self.root / "data"
        self.log_file = self.root / "postgres.log"

    @property
    def dsn(self) -> str:
        verify = f" sslmode=verify-full sslrootcert={self.tls.ca}" if self.tls is not None else ""
        return (
            f"host=127.0.0.1 port={self.port} user={SUPERUSER} password={self.password} "
            f"dbname={self.database} connect_timeout=5{verify}"
        )

    @property
    def socket_dsn(self) -> str:
        """The superuser over the Unix socket (``trust``, no TLS): admin work whatever the certificate."""
        return f"host={self.data} port={self.port} user={SUPERUSER} dbname={self.database}"

    def serve_certificate(self, files: TlsFiles, timeout: float = 10.0) -> None:
        """Serve ``files``' certificate and key from now on (new connections; ``pg_reload_conf()``), e.g. an
        expired one signed by the same CA (``make_server_files(..., expired=True, signed_by=server.tls)``),
        then ``server.tls`` again."""
        import psycopg

        if self.tls is None:
            raise ValueError("serve_certificate: this server was made without tls; give EmbeddedPostgres(tls=...)")
        self._install_certificate(files)
        with psycopg.connect(self.socket_dsn, autocommit=True) as conn:
            before = conn.execute("SELECT pg_conf_load_time()").fetchone()
            conn.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # a new session's load time is the postmaster's: reloaded when later
            with psycopg.connect(self.socket_dsn, autocommit=True) as conn:
                if conn.execute("SELECT pg_conf_load_time()").fetchone() != before:
                    return
            time.sleep(0.05)
        raise ServiceError("postgres", f"the certificate was not reloaded within {timeout:.0f}s", tail(self.log_file))

    def __repr__(self) -> str:  # never show the password
        return f"EmbeddedPostgres(port={self.port}, data={str(self.data)!r})"

    def start(self, timeout: float = 60.0) -> EmbeddedPostgres:
        if not (self.data / "PG_VERSION").exists():
            self._initdb() if self.standby_of is None else self._base_backup()
        self._pg_ctl("start", "-w", "-t", str(int(timeout)), "-l", str(self.log_file), "-o", f"-p {self.port}")
        self._wait_ready(timeout)
        return self

    def promote(self, timeout: float = 60.0) -> None:
        """A standby becomes a primary (fail-over): it stops replaying and accepts writes."""
        self._pg_ctl("promote", "-w", "-t", str(int(timeout)))

    def wait_for_standby(self, standby: EmbeddedPostgres | None) -> None:
        """Synchronous replication: every commit returns once ``standby`` has flushed it
        (``synchronous_standby_names``, ``synchronous_commit = on``); None: asynchronous again. Set after the
        standby's base backup (which would copy it) and the database's creation (which would wait)."""
        import psycopg

        name = standby.application_name if standby is not None else ""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{name}'")
            conn.execute("SELECT pg_reload_conf()")

    def in_recovery(self) -> bool:
        """Is this server a standby (replaying WAL, read-only)?"""
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        return bool(row and row[0])

    def stop(self, mode: str = "fast") -> None:
        """Stop the server, keeping its data (``start()`` brings it back on the same port)."""
        if (self.data / "postmaster.pid").exists():
            self._pg_ctl("stop", "-w", "-m", mode, check=False)

    def kill(self, timeout: float = 10.0) -> None:
        """Crash the server (fault tests): SIGKILL the postmaster and every process it started, so
        nothing is flushed on the way down (asynchronous commits not yet written are lost, as in a
        power cut of the database host); ``start()`` recovers from the WAL."""
        pid_file = self.data / "postmaster.pid"
        if not pid_file.exists():
            return
        pid = int(pid_file.read_text().split()[0])
        try:
            os.kill(pid, signal.SIGSTOP)  # no new backends while its children are collected
        except ProcessLookupError:
            return
        victims = [*_children(pid), pid]
        for victim in victims:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while any(Path(f"/proc/{v}").exists() for v in victims) and time.monotonic() < deadline:
            time.sleep(0.02)

    def destroy(self) -> None:
        self.stop("immediate")
        if self._instance is not None:
            self._instance.release()
        else:
            shutil.rmtree(self.root, ignore_errors=True)

    @property
    def link(self) -> Path | None:
        """Under root, the work dir's symlink to :attr:`root` (which lives outside the checkout)."""
        return self._instance.link if self._instance else None

    @property
    def os_user(self) -> str:
        """The OS user the server runs as."""
        return self._user.name if self._user else _current_user()

    # -- internals -----------------------------------------------------------------------------

    def _initdb(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self._user:
            os.chown(self.root, self._user.uid, self._user.gid)
            pgdirs.check_reachable(self.root, self._user, self._unreachable_fix())
        pwfile = self.root / ".pw"
        pwfile.write_text(self.password + "\n")
        os.chmod(pwfile, 0o600)
        if self._user:
            os.chown(pwfile, self._user.uid, self._user.gid)
        proc = self._run(
            [
                str(self._bindir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                SUPERUSER,
                f"--pwfile={pwfile}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ],
        )
        pwfile.unlink()
        if proc.returncode != 0:
            raise ServiceError(
                "postgres",
                f"initdb (as user {self.os_user!r}, data folder {self.data}) failed: {proc.stderr.strip()[-800:]}",
            )
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                "\n# harvest_local: loopback only, socket in the data dir, sized for tests\n"
                "listen_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.data}'\n"
                # a relay fleet holds ~5 connections per outbox per process (docs/fleet.md)
                "max_connections = 400\n"
                "shared_buffers = 128MB\n"
                "fsync = on\n"
                "synchronous_commit = on\n"
                "max_wal_size = 1GB\n"
                "log_min_messages = warning\n"
                "log_line_prefix = '%m [%p] %u@%d '\n"
            )
            if self.logical_replication:
                # One slot and one WAL sender per Debezium connector; a test may run several at once.
                conf.write("wal_level = logical\nmax_replication_slots = 20\nmax_wal_senders = 20\n")
            if self.max_prepared_transactions:
                conf.write(f"max_prepared_transactions = {int(self.max_prepared_transactions)}\n")
            if self.tls is not None:
                conf.write(f"ssl = on\nssl_cert_file = '{CERT_FILE}'\nssl_key_file = '{KEY_FILE}'\n")
        if self.tls is not None:
            self._install_certificate(self.tls)
            self._write_as_server(self.data / "pg_hba.conf", TLS_HBA.encode())

    def _base_backup(self) -> None:
        """A standby's data folder: the primary's, streamed by ``pg_basebackup`` with ``-R`` (it writes
        ``standby.signal`` and ``primary_conninfo``), then this server's own port and name."""
        primary = self.standby_of
        assert primary is not None
        self.root.mkdir(parents=True, exist_ok=True)
        if self._user:
            os.chown(self.root, self._user.uid, self._user.gid)
        passfile = self.root / ".pgpass"
        passfile.write_text(f"127.0.0.1:{primary.port}:*:{SUPERUSER}:{self.password}\n")
        os.chmod(passfile, 0o600)
        if self._user:
            os.chown(passfile, self._user.uid, self._user.gid)
        proc = self._run(
            [
                str(self._bindir / "pg_basebackup"),
                "-D",
                str(self.data),
                "-h",
                "127.0.0.1",
                "-p",
                str(primary.port),
                "-U",
                SUPERUSER,
                "-X",
                "stream",
                "-R",
                "--no-sync",
                "--checkpoint=fast",  # the default, spread, paces the primary's checkpoint over minutes
                "-d",
                f"application_name={self.application_name} passfile={passfile}",
            ],
        )
        if proc.returncode != 0:
            raise ServiceError(
                "postgres",
                f"pg_basebackup from port {primary.port} into {self.data} failed: {proc.stderr.strip()[-800:]}",
            )
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"\n# harvest_local: a standby of port {primary.port}\nunix_socket_directories = '{self.data}'\n"
            )
            conf.write("synchronous_standby_names = ''\nhot_standby = on\n")

    def _install_certificate(self, files: TlsFiles) -> None:
        self._write_as_server(self.data / CERT_FILE, files.cert.read_bytes())
        self._write_as_server(self.data / KEY_FILE, files.key.read_bytes())

    def _write_as_server(self, path: Path, data: bytes) -> None:
        """``path`` holding ``data``, the server user's, 0600 before a byte lands in it; replaced whole
        (renamed into place), so the server never reads half a key."""
        partial = path.with_name(path.name + ".partial")
        partial.unlink(missing_ok=True)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            if self._user:
                os.fchown(fd, self._user.uid, self._user.gid)
            out.write(data)
        os.replace(partial, path)

    def _pg_ctl(self, *args: str, check: bool = True) -> None:
        proc = self._run([str(self._bindir / "pg_ctl"), "-D", str(self.data), *args])
        if check and proc.returncode != 0:
            raise ServiceError(
                "postgres",
                f"pg_ctl {args[0]} (as user {self.os_user!r}, data folder {self.data}) "
                f"failed: {proc.stderr.strip()[-500:]}",
                tail(self.log_file),
            )

    def _run(self, cmd: list[str]) -> subprocess.CompletedProcess[str]:
        kwargs: dict[str, object] = {}
        if self._user:
            kwargs.update(user=self._user.uid, group=self._user.gid, extra_groups=[])
        return subprocess.run(cmd, capture_output=True, text=True, cwd=str(self.root), **kwargs)  # type: ignore[call-overload]

    def _unreachable_fix(self) -> str:
        if self._instance is None:
            return f"pass a root folder that {self.os_user!r} can write, or run as a non-root user"
        return (
            f"set HARVEST_PG_RUN_DIR to a folder {self.os_user!r} can reach (default {pgdirs.DEFAULT_RUN_DIR}), "
            "or run as a non-root user, or point the project at an existing server with HARVEST_PG_DSN"
        )

    def _wait_ready(self, timeout: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(self.dsn.replace(f"dbname={self.database}", "dbname=postgres")) as conn:
                    conn.autocommit = True
                    exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)).fetchone()
                    if not exists and self.standby_of is None:  # a standby has the primary's (read-only)
                        conn.execute(f'CREATE DATABASE "{self.database}"')
                return
            except psycopg.OperationalError as exc:
                last = exc
                time.sleep(0.2)
        raise ServiceError("postgres", f"not ready after {timeout:.0f}s ({last})", tail(self.log_file))


def stop_leftover(folder: Path) -> None:
    """Stop the server a killed run may have left running in the instance folder ``folder`` (the
    ``stop_server`` of :func:`pgdirs.sweep`): an immediate shutdown, as the user it runs as."""
    kwargs: dict[str, object] = {}
    user = pgdirs.server_user()
    if user:
        kwargs.update(user=user.uid, group=user.gid, extra_groups=[])
    cmd = [
        str(prereqs.postgres_bindir() / "pg_ctl"),
        "-D",
        str(folder / "data"),
        "stop",
        "-w",
        "-t",
        "30",
        "-m",
        "immediate",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(folder), **kwargs)  # type: ignore[call-overload]
    if proc.returncode == 0:
        log.info("stopped the Postgres server a killed run left running in %s", folder)


def _current_user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # field 4: ppid
            found.append(int(entry.name))
    return found
