"""Leader election: who relays (the whole outbox, or which of its shards), one module per kind.

* :mod:`.neli` — the interface every relay sees (:class:`LeaderElection`: ``start(listener)``,
  ``pulse()``, ``is_leader``, ``close()``; :class:`StaticElection` for tests and embedding) and
  NELI (goneli's 'fast' variant) over a one-partition Kafka topic (``leaderElection: neli``);
* :mod:`.postgres` — one session advisory lock in the outbox's database (``leaderElection: postgres``);
* :mod:`.sharded_neli` — ``shards: S``: the shard-set interface (:class:`ShardElection`), the seat
  that lets the one relay loop lead while any shard is led (:class:`ShardSetSeat`), and NELI over an
  S-partition leader topic;
* :mod:`.sharded_postgres` — ``shards: S`` with one advisory lock per shard;
* :mod:`.shared_postgres` — a fleet's Postgres elections of many outboxes on one session per database.

The names below load on first use (PEP 562), so ``import harvest_outbox.producer.election`` pulls in
neither confluent-kafka nor psycopg; the relay's modules import the submodule they need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harvest_outbox._lazy import exports

_MODULE_OF = {
    "ElectionListener": "neli",
    "LeaderElection": "neli",
    "StaticElection": "neli",
    "NeliElection": "neli",
    "PostgresElection": "postgres",
    "ShardListener": "sharded_neli",
    "ShardElection": "sharded_neli",
    "ShardSetSeat": "sharded_neli",
    "NeliShardElection": "sharded_neli",
    "fair_share": "sharded_neli",
    "PostgresShardElection": "sharded_postgres",
}

__all__ = [
    "ElectionListener",
    "LeaderElection",
    "NeliElection",
    "NeliShardElection",
    "PostgresElection",
    "PostgresShardElection",
    "ShardElection",
    "ShardListener",
    "ShardSetSeat",
    "StaticElection",
    "fair_share",
]


__getattr__, __dir__ = exports(__name__, _MODULE_OF)


if TYPE_CHECKING:
    from .neli import ElectionListener, LeaderElection, NeliElection, StaticElection
    from .postgres import PostgresElection
    from .sharded_neli import NeliShardElection, ShardElection, ShardListener, ShardSetSeat, fair_share
    from .sharded_postgres import PostgresShardElection
