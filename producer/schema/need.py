"""One component's privileges on one object (:class:`Need`): what each layout says of its own objects
(:meth:`~producer.layouts.layout.OutboxLayout.grants`) and producer/schema/grants.py of the rest. Its own
module so that the layouts, which grants.py chooses among, import it without importing grants.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from psycopg import sql

from harvest_outbox.producer.mapping.names import OutboxNames

Component = Literal["owner", "relay", "writer", "admin", "reader"]
Kind = Literal["SCHEMA", "TABLE", "SEQUENCE", "OWNER", "MEMBER"]


@dataclass(frozen=True)
class Need:
    """``component``'s privileges on one object (``OWNER``: the object is to be owned by it; ``MEMBER``:
    it joins the role of ``member_of``, for that role's rights on the object), and why."""

    component: Component
    kind: Kind
    target: sql.Identifier
    privileges: tuple[str, ...]
    why: str
    #: Only these columns of the table (a column privilege), when given.
    columns: tuple[str, ...] = ()
    #: ``MEMBER``: the component whose role this one's joins.
    member_of: Component | None = None


def schema_of(names: OutboxNames) -> sql.Identifier:
    """The outbox's schema; ``public`` for an unqualified outbox (the usual ``search_path``)."""
    return sql.Identifier(names.schema or "public")
