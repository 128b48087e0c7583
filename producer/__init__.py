"""The outbox side: schema, stasher, the harvest relay (MP/R + NELI) and the ``harvest`` CLI.

Embedded use::

    from harvest_outbox.producer import Harvest, HarvestConfig, OutboxRecord, Stasher, init_db
    init_db(dsn, "app.outbox")
    with psycopg.connect(dsn) as conn:          # in the application's transaction
        Stasher("app.outbox").stash(conn, OutboxRecord("orders", "order-1", '{"total": 3}'))
    # asyncio: await producer.AsyncStasher("app.outbox").stash(async_conn, record)
    # SQLAlchemy sessions: producer.sqlalchemy.SessionStasher (needs harvest-outbox[sqlalchemy])
    relay = Harvest(HarvestConfig(data_source=dsn, outbox_table="app.outbox",
                                  base_kafka_config={"bootstrap.servers": "kafka:9092"})).start()
    ...
    relay.stop(); relay.wait()
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("harvest-outbox")
except PackageNotFoundError:  # running from a checkout without installing
    __version__ = "0.0.0+unknown"

from harvest_outbox.producer.config import HarvestConfig, Limits, load_yaml  # noqa: E402
from harvest_outbox.producer.errors import (ConfigError, DatabaseError, ElectionError, HarvestError, ProducerError,  # noqa: E402
                                            RecordError, SchemaError)
from harvest_outbox.producer.events import (LeaderAcquired, LeaderFenced, LeaderRefreshed, LeaderRevoked,  # noqa: E402
                                            MeterRead)
from harvest_outbox.producer.harvest import Harvest  # noqa: E402
from harvest_outbox.producer.schema import init_db  # noqa: E402
from harvest_outbox.producer.stasher import OutboxRecord, Stasher, stash, stash_many  # noqa: E402
from harvest_outbox.producer.stasher_async import AsyncStasher  # noqa: E402

__all__ = [
    "AsyncStasher", "ConfigError", "DatabaseError", "ElectionError", "Harvest", "HarvestConfig", "HarvestError",
    "LeaderAcquired",
    "LeaderFenced", "LeaderRefreshed", "LeaderRevoked", "Limits", "MeterRead", "OutboxRecord", "ProducerError",
    "RecordError", "SchemaError", "Stasher", "__version__", "init_db", "load_yaml", "stash", "stash_many",
]
