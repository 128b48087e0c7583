"""The outbox side: schema, stasher, the harvest relay (MP/R + NELI) and the ``harvest`` CLI.

Embedded use::

    from harvest_outbox.producer import Harvest, HarvestConfig, OutboxRecord, Stasher, init_db
    init_db(dsn, "app.outbox")
    with psycopg.connect(dsn) as conn:          # in the application's transaction
        Stasher("app.outbox").stash(conn, OutboxRecord("orders", "order-1", '{"total": 3}'))
    # asyncio: await producer.AsyncStasher("app.outbox").stash(async_conn, record)
    # SQLAlchemy sessions: producer.stash.sqlalchemy.SessionStasher (needs harvest-outbox[sqlalchemy])
    relay = Harvest(HarvestConfig(data_source=dsn, outbox_table="app.outbox",
                                  base_kafka_config={"bootstrap.servers": "kafka:9092"})).start()
    ...
    relay.stop(); relay.wait()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harvest_outbox._lazy import exports

# The names below (and __version__) load on first use (PEP 562), not with the package: the `harvest`
# command installs its stop-signal handlers before the relay's dependencies (psycopg, confluent-kafka)
# take their ~0.2-0.4 s to import, so a SIGTERM right after start is a graceful stop, not a kill.
_EXPORTS = {
    "config": ("HarvestConfig", "Limits", "load_yaml"),
    "errors": (
        "ConfigError",
        "DatabaseError",
        "ElectionError",
        "HarvestError",
        "ProducerError",
        "RecordError",
        "SchemaError",
    ),
    "relay.events": ("LeaderAcquired", "LeaderFenced", "LeaderRefreshed", "LeaderRevoked", "MeterRead"),
    "harvest": ("Harvest",),
    "schema.ddl": ("init_db",),
    # Not the one-call ``stash()``: ``harvest_outbox.producer.stash`` is the stashing package, and Python
    # binds that name to the package whenever it is imported (it shadowed the function, so the name gave
    # one or the other by import order). The function is ``harvest_outbox.producer.stash.stasher.stash``.
    "stash.stasher": ("OutboxRecord", "Stasher", "stash_many"),
    "stash.async_stasher": ("AsyncStasher",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

if TYPE_CHECKING:
    from harvest_outbox.producer.config import HarvestConfig, Limits, load_yaml
    from harvest_outbox.producer.errors import (
        ConfigError,
        DatabaseError,
        ElectionError,
        HarvestError,
        ProducerError,
        RecordError,
        SchemaError,
    )
    from harvest_outbox.producer.harvest import Harvest
    from harvest_outbox.producer.relay.events import (
        LeaderAcquired,
        LeaderFenced,
        LeaderRefreshed,
        LeaderRevoked,
        MeterRead,
    )
    from harvest_outbox.producer.schema.ddl import init_db
    from harvest_outbox.producer.stash.async_stasher import AsyncStasher
    from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher, stash_many


_lazy_getattr, __dir__ = exports(__name__, _MODULE_OF, listed=("__version__",))


def __getattr__(name: str) -> Any:
    if name == "__version__":  # reading the installed metadata costs ~10-20 ms: only when asked
        import harvest_outbox  # the one definition, read on first use there too

        globals()[name] = value = harvest_outbox.__version__
        return value
    return _lazy_getattr(name)


__all__ = [
    "AsyncStasher",
    "ConfigError",
    "DatabaseError",
    "ElectionError",
    "Harvest",
    "HarvestConfig",
    "HarvestError",
    "LeaderAcquired",
    "LeaderFenced",
    "LeaderRefreshed",
    "LeaderRevoked",
    "Limits",
    "MeterRead",
    "OutboxRecord",
    "ProducerError",
    "RecordError",
    "SchemaError",
    "Stasher",
    "__version__",
    "init_db",
    "load_yaml",
    "stash_many",
]
