"""A fault run's history: what was injected when, and how far each reader had got, as JSON lines.

One file per run (``history.jsonl`` in the run's folder), one JSON object per line, appended and
flushed as things happen, so a run cut short still leaves what it recorded:

- ``{"ev": "run", "run": seed, "t": wall, "plan": {...}}`` — the run starts (its :class:`FaultPlan` fields);
- ``{"ev": "fault", "run": seed, "kind": k, "target": who, "start": wall, "end": wall, "detail": note}`` — a
  fault from its injection to its end (a kill's span is the kill itself; a pause or an outage lasts);
- ``{"ev": "sample", "run": seed, "t": wall, "committed": n, "backlog": n, "readers": {name: n}}`` — about once
  a second: rows the writers have committed, rows waiting in the outbox (the relays' lag), and rows in each
  reader's table, so a reader's lag is ``committed - readers[name]``;
- ``{"ev": "end", "run": seed, "t": wall, "ok": b, "committed": n, "rolled_back": n, "seconds": s,
  "verdicts": [...], "injected": {...}, "notes": [...], "error": str|null}`` — the run's verdict.

A value a probe could not read (the database restarting) is left out of that sample, never recorded as 0:
a reader's series only ever holds counts that were read. Times are wall-clock seconds (``time.time()``),
so runs of one soak share one axis. :func:`read` parses a file back (``harvest_local.soak_report`` draws
it); a line cut off by a kill mid-write is skipped. Writes are serialized by a lock: the run's thread
records faults while the :class:`Sampler`'s thread records samples.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FILE_NAME = "history.jsonl"


class History:
    """Records one run (``run``: its seed) into ``path``; thread-safe."""

    def __init__(self, path: Path, run: int) -> None:
        self.path, self.run = path, run
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def _write(self, ev: str, **fields: Any) -> None:
        line = json.dumps({"ev": ev, "run": self.run, **fields}, default=str)
        with self._lock, self.path.open("a") as out:
            out.write(line + "\n")

    def run_started(self, plan: Mapping[str, Any]) -> None:
        self._write("run", t=time.time(), plan=dict(plan))

    def fault(self, kind: str, target: str, start: float, end: float, detail: str = "") -> None:
        self._write("fault", kind=kind, target=target, start=start, end=end, detail=detail)

    def sample(self, committed: int, backlog: int | None, readers: Mapping[str, int]) -> None:
        self._write("sample", t=time.time(), committed=committed, backlog=backlog, readers=dict(readers))

    def run_ended(
        self,
        *,
        ok: bool,
        committed: int,
        rolled_back: int,
        seconds: float,
        verdicts: list[dict[str, Any]],
        injected: Mapping[str, int],
        notes: list[str],
        error: str | None = None,
    ) -> None:
        self._write(
            "end",
            t=time.time(),
            ok=ok,
            committed=committed,
            rolled_back=rolled_back,
            seconds=seconds,
            verdicts=verdicts,
            injected=dict(injected),
            notes=notes,
            error=error,
        )

    def sampler(
        self,
        committed: Callable[[], int],
        backlog: Callable[[], int] | None,
        readers: Mapping[str, Callable[[], int]],
        every: float = 1.0,
        on_stop: Callable[[], None] | None = None,
    ) -> Sampler:
        return Sampler(self, committed, backlog, readers, every, on_stop)


class Sampler:
    """Calls the probes every ``every`` seconds on a thread of its own and records a sample, from
    :meth:`start` to :meth:`stop` (which records a last one, then calls ``on_stop``: closing the probes'
    connections). A probe that raises is left out of that sample (logged at debug): the services it reads
    may be the fault being injected."""

    def __init__(
        self,
        history: History,
        committed: Callable[[], int],
        backlog: Callable[[], int] | None,
        readers: Mapping[str, Callable[[], int]],
        every: float = 1.0,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        self.history, self.committed, self.backlog, self.readers, self.every = (
            history,
            committed,
            backlog,
            dict(readers),
            every,
        )
        self.on_stop = on_stop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"history-{history.run}", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        try:
            self.sample()
        finally:
            if self.on_stop is not None:
                self.on_stop()

    def sample(self) -> None:
        backlog = _probe("backlog", self.backlog) if self.backlog is not None else None
        readers = {name: n for name, probe in self.readers.items() if (n := _probe(name, probe)) is not None}
        self.history.sample(self.committed(), backlog, readers)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()


def _probe(name: str, probe: Callable[[], int]) -> int | None:
    try:
        return int(probe())
    except Exception as exc:  # a service down is what the run injects: this sample goes without it
        log.debug("history probe %s failed: %s", name, exc)
        return None


class TableCounts:
    """Row counts from one Postgres connection, reconnected after a failure (a restart, a fail-over):
    the sampler's probes. Not thread-safe: one sampler thread uses it."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: Any = None

    def _run(self, query: Callable[[Any], int]) -> int:
        import psycopg

        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self.dsn, autocommit=True, connect_timeout=3, application_name="harvest-history"
            )
        try:
            return query(self._conn)
        except psycopg.Error:
            self.close()
            raise

    def rows(self, schema: str, table: str) -> int:
        from psycopg import sql

        count = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, table))
        return self._run(lambda conn: int(conn.execute(count).fetchone()[0]))

    def backlog(self, outbox_table: str, layout: str) -> int:
        """Rows committed to the outbox that the relays have not committed to Kafka yet: rows left in
        the outbox table (``mark``), or rows past the committed cursor (``cursor``, whose rows stay until retired)."""
        from harvest_outbox.producer.layouts.choice import layout_for
        from harvest_outbox.producer.schema import OutboxNames

        names, chosen = OutboxNames.parse(outbox_table), layout_for(layout)
        return self._run(lambda conn: chosen.backlog(conn, names))

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


# --- reading back -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    kind: str
    target: str
    start: float
    end: float
    detail: str = ""


@dataclass(frozen=True)
class Sample:
    t: float
    committed: int
    backlog: int | None
    readers: dict[str, int]


@dataclass
class RunHistory:
    """One run as recorded; ``end`` is None for a run cut short (no verdict)."""

    run: int
    started: float
    plan: dict[str, Any]
    faults: list[Fault] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    end: dict[str, Any] | None = None

    @property
    def finished(self) -> float:
        """When the run ended, or its last record's time when it was cut short."""
        if self.end is not None:
            return float(self.end["t"])
        times = [self.started] + [s.t for s in self.samples] + [f.end for f in self.faults]
        return max(times)

    @property
    def readers(self) -> list[str]:
        """Every reader sampled, in first-seen order."""
        seen: dict[str, None] = {}
        for s in self.samples:
            seen.update(dict.fromkeys(s.readers))
        return list(seen)

    def lag(self, reader: str) -> list[tuple[float, int]]:
        """``(t, committed - rows in the reader's table)`` for each sample that read the reader (at least 0:
        a writer's count moves just after its commit, which a fast reader may pass)."""
        return [(s.t, max(s.committed - s.readers[reader], 0)) for s in self.samples if reader in s.readers]


def read(path: Path) -> RunHistory:
    """Parse one run's file; a ValueError names the file when it holds no run record."""
    run: RunHistory | None = None
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            log.warning("%s:%d: not a JSON line (cut off by a kill?); skipped", path, n)
            continue
        ev = rec.get("ev")
        if ev == "run":
            run = RunHistory(int(rec["run"]), float(rec["t"]), dict(rec.get("plan", {})))
        elif run is None:
            continue
        elif ev == "fault":
            run.faults.append(
                Fault(rec["kind"], rec["target"], float(rec["start"]), float(rec["end"]), rec.get("detail", ""))
            )
        elif ev == "sample":
            run.samples.append(
                Sample(float(rec["t"]), int(rec["committed"]), rec.get("backlog"), dict(rec.get("readers", {})))
            )
        elif ev == "end":
            run.end = rec
    if run is None:
        raise ValueError(f"{path}: no run record (first line must be {{'ev': 'run', ...}}): not a soak history")
    return run
