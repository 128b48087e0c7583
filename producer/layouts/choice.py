"""The one place an outbox layout is chosen (docs/design.md, "Outbox layouts"): :func:`layout_for` maps
``outboxLayout``'s value (or a config's) to its :class:`~producer.layouts.layout.OutboxLayout`, and
:func:`detected_layout` names the layout an existing outbox table is in.

Invariant (tests/test_foundation/test_layouts.py): no other module tells the layouts apart by name or
class; they ask the strategy chosen here.
"""

from __future__ import annotations

from typing import Protocol

import psycopg

from harvest_outbox.producer.errors import ConfigError, shown
from harvest_outbox.producer.layouts.cursor.layout import CursorLayout
from harvest_outbox.producer.layouts.cursor.schema import is_cursor_table
from harvest_outbox.producer.layouts.layout import OutboxLayout
from harvest_outbox.producer.layouts.mark.layout import MarkLayout
from harvest_outbox.producer.mapping.names import OutboxNames

MARK: OutboxLayout = MarkLayout()
CURSOR: OutboxLayout = CursorLayout()
#: ``outboxLayout``'s values, the default first.
LAYOUTS: dict[str, OutboxLayout] = {MARK.name: MARK, CURSOR.name: CURSOR}


class _Configured(Protocol):
    @property
    def outbox_layout(self) -> str: ...


def layout_for(name_or_config: str | _Configured) -> OutboxLayout:
    """The layout named ``outboxLayout: <name>`` (or a config's); :class:`~producer.errors.ConfigError`
    naming the value and the layouts for any other."""
    name = name_or_config if isinstance(name_or_config, str) else name_or_config.outbox_layout
    layout = LAYOUTS.get(name)
    if layout is None:
        raise ConfigError(
            f"outboxLayout: {shown(name)} is not a layout; use mark (goharvest's table, the "
            f"default) or cursor (the cursor layout's partitioned outbox `harvest init-db` creates)"
        )
    return layout


def detected_layout(conn: psycopg.Connection, names: OutboxNames) -> OutboxLayout | None:
    """The layout of the outbox table ``names`` names, None when there is no table."""
    cursor = is_cursor_table(conn, names)
    if cursor is None:
        return None
    return CURSOR if cursor else MARK
