"""The relay's own settings (YAML ``harvest:``): :class:`HarvestConfig`, the whole relay config.

Construct it directly (embedded mode) or read it from a file (:func:`~producer.config._file.load_yaml`).
Its sections have modules of their own: :mod:`~producer.config._limits` (``limits``),
:mod:`~producer.config._kafka` (the Kafka properties), :mod:`~producer.config._election` (the leader
election), :mod:`~producer.mapping.table`, :mod:`~producer.relay.spans` (``tracing``) and
:mod:`~producer.config.serialization` (``serialization``).

Invariants:
- a :class:`HarvestConfig` that exists is valid: frozen, checked at construction; :meth:`HarvestConfig.from_mapping`
  refuses an unknown key (naming it and listing the valid ones, :data:`TOP_KEYS`); every error is a
  :class:`~producer.errors.ConfigError` naming the field (YAML path), the value and a fix;
- ``dataSource`` is parsed by libpq (no connection) and ``outboxTable`` as a table name, at construction;
- ``repr()``/``str()`` never shows a secret (DSN password, SASL/SSL credentials, ``prometheusBasicAuth``, a
  password command's arguments: only its program);
- at most one of ``dataSourcePasswordCommand`` and ``dataSourcePasswordProvider``, its provider built (a
  command split, a function imported) at construction (:mod:`~producer.db.credentials`);
- likewise at most one of ``kafkaOAuthTokenCommand`` and ``kafkaOAuthTokenProvider``, whose provider is
  ``baseKafkaConfig``'s ``oauth_cb`` (every Kafka client of the relay is made from it) and needs
  ``sasl.mechanism: OAUTHBEARER`` there (:func:`~producer.config._kafka.with_token_provider`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from harvest_outbox.kafka_token import KafkaTokenProvider
from harvest_outbox.producer.config._election import check_election, check_election_limits, leader_names
from harvest_outbox.producer.config._env import MAPPING, SCALAR, TEXT
from harvest_outbox.producer.config._kafka import (
    check_with_librdkafka,
    checked_sections,
    kafka_map,
    producer_properties,
    with_token_provider,
)
from harvest_outbox.producer.config._limits import Limits
from harvest_outbox.producer.config._values import (
    DEFAULT_BIND_ADDRESS,
    check_basic_auth,
    check_bind_address,
    default_name,
    format_duration,
    key_text,
    parse_duration,
)
from harvest_outbox.producer.config.serialization import SerializationConfig
from harvest_outbox.producer.db.credentials import PasswordProvider
from harvest_outbox.producer.errors import ConfigError, shown
from harvest_outbox.producer.layouts.choice import layout_for
from harvest_outbox.producer.mapping.table import GOHARVEST, TableMapping, table_mapping
from harvest_outbox.producer.relay.spans import TracingConfig
from harvest_outbox.redact import redact_dsn, redact_error, redact_kafka_config

DEFAULT_DATA_SOURCE = "host=localhost port=5432 user=postgres password= dbname=postgres sslmode=disable"

#: The keys of the ``harvest:`` section, in the configuration reference's order.
TOP_KEYS = (
    "baseKafkaConfig",
    "producerKafkaConfig",
    "leaderTopic",
    "leaderGroupID",
    "dataSource",
    "outboxTable",
    "limits",
    "name",
    "prometheusPort",
    "leaderTopicReplicationFactor",
    "uuidSequencing",
    "leaderElection",
    "leaderLockCheckInterval",
    "prometheusBindAddress",
    "missingTopicPolicy",
    "shards",
    "tableMapping",
    "eventRouter",
    "eventIdHeader",
    "deadLetterRetention",
    "deadLetterPolicy",
    "tracing",
    "serialization",
    "outboxLayout",
    "wakeup",
    "standby",
    "prometheusBasicAuth",
    "dataSourcePasswordCommand",
    "dataSourcePasswordProvider",
    "kafkaOAuthTokenCommand",
    "kafkaOAuthTokenProvider",
)
#: How a ``HARVEST_<KEY>`` variable's text is read for each key (producer/config/_env.py).
ENV_KINDS = {
    **dict.fromkeys(TOP_KEYS, TEXT),
    **dict.fromkeys(("prometheusPort", "leaderTopicReplicationFactor", "uuidSequencing", "shards"), SCALAR),
    **dict.fromkeys(
        ("baseKafkaConfig", "producerKafkaConfig", "limits", "eventRouter", "tracing", "serialization"), MAPPING
    ),
}
#: What the relay does with a row whose topic does not exist: park it in the dead letters at once,
#: or hold that topic's rows (marked, in memory) until the topic exists while other topics flow.
MISSING_TOPIC_POLICIES = ("deadLetter", "hold")
#: After a row is dead-lettered: its key's later rows flow (``skip``) or wait in the outbox until the
#: dead letter is requeued or discarded (``haltKey``; producer/relay/key_halt.py, docs/dead-letters.md).
DEAD_LETTER_POLICIES = ("skip", "haltKey")
#: How the relay learns of new rows: ``notify`` (a statement-level NOTIFY trigger on the outbox, the relay
#: LISTENs) or ``poll`` (no trigger: the idle relay marks every ``limits.idlePollInterval``, at most
#: ``limits.minPollInterval``). A NOTIFY makes ``PREPARE TRANSACTION`` fail, so two-phase-commit (XA)
#: writers need ``poll`` (docs/writing.md, "Two-phase commit").
WAKEUPS = ("notify", "poll")
#: What a relay that does not lead keeps open: ``hot`` (its database connections, LISTEN and Kafka producer,
#: so a fail-over sends its first record at once) or ``cold`` (only its election and layout sessions: it
#: connects when it is elected and lets go when it is not; a fleet's default, docs/fleet.md).
STANDBYS = ("hot", "cold")
#: ``deadLetterRetention`` bounds, in seconds.
MIN_RETENTION, MAX_RETENTION = 60.0, 87600 * 3600.0


@dataclass(frozen=True)
class HarvestConfig:
    """Everything the relay needs. Construct directly (embedded mode) or via :func:`load_yaml`."""

    # Each field's ``#:`` comment is its entry in the generated configuration reference
    # (docs/hooks/config_reference.py): a new key documented here appears there.

    #: The outbox's Postgres, as a libpq connection string or URI (parsed by libpq when the file is
    #: read). Shown with its password and unknown keys redacted; prefer ``${file:…}`` or
    #: ``HARVEST_DATA_SOURCE`` to a password in the file (docs/environment.md).
    data_source: str = DEFAULT_DATA_SOURCE
    #: The outbox table, optionally schema-qualified (``app.outbox``).
    outbox_table: str = "outbox"
    #: librdkafka properties of every Kafka client the relay makes (producer, election, admin), checked
    #: by librdkafka when the file is read. ``bootstrap.servers`` must be a non-empty string; left out,
    #: the relay connects to ``localhost:9092`` (goharvest's default) and warns at start.
    base_kafka_config: Mapping[str, Any] = field(default_factory=dict)
    #: librdkafka properties of the producer only, over ``baseKafkaConfig``. ``enable.idempotence=true``
    #: and ``acks=all`` are forced (a contradicting value is an error); ``linger.ms`` defaults to 1; the
    #: delivery timeout derives from ``limits.rowTimeout``.
    producer_kafka_config: Mapping[str, Any] = field(default_factory=dict)
    #: NELI: the leader topic (created with one partition if missing). Unset: ``<leaderGroupID>.neli``,
    #: or ``<leaderGroupID>.neli.shards<S>`` with ``shards: S`` > 1 (one partition per shard).
    leader_topic: str = ""
    #: NELI: the consumer group of the election. Unset: ``harvest``.
    leader_group_id: str = ""
    #: This relay's name: the ``relay`` label of its metrics, the start of its log lines, its
    #: ``application_name``. Printable, no ``%``. Unset: ``<host>_<pid>_<time>``.
    name: str = ""
    #: Timing and sizing limits (below); durations are written ``500ms``, ``5s``, ``1m30s``.
    limits: Limits = field(default_factory=Limits)
    #: Serve ``/metrics``, ``/healthz`` and ``/readyz`` on this TCP port (0: any free port); unset: no
    #: endpoint (docs/health.md).
    prometheus_port: int | None = None
    #: Address the /metrics, /healthz and /readyz endpoint binds to (with ``prometheusPort``);
    #: ``127.0.0.1`` keeps them on this host. Every interface by default, on purpose: in a container the
    #: kubelet's probes and Prometheus connect from outside (docs/security.md, "The HTTP endpoint").
    prometheus_bind_address: str = DEFAULT_BIND_ADDRESS
    #: ``user:password``: the endpoint answers only requests with these HTTP basic-auth credentials
    #: (``401`` otherwise; compared in constant time). Put the password in a file
    #: (``prometheusBasicAuth: "prometheus:${file:/run/secrets/metrics_password}"``); redacted in every
    #: repr and message. Basic auth sends the password in clear: put TLS in front (docs/security.md).
    #: Unset (default): no authentication.
    prometheus_basic_auth: str = field(default="", repr=False)
    #: NELI: replication factor of a leader topic the relay creates; -1: the broker's default.
    leader_topic_replication_factor: int = -1
    #: Exactly-once mode (docs/design.md §5): UUID-stamped CONTINUE_TXN records, harvest
    #: transactions committed with a fenced DB transaction, then ACK_TXN messages.
    uuid_sequencing: bool = False
    #: ``neli`` (goharvest's: Kafka consumer-group membership of ``leaderTopic``) or ``postgres`` (a
    #: session advisory lock in the outbox's database; see :mod:`producer.election.postgres`).
    leader_election: str = "neli"
    #: ``postgres`` election: how often the holder verifies its lock and standbys try to take it; the
    #: holder fences itself when it has not verified the lock for 2 x this.
    leader_lock_check_interval: float = 1.0
    #: ``deadLetter`` (default) or ``hold`` (see :data:`MISSING_TOPIC_POLICIES`).
    missing_topic_policy: str = "deadLetter"
    #: Scale out (``shards: S``): rows are split into S shards by a hash of ``kafka_key`` and each
    #: shard has its own leader, so up to S relays publish one outbox at once (docs/sharding.md).
    #: 1 (default): one active relay for the whole outbox, as goharvest.
    shards: int = 1
    #: Which columns of ``outboxTable`` make a record: goharvest's table (default) or Debezium's outbox
    #: routed as its event router does (YAML ``tableMapping: debezium`` + ``eventRouter: {...}`` with
    #: the router's option names; :mod:`producer.mapping.table`, docs/debezium.md).
    table_mapping: TableMapping = GOHARVEST
    #: A goharvest table's records get this header with a stable event id, ``<outboxTable>/<row id>``
    #: (the same on every re-send, so at-least-once consumers can dedupe); empty (default): records
    #: exactly as goharvest's. A Debezium table's records always carry the router's ``id`` header.
    event_id_header: str = ""
    #: The leader deletes dead letters parked (``dead_time``) longer ago than this, a batch at a time
    #: (docs/hygiene.md); 1m-87600h. Unset (or ``keep``, the default): kept until requeued.
    dead_letter_retention: float | None = None
    #: ``skip`` (default) or ``haltKey`` (see :data:`DEAD_LETTER_POLICIES`).
    dead_letter_policy: str = "skip"
    #: ``tracing: {spans, sampleRatio}``: relay spans when an OpenTelemetry SDK is configured
    #: (:class:`~producer.relay.spans.TracingConfig`, docs/tracing.md); on by default, a no-op without one.
    tracing: TracingConfig = field(default_factory=TracingConfig)
    #: ``serialization: {registry, topics}``: topics whose values the relay encodes with a schema
    #: registry (:class:`~producer.config.serialization.SerializationConfig`, docs/schemas.md); empty
    #: (default): every value published as stored.
    serialization: SerializationConfig = field(default_factory=SerializationConfig)
    #: Unset (default): the outbox table's layout, and ``cursor`` for a new outbox ``harvest init-db`` creates
    #: (``mark`` instead when the config uses a setting ``cursor`` does not support, or on Postgres 12 or
    #: older; docs/design.md, "Which layout a new outbox gets"). ``mark``: goharvest's table, each row marked
    #: then deleted (Debezium's too with ``tableMapping: debezium``). ``cursor``: the cursor layout, a
    #: partitioned outbox ``harvest init-db`` creates, read by snapshot with one cursor row, delivered
    #: partitions truncated; about 0.005x the mark layout's relay WAL per row and 0.3x its Postgres CPU
    #: (docs/primary-cost.md). Set, it must match the table (a relay refuses the other layout's).
    #: ``cursor`` needs Postgres 13+ and does not support yet: ``missingTopicPolicy: hold``, nor
    #: ``deadLetterPolicy: haltKey`` with ``tableMapping: debezium`` (docs/limitations.md);
    #: ``deadLetterPolicy: haltKey`` holds a key's rows in ``<outbox>_held`` there. ``harvest init-db --migrate
    #: --online`` moves a mark-layout outbox to it while writers and relays run (docs/migrating.md).
    outbox_layout: str | None = None
    #: ``notify`` or ``poll`` (see :data:`WAKEUPS`): ``harvest init-db`` creates the NOTIFY trigger, or with
    #: ``poll`` drops it, so writers that ``PREPARE TRANSACTION`` (XA / JTA two-phase commit) keep working;
    #: a row then waits up to one idle poll (100ms by default) before the relay sees it. Unset: ``notify``,
    #: and ``init-db`` and ``harvest check`` warn when the server allows prepared transactions
    #: (``max_prepared_transactions`` > 0); setting it says which was chosen.
    wakeup: str = ""
    #: ``hot`` or ``cold`` (see :data:`STANDBYS`). ``cold`` costs a fail-over the connections' and the
    #: producer's start (tens to hundreds of milliseconds) and saves a standby three Postgres connections,
    #: a producer and an admin client. Unset: ``hot`` for one relay, ``cold`` for a fleet's outboxes.
    standby: str = "hot"
    #: A command that prints the Postgres password (e.g. ``aws rds generate-db-auth-token --hostname …``),
    #: run for each new connection the relay makes: rotated credentials are picked up without a restart.
    #: Run without a shell (split as a POSIX shell would), at most 10 s; its stdout, stripped, is the
    #: password and overrides one in ``dataSource``. Unset (default): the password is ``dataSource``'s.
    data_source_password_command: str = ""
    #: ``package.module:function``, a function of no arguments returning the Postgres password, called for
    #: each new connection (for embedders; instead of ``dataSourcePasswordCommand``). Unset (default): none.
    data_source_password_provider: str = ""
    # The provider of the two above (None: none), built and checked at construction; not a key.
    password_provider: PasswordProvider | None = field(default=None, init=False, compare=False)
    #: A command that prints a Kafka OAUTHBEARER token, run when each Kafka client of the relay starts and
    #: again at 80 % of the token's life (librdkafka then re-authenticates): rotated tokens without a restart.
    #: It prints a JWT (its expiry is the ``exp`` claim) or JSON ``{"token": "...", "expires_at": <epoch
    #: seconds>}``; run without a shell, at most 8 s. Needs ``sasl.mechanism: OAUTHBEARER`` and
    #: ``security.protocol: SASL_SSL`` in ``baseKafkaConfig`` (docs/security.md). Unset (default): none.
    kafka_oauth_token_command: str = ""
    #: ``package.module:function``, a function of no arguments returning ``(token, expires_at)`` (epoch
    #: seconds), called as ``kafkaOAuthTokenCommand`` is (for embedders; instead of it). Unset (default): none.
    kafka_oauth_token_provider: str = ""
    # The provider of the two above (None: none), also ``base_kafka_config``'s ``oauth_cb``; not a key.
    kafka_token_provider: KafkaTokenProvider | None = field(default=None, init=False, compare=False)

    def __post_init__(self) -> None:
        base, prod = checked_sections(self.base_kafka_config, self.producer_kafka_config, self.limits)
        token_provider = with_token_provider(
            base, prod, self.kafka_oauth_token_command, self.kafka_oauth_token_provider
        )
        object.__setattr__(self, "kafka_token_provider", token_provider)
        object.__setattr__(self, "base_kafka_config", base)
        object.__setattr__(self, "producer_kafka_config", prod)
        if not isinstance(self.data_source, str) or not self.data_source.strip():
            raise ConfigError(
                "dataSource: must be a non-empty libpq connection string or URI, e.g. "
                "'host=localhost dbname=app user=relay' or 'postgresql://relay@localhost/app'"
            )
        try:  # libpq's own parser (no connection): a typo such as passwd= is an error now, not at connect
            conninfo_to_dict(self.data_source)
        except psycopg.Error as exc:  # not chained: libpq's message quotes fragments of the DSN
            raise ConfigError(
                f"dataSource: {redact_error(str(exc), self.data_source).strip()} in "
                f"{redact_dsn(self.data_source)!r}; write a libpq connection string of key=value "
                f"pairs ('host=db dbname=app user=relay'; single-quote a value holding spaces or "
                f"quotes, backslash-escape quotes in it) or a URI "
                f"('postgresql://relay@db/app')"
            ) from None
        if not isinstance(self.outbox_table, str) or not self.outbox_table.strip():
            raise ConfigError("outboxTable: must be a table name, optionally schema-qualified ('app.outbox')")
        from harvest_outbox.producer.schema import parse_table_name  # late: schema imports errors only

        parse_table_name(self.outbox_table)  # raises ConfigError with the reason
        name = self.name or default_name()
        if "%" in name:
            raise ConfigError(f"name: {name!r} must not contain '%' (it separates fields in heartbeats)")
        if not name.isprintable():  # it starts every log line: a newline or ESC would forge or recolour lines
            raise ConfigError(
                f"name: {name!r} contains control or other non-printable characters; use a printable "
                f"name such as 'relay-1' (letters, digits, '.', '_', '-')"
            )
        object.__setattr__(self, "name", name)
        from harvest_outbox.producer.relay.shards import check_shard_count

        check_shard_count(self.shards)
        if not isinstance(self.table_mapping, TableMapping):
            raise ConfigError(
                f"tableMapping: {shown(self.table_mapping)} is not a table mapping; build one with "
                f"producer.mapping.table.table_mapping('goharvest' | 'debezium', router_options)"
            )
        if not isinstance(self.event_id_header, str) or (
            self.event_id_header and (not self.event_id_header.isprintable() or len(self.event_id_header) > 64)
        ):
            raise ConfigError(
                f"eventIdHeader: {shown(self.event_id_header)} must be a header name of 1-64 printable "
                f"characters, e.g. 'harvest.event.id' (or empty: no event id header)"
            )
        if self.event_id_header in ("uuid", "traceparent", "tracestate"):
            raise ConfigError(
                f"eventIdHeader: {self.event_id_header!r} is a header harvest or its readers use; "
                f"choose another name, e.g. 'harvest.event.id'"
            )
        if self.event_id_header and self.table_mapping.event_id_source is not None:
            raise ConfigError(
                f"eventIdHeader: {self.event_id_header!r} applies to goharvest tables; a "
                f"{self.table_mapping.kind} table's records carry {self.table_mapping.event_id_source}; "
                f"remove eventIdHeader"
            )
        retention = self.dead_letter_retention
        if retention is not None and (
            isinstance(retention, bool)
            or not isinstance(retention, (int, float))
            or not MIN_RETENTION <= retention <= MAX_RETENTION
        ):
            number = isinstance(retention, (int, float)) and not isinstance(retention, bool)
            text = format_duration(retention) if number else shown(retention)
            raise ConfigError(
                f"deadLetterRetention: {text} must be a duration from {format_duration(MIN_RETENTION)} "
                f"(a shorter one deletes dead letters before anyone can look at them) to "
                f"{format_duration(MAX_RETENTION)} (10 years), e.g. '168h' for a week; leave it out "
                f"(or write 'keep') to keep dead letters until they are requeued"
            )
        group, topic = leader_names(self.leader_group_id, self.leader_topic, self.shards)
        if not isinstance(self.uuid_sequencing, bool):
            raise ConfigError(f"uuidSequencing: {shown(self.uuid_sequencing)} must be true or false")
        if self.missing_topic_policy not in MISSING_TOPIC_POLICIES:
            raise ConfigError(
                f"missingTopicPolicy: {shown(self.missing_topic_policy)} is not a policy; use deadLetter "
                f"(park the row at once) or hold (keep that topic's rows until it exists)"
            )
        if not isinstance(self.tracing, TracingConfig):
            raise ConfigError(
                f"tracing: {shown(self.tracing)} is not a tracing config; build one with "
                f"producer.relay.spans.TracingConfig(spans=..., sample_ratio=...)"
            )
        if self.dead_letter_policy not in DEAD_LETTER_POLICIES:
            raise ConfigError(
                f"deadLetterPolicy: {shown(self.dead_letter_policy)} is not a policy; use skip (a key's later "
                f"rows flow past its dead letter) or haltKey (they wait until it is requeued or discarded)"
            )
        self._check_layout()
        if self.wakeup not in ("", *WAKEUPS):
            raise ConfigError(
                f"wakeup: {shown(self.wakeup)} is not a wake-up; use notify (a NOTIFY trigger wakes the relay at "
                f"each commit) or poll (no trigger, so writers may PREPARE TRANSACTION; rows wait up to one idle poll)"
            )
        if self.standby not in STANDBYS:
            raise ConfigError(
                f"standby: {shown(self.standby)} is not a standby; use hot (a standby keeps its connections and "
                f"producer open) or cold (it connects when elected)"
            )
        check_election(self.leader_election, self.leader_lock_check_interval)
        object.__setattr__(self, "leader_group_id", group)
        object.__setattr__(self, "leader_topic", topic)
        if not isinstance(self.limits, Limits):
            raise ConfigError("limits: expected a producer.config.Limits instance")
        check_election_limits(self.leader_election, self.limits.heartbeat_timeout, self.leader_topic_replication_factor)
        if self.prometheus_port is not None and (
            isinstance(self.prometheus_port, bool)
            or not isinstance(self.prometheus_port, int)
            or not 0 <= self.prometheus_port <= 65535
        ):
            raise ConfigError(
                f"prometheusPort: {shown(self.prometheus_port)} must be a TCP port 0-65535 (0 = any free "
                f"port), or omitted to disable the endpoint"
            )
        object.__setattr__(self, "prometheus_bind_address", check_bind_address(self.prometheus_bind_address))
        if not isinstance(self.prometheus_basic_auth, str) or (
            self.prometheus_basic_auth and not check_basic_auth(self.prometheus_basic_auth)
        ):
            raise ConfigError(
                "prometheusBasicAuth: <redacted> must be a 'user:password' string with a user and a password, "
                "e.g. 'prometheus:${file:/run/secrets/metrics_password}'"
            )
        object.__setattr__(self, "password_provider", self._password_provider())

    def _password_provider(self) -> PasswordProvider | None:
        command, function = self.data_source_password_command, self.data_source_password_provider
        for key, value in (("dataSourcePasswordCommand", command), ("dataSourcePasswordProvider", function)):
            if not isinstance(value, str):
                raise ConfigError(f"{key}: {shown(value)} must be a string")
        if command and function:
            raise ConfigError("dataSourcePasswordCommand and dataSourcePasswordProvider are both set; keep one of them")
        if not command and not function:
            return None
        return PasswordProvider(command=command, function=function)

    def _check_layout(self) -> None:
        """``outboxLayout``: a known layout, and only with what it supports (never a row lost); unset, the
        layout the table turns out to have refuses them then (producer/layouts/choice.py, ``layout_of``)."""
        if self.outbox_layout is not None:
            layout_for(self).refuse(self)

    @property
    def wakeup_mode(self) -> str:
        """``wakeup`` with its default applied: ``notify`` or ``poll``."""
        return self.wakeup or "notify"

    def producer_config(self) -> dict[str, Any]:
        """Effective confluent-kafka producer properties: base, then producer overrides, then forced values."""
        return producer_properties(self.base_kafka_config, self.producer_kafka_config, self.limits.row_timeout)

    def check_kafka_properties(self) -> None:
        """Let librdkafka judge the Kafka properties now, so a misspelt name or a bad value is a
        :class:`ConfigError` naming the section before anything starts (instead of an error at the first
        leadership). Builds a producer and a consumer with no bootstrap servers: they connect nowhere."""
        election_consumer = None
        if self.leader_election == "neli":  # the election consumer adds settings derived from the limits
            from harvest_outbox.producer.election.neli import neli_consumer_config

            election_consumer = neli_consumer_config(
                dict(self.base_kafka_config), self.leader_group_id, self.name, self.limits.heartbeat_timeout
            )
        check_with_librdkafka(self.base_kafka_config, self.producer_kafka_config, self.limits, election_consumer)

    def replace(self, **changes: Any) -> HarvestConfig:
        if "base_kafka_config" not in changes and self.kafka_token_provider is not None:
            # the provider the token keys made goes with them: the copy makes its own (or none)
            base = {k: v for k, v in self.base_kafka_config.items() if v is not self.kafka_token_provider}
            changes = {**changes, "base_kafka_config": base}
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        return (
            f"HarvestConfig(data_source={redact_dsn(self.data_source)!r}, outbox_table={self.outbox_table!r}, "
            f"base_kafka_config={redact_kafka_config(self.base_kafka_config)!r}, "
            f"producer_kafka_config={redact_kafka_config(self.producer_kafka_config)!r}, "
            f"leader_topic={self.leader_topic!r}, leader_group_id={self.leader_group_id!r}, "
            f"name={self.name!r}, limits={self.limits!r}, prometheus_port={self.prometheus_port!r}, "
            f"prometheus_bind_address={self.prometheus_bind_address!r}, "
            f"uuid_sequencing={self.uuid_sequencing!r}, leader_election={self.leader_election!r}, "
            f"leader_lock_check_interval={self.leader_lock_check_interval!r}, "
            f"missing_topic_policy={self.missing_topic_policy!r}, shards={self.shards!r}, "
            f"table_mapping={self.table_mapping!r}, event_id_header={self.event_id_header!r}, "
            f"dead_letter_retention={self.dead_letter_retention!r}, dead_letter_policy={self.dead_letter_policy!r}, "
            f"tracing={self.tracing!r}, serialization={self.serialization!r}, outbox_layout={self.outbox_layout!r}, "
            f"wakeup={self.wakeup!r}, standby={self.standby!r}, prometheus_basic_auth={'<redacted>' if self.prometheus_basic_auth else ''!r}, "
            f"password_provider={self.password_provider!r}, kafka_token_provider={self.kafka_token_provider!r})"
        )

    __str__ = __repr__

    @classmethod
    def from_mapping(
        cls, data: Mapping[str, Any] | None, path: str = "harvest", overrides: Mapping[str, Any] | None = None
    ) -> HarvestConfig:
        data = {} if data is None else data
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: expected a mapping, got {type(data).__name__}")
        for key in data:
            if key not in TOP_KEYS:
                raise ConfigError(f"{path}.{key_text(key)}: unknown key; valid keys are: {', '.join(sorted(TOP_KEYS))}")
        kwargs: dict[str, Any] = {}
        for key, attr in (
            ("dataSource", "data_source"),
            ("outboxTable", "outbox_table"),
            ("leaderTopic", "leader_topic"),
            ("leaderGroupID", "leader_group_id"),
            ("name", "name"),
            ("prometheusBindAddress", "prometheus_bind_address"),
            ("prometheusBasicAuth", "prometheus_basic_auth"),
            ("dataSourcePasswordCommand", "data_source_password_command"),
            ("dataSourcePasswordProvider", "data_source_password_provider"),
            ("kafkaOAuthTokenCommand", "kafka_oauth_token_command"),
            ("kafkaOAuthTokenProvider", "kafka_oauth_token_provider"),
        ):
            if key in data and data[key] is not None:
                if not isinstance(data[key], str):
                    text = "<redacted>" if key in ("dataSource", "prometheusBasicAuth") else shown(data[key])
                    raise ConfigError(f"{path}.{key}: {text} must be a string")
                kwargs[attr] = data[key]
        for key, attr in (
            ("prometheusPort", "prometheus_port"),
            ("leaderTopicReplicationFactor", "leader_topic_replication_factor"),
        ):
            if data.get(key) is not None:
                kwargs[attr] = data[key]
        if data.get("uuidSequencing") is not None:
            kwargs["uuid_sequencing"] = data["uuidSequencing"]
        if data.get("leaderElection") is not None:
            kwargs["leader_election"] = data["leaderElection"]
        if data.get("shards") is not None:
            kwargs["shards"] = data["shards"]
        if data.get("eventIdHeader") is not None:
            kwargs["event_id_header"] = data["eventIdHeader"]
        if data.get("tableMapping") is not None or data.get("eventRouter") is not None:
            kwargs["table_mapping"] = table_mapping(data.get("tableMapping"), data.get("eventRouter"), path)
        if data.get("missingTopicPolicy") is not None:
            kwargs["missing_topic_policy"] = data["missingTopicPolicy"]
        if data.get("deadLetterPolicy") is not None:
            kwargs["dead_letter_policy"] = data["deadLetterPolicy"]
        if data.get("outboxLayout") is not None:
            kwargs["outbox_layout"] = data["outboxLayout"]
        if data.get("wakeup") is not None:
            kwargs["wakeup"] = data["wakeup"]
        if data.get("standby") is not None:
            kwargs["standby"] = data["standby"]
        if data.get("tracing") is not None:
            kwargs["tracing"] = TracingConfig.from_mapping(data["tracing"], f"{path}.tracing")
        if data.get("serialization") is not None:
            kwargs["serialization"] = SerializationConfig.from_mapping(data["serialization"], f"{path}.serialization")
        if data.get("deadLetterRetention") not in (None, "keep"):
            kwargs["dead_letter_retention"] = parse_duration(data["deadLetterRetention"], f"{path}.deadLetterRetention")
        if data.get("leaderLockCheckInterval") is not None:
            kwargs["leader_lock_check_interval"] = parse_duration(
                data["leaderLockCheckInterval"], f"{path}.leaderLockCheckInterval"
            )
        kwargs["base_kafka_config"] = kafka_map(data.get("baseKafkaConfig"), f"{path}.baseKafkaConfig")
        kwargs["producer_kafka_config"] = kafka_map(data.get("producerKafkaConfig"), f"{path}.producerKafkaConfig")
        kwargs["limits"] = Limits.from_mapping(data.get("limits"), f"{path}.limits")
        for attr, value in (overrides or {}).items():
            if value is None:
                continue
            if attr == "bootstrap_servers":
                kwargs["base_kafka_config"] = {**kwargs["base_kafka_config"], "bootstrap.servers": value}
            else:
                kwargs[attr] = value
        try:
            return cls(**kwargs)
        except ConfigError as exc:
            msg = str(exc)
            raise ConfigError(msg if msg.startswith(path) else f"{path}.{msg}") from None
