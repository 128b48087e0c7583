"""freed_memory's invariants: release() hands back pages that hold no allocation (glibc keeps a heap's
freed middle resident until malloc_trim), frees nothing alive, is turned off by
HARVEST_SPARK_RELEASE_FREED=0 and refuses any other value but 0 / 1, naming the variable.

Each case runs in a fresh interpreter, so its RSS is its own. No Spark, no Kafka."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harvest_outbox.spark_reader import freed_memory
from harvest_outbox.spark_reader.errors import ReaderConfigError

# 120 MiB of 2 KiB bytes objects (above pymalloc's 512-byte limit: plain malloc), all freed but the
# last one, which pins the heap's top: glibc keeps the freed middle resident on its own.
_CHILD = """
import hashlib, json, sys
from harvest_outbox.spark_reader import freed_memory

def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) // 1024 for l in f if l.startswith("VmRSS:"))

base = rss_mb()
blobs = [bytes(2048) for _ in range(60_000)]
pinned = bytes(2048)
kept = blobs[-100:]  # alive across release(): must be intact afterwards
digest = hashlib.sha256(b"".join(kept)).hexdigest()
del blobs
freed = rss_mb()
seconds = freed_memory.release()
after = rss_mb()
assert hashlib.sha256(b"".join(kept)).hexdigest() == digest
print(json.dumps({"base": base, "freed": freed, "after": after, "seconds": seconds}))
"""


def _run(env_value: str | None) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != freed_memory.ENV}
    if env_value is not None:
        env[freed_memory.ENV] = env_value
    done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; malloc_trim is glibc's")
@pytest.mark.parametrize("env_value", [None, "1"], ids=["default", "on"])
def test_release_hands_freed_pages_back(env_value) -> None:
    r = _run(env_value)
    assert r["freed"] - r["base"] >= 80, r  # the precondition: freed, yet still resident
    assert r["freed"] - r["after"] >= 80, r
    assert r["seconds"] > 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_turned_off_leaves_memory_to_the_allocators() -> None:
    r = _run("0")
    assert r["freed"] - r["base"] >= 80, r
    assert r["freed"] - r["after"] < 20, r
    assert r["seconds"] == 0.0


@pytest.mark.parametrize("value", ["yes", "2", ""], ids=["word", "two", "empty"])
def test_bad_setting_is_refused_naming_it(monkeypatch, value) -> None:
    monkeypatch.setenv(freed_memory.ENV, value)
    with pytest.raises(ReaderConfigError, match=rf"{freed_memory.ENV}={value!r}.*set it to 1"):
        freed_memory.release()
