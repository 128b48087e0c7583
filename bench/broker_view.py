"""What the broker and the machine were doing while a slow row waited: the latency benchmark's attribution
of its tail (issue #51). Not a test.

- **The broker's request log.** Kafka's ``kafka.request.logger`` at DEBUG writes one line per completed
  request with its phases (``requestQueueTimeMs``: waiting for a request handler thread;
  ``localTimeMs``: the append or read; ``remoteTimeMs``: a fetch parked until data arrives or
  ``fetch.wait.max.ms``; ``responseQueueTimeMs``: waiting for a network thread; ``sendTimeMs``). A request
  whose *queue* phases are long waited inside the broker for a thread: the broker's JVM was not running
  (a CPU it could not get, a safepoint), not appending or fetching. :func:`jvm_options` points an
  embedded broker's log4j at the default configuration plus :data:`REQUEST_LOG` (log4j2 merges a
  comma-separated list), through ``HARVEST_JVM_OPTS``, which the embedded broker applies last.
- **The machine's CPU.** :class:`CpuSampler` reads ``/proc/stat`` every 50 ms: the busy share of all
  cores per interval; a window at 1.0 had every core busy, so any process that woke then waited.

Each slow row's window is [produce, receipt]: :meth:`BrokerRequests.queue_ms` is the longest queue phase of a
produce or fetch request that completed in it, :meth:`CpuSampler.busiest` the busiest 50 ms in it. With the
row's partition and offset (the consumer records them), :meth:`BrokerRequests.appended_at` says when the
broker had appended it (the produce response's base offsets place it in a batch) and
:meth:`BrokerRequests.fetched_at` when the broker sent it to the consumer (each consumer's client id names its
run): produce -> append -> fetch response -> receipt.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from bisect import bisect_left, bisect_right
from pathlib import Path

from harvest_outbox.harvest_local.kafka import CONF_DIR

#: The extra log4j2 configuration (``{path}``: the request log file). Times in Unix ms: the rows' stamps compare.
REQUEST_LOG = """\
appender.req.type = File
appender.req.name = REQ
appender.req.fileName = {path}
appender.req.layout.type = PatternLayout
appender.req.layout.pattern = %d{{UNIX_MILLIS}} %m%n
logger.req.name = kafka.request.logger
logger.req.level = DEBUG
logger.req.additivity = false
logger.req.appenderRef.req.ref = REQ
"""

_LINE = re.compile(r"^(\d{13}) Completed request:(.*)$")
_KINDS = ("PRODUCE", "FETCH")


def jvm_options(folder: Path) -> tuple[str, Path]:
    """The ``-D`` option that adds the request log, and the log's path (both under ``folder``)."""
    log, conf = folder / "kafka-requests.log", folder / "log4j2-requests.properties"
    conf.write_text(REQUEST_LOG.format(path=log))
    return f"-Dlog4j2.configurationFile={CONF_DIR / 'log4j2.properties'},{conf}", log


def _end(request: tuple[float, float]) -> float:
    return request[0]


class BrokerRequests:
    """The produce and fetch requests of a request log (read, then emptied, after each run: the log of a
    whole benchmark would be gigabytes): each with its end time and queue phases, and where the records of
    each topic partition were appended and fetched."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._requests: list[tuple[float, float]] = []  # (end s, queue ms), sorted by end
        # (topic, partition) -> [(base offset, append done s)], in log order
        self._appends: dict[tuple[str, int], list[tuple[int, float]]] = {}
        # (client id, partition) -> [(first offset, end offset, response done s)]
        self._fetches: dict[tuple[str, int], list[tuple[int, int, float]]] = {}

    def take(self) -> None:
        """Read what the log holds now and empty it (the broker appends: it carries on at the new end)."""
        if not self.path.exists():
            return
        text = self.path.read_text(errors="replace")
        os.truncate(self.path, 0)
        rows: list[tuple[float, float]] = []
        positions: dict[tuple[str, int], int] = {}
        for line in text.splitlines():
            m = _LINE.match(line)
            if not m:
                continue
            try:
                d = json.loads(m.group(2))
            except ValueError:
                continue
            header = d.get("requestHeader", {})
            kind = header.get("requestApiKeyName")
            if kind not in _KINDS:
                continue
            end = int(m.group(1)) / 1000
            queue = float(d.get("requestQueueTimeMs", 0)) + float(d.get("responseQueueTimeMs", 0))
            rows.append((end, queue))
            # the append was done before the response waited for a network thread and was sent
            done = end - (float(d.get("responseQueueTimeMs", 0)) + float(d.get("sendTimeMs", 0))) / 1000
            response = d.get("response") or {}
            if kind == "PRODUCE":
                for topic in response.get("responses", []):
                    if "name" not in topic:  # produce v13+ (the Java producer, Connect's) names a topic by id
                        continue
                    for part in topic.get("partitionResponses", []):
                        if part.get("errorCode") == 0 and part.get("baseOffset", -1) >= 0:
                            key = (topic["name"], part["index"])
                            self._appends.setdefault(key, []).append((part["baseOffset"], done))
            else:
                client = header.get("clientId", "")
                for topic in response.get("responses", []):
                    for part in topic.get("partitions", []):
                        if part.get("recordsSizeInBytes", 0) > 0 and part.get("errorCode") == 0:
                            key = (client, part["partitionIndex"])
                            first, last = positions.get(key, 0), part["highWatermark"]
                            self._fetches.setdefault(key, []).append((first, last, end))
                            positions[key] = last
        self._requests.extend(rows)
        self._requests.sort()  # a run's lines follow the last run's: nearly sorted already

    def __len__(self) -> int:
        return len(self._requests)

    def _queues_between(self, start_s: float, end_s: float) -> list[float]:
        i = bisect_left(self._requests, start_s, key=_end)
        j = bisect_right(self._requests, end_s, key=_end)
        return [q for _, q in self._requests[i:j]]

    def appended_at(self, topic: str, partition: int, offset: int) -> float | None:
        """When the broker had appended ``offset`` (the produce request whose batch holds it)."""
        best = None
        for base, done in self._appends.get((topic, partition), ()):
            if base <= offset and (best is None or base >= best[0]):
                best = (base, done)
        return None if best is None else best[1]

    def fetched_at(self, client: str, partition: int, offset: int) -> float | None:
        """When the broker sent ``client`` the fetch response carrying ``offset`` (positions tracked from 0:
        the bench's consumers read every partition from its start)."""
        for first, last, end in self._fetches.get((client, partition), ()):
            if first <= offset < last:
                return end
        return None

    def queue_ms(self, start_s: float, end_s: float) -> float | None:
        """The longest queue phase of a request that completed in [start_s, end_s] (None: none did)."""
        queues = self._queues_between(start_s, end_s)
        return round(max(queues), 1) if queues else None

    def summary(self, start_s: float, end_s: float) -> dict[str, float | int | None]:
        """Over a run's window: requests, p99 and max queue ms, and how many waited 20 ms or more."""
        q = sorted(self._queues_between(start_s, end_s))
        if not q:
            return {"requests": 0, "queue_p99_ms": None, "queue_max_ms": None, "queued_20ms_or_more": 0}
        return {
            "requests": len(q),
            "queue_p99_ms": round(q[min(len(q) - 1, int(len(q) * 0.99))], 1),
            "queue_max_ms": round(q[-1], 1),
            "queued_20ms_or_more": sum(1 for x in q if x >= 20),
        }


class CpuSampler:
    """The busy share of all cores per ~50 ms, from ``/proc/stat``, on a daemon thread."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self._times: list[float] = []
        self._busy: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def start(self) -> CpuSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    @staticmethod
    def _ticks() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields) - idle, sum(fields)

    def _run(self) -> None:
        busy0, total0 = self._ticks()
        while not self._stop.wait(self.interval):
            busy1, total1 = self._ticks()
            if total1 > total0:
                self._times.append(time.time())
                self._busy.append((busy1 - busy0) / (total1 - total0))
            busy0, total0 = busy1, total1

    def busiest(self, start_s: float, end_s: float) -> float | None:
        """The busiest sample ending in [start_s, end_s + one interval] (None: no sample)."""
        i, j = bisect_left(self._times, start_s), bisect_right(self._times, end_s + self.interval)
        return round(max(self._busy[i:j]), 2) if j > i else None

    def mean(self, start_s: float, end_s: float) -> float | None:
        i, j = bisect_left(self._times, start_s), bisect_right(self._times, end_s)
        return round(sum(self._busy[i:j]) / (j - i), 2) if j > i else None
