"""The outbox table (goharvest's schema, as is) and the objects the relay adds next to it.

Objects, for an outbox table ``[schema.]name``:
- ``name``: goharvest's outbox (``id BIGSERIAL PK, create_time, kafka_topic, kafka_key,
  kafka_value, kafka_header_keys, kafka_header_values, leader_id``); ``kafka_value`` is
  ``VARCHAR`` (goharvest) or ``BYTEA`` (binary payloads). Existing goharvest tables work unchanged.
- ``name_dead_letters``: rows the relay gave up on, with the error and attempt count.
- ``name_harvest_state``: one row (``epoch``, ``leader_id``, ``leader_name``, ``updated_at``,
  ``last_clock``) — the fence of ``--uuid-sequencing``: every leader view increments ``epoch``; a
  commit checks it and raises ``last_clock`` to its ACK clock, the floor of every later view's
  UUID clock (so clocks rise across views even when a leader's wall clock steps back).
- ``name_ack_intents``: persisted, not yet confirmed ACK_TXN intents of committed harvest
  transactions (``epoch``, ``producer``, ``clock``, ``topic``, ``kafka_partition``).
- ``name_delivery_attempts``: failed delivery attempts per outbox row id (``attempts``,
  ``last_error``, ``updated_at``), so ``maxDeliveryAttempts`` counts across relay restarts and
  leader changes. Rows exist only for ids that failed at least once; they are deleted when the row
  is delivered, committed or dead-lettered.
- with ``shards: S`` (S > 1): an expression index ``name_shard<S>_v2_idx`` on ``(shard, id)``
  (:func:`producer.relay.shards.shard_expression`) and ``name_harvest_shards``, the fence row of each shard
  (``shard_count``, ``shard``, then the columns of ``name_harvest_state``); ACK intents carry
  ``shard_count`` and ``shards``, the shards of the view that wrote them (1 and ``{0}`` for the
  unsharded relay), so a view recovers only intents of views that led one of its shards.
- ``name_harvest_layout``: one row, the layout of the relays running on the outbox (``shards``,
  ``leader_election``, ``leader_group_id``, ``leader_topic``, ``updated_by``, ``updated_at``;
  :mod:`producer.relay.admission`); empty until the first relay starts.
- storage parameters of a queue table on the outbox: ``fillfactor`` (:data:`OUTBOX_FILLFACTOR`) and
  autovacuum (:data:`OUTBOX_AUTOVACUUM`), each only where the table has no value of its own.
- ``harvest_notify()`` + statement-level trigger ``name_notify``: ``pg_notify(channel)`` after each
  INSERT statement. Notifications are delivered at commit (and dropped on rollback), so any writer,
  including goharvest's Go stasher, wakes the relay without code changes.

Each concept has a module of its own, re-exported here (``from harvest_outbox.producer.schema import …``):
:mod:`~producer.mapping.names` (the objects' names), :mod:`~producer.schema._storage` (the queue table's
storage parameters) and :mod:`~producer.schema.checks` (what the relay checks before it runs). The DDL and
:func:`~producer.schema.ddl.init_db` are imported from :mod:`producer.schema.ddl` (or ``init_db`` from
:mod:`producer`), not from here: they depend on the outbox layouts (:func:`~producer.layouts.choice.layout_for`),
whose relay databases run this package's checks, so this package does not import them (no import cycle).

Invariants (each kept by the module that owns it):
- identifiers are always passed through :class:`psycopg.sql.Identifier`; a table name is split
  into at most (schema, table) and never interpolated raw;
- :func:`init_db` is idempotent (``IF NOT EXISTS`` / ``OR REPLACE``) and runs in one transaction.
"""

from __future__ import annotations

from harvest_outbox.producer.mapping.names import OutboxNames, Statement, ValueType, parse_table_name
from harvest_outbox.producer.schema._storage import (
    OUTBOX_AUTOVACUUM,
    OUTBOX_FILLFACTOR,
    missing_storage,
    outbox_fillfactor,
    packed_outbox_fix,
    storage_sql,
    table_reloptions,
)
from harvest_outbox.producer.schema.checks import (
    inspect_outbox,
    require_attempts_table,
    require_shards,
    require_utf8_readable,
    unrelayed_rows,
)

__all__ = [
    "OUTBOX_AUTOVACUUM",
    "OUTBOX_FILLFACTOR",
    "OutboxNames",
    "Statement",
    "ValueType",
    "inspect_outbox",
    "missing_storage",
    "outbox_fillfactor",
    "packed_outbox_fix",
    "parse_table_name",
    "require_attempts_table",
    "require_shards",
    "require_utf8_readable",
    "storage_sql",
    "table_reloptions",
    "unrelayed_rows",
]
