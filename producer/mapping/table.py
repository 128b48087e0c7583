"""The table mapping chooser: ``tableMapping`` (and ``eventRouter``) of the config -> the one
:class:`~producer.mapping.protocol.TableMapping` the relay reads its outbox through (docs/debezium.md,
docs/design.md "Table mappings").

- :data:`GOHARVEST` (default, :mod:`producer.mapping.goharvest`): goharvest's table as is;
- :class:`DebeziumMapping` (:mod:`producer.mapping.debezium`): Debezium's outbox convention, routed the way
  Debezium's outbox event router routes it.

The relay's statements (:mod:`producer.db`, :mod:`producer.ops._deadletters`, :mod:`producer.relay.shards`) name
the outbox's columns only through a mapping: :meth:`TableMapping.id` (the order of rows, bigint),
:meth:`~TableMapping.leader`, :meth:`~TableMapping.created`, and the record expressions of
:meth:`~TableMapping.record` (topic, key, value, header keys, header values), each qualified by the
statement's alias for the outbox.

Invariants (tests/test_producer/mapping/test_table_mapping.py, tests/test_foundation/test_table_mapping_chosen_once.py):
- :func:`table_mapping` is the one place that tells the mappings apart; every other module calls the
  mapping it is given;
- the router's options are read strictly (:mod:`producer.mapping._event_router`: an unknown, unimplemented or
  mistyped option is a :class:`~producer.errors.ConfigError` naming it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harvest_outbox.producer.errors import ConfigError, shown

# Re-exported: their import path before each mapping had a module of its own.
from harvest_outbox.producer.mapping._event_router import AdditionalField as AdditionalField
from harvest_outbox.producer.mapping._event_router import EventRouter as EventRouter
from harvest_outbox.producer.mapping.debezium import DEBEZIUM_CREATED as DEBEZIUM_CREATED
from harvest_outbox.producer.mapping.debezium import DEBEZIUM_LEADER as DEBEZIUM_LEADER
from harvest_outbox.producer.mapping.debezium import DEBEZIUM_PAYLOAD_TYPES as DEBEZIUM_PAYLOAD_TYPES
from harvest_outbox.producer.mapping.debezium import DEBEZIUM_SEQ as DEBEZIUM_SEQ
from harvest_outbox.producer.mapping.debezium import DEBEZIUM_TEXT_TYPES as DEBEZIUM_TEXT_TYPES
from harvest_outbox.producer.mapping.debezium import DebeziumMapping as DebeziumMapping
from harvest_outbox.producer.mapping.goharvest import GOHARVEST as GOHARVEST
from harvest_outbox.producer.mapping.goharvest import GoharvestMapping as GoharvestMapping
from harvest_outbox.producer.mapping.protocol import RecordSql as RecordSql
from harvest_outbox.producer.mapping.protocol import TableMapping as TableMapping

TABLE_MAPPINGS = ("goharvest", "debezium")


def table_mapping(kind: Any, router_options: Mapping[str, Any] | None = None, path: str = "") -> TableMapping:
    """The mapping named by ``tableMapping`` (with ``eventRouter``'s options for ``debezium``)."""
    where = f"{path}." if path else ""
    if kind in (None, "goharvest"):
        if router_options:
            raise ConfigError(
                f"{where}eventRouter: only applies to tableMapping: debezium (this outbox is "
                f"goharvest's); remove it or set tableMapping: debezium"
            )
        return GOHARVEST
    if kind == "debezium":
        return DebeziumMapping(EventRouter.from_options(router_options, f"{where}eventRouter"))
    raise ConfigError(
        f"{where}tableMapping: {shown(kind)} is not a table mapping; use one of "
        f"{', '.join(TABLE_MAPPINGS)} (default goharvest)"
    )
