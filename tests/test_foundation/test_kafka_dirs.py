"""The sweep of broker folders that killed runs left behind (harvest_local/kafka_dirs.py): K1-K3, with a real
broker whose owner is killed with SIGKILL, in a work dir of the test's own (so no other run's folder is near)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harvest_outbox.harvest_local import kafka_dirs
from harvest_outbox.harvest_local.workdir import work_dir


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A work dir of the test's own, sharing the checkout's resolved Maven jars (no download)."""
    jars = work_dir() / "maven"
    (tmp_path / "maven").symlink_to(jars, target_is_directory=True)
    monkeypatch.setenv("HARVEST_WORK_DIR", str(tmp_path))
    return tmp_path


def _naming(folder: Path) -> list[int]:
    """Processes whose command line names ``folder``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(folder).encode() + b"/" in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


_OWNER = """
import sys, time
from harvest_outbox.harvest_local.kafka import EmbeddedKafka
broker = EmbeddedKafka().start()
print(broker.root, flush=True)
time.sleep(600)
"""


def test_a_broker_whose_owner_was_killed_is_ended_and_its_folder_removed(work: Path) -> None:
    """K1/K2: a run killed with SIGKILL leaves its broker running (its own session) and its folder; the next
    sweep takes the folder's lock, kills the JVM and removes both folder and lock; the sweeper's own claim
    and a live owner's folder stay."""
    owner = subprocess.Popen([sys.executable, "-c", _OWNER], stdout=subprocess.PIPE, env=os.environ.copy())
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline().decode().strip()
        assert line, "the owner process did not start its broker"
        folder = Path(line)
        assert folder.parent == work and (work / (folder.name + ".lock")).exists()
        jvms = _naming(folder)
        assert jvms, "no broker process names the folder"
        assert kafka_dirs.sweep() == [], "swept the folder of a live run"
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        assert all(kafka_dirs._running(pid) for pid in jvms), "the broker died with its owner: nothing to sweep"

        mine = work / f"kafka-1-{os.getpid()}"
        mine.mkdir()
        claim = kafka_dirs.claim(mine)
        assert claim is not None
        assert kafka_dirs.sweep() == [folder]
        assert not folder.exists() and not (work / (folder.name + ".lock")).exists()
        deadline = time.monotonic() + 10
        while any(kafka_dirs._running(pid) for pid in jvms) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(kafka_dirs._running(pid) for pid in jvms), "the orphaned broker still runs"
        assert mine.exists(), "swept a folder whose lock its owner holds"
        claim.release()
    finally:
        if owner.poll() is None:
            owner.kill()
        for pid in _naming(work):
            os.kill(pid, signal.SIGKILL)


def test_folders_from_before_the_locks_go_only_when_their_owner_is_gone(work: Path) -> None:
    """K3: with no lock file, the pid in the name decides; anything not a broker folder is left alone."""
    gone = work / f"kafka-7-{_dead_pid()}"
    cluster_gone = work / f"kafka-cluster-8-{_dead_pid()}"
    alive = work / f"kafka-9-{os.getpid()}"
    other = work / f"kafka-notes-{_dead_pid()}"
    for folder in (gone, cluster_gone, alive, other):
        (folder / "data").mkdir(parents=True)
    assert sorted(kafka_dirs.sweep()) == sorted([gone, cluster_gone])
    assert alive.exists() and other.exists() and not gone.exists() and not cluster_gone.exists()


def test_only_a_top_level_broker_folder_is_claimed(work: Path) -> None:
    """K1: a cluster's node folder is its cluster's to claim; a claim is exclusive until released."""
    top = work / "kafka-cluster-5-1"
    assert kafka_dirs.claim(top / "node-1") is None
    assert kafka_dirs.claim(work / "elsewhere") is None
    first = kafka_dirs.claim(top)
    assert first is not None
    assert kafka_dirs.claim(top) is None
    first.release()
    again = kafka_dirs.claim(top)
    assert again is not None
    again.release()
    assert not (work / "kafka-cluster-5-1.lock").exists()
