"""Checks for what the machine must provide, each failing with one message: what and how to fix."""

from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

from harvest_outbox.harvest_local.errors import PrerequisiteError

log = logging.getLogger(__name__)

MIN_JAVA = 17


def java() -> str:
    exe = shutil.which("java")
    if exe is None and os.environ.get("JAVA_HOME"):
        candidate = Path(os.environ["JAVA_HOME"]) / "bin" / "java"
        exe = str(candidate) if candidate.exists() else None
    if exe is None:
        raise PrerequisiteError(
            "Java (17 or newer) for the Kafka broker and Spark",
            "install a JDK 17, e.g. `apt-get install openjdk-17-jre-headless`, or set JAVA_HOME",
        )
    out = subprocess.run([exe, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)', out)
    if match and int(match.group(1)) < MIN_JAVA:
        raise PrerequisiteError(
            f"Java {MIN_JAVA}+ (found {match.group(1)} at {exe})",
            "install a JDK 17 and put it first on PATH or in JAVA_HOME",
        )
    return exe


def maven() -> str:
    exe = shutil.which("mvn")
    if exe is None:
        raise PrerequisiteError(
            "Maven (`mvn`), which resolves the Kafka broker and Spark's Kafka source from Maven Central",
            "install it, e.g. `apt-get install maven`",
        )
    return exe


def postgres_bindir() -> Path:
    """The directory holding ``initdb``/``pg_ctl``; installs Debian's postgresql when root."""
    found = _find_postgres_bindir()
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        log.warning("PostgreSQL server binaries not found; installing Debian's `postgresql` with apt-get")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "postgresql"]):
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                raise PrerequisiteError(
                    "PostgreSQL server binaries (initdb, pg_ctl), and `"
                    + " ".join(cmd)
                    + f"` failed: {proc.stderr.strip()[-500:]}",
                    "check network access to Debian's package mirror, or install `postgresql` by hand",
                )
        found = _find_postgres_bindir()
        if found:
            return found
    raise PrerequisiteError(
        "PostgreSQL server binaries (initdb, pg_ctl)",
        "run once as root so the project installs Debian's `postgresql`, or `sudo apt-get install "
        "postgresql`, or set HARVEST_PG_BINDIR, or point the project at a server with HARVEST_PG_DSN",
    )


def _find_postgres_bindir() -> Path | None:
    configured = os.environ.get("HARVEST_PG_BINDIR")
    if configured:
        return Path(configured)
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if versions:
        return Path(versions[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None
