"""The relay's timing and sizing limits (YAML ``harvest.limits``): goharvest's names and defaults, plus our own.

:class:`Limits` carries goharvest's ``Limits`` (``ioErrorBackoff`` ... ``minMetricsInterval``) and the
relay's own (``maxDeliveryAttempts``, ``purgeBatchRecords``, ``purgeInterval``, ``idlePollInterval``,
``rowTimeout``, the ``--uuid-sequencing`` transaction limits, ``livenessTimeout``).

Invariants:
- a :class:`Limits` that exists is valid: frozen, checked at construction, each error a
  :class:`~producer.errors.ConfigError` naming ``limits.<key>``, the value and the rule;
- every limit is bounded by what Kafka, Postgres and Python's timed waits accept: durations <=
  :data:`MAX_DURATION`, ``ioErrorBackoff`` >= :data:`MIN_IO_ERROR_BACKOFF`, row counts <= 1,000,000,
  ``producerRing`` <= 256 (docs/configuration.md, Bounds, says why);
- the derived limits (``maxPollInterval``, ``drainInterval``, ``livenessTimeout``) are filled in when
  left out, so every field but the adaptive ones (:data:`_AUTO_FIELDS`, read through
  :attr:`Limits.mark_ceiling`, :attr:`Limits.in_flight_limit`, :attr:`Limits.txn_ceiling`) holds a number.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from harvest_outbox.producer.config._values import format_duration, key_text, parse_duration
from harvest_outbox.producer.errors import ConfigError, shown

#: Every duration limit is at most this: timed waits in Python overflow near 2**63 ns and Kafka's
#: millisecond settings are 32-bit (24.8 days); no relay timing is meaningful beyond a day.
MAX_DURATION = 24 * 3600.0
#: ioErrorBackoff floor: the pause after a failed database/Kafka operation before the next try.
MIN_IO_ERROR_BACKOFF = 0.01
INT32_MAX = 2**31 - 1
_ROWS_CAP = 1_000_000
_INT_CAPS = {
    "mark_query_records": _ROWS_CAP,
    "purge_batch_records": _ROWS_CAP,
    "txn_max_records": _ROWS_CAP,
    "max_in_flight_records": _ROWS_CAP,
    "producer_ring": 256,
}
_INT_CAP_WHY = {
    "mark_query_records": "one mark's rows are returned by one UPDATE ... RETURNING and held in memory at once",
    "purge_batch_records": "one purge sends its ids as one Postgres array parameter",
    "txn_max_records": "one harvest transaction's ids are deleted with one Postgres array parameter and held "
    "in memory until its commit",
    "max_in_flight_records": "in-flight records are held in memory until delivered",
    "producer_ring": "every ProducerID of every view is state that readers keep per partition until pruned; "
    "pipelining gains nothing beyond a few transactions in flight",
}

# (yaml key, attribute, kind) — kind "d" = duration (seconds), "i" = int
_LIMIT_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("ioErrorBackoff", "io_error_backoff", "d"),
    ("pollDuration", "poll_duration", "d"),
    ("minPollInterval", "min_poll_interval", "d"),
    ("maxPollInterval", "max_poll_interval", "d"),
    ("heartbeatTimeout", "heartbeat_timeout", "d"),
    ("drainInterval", "drain_interval", "d"),
    ("queueTimeout", "queue_timeout", "d"),
    ("markBackoff", "mark_backoff", "d"),
    ("maxInFlightRecords", "max_in_flight_records", "i"),
    ("sendConcurrency", "send_concurrency", "i"),
    ("sendBuffer", "send_buffer", "i"),
    ("markQueryRecords", "mark_query_records", "i"),
    ("minMetricsInterval", "min_metrics_interval", "d"),
    # ours
    ("maxDeliveryAttempts", "max_delivery_attempts", "i"),
    ("purgeBatchRecords", "purge_batch_records", "i"),
    ("purgeInterval", "purge_interval", "d"),
    ("idlePollInterval", "idle_poll_interval", "d"),
    ("rowTimeout", "row_timeout", "d"),
    # --uuid-sequencing (docs/design.md §5)
    ("txnMaxRecords", "txn_max_records", "i"),
    ("txnMaxDuration", "txn_max_duration", "d"),
    ("producerRing", "producer_ring", "i"),
    # operations (producer/observe/health.py)
    ("livenessTimeout", "liveness_timeout", "d"),
)


# Limits that adapt to the backlog when the config leaves them out (``None``); a value a user sets
# is a cap. Measured on the relay benchmark (bench/bench_relay.py): beyond these the database's
# mark+purge loop, not the relay, bounds the drain.
_AUTO_FIELDS = frozenset({"mark_query_records", "max_in_flight_records", "txn_max_records"})
MARK_FLOOR = 100  # goharvest's markQueryRecords: the first mark of an idle relay asks for this many
AUTO_MARK_RECORDS = 5000
AUTO_MAX_IN_FLIGHT = 10000
AUTO_TXN_RECORDS = 5000


@dataclass(frozen=True)
class Limits:
    """Timing and sizing limits, in seconds / counts. Names follow goharvest's ``Limits``.

    ``None`` for ``max_poll_interval`` / ``drain_interval`` means goharvest's derived default
    (``heartbeat_timeout / 2`` and ``min(max_poll_interval, queue_timeout)``).
    ``send_concurrency`` and ``send_buffer`` are accepted for goharvest compatibility; this relay
    sends from one thread through one idempotent producer, so they have no effect.
    """

    # Each field's ``#:`` comment is its entry in the generated configuration reference
    # (docs/hooks/config_reference.py): a new limit documented here appears there.

    #: Pause after a database or Kafka error before retrying; at least 10ms (0 turned a database
    #: outage into a busy loop: 88 % CPU, ~5,000 log lines/s).
    io_error_backoff: float = 0.5
    #: How long the relay polls the producer per loop turn.
    poll_duration: float = 0.001
    #: NELI: the shortest pulse period of the election (goharvest's).
    min_poll_interval: float = 0.1
    #: NELI: the longest pulse period of the election. Unset: ``heartbeatTimeout`` / 2.
    max_poll_interval: float | None = None
    #: NELI: the leader fences itself when no heartbeat returns within this; the election group's
    #: session timeout is 3x it, so with ``leaderElection: neli`` it must be 2s-10m (brokers accept
    #: sessions of 6s-30m by default).
    heartbeat_timeout: float = 5.0
    #: How long a revoked leader waits for its in-flight records. Unset: min(``maxPollInterval``,
    #: ``queueTimeout``).
    drain_interval: float | None = None
    #: A record in flight longer than this is abandoned and its row marked again.
    queue_timeout: float = 30.0
    #: Pause when a mark finds nothing to claim.
    mark_backoff: float = 0.01
    #: Records in flight at once (at-least-once: also one record in flight per key). Unset: adaptive,
    #: up to :data:`AUTO_MAX_IN_FLIGHT`; a number caps it.
    max_in_flight_records: int | None = None
    #: Accepted for goharvest compatibility; no effect (one sending thread, one idempotent producer).
    send_concurrency: int = 8
    #: Accepted for goharvest compatibility; no effect.
    send_buffer: int = 10
    #: Rows one mark claims. Unset: adaptive, from :data:`MARK_FLOOR` (goharvest's, for the first mark
    #: of an idle relay) up to :data:`AUTO_MARK_RECORDS` (the ceiling once a mark comes back full,
    #: halving while they come back mostly empty); a number caps the adaptation (goharvest's meaning:
    #: no mark claims more rows than this).
    mark_query_records: int | None = None
    #: Period of the relay's metrics reading (``MeterRead``: backlog, oldest unsent age, throughput).
    min_metrics_interval: float = 5.0
    #: Failed deliveries before a row is dead-lettered, counted in Postgres across restarts
    #: (docs/reliability.md).
    max_delivery_attempts: int = 5
    #: At-least-once: delivered rows deleted per purge statement (with ``purgeInterval``).
    purge_batch_records: int = 500
    #: At-least-once: the longest a delivered row waits for its purge batch.
    purge_interval: float = 0.02
    #: Polling fallback: how often an idle relay marks when no NOTIFY arrives. With ``wakeup: poll``, at most
    #: ``minPollInterval`` apart, since the idle wait ends for the election's pulse. With a LISTEN open
    #: (``wakeup: notify``) every commit wakes the relay, so its empty marks back off from ``minPollInterval``,
    #: doubling, to this (a NOTIFY marks at once): an outbox without the trigger waits up to this long.
    idle_poll_interval: float = 1.0
    #: The longest one record may wait for its delivery report: the producer's ``message.timeout.ms``
    #: (``delivery.timeout.ms``) derives from it, so it bounds how long one row holds up others. A
    #: record that waits it out while the broker acknowledges other records counts as a failed attempt
    #: (in ``--uuid-sequencing`` mode, where a waiting record holds up every key, it is dead-lettered
    #: at once); one that waits it out while the broker acknowledges nothing (an outage) does not count.
    row_timeout: float = 30.0
    #: ``--uuid-sequencing``: a harvest transaction closes at this many records, at ``txnMaxDuration``,
    #: or once the backlog is drained and its first delivery report has arrived. Unset:
    #: :data:`AUTO_TXN_RECORDS`, halved after a delivery failure and grown back by half per commit.
    txn_max_records: int | None = None
    #: ``--uuid-sequencing``: a harvest transaction closes this long after its first record (or at
    #: ``txnMaxRecords``, or as soon as the backlog is drained).
    txn_max_duration: float = 0.05
    #: ``--uuid-sequencing``: producer ids per leader view, i.e. harvest transactions in flight (1 =
    #: stop-and-wait); at most 256.
    producer_ring: int = 4
    #: ``/healthz`` fails when the relay loop has not completed a metrics reading (one per
    #: ``minMetricsInterval``) for this long. Unset: max(15s, 3 x minMetricsInterval + heartbeatTimeout).
    liveness_timeout: float | None = None

    def __post_init__(self) -> None:
        if self.liveness_timeout is None and all(
            isinstance(v, (int, float)) and not isinstance(v, bool)
            for v in (self.min_metrics_interval, self.heartbeat_timeout)
        ):
            object.__setattr__(
                self, "liveness_timeout", max(15.0, 3 * self.min_metrics_interval + self.heartbeat_timeout)
            )
        max_poll = self.max_poll_interval
        if max_poll is None:
            max_poll = self.heartbeat_timeout / 2
            object.__setattr__(self, "max_poll_interval", max_poll)
        if self.drain_interval is None:
            object.__setattr__(self, "drain_interval", min(max_poll, self.queue_timeout))
        yaml_name = {attr: key for key, attr, _ in _LIMIT_FIELDS}

        kinds = {attr: kind for _, attr, kind in _LIMIT_FIELDS}

        def need(attr: str, ok: bool, rule: str) -> None:
            if not ok:
                value = getattr(self, attr)
                text = format_duration(value) if kinds[attr] == "d" else shown(value)
                raise ConfigError(f"limits.{yaml_name[attr]}: {text} is invalid; it must be {rule}")

        for key, attr, kind in _LIMIT_FIELDS:
            value = getattr(self, attr)
            if value is None and attr in _AUTO_FIELDS:
                continue
            if kind == "i" and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"limits.{key}: {shown(value)} is not an integer; write a whole number, e.g. 100")
            if kind == "d" and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ConfigError(f"limits.{key}: {shown(value)} is not a duration in seconds")
        # Derived limits (maxPollInterval, drainInterval) last: their error should name what they derive from.
        for _key, attr, kind in sorted(_LIMIT_FIELDS, key=lambda f: f[1] in ("max_poll_interval", "drain_interval")):
            value = getattr(self, attr)
            if value is None and attr in _AUTO_FIELDS:
                continue
            if kind == "d":
                need(
                    attr,
                    value <= MAX_DURATION,
                    f"at most {format_duration(MAX_DURATION)} (Python's timed waits and "
                    f"Kafka's 32-bit millisecond settings overflow beyond; nothing in the relay needs more)",
                )
            else:
                cap = _INT_CAPS.get(attr, INT32_MAX)
                need(attr, value <= cap, f"at most {cap:,} ({_INT_CAP_WHY.get(attr, 'a 32-bit integer')})")
        # A zero back-off turns a database or Kafka outage into a busy loop (measured: 88 % CPU and
        # ~5,000 log lines/s during a Postgres outage with ioErrorBackoff: 0s).
        need(
            "io_error_backoff",
            self.io_error_backoff >= MIN_IO_ERROR_BACKOFF,
            f">= {format_duration(MIN_IO_ERROR_BACKOFF)} (a smaller back-off spins on the CPU and floods the log "
            f"while the database or Kafka is down)",
        )
        for attr in ("mark_backoff", "min_metrics_interval", "purge_interval"):
            need(attr, getattr(self, attr) >= 0, ">= 0")
        for attr in (
            "poll_duration",
            "min_poll_interval",
            "heartbeat_timeout",
            "drain_interval",
            "queue_timeout",
            "idle_poll_interval",
        ):
            need(attr, getattr(self, attr) >= 0.001, ">= 1ms")
        need("row_timeout", 1.0 <= self.row_timeout <= 3600.0, "between 1s and 1h (librdkafka's message timeout)")
        need(
            "max_poll_interval",
            self.max_poll_interval is not None and self.max_poll_interval >= self.min_poll_interval,
            f">= limits.minPollInterval ({format_duration(self.min_poll_interval)})",
        )
        need("txn_max_duration", self.txn_max_duration >= 0.0001, ">= 100us")
        # A metrics reading happens at most every minMetricsInterval: a shorter timeout would flap.
        need(
            "liveness_timeout",
            self.liveness_timeout is not None and self.liveness_timeout > self.min_metrics_interval,
            f"> limits.minMetricsInterval ({format_duration(self.min_metrics_interval)}), e.g. 3x it",
        )
        for attr in (
            "max_in_flight_records",
            "send_concurrency",
            "mark_query_records",
            "max_delivery_attempts",
            "purge_batch_records",
            "txn_max_records",
            "producer_ring",
        ):
            value = getattr(self, attr)
            need(attr, (value is None and attr in _AUTO_FIELDS) or value >= 1, ">= 1")
        need("send_buffer", self.send_buffer >= 0, ">= 0")

    @property
    def mark_ceiling(self) -> int:
        """The most rows one mark claims: ``markQueryRecords``, or the adaptive ceiling when unset."""
        return AUTO_MARK_RECORDS if self.mark_query_records is None else self.mark_query_records

    @property
    def in_flight_limit(self) -> int:
        return AUTO_MAX_IN_FLIGHT if self.max_in_flight_records is None else self.max_in_flight_records

    @property
    def txn_ceiling(self) -> int:
        return AUTO_TXN_RECORDS if self.txn_max_records is None else self.txn_max_records

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, path: str = "limits") -> Limits:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: expected a mapping of limit names to values, got {type(data).__name__}")
        by_key = {key: (attr, kind) for key, attr, kind in _LIMIT_FIELDS}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in by_key:
                raise ConfigError(f"{path}.{key_text(key)}: unknown key; valid keys are: {', '.join(sorted(by_key))}")
            attr, kind = by_key[key]
            if kind == "d":
                kwargs[attr] = parse_duration(value, f"{path}.{key}")
            else:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ConfigError(f"{path}.{key}: {shown(value)} is not an integer; write a whole number, e.g. 100")
                kwargs[attr] = value
        return cls(**kwargs)
