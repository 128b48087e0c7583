"""librdkafka's own log lines of harvest's Kafka clients, through :mod:`logging` (:data:`LIBRDKAFKA_LOG`).

Invariants:
- every client harvest makes logs through :data:`LIBRDKAFKA_LOG` (:func:`logged`, :func:`logged_admin`),
  never raw lines on stderr, so the CLI's format, level and handlers apply;
- an admin client's lines are served (nothing else polls it), so they never pile up in memory;
- a warning or error repeated by any client is logged once per :attr:`_RepeatedLines.WINDOW`, and the
  next one says how many were left out; the ``enable.gapless.guarantee`` warning harvest chose is DEBUG.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import weakref
from typing import Any

#: librdkafka's own log lines of harvest's clients (broker connections lost, config warnings) go
#: through :mod:`logging` instead of raw lines on stderr, so the CLI's format, level and handlers
#: apply. confluent-kafka serves them inside ``poll()``/``flush()``, which every such client calls
#: (admin clients included: :func:`serve_logs`). Repeated failures are logged once per window.
LIBRDKAFKA_LOG = logging.getLogger("harvest_outbox.librdkafka")


class _ChosenSettingWarnings(logging.Filter):
    """librdkafka warns on every producer that ``enable.gapless.guarantee`` is experimental. With
    ``--uuid-sequencing`` harvest sets it on purpose (a gap must fail the producer, not the order:
    docs/design.md §5), so at each relay start and producer replacement the warning told users nothing
    they could act on. It is kept, at DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if (
            record.levelno >= logging.WARNING
            and isinstance(args, tuple)
            and len(args) == 3
            and args[0] == "CONFWARN"
            and "enable.gapless.guarantee is experimental" in str(args[2])
        ):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return LIBRDKAFKA_LOG.isEnabledFor(logging.DEBUG)
        return True


# What differs between two reports of one failure: librdkafka's own "(after 0ms in state CONNECT, 3
# identical error(s) suppressed)" tail.
_REPORT_TAIL = re.compile(r"\s*\(after \d+ms in state [^)]*\)")


class _RepeatedLines(logging.Filter):
    """A broker that is down makes every client report each reconnection (~20 ``FAIL`` lines a second
    at start-up, one per client). A warning or error is logged once per :attr:`WINDOW` whatever client
    repeats it; the next one after the window says how many were left out. Thread-safe: clients are
    polled on the relay's and the elections' threads."""

    WINDOW = 30.0
    _MAX_KINDS = 1000  # distinct lines remembered; forgetting them only lets a repeat through early

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], list[float]] = {}  # kind -> [first logged at, left out since]

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if record.levelno < logging.WARNING or not (isinstance(args, tuple) and len(args) == 3):
            return True
        kind = (str(args[0]), _REPORT_TAIL.sub("", str(args[2])))
        now = time.monotonic()
        with self._lock:
            seen = self._seen.get(kind)
            if seen is not None and now - seen[0] < self.WINDOW:
                seen[1] += 1
                return False
            if len(self._seen) >= self._MAX_KINDS:
                self._seen.clear()
            self._seen[kind] = [now, 0]
        if seen is not None and seen[1]:
            record.args = (
                args[0],
                args[1],
                f"{args[2]} ({int(seen[1])} more like it in the last {now - seen[0]:.0f} s not logged)",
            )
        return True


LIBRDKAFKA_LOG.addFilter(_ChosenSettingWarnings())
LIBRDKAFKA_LOG.addFilter(_RepeatedLines())


def logged(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with harvest's librdkafka logger, for a producer or consumer the relay polls anyway
    (an admin client is made by :func:`logged_admin`)."""
    return {"logger": LIBRDKAFKA_LOG, **config}


class _AdminLogPump:
    """confluent-kafka hands a client's log lines over only inside ``poll()``, which nothing calls on an
    admin client: its lines would pile up in memory (about one a second while a broker is down). One
    daemon thread polls every live admin client of the relay; it ends when none is left."""

    INTERVAL = 0.5

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: weakref.WeakSet[Any] = weakref.WeakSet()
        self._thread: threading.Thread | None = None

    def add(self, client: Any) -> None:
        with self._lock:
            self._clients.add(client)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="harvest-librdkafka-log", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.INTERVAL)
            with self._lock:
                clients = list(self._clients)
                if not clients:
                    self._thread = None
                    return
            for client in clients:
                serve_logs(client)
            del clients  # no strong reference between two rounds: a dropped client goes at once


_ADMIN_LOG_PUMP = _AdminLogPump()


def logged_admin(config: dict[str, Any]) -> Any:
    """An admin client whose librdkafka lines go to :data:`LIBRDKAFKA_LOG` (not raw to stderr)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(logged(config))
    _ADMIN_LOG_PUMP.add(admin)
    return admin


def serve_logs(client: Any) -> None:
    """Hand over the log lines ``client`` queued now (before dropping an admin client, say)."""
    try:
        client.poll(0)
    except Exception as exc:  # a log pump must not fail its caller
        LIBRDKAFKA_LOG.debug("polling a Kafka client for its log lines: %s", exc)
