"""Resolve the jars of a checked-in pom (``maven/<name>/pom.xml``) into the work folder, once.

Invariant: ``resolve(name)`` returns the jars of exactly the current pom; a changed pom (or
settings.xml) is resolved again, an unchanged one costs a hash and a directory listing.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import shutil
import subprocess
from pathlib import Path

from harvest_outbox.harvest_local import prereqs
from harvest_outbox.harvest_local.errors import PrerequisiteError
from harvest_outbox.harvest_local.workdir import work_dir

log = logging.getLogger(__name__)

MAVEN_DIR = Path(__file__).resolve().parent / "maven"


def resolve(name: str) -> list[Path]:
    pom = MAVEN_DIR / name / "pom.xml"
    settings = MAVEN_DIR / "settings.xml"
    digest = hashlib.sha256(pom.read_bytes() + settings.read_bytes()).hexdigest()
    dest = work_dir() / "maven" / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = dest / ".pom-sha256"
        if not (stamp.is_file() and stamp.read_text() == digest):
            _copy_dependencies(name, pom, settings, dest)
            stamp.write_text(digest)
    return sorted(dest.glob("*.jar"))


def _copy_dependencies(name: str, pom: Path, settings: Path, dest: Path) -> None:
    mvn = prereqs.maven()
    staging = dest.with_name(dest.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    log.info("resolving %s jars from Maven Central (first run only)", name)
    cmd = [
        mvn,
        "-B",
        "-q",
        "-gs",
        str(settings),
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr).strip()
        errors = [line for line in output.splitlines() if "ERROR" in line][:3]
        raise PrerequisiteError(
            f"the {name} jars from Maven Central (`mvn dependency:copy-dependencies` failed: "
            + (" | ".join(errors) or output[-500:])
            + ")",
            "check network access to Maven Central (repo.maven.apache.org) or configure a mirror in ~/.m2/settings.xml",
        )
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)
