"""The published artefacts: ``python -m build``'s sdist and wheel, installed into a clean virtualenv.

Every other test runs the editable install (``./dev``), which maps ``harvest_outbox.*`` onto the
repository's folders; these check what a user gets from ``pip install harvest-outbox``:

* the sdist builds, and the wheel built from it holds one top-level package, ``harvest_outbox``,
  with the compiled extensions inside (nothing named ``producer``, ``consumer``... at the top of
  site-packages);
* the wheel installs with its dependencies into a fresh venv (pip's cache makes that quick where
  ``./dev setup`` ran before), where ``harvest --version`` runs, every module imports, and a
  stash -> relay (the installed ``harvest`` command) -> ``ReadCommittedIter`` round trip works
  against the session's Postgres and Kafka, all with the installed interpreter from a folder
  outside the checkout;
* ``HARVEST_PURE_PYTHON=1`` builds a pure-Python wheel (``py3-none-any``) that imports and runs the
  pure-Python sequencer and readers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import venv
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from harvest_outbox.harvest_local.relays import wait_for, write_config
from harvest_outbox.harvest_local.workdir import project_root

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SUBPACKAGES = ("producer", "consumer", "sequencer", "spark_reader", "harvest_local")
ROWS = 12


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment without what would put the checkout's code on the path or force pure Python."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "HARVEST_PURE_PYTHON")
    }
    env.update(extra)
    return env


def _run(
    args: list[str],
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, cwd=cwd, env=env or _clean_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def _build(outdir: Path, *args: str, env: dict[str, str] | None = None) -> None:
    root = project_root()
    assert root is not None, "these tests build the checkout: run them from an editable install (./dev test)"
    _run(
        [sys.executable, "-m", "build", "--outdir", str(outdir), *args, str(root)],
        cwd=outdir.parent,
        env=env,
        timeout=480,
    )


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m build``: the sdist, then the wheel built from the unpacked sdist."""
    out = tmp_path_factory.mktemp("dist")
    _build(out, env=_clean_env(HARVEST_PURE_PYTHON="0"))
    return out


def _one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    assert len(found) == 1, f"expected one {pattern} in {folder}, found {[p.name for p in found]}"
    return found[0]


@pytest.fixture(scope="module")
def installed(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel and its dependencies (pip's cache serves what it already has);
    returns the venv's bin folder."""
    home = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True, clear=True).create(home)
    wheel = _one(dist, "harvest_outbox-*.whl")
    _run(
        [
            str(home / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--find-links",
            str(dist),
            f"{wheel}[sqlalchemy,otel,local]",  # (delta: its module imports without deltalake; the extra costs ~30 s here)
        ],
        cwd=home,
        timeout=480,
    )
    return home / "bin"


def test_sdist_holds_the_sources_and_the_build_files(dist: Path) -> None:
    sdist = _one(dist, "harvest_outbox-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    for needed in (
        "pyproject.toml",
        "setup.py",
        "README.md",
        "harvest_outbox/__init__.py",
        "sequencer/_native.pyx",
        "sequencer/_native.pxd",
        "consumer/_native.pyx",
        "producer/relay/sequenced/_native.pyx",
        "producer/relay/at_least_once/_native.pyx",
        "producer/db/_text_arrays.pyx",
        "producer/ops/_header_room.pxd",
        "producer/ops/cli.py",
        "harvest_local/maven/settings.xml",
        "harvest_local/maven/kafka/pom.xml",
    ):
        assert needed in names, f"{needed} missing from {sdist.name}"
    assert not any(n.startswith(("tests/", ".work/", "build/")) for n in names)


def test_wheel_nests_everything_under_harvest_outbox_with_the_extensions(dist: Path) -> None:
    wheel = _one(dist, "harvest_outbox-*.whl")
    assert "-none-any" not in wheel.name, f"{wheel.name}: the compiled extensions make it platform-specific"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        info = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        entry_points = zf.read(info).decode()
        top_level = zf.read(info.replace("entry_points.txt", "top_level.txt")).decode().split()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"harvest_outbox", next(t for t in tops if t.endswith(".dist-info"))}, tops
    assert top_level == ["harvest_outbox"]
    for sub in ("sequencer", "consumer", "producer/relay/sequenced", "producer/relay/at_least_once"):
        assert any(n.startswith(f"harvest_outbox/{sub}/_native.") and n.endswith(".so") for n in names), (
            f"no compiled harvest_outbox.{sub.replace('/', '.')}._native in {wheel.name}"
        )
    for sub in SUBPACKAGES:
        assert f"harvest_outbox/{sub}/__init__.py" in names and f"harvest_outbox/{sub}/py.typed" in names
    assert "harvest_outbox/harvest_local/maven/settings.xml" in names
    assert not any(n.endswith(".c") for n in names), "Cython's generated C is build output"
    assert "harvest = harvest_outbox.producer.ops.cli:main" in entry_points


def test_installed_harvest_version(installed: Path, tmp_path: Path) -> None:
    out = _run([str(installed / "harvest"), "--version"], cwd=tmp_path).stdout
    assert out.startswith("harvest 0.1.0 "), out
    assert "(sequencer: native, reader fast path: native, relay fast path: native)" in out, out


_IMPORT_ALL = """
import importlib, importlib.util, json, pkgutil, sys
import harvest_outbox
found = []
for info in pkgutil.walk_packages(harvest_outbox.__path__, "harvest_outbox."):
    if info.name.endswith(".__main__"):  # the command-line entry points run when imported
        continue
    module = importlib.import_module(info.name)
    found.append([info.name, module.__file__])
import harvest_outbox.sequencer as seq, harvest_outbox.consumer.record as rec
print(json.dumps({"modules": found, "sequencer": seq.IMPLEMENTATION,
                  "reader": "native" if rec._native is not None else "python",
                  "top_level": [n for n in %r if importlib.util.find_spec(n) is not None]}))
""" % (SUBPACKAGES,)  # noqa: UP031 - %-formatting: the script has braces of its own


def _import_all(python: Path, cwd: Path, env: dict[str, str] | None = None) -> dict[str, object]:
    out = _run([str(python), "-c", _IMPORT_ALL], cwd=cwd, env=env).stdout
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


def test_installed_wheel_imports_every_module_from_site_packages(installed: Path, tmp_path: Path) -> None:
    result = _import_all(installed / "python", tmp_path)
    modules = dict(result["modules"])  # type: ignore[call-overload]
    site = installed.parent / "lib"
    for sub in SUBPACKAGES:
        assert f"harvest_outbox.{sub}" in modules
    for name in (
        "harvest_outbox.producer.ops.cli",
        "harvest_outbox.producer.stash.sqlalchemy",
        "harvest_outbox.producer.observe.tracing",
        "harvest_outbox.consumer.committed",
        "harvest_outbox.spark_reader.stream",
        "harvest_outbox.spark_reader.delta_tables",
        "harvest_outbox.harvest_local.demo",
        "harvest_outbox.sequencer._native",
        "harvest_outbox.consumer._native",
        "harvest_outbox.producer.relay.sequenced._native",
        "harvest_outbox.producer.relay.at_least_once._native",
        "harvest_outbox.producer.db._text_arrays",
    ):
        assert name in modules, f"{name} not importable from the wheel"
    outside = {n: f for n, f in modules.items() if not Path(f).is_relative_to(site)}
    assert not outside, f"modules loaded from outside the venv: {outside}"
    assert result["top_level"] == [], "the wheel must not install top-level producer/consumer/... packages"
    assert (result["sequencer"], result["reader"]) == ("native", "native")


_STASH = """
import json, sys
import psycopg
from harvest_outbox.producer import OutboxRecord, Stasher, init_db
dsn, table, topic, rows = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
init_db(dsn, table)
with psycopg.connect(dsn) as conn:
    Stasher(table).stash_many(conn, [OutboxRecord(topic, f"k{i % 3}", f"v{i}") for i in range(rows)])
print(json.dumps({"stasher": Stasher.__module__}))
"""

_READ = """
import json, sys, uuid
from harvest_outbox.consumer import ReadCommittedIter
bootstrap, topic, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
kafka = {"bootstrap.servers": bootstrap, "group.id": f"wheel-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest"}
values = []
with ReadCommittedIter(kafka, topics=[topic], idle_timeout=30.0) as it:
    for record in it:
        values.append(record.value.decode())
        if len(values) == rows:
            break
print(json.dumps({"values": values}))
"""


def test_installed_stash_relay_read_round_trip(
    installed: Path,
    tmp_path: Path,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    """Stash with the installed stasher, relay with the installed ``harvest`` command, read with the
    installed ``ReadCommittedIter``: the UUID-sequenced path end to end, nothing from the checkout."""
    python, table, topic = str(installed / "python"), f"{pg_schema}.outbox", topic_factory()
    stashed = json.loads(_run([python, "-c", _STASH, pg_dsn, table, topic, str(ROWS)], cwd=tmp_path).stdout)
    assert stashed["stasher"].startswith("harvest_outbox.producer.")
    cfg = write_config(
        tmp_path / "harvest.yaml",
        dsn=pg_dsn,
        bootstrap=kafka_bootstrap,
        outbox_table=table,
        group=unique_name("wheel"),
        leader_election="postgres",
        leader_lock_check_interval="200ms",
    )
    log = tmp_path / "relay.log"
    with log.open("w") as out:
        relay = subprocess.Popen(
            [str(installed / "harvest"), "-f", str(cfg), "--name", "wheel-relay"],
            cwd=tmp_path,
            env=_clean_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        wait_for(lambda: "elected leader" in log.read_text() or relay.poll() is not None, 60, "the relay's election")
        assert relay.poll() is None, log.read_text()[-3000:]
        read = json.loads(
            _run([python, "-c", _READ, kafka_bootstrap, topic, str(ROWS)], cwd=tmp_path, timeout=120)
            .stdout.strip()
            .splitlines()[-1]
        )
        assert read["values"] == [f"v{i}" for i in range(ROWS)], log.read_text()[-3000:]
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.wait()


@pytest.fixture(scope="module")
def pure_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist-pure")
    _build(out, "--wheel", env=_clean_env(HARVEST_PURE_PYTHON="1"))
    return _one(out, "harvest_outbox-*.whl")


def test_pure_python_build_is_a_universal_wheel_that_imports(pure_wheel: Path, installed: Path, tmp_path: Path) -> None:
    """``HARVEST_PURE_PYTHON=1`` (or no compiler): no extension modules, and the install still works.
    Installed (without dependencies) into a folder ahead of the venv's own copy on ``PYTHONPATH``,
    which supplies the dependencies: every module imports and the pure-Python paths run."""
    assert pure_wheel.name.endswith("-py3-none-any.whl"), pure_wheel.name
    with zipfile.ZipFile(pure_wheel) as zf:
        assert not [n for n in zf.namelist() if n.endswith((".so", ".pyd"))]
    target = tmp_path / "pure"
    _run(
        [
            str(installed / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--target",
            str(target),
            str(pure_wheel),
        ],
        cwd=tmp_path,
    )
    result = _import_all(installed / "python", tmp_path, env=_clean_env(PYTHONPATH=str(target)))
    modules = dict(result["modules"])  # type: ignore[call-overload]
    assert all(Path(f).is_relative_to(target) for f in modules.values()), modules
    assert "harvest_outbox.sequencer._native" not in modules
    assert (result["sequencer"], result["reader"]) == ("python", "python")
