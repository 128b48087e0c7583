"""Where the embedded Postgres keeps its files, and the sweep of those that killed runs left behind.

Postgres refuses to run as root, so under root the server runs as an unprivileged user
(:func:`server_user`). That user often cannot reach the checkout at all: ``/root`` and every
``mktemp -d`` folder are mode 0700. So under root the server's files never live in the checkout:

- not root: the server runs as the caller; its instance folder is ``<work dir>/postgres-<port>-<pid>``
  (the work dir is ``.work/`` or ``$HARVEST_WORK_DIR``, see :mod:`harvest_local.workdir`).
- root: the instance folder is ``<run dir>/<checkout>-<hash>/postgres-<port>-<pid>``, owned by the
  server user, mode 0700. The run dir (``$HARVEST_PG_RUN_DIR``, default ``/var/tmp/harvest-postgres``)
  and the per-checkout folders in it are owned and writable by root only, so no other user (the
  server user included) can plant or swap entries that root later opens or removes. The hash is of
  the checkout's work dir path: two checkouts never share a folder. ``<work dir>/postgres-<port>-<pid>``
  is a symlink to the instance folder, so the server log is where it always was.

Invariants:
- the permissions of folders this module did not create are never changed;
- every instance folder has a sibling ``<name>.lock`` that the process owning the instance holds
  (``flock``) for the instance's lifetime; the kernel drops the lock when that process dies, however
  it dies, and PIDs being reused does not matter;
- :func:`sweep` removes exactly the instance folders whose lock it can take (their owner is gone),
  first stopping a server still running in one (an orphan of a SIGKILLed run); a live run's folder
  is never touched;
- before a server is initialised, the server user is proven able to write its folder
  (:func:`check_reachable`); when it cannot, the error names the folder, the user, the folder in the
  way and the fix.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import pwd
import re
import shutil
import stat
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harvest_outbox.harvest_local.errors import ServiceError
from harvest_outbox.harvest_local.workdir import work_dir

log = logging.getLogger(__name__)

DEFAULT_RUN_DIR = Path("/var/tmp/harvest-postgres")
DEFAULT_SERVER_USER = "harvestpg"
PREFIX = "postgres-"
_LOCK_SUFFIX = ".lock"
# Each failed attempt lost a race with another run of the checkout releasing (removing) the then
# empty per-checkout folder between our mkdir and our lock, or sweeping our just-created lock file:
# under load (two pytest-xdist workers and other runs of one checkout claiming, releasing and
# sweeping back to back) 50 losses in a row happened within a second, so claim() retries for a
# time, not a count; each retry backs off a little more, up to 50 ms.
_CLAIM_SECONDS = 30.0


@dataclass(frozen=True)
class ServerUser:
    """The unprivileged OS user the server runs as when we are root."""

    name: str
    uid: int
    gid: int


def server_user() -> ServerUser | None:
    """The user to run the server as when we are root (``$HARVEST_PG_USER``, default ``harvestpg``,
    created when missing); None when we are not root (the server then runs as us)."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("HARVEST_PG_USER", DEFAULT_SERVER_USER)
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        proc = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise ServiceError(
                "postgres",
                f"cannot create the unprivileged user {name!r} for the server (Postgres refuses root): "
                f"{proc.stderr.strip()}. Fix: create it (`useradd --system {name}`), or set HARVEST_PG_USER "
                "to an existing unprivileged user, or point the project at a server with HARVEST_PG_DSN",
            ) from None
        entry = pwd.getpwnam(name)
    if entry.pw_uid == 0:
        raise ServiceError(
            "postgres",
            f"HARVEST_PG_USER={name!r} is uid 0, and Postgres refuses to run as root. Fix: name an "
            f"unprivileged user, or unset HARVEST_PG_USER to use {DEFAULT_SERVER_USER!r}",
        )
    return ServerUser(name, entry.pw_uid, entry.pw_gid)


def run_dir() -> Path:
    """Where, under root, the server user's instance folders live (``$HARVEST_PG_RUN_DIR``)."""
    return Path(os.environ.get("HARVEST_PG_RUN_DIR") or DEFAULT_RUN_DIR).absolute()


def checkout_key(work: Path) -> str:
    """``<checkout name>-<12 hex of sha256(work dir path)>``: readable, and distinct per checkout."""
    resolved = work.resolve()
    label = resolved.parent.name if resolved.name == ".work" else resolved.name
    label = re.sub(r"[^A-Za-z0-9._-]", "_", label)[:40].lstrip(".") or "harvest"
    return f"{label}-{hashlib.sha256(str(resolved).encode()).hexdigest()[:12]}"


class Instance:
    """One claimed instance folder; :meth:`release` removes it (and its link and lock)."""

    def __init__(self, path: Path, link: Path | None, lock_path: Path, lock_fd: int) -> None:
        self.path = path
        self.link = link
        self._lock_path = lock_path
        self._lock_fd: int | None = lock_fd

    def __repr__(self) -> str:
        return f"Instance(path={str(self.path)!r}, link={str(self.link) if self.link else None!r})"

    def release(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self.link is not None and self.link.is_symlink():
            self.link.unlink(missing_ok=True)
        if self._lock_fd is not None:
            # Unlink while still holding the lock, so a sweeper never removes a newer claim's file.
            self._lock_path.unlink(missing_ok=True)
            os.close(self._lock_fd)
            self._lock_fd = None
        if self.link is not None:  # root's layout: the per-checkout folder goes when empty
            try:
                self.path.parent.rmdir()
            except OSError:  # another run of this checkout is using it
                pass


def claim(name: str, user: ServerUser | None) -> Instance:
    """Create and lock the instance folder ``name`` (see the module docstring for where)."""
    work = work_dir()
    deadline, attempt = time.monotonic() + _CLAIM_SECONDS, 0
    while time.monotonic() < deadline:
        attempt += 1
        try:
            parent = work if user is None else _checkout_dir(work)
            lock_path = parent / (name + _LOCK_SUFFIX)
            fd = try_lock(lock_path, create=True)
        except FileNotFoundError:  # a sweeper removed the (then empty) per-checkout folder: again
            time.sleep(min(0.05, 0.001 * attempt))
            continue
        if fd is not None:
            break
        time.sleep(min(0.05, 0.001 * attempt))
    else:
        raise ServiceError(
            "postgres",
            f"could not claim the folder {name!r} for the server in "
            f"{_CLAIM_SECONDS:.0f} s ({attempt} attempts: its lock is held by another process, or "
            "its parent keeps disappearing). Fix: retry",
        )
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}\nwork dir {work.resolve()}\n".encode())
        path = parent / name
        if os.path.lexists(path):  # a dead run's leftover with the same port and pid: ours now
            _remove(path)
        os.mkdir(path, 0o700)
        link: Path | None = None
        if user is not None:
            os.chown(path, user.uid, user.gid)
            link = work / name
            if link.is_symlink():
                link.unlink()
            if not os.path.lexists(link):
                link.symlink_to(path, target_is_directory=True)
            else:
                link = None  # a real folder of that name (an older layout): leave it, skip the link
    except BaseException:
        lock_path.unlink(missing_ok=True)
        os.close(fd)
        raise
    return Instance(path, link, lock_path, fd)


def sweep(stop_server: Callable[[Path], None]) -> list[Path]:
    """Remove the instance folders of runs that are gone; returns what was removed.

    ``stop_server(folder)`` is called first for a folder whose server may still run
    (``data/postmaster.pid`` present). Covers every checkout under root (a deleted checkout never
    comes back to clean up after itself), the work dir otherwise.
    """
    removed: list[Path] = []
    work = work_dir()
    if os.geteuid() != 0:
        removed += _sweep_folder(work, stop_server)
        return removed
    base = run_dir()
    if not base.is_dir() or not _is_root_only(base):
        return removed  # claim() reports an unsafe run dir; never act on its content as root
    for entry in sorted(base.iterdir()):
        if entry.is_dir() and _is_root_only(entry):
            removed += _sweep_folder(entry, stop_server)
            try:
                entry.rmdir()  # only when empty; a concurrent claim() retries if it loses the race
            except OSError:
                pass
    for link in work.glob(PREFIX + "*"):
        if link.is_symlink() and not link.exists():  # its instance folder was swept
            link.unlink(missing_ok=True)
    return removed


def check_reachable(path: Path, user: ServerUser, fix: str) -> None:
    """Prove ``user`` can write ``path`` (by asking the OS as that user); else a ServiceError naming
    the folder, the user, the folder in the way, and ``fix``."""
    probe = shutil.which("test") or "/usr/bin/test"
    proc = subprocess.run(
        [probe, "-w", str(path), "-a", "-x", str(path)],
        capture_output=True,
        user=user.uid,
        group=user.gid,
        extra_groups=[],
    )
    if proc.returncode == 0:
        return
    blocker = _first_blocker(path, user)
    why = f": {blocker}" if blocker else ""
    raise ServiceError(
        "postgres",
        f"the server runs as the unprivileged user {user.name!r} (uid {user.uid}; Postgres refuses root), "
        f"which cannot write its folder {path}{why}. Fix: {fix}",
    )


# -- internals ---------------------------------------------------------------------------------


def _checkout_dir(work: Path) -> Path:
    base = run_dir()
    _make_root_only(base)
    folder = base / checkout_key(work)
    _make_root_only(folder)
    return folder


def _make_root_only(path: Path) -> None:
    """Create ``path`` (and missing parents) as root, 0755; an existing one must be root-only."""
    missing: list[Path] = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        _create_0755(folder)
    if not _is_root_only(path):
        st = os.lstat(path)  # FileNotFoundError when a sweep raced us: claim() tries again
        raise ServiceError(
            "postgres",
            f"{path} holds the embedded server's folders, so it must be a folder owned and writable by "
            f"root only, but it is {_describe(st)}. Fix: remove it (`rm -rf {path}`) or set "
            "HARVEST_PG_RUN_DIR to another folder",
        )


def _create_0755(folder: Path) -> None:
    """Make ``folder`` appear already 0755, never in between: made under another name, given its mode (a umask
    of 077 would hide it from the server user, one of 002 would leave it group-writable), then renamed into
    place. A concurrent run that made it first keeps its own (a rename onto an empty folder replaces it with
    this one, as good; onto a used one it fails, and this one goes)."""
    staging = folder.with_name(f".{folder.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    os.mkdir(staging, 0o700)
    os.chmod(staging, 0o755)
    try:
        os.rename(staging, folder)
    except OSError:
        os.rmdir(staging)
        if not os.path.isdir(folder):
            raise


def _is_root_only(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:  # swept by a concurrent run between our listing and now
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022


def try_lock(path: Path, create: bool) -> int | None:
    """An fd holding an exclusive flock on ``path``, or None when another process holds it or the
    file was unlinked between our open and our lock (a sweeper or a release got there first)."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held = os.fstat(fd)
        now = os.stat(path, follow_symlinks=False)
        if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
            return fd
    except (BlockingIOError, FileNotFoundError):
        pass
    os.close(fd)
    return None


def _sweep_folder(parent: Path, stop_server: Callable[[Path], None]) -> list[Path]:
    removed: list[Path] = []
    for lock_path in sorted(parent.glob(PREFIX + "*" + _LOCK_SUFFIX)):
        try:
            fd = try_lock(lock_path, create=False)
        except OSError as exc:  # not ours to open (another user's run), or a symlink (ELOOP)
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.ELOOP, errno.ENOENT):
                log.warning("cannot inspect %s: %s", lock_path, exc)
            continue
        if fd is None:
            continue  # its run is alive
        try:
            folder = lock_path.with_name(lock_path.name[: -len(_LOCK_SUFFIX)])
            if (folder / "data" / "postmaster.pid").exists() and not folder.is_symlink():
                try:
                    stop_server(folder)
                except Exception:  # keep sweeping; the folder is removed regardless
                    log.exception("stopping the leftover server in %s", folder)
            if os.path.lexists(folder):
                _remove(folder)
                removed.append(folder)
                log.info("removed %s, left by a run that ended without cleaning up", folder)
            lock_path.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return removed


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink()
    else:
        shutil.rmtree(path)


def _first_blocker(path: Path, user: ServerUser) -> str:
    """The first folder on the way to ``path`` that ``user`` may not enter (or ``path`` itself when
    it may not write it), by the mode bits; empty when the bits allow it (ACLs, SELinux...)."""
    for folder in [*reversed(path.parents), path]:
        try:
            st = os.stat(folder)
        except OSError:
            return f"{folder} does not exist"
        need = 0o3 if folder == path else 0o1  # write + search on the folder itself, search above it
        if st.st_uid == user.uid:
            bits = (st.st_mode >> 6) & 0o7
        elif st.st_gid == user.gid:
            bits = (st.st_mode >> 3) & 0o7
        else:
            bits = st.st_mode & 0o7
        if bits & need != need:
            verb = "enter" if need == 0o1 else "write"
            return f"{folder} is {_describe(st)}, which {user.name} may not {verb}"
    return ""


def _describe(st: os.stat_result) -> str:
    kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode) else "a file"
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    return f"{kind} owned by {owner}, mode {stat.S_IMODE(st.st_mode):04o}"
