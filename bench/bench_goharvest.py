"""goharvest side by side (a benchmark, not a test): the Go implementation harvest's relay follows,
draining the same backlog on the same Postgres and Kafka.

    python -m bench.bench_goharvest --rows 100000          # goharvest's default limits, then tuned ones

``bench/goharvest/`` is a small Go main that imports ``github.com/obsidiandynamics/goharvest`` as a
module dependency; :func:`build` compiles it with ``go build`` into ``.work/goharvest/`` (cached,
rebuilt when ``go.mod``, ``go.sum``, ``main.go`` or the Go version change). :func:`run_goharvest`
fills a backlog shaped like ``bench/bench_relay.py``'s (100-byte values, 1,000 keys, 8 partitions),
runs the binary until the outbox is empty, then reads the topic back and checks that every row
arrived. Without a Go toolchain it logs one line and returns None: this comparison is never a CI
requirement.

Invariants:
- the clock covers the same window as ``bench_relay.drain_once``: from leadership to an empty
  outbox (the Go main measures it, so process start-up and the NELI election are not counted);
- a run counts only when the topic holds every backlog row (by its unique value) at least once;
  goharvest is at-least-once, so duplicates are reported, not hidden;
- the Postgres DSN reaches the binary through its environment, never its command line;
- nothing under ``bench/goharvest/`` holds a machine path: the ``replace`` the build needs (see
  ``bench/goharvest/go.mod``) lives in a generated ``go.mod`` under ``.work/``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench import backlog
from bench.services import endpoints

GO_DIR = Path(__file__).resolve().parent / "goharvest"
CKG_MODULE = "gopkg.in/confluentinc/confluent-kafka-go.v1"
CKG_VERSION = "v1.8.2"
#: goharvest limit (YAML name) -> the Go main's flag. Anything not given runs at goharvest's default.
LIMIT_FLAGS = {
    "markQueryRecords": "-mark-query-records",
    "maxInFlightRecords": "-max-in-flight-records",
    "sendConcurrency": "-send-concurrency",
}
#: The limits harvest's relay benchmark runs with (bench_relay.LIMITS), in goharvest's names.
TUNED = {"markQueryRecords": 5000, "maxInFlightRecords": 5000}
KEYS, PARTITIONS = 1000, 8

log = logging.getLogger("harvest.bench.goharvest")


class GoharvestBenchError(RuntimeError):
    """The goharvest comparison could not run: bad limits, a failed build, a failed or short drain."""


def go_toolchain() -> str | None:
    """The ``go`` command, or None when no Go toolchain is on PATH."""
    return shutil.which("go")


def _sources_digest(go: str) -> str:
    h = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go"):
        h.update(name.encode() + b"\0" + (GO_DIR / name).read_bytes() + b"\0")
    h.update(subprocess.run([go, "version"], capture_output=True, text=True, check=True).stdout.encode())
    return h.hexdigest()


def _go(go: str, *args: str, what: str, timeout: float = 900.0) -> str:
    proc = subprocess.run(
        [go, *args], cwd=GO_DIR, capture_output=True, text=True, timeout=timeout, env={**os.environ, "CGO_ENABLED": "1"}
    )
    if proc.returncode != 0:
        raise GoharvestBenchError(
            f"{what} failed (go {' '.join(args)}):\n{proc.stderr.strip()[-3000:]}\n"
            f"fix: the Go module proxy must be reachable and gcc installed (cgo)"
        )
    return proc.stdout


def build(go: str, out_dir: Path | None = None) -> Path:
    """Compile ``bench/goharvest`` (once per source/toolchain change) and return the binary's path."""
    if out_dir is None:
        from harvest_outbox.harvest_local.workdir import work_dir

        out_dir = work_dir() / "goharvest"
    out_dir.mkdir(parents=True, exist_ok=True)
    binary, stamp = out_dir / "goharvest-bench", out_dir / "build.sha256"
    digest = _sources_digest(go)
    if binary.is_file() and stamp.is_file() and stamp.read_text().strip() == digest:
        return binary
    started = time.monotonic()
    log.info("building bench/goharvest with %s (first build compiles librdkafka's cgo glue: about a minute)", go)
    # confluent-kafka-go v1.8.2 lacks the kafka/librdkafka package goharvest blank-imports (renamed
    # librdkafka_vendor in v1.6). Build against an unmodified copy of the module plus that one empty
    # package; the module cache itself is read-only and `go build -overlay` may not add files there.
    info = json.loads(
        _go(
            go,
            "mod",
            "download",
            "-json",
            f"{CKG_MODULE}@{CKG_VERSION}",
            what=f"downloading {CKG_MODULE}@{CKG_VERSION}",
        )
    )
    ckg = out_dir / f"confluent-kafka-go.v1@{CKG_VERSION}"
    if ckg.exists():
        shutil.rmtree(ckg)
    # Other platforms' static librdkafka archives (30 MB) are never linked here.
    shutil.copytree(
        info["Dir"],
        ckg,
        ignore=shutil.ignore_patterns("librdkafka_darwin.a", "librdkafka_musl_linux.a", "librdkafka_windows.a"),
    )
    for path in [ckg, *ckg.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    (ckg / "go.mod").write_text(f"module {CKG_MODULE}\n")
    stub = ckg / "kafka" / "librdkafka"
    stub.mkdir(exist_ok=True)
    (stub / "librdkafka.go").write_text(
        "// Package librdkafka stands in for the package goharvest blank-imports; added by bench_goharvest.py.\n"
        "package librdkafka\n"
    )
    modfile = out_dir / "go.mod"
    modfile.write_text((GO_DIR / "go.mod").read_text() + f"\nreplace {CKG_MODULE} {CKG_VERSION} => {ckg}\n")
    shutil.copyfile(GO_DIR / "go.sum", out_dir / "go.sum")  # -modfile X.mod reads X.sum
    tmp = out_dir / "goharvest-bench.tmp"
    _go(go, "build", "-modfile", str(modfile), "-o", str(tmp), ".", what="building bench/goharvest")
    tmp.replace(binary)
    stamp.write_text(digest + "\n")
    log.info("built %s in %.0fs", binary, time.monotonic() - started)
    return binary


def lib_pq_dsn(dsn: str) -> str:
    """``dsn`` as goharvest's driver (lib/pq) takes it: lib/pq defaults to ``sslmode=require`` and
    knows no ``prefer``/``allow``, where libpq (psycopg) defaults to ``prefer``. Both mean "TLS if the
    server offers it"; the nearest lib/pq setting that still connects to a server without TLS is
    ``disable``."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(dsn)
    if params.get("sslmode") in (None, "prefer", "allow"):
        params["sslmode"] = "disable"
    return make_conninfo("", **{k: str(v) for k, v in params.items() if v is not None})


def _limit_args(limits: dict[str, int] | None) -> list[str]:
    args: list[str] = []
    for name, value in (limits or {}).items():
        if name not in LIMIT_FLAGS:
            raise GoharvestBenchError(
                f"limits: {name!r} is not a goharvest limit this benchmark sets; use one of {', '.join(LIMIT_FLAGS)}"
            )
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise GoharvestBenchError(
                f"limits.{name}: {value!r} must be a positive integer (leave it out for goharvest's default)"
            )
        args += [LIMIT_FLAGS[name], str(value)]
    return args


def fill_backlog(pg_dsn: str, table: str, topic: str, rows: int, keys: int = KEYS) -> None:
    """``rows`` outbox rows for ``topic``, written with ``Stasher.stash_many`` exactly as
    ``bench_relay.drain_once`` writes its backlog (same keys, same 100-byte values)."""
    from harvest_outbox.producer.schema.ddl import init_db

    init_db(pg_dsn, table)
    backlog.fill_backlog(pg_dsn, table, topic, rows, keys)


def topic_contents(bootstrap: str, topic: str, timeout: float = 60.0) -> tuple[int, set[bytes]]:
    """(records in ``topic``, the distinct 10-digit row numbers their values start with)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"gh-verify-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    try:
        parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        total = sum(ends.values())
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        seen: set[bytes] = set()
        read, deadline = 0, time.monotonic() + timeout
        while read < total and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                if m.error() is None:
                    read += 1
                    seen.add((m.value() or b"")[:10])
        if read < total:
            raise GoharvestBenchError(f"read only {read} of the {total} records of {topic!r} in {timeout:.0f}s")
        return total, seen
    finally:
        c.close()


def run_goharvest(
    pg_dsn: str,
    kafka_bootstrap: str,
    table: str,
    rows: int,
    limits: dict[str, int] | None = None,
    *,
    keys: int = KEYS,
    partitions: int = PARTITIONS,
    timeout: float = 600.0,
) -> dict[str, Any] | None:
    """Drain a fresh backlog of ``rows`` rows from ``table`` with goharvest; None without Go.

    ``table`` (``schema.table``) is created goharvest-compatible if missing and must be empty;
    it is left in place (empty) for the caller to drop. ``limits`` uses goharvest's YAML names
    (``markQueryRecords``, ``maxInFlightRecords``, ``sendConcurrency``); None runs its defaults.
    Returns the Go main's figures (``rows``, ``seconds``, ``rows_per_s``, ``election_seconds``,
    ``limits``, ``limits_are_default``) plus what the topic holds (``kafka``)."""
    go = go_toolchain()
    if go is None:
        log.warning("goharvest side by side skipped: no Go toolchain ('go' is not on PATH)")
        return None
    limit_args = _limit_args(limits)
    if rows < 1:
        raise GoharvestBenchError(f"rows: {rows!r} must be at least 1")
    binary = build(go)

    from harvest_outbox.harvest_local.kafka import create_topic

    topic = f"goharvest-bench-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, partitions)
    fill_backlog(pg_dsn, table, topic, rows, keys)
    group = f"goharvest-bench-{uuid.uuid4().hex[:8]}"
    cmd = [
        str(binary),
        "-bootstrap",
        kafka_bootstrap,
        "-table",
        table,
        "-leader-group",
        group,
        "-timeout",
        f"{int(timeout)}s",
        *limit_args,
    ]
    log.info("goharvest draining %d rows (limits: %s)", rows, limits or "goharvest's defaults")
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout + 60,
        env={**os.environ, "HARVEST_DATA_SOURCE": lib_pq_dsn(pg_dsn)},
    )
    if proc.returncode != 0:
        raise GoharvestBenchError(f"goharvest-bench exited with {proc.returncode}:\n{proc.stderr.strip()[-3000:]}")
    for line in proc.stderr.strip().splitlines()[-10:]:  # goharvest's warnings (re-marks, slow close)
        log.info("goharvest: %s", line)
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise GoharvestBenchError(f"goharvest-bench printed no result; its stderr:\n{proc.stderr.strip()[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    if result["rows"] != rows:
        raise GoharvestBenchError(
            f"table: {table!r} held {result['rows']} rows when goharvest started, "
            f"expected the {rows} of this run; fix: pass an empty (or new) table"
        )
    records, distinct = topic_contents(kafka_bootstrap, topic)
    expected = {f"{i:010d}".encode() for i in range(rows)}
    missing = len(expected - distinct)
    if missing:
        raise GoharvestBenchError(
            f"goharvest emptied the outbox but {missing} of {rows} rows are not in topic {topic!r}"
        )
    result["kafka"] = {
        "topic": topic,
        "records": records,
        "distinct_rows": len(distinct & expected),
        "duplicates": records - len(distinct & expected),
    }
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.bench_goharvest",
        description=__doc__.splitlines()[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--keys", type=int, default=KEYS)
    ap.add_argument("--partitions", type=int, default=PARTITIONS)
    ap.add_argument(
        "--variant",
        action="append",
        choices=("default", "tuned"),
        help="goharvest's default limits, or markQueryRecords=maxInFlightRecords=5000 "
        "(bench_relay's); repeatable; default: both",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("harvest_outbox.harvest_local.maven", "harvest_outbox.harvest_local.launcher"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    go = go_toolchain()
    if go is None:
        log.warning("goharvest side by side skipped: no Go toolchain ('go' is not on PATH)")
        print(json.dumps({"skipped": "no Go toolchain"}))
        return 0
    build(go)  # before the services start: a build failure costs nothing else
    variants = args.variant or ["default", "tuned"]
    services, dsn, bootstrap = endpoints()
    import psycopg
    from psycopg import sql

    out: dict[str, Any] = {
        "setup": {
            "rows": args.rows,
            "keys": args.keys,
            "partitions": args.partitions,
            "value_bytes": 100,
            "cpus": os.cpu_count(),
        }
    }
    try:
        for variant in variants:
            schema = f"gh_{uuid.uuid4().hex[:8]}"
            try:
                out[variant] = run_goharvest(
                    dsn,
                    bootstrap,
                    f"{schema}.outbox",
                    args.rows,
                    TUNED if variant == "tuned" else None,
                    keys=args.keys,
                    partitions=args.partitions,
                )
            finally:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    finally:
        if services is not None:
            services.stop()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
