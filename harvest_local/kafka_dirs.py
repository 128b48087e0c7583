"""The embedded brokers' folders, and the sweep of those that killed runs left behind, with their JVMs.

A broker's folder is ``<work dir>/kafka-<port>-<pid>``, a cluster's ``<work dir>/kafka-cluster-<port>-<pid>``
(its nodes' folders inside). The JVMs run in sessions of their own (a Ctrl-C in the terminal is their
owner's to handle), so an owner killed with SIGKILL leaves its brokers running, each holding a JVM heap, a
core's share of CPU now and then and every message of the run on disk; a benchmark run beside them measures
them too. :func:`sweep`, at every start of a broker or cluster (:func:`take`), ends them.

Invariants (tests/test_foundation/test_kafka_dirs.py):
- K1: the process that owns a top-level broker folder holds an ``flock`` on its sibling ``<folder>.lock`` for
  the folder's lifetime (:func:`claim`); the kernel drops the lock when that process dies, however it dies,
  and pids being reused does not matter;
- K2: :func:`sweep` removes exactly the folders whose lock it can take, first killing every process whose
  command line names the folder (the JVMs of its broker or nodes); a live run's folder is never touched;
- K3: a folder from before the locks (no ``.lock``) is swept only when no process has the pid in its name.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import time
from pathlib import Path

from harvest_outbox.harvest_local.pgdirs import try_lock
from harvest_outbox.harvest_local.workdir import work_dir

log = logging.getLogger(__name__)

_LOCK_SUFFIX = ".lock"
#: A top-level broker or cluster folder: ``kafka-<port>-<pid>``, ``kafka-cluster-<port>-<pid>``.
_FOLDER = re.compile(r"^kafka-(?:cluster-)?\d+-(\d+)$")
#: How long a killed JVM may take to go (SIGKILL: the kernel's time to tear down its memory).
_KILL_WAIT = 10.0


class Claim:
    """The lock on a broker folder, held for the folder's lifetime (K1)."""

    def __init__(self, lock_path: Path, fd: int) -> None:
        self.lock_path, self._fd = lock_path, fd

    def release(self) -> None:
        """After the folder is gone: drop the lock file, then the lock (unlinked while held, so a sweeper
        never removes a newer claim's file)."""
        if self._fd < 0:
            return
        self.lock_path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = -1


def take(folder: Path) -> Claim | None:
    """A broker start's part: for a top-level broker folder, :func:`sweep` the leftovers of runs that are
    gone, then :func:`claim` ``folder``; None (and no sweep) for a cluster's node, whose cluster did both."""
    if not _top_level(folder):
        return None
    sweep()
    return claim(folder)


def _top_level(folder: Path) -> bool:
    return folder.parent == work_dir() and _FOLDER.match(folder.name) is not None


def claim(folder: Path) -> Claim | None:
    """Hold ``folder``'s lock (K1); None for a folder that is not a top-level broker folder of the work dir
    (a cluster's node: its cluster's claim covers it), or when another process holds it."""
    if not _top_level(folder):
        return None
    lock_path = folder.with_name(folder.name + _LOCK_SUFFIX)
    fd = try_lock(lock_path, create=True)
    return None if fd is None else Claim(lock_path, fd)


def sweep() -> list[Path]:
    """Remove the broker folders of runs that are gone, their JVMs first (K2, K3); returns what was removed."""
    removed: list[Path] = []
    work = work_dir()
    if not work.is_dir():
        return removed
    for folder in sorted(work.iterdir()):
        match = _FOLDER.match(folder.name)
        if match is None or folder.is_symlink() or not folder.is_dir():
            continue
        lock_path = folder.with_name(folder.name + _LOCK_SUFFIX)
        fd: int | None = None
        if lock_path.exists():
            try:
                fd = try_lock(lock_path, create=False)
            except OSError:
                continue  # not ours to open, or gone meanwhile
            if fd is None:
                continue  # its run is alive (K2)
        elif _alive(int(match.group(1))):
            continue  # from before the locks, and its owner may still run (K3)
        try:
            killed = _kill_naming(folder)
            shutil.rmtree(folder, ignore_errors=True)
            if fd is not None:
                lock_path.unlink(missing_ok=True)
            removed.append(folder)
            log.info(
                "removed %s, left by a run that ended without cleaning up%s",
                folder,
                f" (killed its {len(killed)} broker process(es): {', '.join(map(str, killed))})" if killed else "",
            )
        finally:
            if fd is not None:
                os.close(fd)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_naming(folder: Path) -> list[int]:
    """SIGKILL every process whose command line names ``folder`` (its brokers' JVMs), and wait until they
    are gone; returns their pids."""
    needle = str(folder).encode()
    killed: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        if needle + b"/" in cmdline or cmdline.endswith(needle) or needle + b"\0" in cmdline:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + _KILL_WAIT
    while any(_running(pid) for pid in killed) and time.monotonic() < deadline:
        time.sleep(0.05)
    return killed


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed child of ours stays one until reaped; an orphan is reaped by init)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False
