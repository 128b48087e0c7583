"""A relay whose outbox moves to the cursor layout under it (``harvest init-db --migrate --online``;
docs/migrating.md): the relay of the mark layout stops, and one whose ``outboxLayout`` is unset starts again on
the new layout.

How a running relay learns of the move: the migrated table refuses every row ``UPDATE`` and ``DELETE`` with its
own SQLSTATE (a statement trigger, producer/layouts/cursor/migrate.py), which is every statement by which a
relay of the mark layout marks, releases or deletes rows; the session turns it into
:class:`~producer.errors.LayoutChanged` (producer/db/_session.py) and the relay loop stops on it instead of
retrying (producer/harvest.py). So that relay never publishes a row of the new table, and the rows it had
marked but not deleted were copied into the new table by the migration: at-least-once, they go out again
(duplicates, no loss); ``--uuid-sequencing``, its fenced commit failed with the trigger, so its un-ACKed
harvest transaction is discarded by readers and the rows go out once from the new table.

Invariants (tests/test_producer/layouts/cursor/test_online_migration.py, whose scenario runs
:func:`run_following_layout` as ``harvest run`` does): :func:`restarts_on` is true exactly for an error caused by
:class:`~producer.errors.LayoutChanged` with ``outboxLayout`` unset; an explicit ``outboxLayout: mark`` relay
stops with that error (exit 1), naming the fix; a relay that stops for any other reason is not started again here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from harvest_outbox.producer.config import HarvestConfig
from harvest_outbox.producer.errors import HarvestError, LayoutChanged

log = logging.getLogger(__name__)
#: Seconds between a relay's stop on a layout change and its successor's start.
RESTART_PAUSE = 1.0


class Relay(Protocol):
    """A relay process (:class:`~producer.harvest.Harvest`, :class:`~producer.relay.sharded.ShardedHarvest`)."""

    def start(self) -> object: ...

    def stop(self) -> None: ...

    def wait(self, timeout: float | None = None) -> bool: ...


def layout_changed(exc: BaseException | None) -> LayoutChanged | None:
    """The :class:`~producer.errors.LayoutChanged` that ``exc`` is or was caused by (the relay's ``wait()``
    chains the loop's error; a sharded relay chains its loop's), None when there is none."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, LayoutChanged):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def restarts_on(exc: BaseException, config: HarvestConfig) -> bool:
    """Whether a relay of ``config`` that ended with ``exc`` starts again, on the table's new layout: its
    outbox moved to the cursor layout and its ``outboxLayout`` is unset (set, the relay is refused, and its
    operator changes the config)."""
    return config.outbox_layout is None and layout_changed(exc) is not None


def stop_message(config: HarvestConfig) -> str:
    """What the log says when a relay stops for a move to the cursor layout."""
    if config.outbox_layout is None:
        return f"outbox {config.outbox_table} moved to the cursor layout: starting relay {config.name} again on it"
    return (
        f"outbox {config.outbox_table} moved to the cursor layout: relay {config.name} (outboxLayout: "
        f"{config.outbox_layout}) stops; set outboxLayout: cursor, or remove it, and start it again (docs/migrating.md)"
    )


def run_following_layout(
    config: HarvestConfig,
    make_relay: Callable[[HarvestConfig], Relay],
    attach: Callable[[Relay], None],
    stopped: threading.Event,
) -> None:
    """Run a relay of ``config`` (``make_relay``; ``attach`` hands it to whatever stops it, the CLI's signal
    handlers) until it stops, and start another, on the table's new layout, while it stops for a move to the
    cursor layout with ``outboxLayout`` unset (:func:`restarts_on`); its other errors are raised as they come,
    and a stop (``stopped``) during the pause ends it."""
    while True:
        relay = make_relay(config)
        attach(relay)
        relay.start()  # returns early, with the relay stopped, when a stop signal arrives meanwhile
        try:
            while not relay.wait(0.5):
                pass
        except HarvestError as exc:
            if layout_changed(exc) is None:
                raise
            log.warning("%s", stop_message(config))
            if not restarts_on(exc, config):
                raise
            if stopped.wait(RESTART_PAUSE):
                return
            continue
        return
