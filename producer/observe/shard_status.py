"""Who leads which shard, and each shard's backlog: what ``harvest shards`` prints.

Read from the engines themselves, not from the relays: the backlog and oldest row per shard from the
outbox (one ``GROUP BY`` over the shard expression), the leaders from the election — the holders of
the shard locks in ``pg_locks`` (named by their election connection's ``application_name``) or the
members of the NELI group and the leader-topic partitions assigned to them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from harvest_outbox.producer.config import HarvestConfig
from harvest_outbox.producer.errors import ConfigError, ElectionError
from harvest_outbox.producer.layouts.choice import layout_of
from harvest_outbox.producer.schema import OutboxNames


@dataclass(frozen=True)
class ShardStatus:
    index: int
    backlog_rows: int
    oldest_unsent_age: float | None
    leader: str | None  # the relay's name; None when nobody leads the shard


def postgres_leaders(conn: psycopg.Connection, outbox_table: str, count: int) -> dict[int, str]:
    from harvest_outbox.producer.election.postgres import key_parts, resolve_table
    from harvest_outbox.producer.election.sharded_postgres import shard_lock_key

    table = resolve_table(conn, outbox_table)
    parts = {key_parts(shard_lock_key(table, count, k)): k for k in range(count)}
    rows = conn.execute(
        "SELECT l.classid::bigint, l.objid::bigint, a.application_name FROM pg_locks l "
        "LEFT JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.objsubid = 1 "
        "AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    ).fetchall()
    out: dict[int, str] = {}
    for classid, objid, app in rows:
        k = parts.get((int(classid), int(objid)))
        if k is not None:
            out[k] = (app or "?").removeprefix("harvest-election:")
    return out


def neli_leaders(config: HarvestConfig, timeout: float = 10.0) -> dict[int, str]:
    import time

    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from harvest_outbox.producer.kafka.client_settings import for_admin

    admin = AdminClient(for_admin(config.base_kafka_config))
    for attempt in range(3):  # a group in the middle of a rebalance may not describe at once
        try:
            group: Any = admin.describe_consumer_groups([config.leader_group_id])[config.leader_group_id].result(
                timeout
            )
            break
        except KafkaException as exc:
            if attempt == 2:
                raise ElectionError(
                    f"cannot describe leader group {config.leader_group_id!r} (rebalancing? try again): "
                    f"{exc.args[0].str() or exc.args[0].name()}"
                ) from exc
            time.sleep(0.5)
    out: dict[int, str] = {}
    for member in group.members:
        name = str(member.client_id).removeprefix("harvest-neli-")
        for tp in member.assignment.topic_partitions if member.assignment else ():
            if tp.topic == config.leader_topic:
                out[tp.partition] = name
    return out


def shard_status(config: HarvestConfig) -> list[ShardStatus]:
    if config.shards < 2:
        raise ConfigError(
            "shards: the config has shards: 1 (one active relay for the whole outbox); "
            "`harvest shards` describes sharded outboxes (shards: 2 or more)"
        )
    from harvest_outbox.producer.db import connect

    names = OutboxNames.parse(config.outbox_table, config.table_mapping)
    with connect(config.data_source) as conn:
        backlog = layout_of(conn, names, config).backlog_by_shard(conn, names, config.shards)
        leaders = (
            postgres_leaders(conn, config.outbox_table, config.shards)
            if config.leader_election == "postgres"
            else neli_leaders(config)
        )
    return [
        ShardStatus(k, backlog.get(k, (0, None))[0], backlog.get(k, (0, None))[1], leaders.get(k))
        for k in range(config.shards)
    ]


def format_status(statuses: list[ShardStatus]) -> str:
    lines = [f"{'shard':>5}  {'backlog':>10}  {'oldest':>9}  leader"]
    for s in statuses:
        age = "-" if s.oldest_unsent_age is None else f"{s.oldest_unsent_age:.1f}s"
        lines.append(f"{s.index:>5}  {s.backlog_rows:>10,}  {age:>9}  {s.leader or '(none)'}")
    relays = {s.leader for s in statuses if s.leader}
    led = sum(1 for s in statuses if s.leader)
    lines.append(
        f"{len(statuses)} shards, {led} led by {len(relays)} relay(s), "
        f"{sum(s.backlog_rows for s in statuses):,} rows waiting"
    )
    return "\n".join(lines)
