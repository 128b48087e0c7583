"""Crash/pause test hooks of the ``--uuid-sequencing`` relay (docs/design.md §5).

:func:`install_crash_points` makes the process SIGKILL (``crash_at``) or SIGSTOP (``pause_at``)
itself the n-th time it reaches ``point``, given as ``point:n``, one of :data:`CRASH_POINTS`:
``after_publish_before_delivery`` (a transaction closed, all its records produced),
``after_delivery_before_commit``, ``after_commit_before_ack`` and ``after_some_acks`` (the first ACK
of a transaction touching >= 2 partitions was delivered, the others not produced).

Invariant: nothing here acts unless a test installed hooks. Only the test-only relay runner
(:mod:`harvest_local.relay_runner`, from ``HARVEST_TEST_CRASH_AT`` / ``HARVEST_TEST_PAUSE_AT``)
calls :func:`install_crash_points`: the ``harvest`` command never does, so those variables mean
nothing to a production relay (tests/test_producer/relay/sequenced/test_crash_hooks.py).
"""

from __future__ import annotations

import logging
import os
import signal
import time

from harvest_outbox.producer.errors import ConfigError

log = logging.getLogger(__name__)

CRASH_POINTS = (
    "after_publish_before_delivery",
    "after_delivery_before_commit",
    "after_commit_before_ack",
    "after_some_acks",
)


class CrashPoints:
    """The crash/pause test hooks of the relays this process builds (see module doc). Empty (and
    falsy) unless :func:`install_crash_points` was called."""

    def __init__(
        self,
        crash_at: str | None = None,
        pause_at: str | None = None,
        names: tuple[str, str] = ("crash_at", "pause_at"),
    ) -> None:
        self._points: dict[str, tuple[int, signal.Signals]] = {}
        self._counts: dict[str, int] = {}
        for what, spec, sig in zip(names, (crash_at, pause_at), (signal.SIGKILL, signal.SIGSTOP), strict=True):
            if spec:
                point, n = _parse_point(what, spec)
                self._points[point] = (n, sig)

    def __bool__(self) -> bool:
        return bool(self._points)

    def hit(self, point: str, settle: float = 0.0) -> None:
        if point not in self._points:
            return
        n = self._counts[point] = self._counts.get(point, 0) + 1
        at, sig = self._points[point]
        if n == at:
            if settle:
                time.sleep(settle)  # let librdkafka's threads write the records; serve no delivery reports
            log.warning("test hook: %s at %s #%d", sig.name, point, n)
            for h in logging.getLogger().handlers:
                h.flush()
            os.kill(os.getpid(), sig)


def _parse_point(what: str, spec: str) -> tuple[str, int]:
    point, _, n = spec.partition(":")
    fix = f"give point:n with point one of {', '.join(CRASH_POINTS)} and n >= 1 (default 1)"
    if point not in CRASH_POINTS:
        raise ConfigError(f"{what}={spec!r}: {point!r} is not a crash point; {fix}")
    try:
        count = int(n or 1)
    except ValueError:
        raise ConfigError(f"{what}={spec!r}: {n!r} is not a whole number; {fix}") from None
    if count < 1:
        raise ConfigError(f"{what}={spec!r}: the count must be 1 or more; {fix}")
    return point, count


#: What :class:`~producer.relay.sequenced.mode.SequencedMode` instances built from now on use; nothing unless a
#: test installed hooks.
_installed = CrashPoints()


def install_crash_points(
    crash_at: str | None = None, pause_at: str | None = None, names: tuple[str, str] = ("crash_at", "pause_at")
) -> None:
    """Test use only: relays built after this call SIGKILL / SIGSTOP themselves at the given points
    (``point:n``, see module doc). ConfigError names a bad value by its entry in ``names``."""
    global _installed
    _installed = CrashPoints(crash_at, pause_at, names)


def installed() -> CrashPoints:
    """The hooks a relay built now uses (falsy: none)."""
    return _installed
