"""The one place an outbox layout is chosen (docs/design.md, "Outbox layouts"): :func:`layout_for` maps
``outboxLayout``'s value (or a config's) to its :class:`~producer.layouts.layout.OutboxLayout`,
:func:`detected_layout` names the layout an existing outbox table is in, and with ``outboxLayout`` unset
:func:`layout_of` follows the table (:func:`new_outbox_layout` for one ``init-db`` is about to create).

The default (``outboxLayout`` unset; docs/design.md, "Which layout a new outbox gets"): an existing table keeps
its layout (goharvest's and Debezium's tables are mark-layout tables), a new outbox gets the cursor layout,
unless the config uses a setting the cursor layout refuses or the server is older than Postgres 13: then the
mark layout, with the reason.

Invariants (tests/test_foundation/test_layouts.py, tests/test_producer/layouts/cursor/test_online_migration.py): no
other module tells the layouts apart by name or class; they ask the strategy chosen here. An explicit
``outboxLayout`` is never overridden (a table of the other layout is refused by the layout's ``require``).
"""

from __future__ import annotations

from typing import Protocol

import psycopg

from harvest_outbox.producer.errors import ConfigError, shown
from harvest_outbox.producer.layouts.cursor.layout import CursorLayout
from harvest_outbox.producer.layouts.cursor.schema import MIN_SERVER_VERSION, is_cursor_table
from harvest_outbox.producer.layouts.layout import LayoutSettings, OutboxLayout
from harvest_outbox.producer.layouts.mark.layout import MarkLayout
from harvest_outbox.producer.mapping.names import OutboxNames

MARK: OutboxLayout = MarkLayout()
CURSOR: OutboxLayout = CursorLayout()
#: ``outboxLayout``'s values, the default first.
LAYOUTS: dict[str, OutboxLayout] = {MARK.name: MARK, CURSOR.name: CURSOR}


#: The layout a new outbox gets when ``outboxLayout`` is unset (docs/primary-cost.md: 0.004-0.008x the
#: mark layout's relay WAL per row, 0.3x its Postgres CPU).
NEW_OUTBOX: OutboxLayout = CURSOR


class _Configured(Protocol):
    @property
    def outbox_layout(self) -> str | None: ...


class _Settings(_Configured, LayoutSettings, Protocol):
    """A config: ``outboxLayout`` and the settings a layout may refuse."""


def layout_for(name_or_config: str | _Configured) -> OutboxLayout:
    """The layout named ``outboxLayout: <name>`` (or a config's, which must set it: an unset one follows the
    table, :func:`layout_of`); :class:`~producer.errors.ConfigError` naming the value and the layouts for any
    other."""
    name = name_or_config if isinstance(name_or_config, str) else name_or_config.outbox_layout
    layout = LAYOUTS.get(name) if name is not None else None
    if layout is None:
        raise ConfigError(
            f"outboxLayout: {shown(name)} is not a layout; use mark (goharvest's table) or cursor (the cursor "
            f"layout's partitioned outbox `harvest init-db` creates), or leave it unset (the table's layout; "
            f"a new outbox gets the cursor layout)"
        )
    return layout


def new_outbox_layout(settings: LayoutSettings, server_version: int | None = None) -> tuple[OutboxLayout, str | None]:
    """The layout ``init-db`` gives a new outbox when ``outboxLayout`` is unset, and why it is not
    :data:`NEW_OUTBOX` (None when it is): a setting the cursor layout refuses, or a server older than
    Postgres 13 (``server_version``, as ``conn.info.server_version``; None: not known, not checked)."""
    try:
        NEW_OUTBOX.refuse(settings)
    except ConfigError as exc:
        return MARK, str(exc).split(" (", 1)[0].replace("outboxLayout: cursor", "the cursor layout")
    if server_version is not None and server_version < MIN_SERVER_VERSION:
        return MARK, f"the server is Postgres {server_version // 10000}, the cursor layout needs 13 or later"
    return NEW_OUTBOX, None


def layout_of(conn: psycopg.Connection, names: OutboxNames, config: _Settings) -> OutboxLayout:
    """The layout of ``config``'s outbox: ``outboxLayout`` when set; unset, the existing table's, or for no
    table the one :func:`new_outbox_layout` picks. A detected layout refuses the settings it cannot keep
    (:class:`~producer.errors.ConfigError`, as an explicit one does with the config)."""
    if config.outbox_layout is not None:
        return layout_for(config)
    layout = detected_layout(conn, names)
    if layout is None:
        return new_outbox_layout(config, conn.info.server_version)[0]
    try:
        layout.refuse(config)
    except ConfigError as exc:
        raise ConfigError(f"outbox {names.display!r} is in the {layout.name} layout: {exc}") from None
    return layout


def detected_layout(conn: psycopg.Connection, names: OutboxNames) -> OutboxLayout | None:
    """The layout of the outbox table ``names`` names, None when there is no table."""
    cursor = is_cursor_table(conn, names)
    if cursor is None:
        return None
    return CURSOR if cursor else MARK


def init_layout(conn: psycopg.Connection, names: OutboxNames, config: _Settings) -> tuple[OutboxLayout, str | None]:
    """The layout ``harvest init-db`` makes or keeps for ``config``'s outbox (:func:`layout_of`), and, for a new
    outbox given the mark layout although ``outboxLayout`` is unset, why (:func:`new_outbox_layout`)."""
    if config.outbox_layout is None and detected_layout(conn, names) is None:
        return new_outbox_layout(config, conn.info.server_version)
    return layout_of(conn, names, config), None


def migration_target(config: _Settings) -> OutboxLayout:
    """The layout ``init-db --migrate`` moves ``config``'s outbox into: the one that ``migrates_into``, named or
    (``outboxLayout`` unset) the default's; :class:`~producer.errors.ConfigError` when the config names another
    or uses a setting it refuses."""
    target = NEW_OUTBOX if config.outbox_layout is None else layout_for(config)
    if not target.migrates_into:
        raise ConfigError(
            f"init-db --migrate: outboxLayout: {config.outbox_layout} is the layout migrated from; set outboxLayout: "
            f"cursor in the config (the layout to migrate to), or leave it unset"
        )
    target.refuse(config)
    return target
