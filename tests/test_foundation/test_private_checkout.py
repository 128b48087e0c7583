"""The embedded Postgres from a checkout other users cannot enter, and the folders killed runs leave.

Under root the server runs as an unprivileged user, which cannot enter ``/root/...`` or a
``mktemp -d`` folder (0700): harvest_local.pgdirs keeps the server's folder elsewhere. These tests
clone this repository's committed HEAD into a 0700 folder and run the services from there, kill a
run to leave an orphaned server behind and watch the next run sweep it, and check the errors when
the server's folder cannot work.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from harvest_outbox.harvest_local import maven, pgdirs
from harvest_outbox.harvest_local.errors import ServiceError
from harvest_outbox.harvest_local.postgres import EmbeddedPostgres, stop_leftover
from harvest_outbox.harvest_local.workdir import project_root

pytestmark = pytest.mark.integration

IS_ROOT = os.geteuid() == 0
#: Variables that would point the child at other services or folders than a fresh user's.
_FOREIGN = (
    "HARVEST_PG_DSN",
    "HARVEST_KAFKA_BOOTSTRAP",
    "HARVEST_TEST_SERVICES",
    "HARVEST_WORK_DIR",
    "HARVEST_PG_RUN_DIR",
    "PYTHONPATH",
)


@pytest.fixture
def private_dir() -> Iterator[Path]:
    """A folder only its owner may enter, like ``mktemp -d`` or ``/root``."""
    path = Path(tempfile.mkdtemp(prefix="harvest-private-"))
    os.chmod(path, 0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _clone_head(dest: Path) -> Path:
    root = project_root()
    assert root is not None and shutil.which("git"), "this test clones the checkout: it needs git and a git checkout"
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(root), str(dest)], check=True, capture_output=True)
    subprocess.run(
        ["git", "-C", str(dest), "checkout", "-q", "--detach", head.stdout.strip()], check=True, capture_output=True
    )
    return dest


def _import_root(checkout: Path) -> Path:
    """A folder that makes ``import harvest_outbox.<package>`` load ``checkout``'s folders, as the
    editable install's package-dir mapping does for this checkout: ``harvest_outbox/`` with links to
    the checkout's ``harvest_outbox/__init__.py`` and its package folders. On ``PYTHONPATH`` it comes
    before the editable install's finder (which setuptools appends to ``sys.meta_path``)."""
    package = checkout / "build" / "import-root" / "harvest_outbox"
    package.mkdir(parents=True)
    (package / "__init__.py").symlink_to(checkout / "harvest_outbox" / "__init__.py")
    for sub in ("producer", "consumer", "sequencer", "spark_reader", "harvest_local"):
        (package / sub).symlink_to(checkout / sub, target_is_directory=True)
    return package.parent


def _pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # an unreaped zombie (no init reaping in some containers) is dead


def test_clone_in_private_folder_runs_services_and_a_round_trip(private_dir: Path) -> None:
    clone = _clone_head(private_dir / "x")
    # Reuse what is installed: this interpreter's packages and the Kafka jars already resolved
    # (same pom, so the clone's resolver accepts them), instead of pip and Maven again.
    shutil.copytree(maven.resolve("kafka")[0].parent, clone / ".work" / "maven" / "kafka")
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
    # The clone has no compiled extensions (they are build output): its pure-Python readers run.
    env.update(PYTHONPATH=str(_import_root(clone)), HARVEST_PURE_PYTHON="1")
    proc = subprocess.run(
        [sys.executable, str(clone / "tests" / "test_foundation" / "private_checkout_child.py")],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"child failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    result = json.loads(lines[-1][len("RESULT ") :])

    assert Path(result["harvest_local"]).is_relative_to(clone), "the child must run the clone's code"
    assert result["values"] == [f"v{i}" for i in range(20)]
    assert Path(result["kafka_root"]).is_relative_to(clone / ".work")  # Kafka runs as us: in the checkout
    pg_root = Path(result["pg_root"])
    if IS_ROOT:
        assert result["pg_user"] == os.environ.get("HARVEST_PG_USER", "harvestpg")
        assert not pg_root.is_relative_to(private_dir), "the server user cannot enter the private folder"
        assert pg_root.parent.name == pgdirs.checkout_key(clone / ".work")
        assert result["pg_root_uid"] != 0
        assert Path(result["pg_link"]).parent == clone / ".work" and result["pg_link_target"] == str(pg_root)
    else:
        assert pg_root.is_relative_to(clone / ".work")
    assert not os.path.lexists(pg_root), "the run's Postgres folder is removed when the run ends"
    assert not list((clone / ".work").glob("postgres-*")), "no link or lock left in the clone's .work"
    assert stat.S_IMODE(private_dir.stat().st_mode) == 0o700, "the user's folder keeps its permissions"


def test_a_killed_runs_server_and_folder_are_swept_and_live_ones_kept(pg_dsn: str) -> None:
    """A SIGKILLed owner leaves its server running (pg_ctl daemonizes it); the next run stops it and
    removes its folder. The session's own server (a live run's) keeps serving throughout."""
    script = (
        "import os, sys, time\n"
        "from harvest_local.postgres import EmbeddedPostgres\n"
        "pg = EmbeddedPostgres().start()\n"
        "pid = (pg.data / 'postmaster.pid').read_text().split()[0]\n"
        "link = pg.link\n"
        "print(pg.root, pid, link, flush=True)\n"
        "time.sleep(300)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        root_s, pid_s, link_s = child.stdout.readline().split()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    root, postmaster = Path(root_s), int(pid_s)
    assert root.is_dir() and _pid_alive(postmaster), "the orphaned server outlives its killed owner"

    fresh = EmbeddedPostgres()  # sweeps first, then claims its own folder
    try:
        deadline = time.monotonic() + 30
        while _pid_alive(postmaster) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _pid_alive(postmaster), "the sweep stops the orphaned server"
        assert not os.path.lexists(root) and not os.path.lexists(f"{root}.lock")
        if link_s != "None":
            assert not os.path.lexists(link_s), "the dangling link in .work goes too"
        with psycopg.connect(pg_dsn) as conn:  # a live run's server is never swept
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        fresh.destroy()
    assert not os.path.lexists(fresh.root)


def test_two_checkouts_get_distinct_locked_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user = pgdirs.server_user()
    instances = []
    for checkout in ("a", "b"):
        monkeypatch.setenv("HARVEST_WORK_DIR", str(tmp_path / checkout / ".work"))
        instances.append(pgdirs.claim("postgres-1-1", user))  # same name: only the checkout differs
    try:
        first, second = instances
        assert first.path != second.path and first.path.is_dir() and second.path.is_dir()
        if IS_ROOT:
            assert first.path.parent.name.startswith("a-") and second.path.parent.name.startswith("b-")
            assert user is not None and first.path.stat().st_uid == user.uid
            assert stat.S_IMODE(first.path.stat().st_mode) == 0o700
        removed = pgdirs.sweep(stop_leftover)
        assert first.path not in removed and second.path not in removed
        assert first.path.is_dir() and second.path.is_dir(), "live claims survive a sweep"
    finally:
        for instance in instances:
            instance.release()
    assert not any(os.path.lexists(i.path) for i in instances)


@pytest.mark.skipif(not IS_ROOT, reason="only root runs the server as another user")
def test_unreachable_folder_is_an_error_naming_folder_user_and_fix(
    private_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = private_dir / "run"
    monkeypatch.setenv("HARVEST_PG_RUN_DIR", str(run_dir))
    pg = EmbeddedPostgres()
    try:
        with pytest.raises(ServiceError) as err:
            pg.start(timeout=20)
    finally:
        pg.destroy()
    message = str(err.value)
    user = os.environ.get("HARVEST_PG_USER", "harvestpg")
    assert str(pg.root) in message and repr(user) in message
    assert f"{private_dir} is a folder owned by root, mode 0700, which {user} may not enter" in message
    assert "Fix: set HARVEST_PG_RUN_DIR" in message
    assert stat.S_IMODE(private_dir.stat().st_mode) == 0o700, "never loosened on the user's behalf"


@pytest.mark.skipif(not IS_ROOT, reason="the run dir is root's")
def test_run_dir_others_can_write_is_refused(private_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = private_dir / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("HARVEST_PG_RUN_DIR", str(shared))
    with pytest.raises(
        ServiceError,
        match=r"must be a folder owned and writable by root only, but it is a "
        r"folder owned by root, mode 0777\. Fix: remove it",
    ):
        EmbeddedPostgres()


def test_concurrent_claims_releases_and_sweeps_of_one_checkout(tmp_path: Path) -> None:
    """Runs of one checkout starting and ending while others sweep: no claim fails, and no live
    folder is swept (releases remove the per-checkout folder when empty, under others' claims)."""
    script = (
        "import os, sys\n"
        "from harvest_local import pgdirs\n"
        "from harvest_local.postgres import stop_leftover\n"
        "user = pgdirs.server_user()\n"
        "for i in range(40):\n"
        "    inst = pgdirs.claim(f'postgres-{i}-{os.getpid()}', user)\n"
        "    pgdirs.sweep(stop_leftover)\n"
        "    assert inst.path.is_dir(), f'live folder {inst.path} was swept'\n"
        "    inst.release()\n"
        "print('ok', flush=True)\n"
    )
    env = {**os.environ, "HARVEST_WORK_DIR": str(tmp_path / ".work")}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    outcomes = [w.communicate(timeout=120) for w in workers]
    assert all(w.returncode == 0 and out.strip() == "ok" for w, (out, _) in zip(workers, outcomes, strict=True)), (
        outcomes
    )
    assert not list((tmp_path / ".work").glob("postgres-*"))
    if IS_ROOT:
        assert not (pgdirs.run_dir() / pgdirs.checkout_key(tmp_path / ".work")).exists()
