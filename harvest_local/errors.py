"""Errors of the embedded-services launcher."""

from __future__ import annotations

from harvest_outbox.errors import HarvestOutboxError


class HarvestLocalError(HarvestOutboxError):
    """Base class of every error raised by :mod:`harvest_local`."""


class PrerequisiteError(HarvestLocalError):
    """Something the machine must provide is missing; the message says what and how to fix it."""

    def __init__(self, missing: str, fix: str) -> None:
        self.missing = missing
        self.fix = fix
        super().__init__(f"missing prerequisite: {missing}. Fix: {fix}")


class ServiceError(HarvestLocalError):
    """A service did not start, or did not become ready in time."""

    def __init__(self, service: str, problem: str, log_tail: str = "") -> None:
        self.service = service
        self.problem = problem
        self.log_tail = log_tail
        detail = f"\n--- last lines of the {service} log ---\n{log_tail}" if log_tail else ""
        super().__init__(f"{service}: {problem}{detail}")
