"""The relay's leader-election settings (YAML ``leaderElection``, ``leaderLockCheckInterval``, ``leaderTopic``,
``leaderGroupID``, ``leaderTopicReplicationFactor``, and NELI's bound on ``limits.heartbeatTimeout``).

Invariants:
- the election is one of :data:`LEADER_ELECTIONS`; the leader group and topic are legal Kafka names, the
  topic of a sharded relay its own (``<group>.neli.shards<S>``, one partition per shard) unless named;
- with NELI, ``heartbeatTimeout`` is within what brokers accept for the election group's session
  (:data:`NELI_MIN_HEARTBEAT_TIMEOUT` - :data:`NELI_MAX_HEARTBEAT_TIMEOUT`), so a relay can always lead;
- every refusal is a :class:`~producer.errors.ConfigError` naming the key, the value and a fix.
"""

from __future__ import annotations

from typing import Any

from harvest_outbox.producer._kafka_names import LEGAL_NAME, NAME_RULE
from harvest_outbox.producer.config._values import format_duration
from harvest_outbox.producer.errors import ConfigError, shown

LEADER_ELECTIONS = ("neli", "postgres")
#: NELI maps heartbeatTimeout to the consumer group's session.timeout.ms = 3 x heartbeatTimeout;
#: brokers accept only sessions within group.min.session.timeout.ms (default 6 s) and
#: group.max.session.timeout.ms (default 30 min).
NELI_MIN_HEARTBEAT_TIMEOUT = 2.0
NELI_MAX_HEARTBEAT_TIMEOUT = 600.0


def leader_names(group_id: str, topic: str, shards: int) -> tuple[str, str]:
    """The election's consumer group and leader topic: the given ones, or the defaults."""
    group = group_id or "harvest"
    # A sharded relay's leader topic has one partition per shard: by default a topic of its own,
    # so it never meets the one-partition topic of unsharded relays (or of another shard count).
    topic = topic or (f"{group}.neli" if shards == 1 else f"{group}.neli.shards{shards}")
    for key, value in (("leaderGroupID", group), ("leaderTopic", topic)):
        if not LEGAL_NAME.match(value):
            raise ConfigError(f"{key}: {shown(value)} is not a valid Kafka name; use {NAME_RULE}")
    return group, topic


def check_election(election: Any, lock_check_interval: Any) -> None:
    """``leaderElection`` names an election; ``leaderLockCheckInterval`` is 10ms-1h."""
    if election not in LEADER_ELECTIONS:
        raise ConfigError(
            f"leaderElection: {shown(election)} is not a leader election; use one of "
            f"{', '.join(LEADER_ELECTIONS)} (default neli)"
        )
    if (
        isinstance(lock_check_interval, bool)
        or not isinstance(lock_check_interval, (int, float))
        or not 0.01 <= lock_check_interval <= 3600
    ):
        raise ConfigError(
            f"leaderLockCheckInterval: {shown(lock_check_interval)} must be a duration between 10ms and 1h, e.g. '1s'"
        )


def check_election_limits(election: str, heartbeat_timeout: float, replication_factor: Any) -> None:
    """NELI's bounds on ``limits.heartbeatTimeout``; ``leaderTopicReplicationFactor`` is -1 or 1-32767."""
    if election == "neli":
        hb = heartbeat_timeout
        if hb < NELI_MIN_HEARTBEAT_TIMEOUT:
            raise ConfigError(
                f"limits.heartbeatTimeout: {format_duration(hb)} is too short for leaderElection neli: the "
                f"election's consumer-group session timeout is 3 x heartbeatTimeout "
                f"({format_duration(3 * hb)}) and brokers refuse sessions shorter than "
                f"group.min.session.timeout.ms (default 6s), so the relay would never lead; use "
                f"{format_duration(NELI_MIN_HEARTBEAT_TIMEOUT)} or more"
            )
        if hb > NELI_MAX_HEARTBEAT_TIMEOUT:
            raise ConfigError(
                f"limits.heartbeatTimeout: {format_duration(hb)} is too long for leaderElection neli: the "
                f"election's consumer-group session timeout is 3 x heartbeatTimeout "
                f"({format_duration(3 * hb)}) and brokers refuse sessions longer than "
                f"group.max.session.timeout.ms (default 30m); use at most "
                f"{format_duration(NELI_MAX_HEARTBEAT_TIMEOUT)}"
            )
    rf = replication_factor
    if isinstance(rf, bool) or not isinstance(rf, int) or not (rf == -1 or 1 <= rf <= 32767):
        raise ConfigError(
            f"leaderTopicReplicationFactor: {shown(rf)} must be -1 (the broker's default) or a replica count 1-32767"
        )
