"""A throw-away Apicurio Registry (in-memory storage) on loopback, with its Confluent-compatible API.

What the schema-registry tests and benchmarks encode against (``producer/encode/serialization.py``); the
relay never needs it. The app comes from Maven Central (``maven/registry/pom.xml``, version pinned
and the choice of version explained there). Maven Central has its classes, not a runnable jar: a
Quarkus app is augmented at build time, so the first use runs ``mvn package`` on that pom once
(about 2 minutes; the quarkus-maven-plugin's build goal) into the work folder, and every later
start runs the jar it built (10-20 s to ready).

Invariants: :meth:`EmbeddedRegistry.url` is the base URL confluent-kafka's ``SchemaRegistryClient``
takes; ``stop()`` then ``start()`` brings the registry back on the same port *empty* (in-memory
storage: a test that stops it re-registers what it needs); the built jar matches the current pom
(a changed pom or settings.xml is built again).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from harvest_outbox.harvest_local import prereqs
from harvest_outbox.harvest_local.child_process import kill_child, stop_child
from harvest_outbox.harvest_local.errors import PrerequisiteError, ServiceError
from harvest_outbox.harvest_local.jvm import extra_options
from harvest_outbox.harvest_local.kafka import UMASK
from harvest_outbox.harvest_local.maven import MAVEN_DIR
from harvest_outbox.harvest_local.workdir import free_port, tail, work_dir

log = logging.getLogger(__name__)

#: The Confluent-compatible API of Apicurio 2.0 (the v6 paths confluent-kafka's client uses).
CCOMPAT_PATH = "/apis/ccompat/v6"
RUNNER_JAR = "apicurio-registry-local-1-runner.jar"


def build() -> Path:
    """The runnable registry jar of the current pom, built once (``mvn package``) and reused."""
    pom = MAVEN_DIR / "registry" / "pom.xml"
    settings = MAVEN_DIR / "settings.xml"
    digest = hashlib.sha256(pom.read_bytes() + settings.read_bytes()).hexdigest()
    dest = work_dir() / "maven" / "registry-build"
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / ".registry-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = dest / ".pom-sha256"
        jar = dest / "target" / RUNNER_JAR
        if not (stamp.is_file() and stamp.read_text() == digest and jar.is_file()):
            _package(pom, settings, dest)
            stamp.write_text(digest)
    return jar


def _package(pom: Path, settings: Path, dest: Path) -> None:
    mvn = prereqs.maven()
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    shutil.copy(pom, dest / "pom.xml")
    log.info("building Apicurio Registry from Maven Central (first run only, ~2 min)")
    cmd = [mvn, "-B", "-q", "-gs", str(settings), "-f", str(dest / "pom.xml"), "package", "-DskipTests"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=dest)
    if proc.returncode != 0 or not (dest / "target" / RUNNER_JAR).is_file():
        output = (proc.stdout + proc.stderr).strip()
        errors = [line for line in output.splitlines() if "ERROR" in line][:3]
        raise PrerequisiteError(
            "Apicurio Registry built from Maven Central (`mvn package` on harvest_local/maven/registry/pom.xml "
            "failed: " + (" | ".join(errors) or output[-500:]) + ")",
            "check network access to Maven Central or configure a mirror in ~/.m2/settings.xml",
        )


class EmbeddedRegistry:
    """One registry JVM on ``127.0.0.1:<port>``; see the module docstring."""

    def __init__(self, root: Path | None = None, port: int | None = None, heap: str = "384m") -> None:
        self.port = port or free_port()
        self.root = root or work_dir() / f"registry-{self.port}-{os.getpid()}"
        self.heap = heap
        self._proc: subprocess.Popen[bytes] | None = None
        self._java = prereqs.java()
        self._jar = build()

    @property
    def url(self) -> str:
        """The base URL for ``SchemaRegistryClient({"url": ...})``."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}"

    @property
    def log_file(self) -> Path:
        return self.root / "stdout.log"

    def __repr__(self) -> str:
        return f"EmbeddedRegistry(url={self.url!r}, root={str(self.root)!r})"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 120.0) -> EmbeddedRegistry:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(os.open(self.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as out:
            self._proc = subprocess.Popen(
                [
                    self._java,
                    "-Xms64m",
                    f"-Xmx{self.heap}",
                    "-XX:+UseSerialGC",  # a small heap on a shared 2-core machine
                    "-XX:TieredStopAtLevel=1",  # faster start; the registry is not the bottleneck
                    "-Djava.awt.headless=true",
                    *extra_options(),
                    f"-Dquarkus.http.port={self.port}",
                    "-Dquarkus.http.host=127.0.0.1",
                    "-Dquarkus.log.console.color=false",
                    "-jar",
                    str(self._jar),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.root,
                umask=UMASK,
                start_new_session=True,  # a Ctrl-C in the terminal is ours to handle, not the registry's
            )
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.kill()
            raise
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (Quarkus shuts down cleanly); the stored schemas are gone (in-memory storage)."""
        proc, self._proc = self._proc, None
        stop_child(proc, timeout)

    def kill(self) -> None:
        proc, self._proc = self._proc, None
        kill_child(proc)

    def destroy(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def register(self, subject: str, schema: str, schema_type: str = "AVRO") -> int:
        """Register ``schema`` under ``subject`` over the Confluent API; returns its global id."""
        body: dict[str, Any] = {"schema": schema}
        if schema_type != "AVRO":
            body["schemaType"] = schema_type
        answer = self._request("POST", f"/subjects/{subject}/versions", body)
        return int(answer["id"])

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return json.loads(reply.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise ServiceError("registry", f"{method} {path}: HTTP {exc.code} {exc.read()[:300]!r}") from exc

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise ServiceError("registry", f"exited with code {self._proc.returncode}", tail(self.log_file))
            try:
                with urllib.request.urlopen(self.url + "/subjects", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except (OSError, urllib.error.URLError) as exc:
                last = str(exc)
            time.sleep(0.3)
        raise ServiceError("registry", f"not ready after {timeout:.0f}s ({last})", tail(self.log_file))
