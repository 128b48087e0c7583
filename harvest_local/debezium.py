"""Debezium's Postgres connector and outbox event router on a Kafka Connect standalone worker.

The reference harvest's Debezium-compatible table mapping is held against (tests, benchmarks); the
relay never needs it. The jars come from Maven Central (``maven/debezium/pom.xml``, versions pinned
there) like the broker's, and run on the machine's Java 17. Postgres must run with
``wal_level = logical`` (``EmbeddedPostgres(logical_replication=True)``).

One worker JVM (:class:`DebeziumOutbox`) serves any number of connectors (:class:`OutboxConnector`,
one outbox table, slot and publication each), added over the worker's REST API on a loopback port,
so a test module pays the worker's start-up (10-20 s) once. The connector configs, which carry the
database password, only ever travel over that loopback API: no file holds them and nothing here
logs them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harvest_outbox.harvest_local import maven, prereqs
from harvest_outbox.harvest_local.errors import HarvestLocalError, ServiceError
from harvest_outbox.harvest_local.jvm import extra_options
from harvest_outbox.harvest_local.kafka import CONF_DIR, UMASK, count_records
from harvest_outbox.harvest_local.workdir import free_port, tail, work_dir

log = logging.getLogger(__name__)

STRING_CONVERTER = "org.apache.kafka.connect.storage.StringConverter"
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
BYTE_ARRAY_CONVERTER = "org.apache.kafka.connect.converters.ByteArrayConverter"
EVENT_ROUTER = "io.debezium.transforms.outbox.EventRouter"
#: ConnectStandalone exits with 128 + SIGTERM when its shutdown hook ran to the end.
_CLEAN_EXITS = (0, 128 + signal.SIGTERM)


@dataclass(frozen=True)
class OutboxConnector:
    """One Debezium Postgres connector on one outbox table, its records shaped by the EventRouter.

    ``router_options`` are the router's own option names without the ``transforms.outbox.`` prefix
    (``{"route.by.field": "aggregatetype", "table.expand.json.payload": "true"}``);
    ``converters`` sets the connector's ``key.converter`` / ``value.converter`` and their options
    (``{"value.converter": JSON_CONVERTER, "value.converter.schemas.enable": "false"}``), over the
    worker's StringConverter; ``options`` are further connector options, applied last. Slot and
    publication names derive from ``name`` unless given.
    """

    name: str
    table: str  # "schema.table"
    router_options: Mapping[str, str] = field(default_factory=dict)
    converters: Mapping[str, str] = field(default_factory=dict)
    options: Mapping[str, str] = field(default_factory=dict)  # more connector options, e.g. extended.headers.enabled
    slot_name: str = ""
    publication_name: str = ""
    snapshot_mode: str = "no_data"  # only rows committed after the slot exists; "initial" adds the table's rows
    topic_partitions: int = 1  # of the topics the worker creates for the routed records

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.name):
            raise HarvestLocalError(
                f"OutboxConnector name {self.name!r}: use letters, digits, '_', '.', '-' "
                "(it is a URL path segment and the default slot name)"
            )
        if self.table.count(".") != 1:
            raise HarvestLocalError(f"OutboxConnector table {self.table!r}: give it as 'schema.table'")
        slug = re.sub(r"[^a-z0-9_]", "_", self.name.lower())
        # Postgres slot names: lower-case letters, digits and '_', at most 63 characters.
        object.__setattr__(self, "slot_name", self.slot_name or f"dbz_{slug}"[:63])
        object.__setattr__(self, "publication_name", self.publication_name or f"dbz_{slug}"[:63])

    def config(self, pg_dsn: str) -> dict[str, str]:
        """The connector's Connect config; it holds the DSN's password: never log or store it."""
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(pg_dsn)
        host = str(params.get("host") or params.get("hostaddr") or "")
        if not host or host.startswith("/"):
            raise HarvestLocalError(
                f"Debezium connects over TCP: the DSN's host is {host or 'unset'!r}; "
                "give host=<name or address> (and port=) in the DSN"
            )
        config = {
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "tasks.max": "1",
            "plugin.name": "pgoutput",
            "database.hostname": host,
            "database.port": str(params.get("port") or 5432),
            "database.user": str(params.get("user") or ""),
            "database.password": str(params.get("password") or ""),
            "database.dbname": str(params.get("dbname") or params.get("user") or ""),
            "topic.prefix": self.name,
            "table.include.list": re.escape(self.table),  # a regex over "schema.table"
            "slot.name": self.slot_name,
            "publication.name": self.publication_name,
            "publication.autocreate.mode": "filtered",
            "snapshot.mode": self.snapshot_mode,
            "topic.creation.default.replication.factor": "1",
            "topic.creation.default.partitions": str(self.topic_partitions),
            "transforms": "outbox",
            "transforms.outbox.type": EVENT_ROUTER,
            **{f"transforms.outbox.{key}": str(value) for key, value in self.router_options.items()},
            **{key: str(value) for key, value in self.converters.items()},
            **{key: str(value) for key, value in self.options.items()},
        }
        return config


class DebeziumOutbox:
    """A Kafka Connect standalone worker running Debezium outbox connectors; see the module docstring.

    ``start()`` starts the JVM and adds ``connectors``; :meth:`add` adds more later. ``stop()`` is a
    graceful shutdown (Connect flushes its producer and offsets), ``kill()`` a SIGKILL of the JVM
    (fault benchmarks); the slots stay either way, so a restarted worker resumes from them.
    """

    def __init__(
        self,
        pg_dsn: str,
        kafka_bootstrap: str,
        connectors: Iterable[OutboxConnector] = (),
        root: Path | None = None,
        heap: str = "512m",
    ) -> None:
        self.pg_dsn = pg_dsn
        self.kafka_bootstrap = kafka_bootstrap
        self.rest_port = free_port()
        self.root = root or work_dir() / f"debezium-{self.rest_port}-{os.getpid()}"
        self.heap = heap
        self.connectors: dict[str, OutboxConnector] = {}
        self._pending = list(connectors)
        self._proc: subprocess.Popen[bytes] | None = None
        self._java = prereqs.java()
        self._classpath = os.pathsep.join(str(jar) for jar in maven.resolve("debezium"))

    def __repr__(self) -> str:  # the DSN carries a password
        return (
            f"DebeziumOutbox(rest_port={self.rest_port}, root={str(self.root)!r}, connectors={list(self.connectors)})"
        )

    @property
    def pid(self) -> int | None:
        """The worker JVM's process id while it runs (its CPU is the relay's, in benchmarks)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def log_file(self) -> Path:
        return self.root / "connect.log"

    def start(self, timeout: float = 120.0) -> DebeziumOutbox:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        props = self.root / "worker.properties"
        props.write_text("".join(f"{key}={value}\n" for key, value in self._worker_properties().items()))
        with open(os.open(self.root / "stdout.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as out:
            self._proc = subprocess.Popen(
                [
                    self._java,
                    "-Xms128m",
                    f"-Xmx{self.heap}",
                    "-XX:+UseG1GC",
                    "-Djava.awt.headless=true",
                    *extra_options(),
                    f"-Dconnect.logs.dir={self.root}",
                    f"-Dlog4j2.configurationFile={CONF_DIR / 'connect-log4j2.properties'}",
                    "-cp",
                    self._classpath,
                    "org.apache.kafka.connect.cli.ConnectStandalone",
                    str(props),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.root,
                umask=UMASK,
                start_new_session=True,  # a Ctrl-C in the terminal is ours to handle, not the worker's
            )
        try:
            self._wait_rest(timeout)
            pending, self._pending = self._pending, []
            for connector in pending:
                self.add(connector, wait=False)
            for connector in pending:
                self.wait_streaming(connector.name, timeout)
        except BaseException:
            self.kill()
            raise
        return self

    def add(self, connector: OutboxConnector, wait: bool = True, timeout: float = 90.0) -> None:
        """Start ``connector`` on the running worker; with ``wait``, return once it streams."""
        if self._proc is None:
            self._pending.append(connector)
            return
        log_offset = self._log_size()
        try:
            self._rest("PUT", f"/connectors/{connector.name}/config", connector.config(self.pg_dsn))
        except ServiceError as exc:
            # Connect's answer may be an internal error (4.3.0 fails with an NPE on some of Debezium's
            # validation results); the connector's own ERROR lines say what is wrong.
            cause = self._errors_since(log_offset) or "no ERROR line in the log"
            raise ServiceError(
                "debezium",
                f"connector {connector.name!r} failed: {cause} (Connect's answer: {exc.problem})",
                exc.log_tail,
            ) from exc
        self.connectors[connector.name] = connector
        if wait:
            try:
                self.wait_streaming(connector.name, timeout)
            except ServiceError:
                # A connector that never streamed holds nothing worth keeping: don't let it fail
                # every later wait, nor pin WAL with its slot.
                try:
                    self.remove(connector.name)
                except Exception:  # the original error is the one to report
                    log.warning("removing the failed connector %r", connector.name, exc_info=True)
                raise

    def remove(self, name: str, drop_replication: bool = True) -> None:
        """Delete connector ``name`` from the worker; with ``drop_replication``, its slot and publication too."""
        connector = self.connectors.pop(name)
        self._rest("DELETE", f"/connectors/{name}")
        if drop_replication:
            drop_slot_and_publication(self.pg_dsn, connector.slot_name, connector.publication_name)

    def wait_streaming(self, name: str, timeout: float = 90.0) -> None:
        """Until connector ``name`` runs and reads its slot: rows committed from then on are captured."""
        connector = self.connectors[name]
        deadline = time.monotonic() + timeout
        state = "not reported yet"
        while time.monotonic() < deadline:
            self._check_alive()
            status = self._status(name)
            if status:
                tasks = status.get("tasks") or []
                state = f"connector {status['connector']['state']}, tasks {[t.get('state') for t in tasks]}"
                if tasks and all(t.get("state") == "RUNNING" for t in tasks) and self._slot_active(connector):
                    return
            time.sleep(0.25)
        raise ServiceError(
            "debezium",
            f"connector {name!r} not streaming after {timeout:.0f}s ({state}; slot {connector.slot_name!r})",
            tail(self.log_file),
        )

    def wait_for_records(self, topics: Iterable[str], count: int, timeout: float = 60.0) -> int:
        """Until ``topics`` hold at least ``count`` records in all; returns how many they hold."""
        names = list(topics)
        deadline = time.monotonic() + timeout
        held = 0
        while time.monotonic() < deadline:
            self._check_alive()
            for name in self.connectors:  # a task that died on a row publishes nothing more
                self._status(name)
            held = count_records(self.kafka_bootstrap, names)
            if held >= count:
                return held
            time.sleep(0.25)
        raise ServiceError(
            "debezium", f"{held} of {count} records in {names} after {timeout:.0f}s", tail(self.log_file)
        )

    def stop(self, timeout: float = 60.0) -> None:
        """Graceful shutdown: Connect stops the tasks, flushes their records and commits offsets. A
        worker that does not exit in ``timeout``, or exits with an error, is reported, not ignored."""
        proc, self._proc = self._proc, None
        self._forget_connectors()
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise ServiceError(
                "debezium",
                f"worker did not stop within {timeout:.0f}s; killed, so records it had not flushed may be missing",
                tail(self.log_file),
            ) from None
        if code not in _CLEAN_EXITS:
            raise ServiceError("debezium", f"worker exited with {code} while stopping", tail(self.log_file))

    def kill(self) -> None:
        """SIGKILL the worker JVM (a crash, for fault benchmarks); ``start()`` brings it back."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self._forget_connectors()

    def destroy(self) -> None:
        """Kill the worker, drop every connector's slot and publication, remove the folder."""
        self.kill()
        for connector in self._pending:
            drop_slot_and_publication(self.pg_dsn, connector.slot_name, connector.publication_name)
        self._pending.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> DebeziumOutbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # -- internals -----------------------------------------------------------------------------

    def _status(self, name: str) -> dict[str, Any] | None:
        """Connector ``name``'s status from the worker (None before it reports one); raises when
        the connector or a task failed, with the exception and its causes from the trace."""
        status = self._rest("GET", f"/connectors/{name}/status", missing_ok=True)
        if not status:
            return None
        for part in [status["connector"], *(status.get("tasks") or [])]:
            if part.get("state") == "FAILED":
                trace = str(part.get("trace", "")).splitlines()
                causes = [line.strip() for line in trace if line and not line.startswith(("\t", " "))]
                raise ServiceError(
                    "debezium", f"connector {name!r} failed: {' | '.join(causes[:4])}", tail(self.log_file)
                )
        return dict(status)

    def _forget_connectors(self) -> None:
        # A standalone worker keeps no connector configs: a restarted one is given them again and
        # resumes each from its slot and the offsets file.
        self._pending = [*self.connectors.values(), *self._pending]
        self.connectors.clear()

    def _worker_properties(self) -> dict[str, str]:
        return {
            "bootstrap.servers": self.kafka_bootstrap,
            "key.converter": STRING_CONVERTER,
            "value.converter": STRING_CONVERTER,
            "offset.storage.file.filename": str(self.root / "offsets.dat"),
            # Debezium confirms a slot's LSN to Postgres only when Connect commits offsets.
            "offset.flush.interval.ms": "1000",
            "listeners": f"http://127.0.0.1:{self.rest_port}",
            "plugin.discovery": "only_scan",  # everything is on the classpath: no plugin.path
        }

    def _rest(self, method: str, path: str, body: Mapping[str, Any] | None = None, missing_ok: bool = False) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.rest_port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            if missing_ok and exc.code == 404:
                return None
            detail = exc.read().decode(errors="replace")
            try:
                detail = str(json.loads(detail)["message"])
            except (ValueError, KeyError, TypeError):
                pass
            detail = detail[:1000]
            raise ServiceError("debezium", f"{method} {path}: HTTP {exc.code} {detail}", tail(self.log_file)) from exc
        return json.loads(text) if text else None

    def _wait_rest(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                # Jetty answers 404 until Connect has registered its REST resources.
                if self._rest("GET", "/connectors", missing_ok=True) is not None:
                    return
            except (urllib.error.URLError, ConnectionError) as exc:
                last = exc
            time.sleep(0.25)
        raise ServiceError("debezium", f"worker REST API not up after {timeout:.0f}s ({last})", self._log_tail())

    def _check_alive(self) -> None:
        if self._proc is None:
            raise ServiceError("debezium", "worker not started (or stopped)")
        code = self._proc.poll()
        if code is not None:
            self._proc = None
            raise ServiceError("debezium", f"worker JVM exited with {code}", self._log_tail())

    def _log_size(self) -> int:
        try:
            return self.log_file.stat().st_size
        except OSError:
            return 0

    def _errors_since(self, offset: int, limit: int = 1) -> str:
        """The ERROR lines the log gained after ``offset``, each with the exception line under it."""
        try:
            with open(self.log_file, "rb") as f:
                f.seek(offset)
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return ""
        found = []
        for i, line in enumerate(lines):
            if "] ERROR " in line:
                cause = lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith(("\t", "[")) else ""
                found.append(f"{line.split('] ERROR ', 1)[1]}{': ' + cause if cause else ''}")
        return " | ".join(found[:limit])

    def _log_tail(self) -> str:
        return tail(self.log_file) or tail(self.root / "stdout.log")

    def _slot_active(self, connector: OutboxConnector) -> bool:
        import psycopg

        with psycopg.connect(self.pg_dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (connector.slot_name,)
            ).fetchone()
        return bool(row and row[0])


def drop_slot_and_publication(pg_dsn: str, slot_name: str, publication_name: str, timeout: float = 30.0) -> None:
    """Drop a connector's replication slot (once no worker reads it) and its publication.

    A slot left behind pins WAL forever, so a slot still in use after ``timeout`` is an error."""
    import psycopg
    from psycopg import sql

    deadline = time.monotonic() + timeout
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        while True:
            row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot_name,)).fetchone()
            if row is None:
                break
            if not row[0]:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot_name,))
                break
            if time.monotonic() > deadline:
                raise ServiceError(
                    "debezium",
                    f"replication slot {slot_name!r} still in use after {timeout:.0f}s; "
                    "stop the worker reading it, then drop it",
                )
            time.sleep(0.2)
        conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(publication_name)))
