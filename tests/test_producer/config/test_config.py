"""Config: goharvest's YAML keys and defaults, strict parsing, clear errors, no secrets in reprs."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from harvest_outbox.producer.config import (
    AUTO_MARK_RECORDS,
    AUTO_MAX_IN_FLIGHT,
    AUTO_TXN_RECORDS,
    HarvestConfig,
    Limits,
    from_mapping,
    load_yaml,
    parse_duration,
)
from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.producer.ops.cli import main
from harvest_outbox.producer.schema import parse_table_name
from harvest_outbox.redact import redact_dsn

GOHARVEST_EXAMPLE = """\
harvest:
  baseKafkaConfig:
    bootstrap.servers: localhost:9092
  producerKafkaConfig:
    compression.type: lz4
    delivery.timeout.ms: 10000
  leaderTopic: my-app-name
  leaderGroupID: my-app-name
  dataSource: host=localhost port=5432 user=postgres password=s3cr3tpw dbname=postgres sslmode=disable
  outboxTable: outbox
  limits:
    minPollInterval: 1s
    heartbeatTimeout: 5s
    maxInFlightRecords: 1000
    minMetricsInterval: 5s
    sendConcurrency: 4
    sendBuffer: 10
logging:
  level: Debug
"""


def test_goharvest_example_yaml_loads(tmp_path: Path) -> None:
    path = tmp_path / "reaper.yaml"
    path.write_text(GOHARVEST_EXAMPLE)
    cfg = load_yaml(path)
    h = cfg.harvest
    assert cfg.log_level == "DEBUG"
    assert h.leader_topic == "my-app-name" and h.leader_group_id == "my-app-name"
    assert h.limits.min_poll_interval == 1.0 and h.limits.heartbeat_timeout == 5.0
    assert h.limits.max_poll_interval == 2.5  # goharvest: heartbeatTimeout / 2
    assert h.limits.drain_interval == 2.5  # min(maxPollInterval, queueTimeout)
    assert h.limits.queue_timeout == 30.0  # goharvest default
    # markQueryRecords left out: adaptive (starts at goharvest's 100, grows with the backlog)
    assert h.limits.mark_query_records is None and h.limits.mark_ceiling == AUTO_MARK_RECORDS
    prod = h.producer_config()
    assert prod["enable.idempotence"] is True and prod["acks"] == "all"
    assert prod["partitioner"] == "murmur2_random" and prod["compression.type"] == "lz4"


def test_defaults_match_goharvest() -> None:
    lim = Limits()
    assert (lim.io_error_backoff, lim.poll_duration, lim.min_poll_interval, lim.heartbeat_timeout) == (
        0.5,
        0.001,
        0.1,
        5.0,
    )
    assert (lim.queue_timeout, lim.mark_backoff, lim.send_concurrency) == (30.0, 0.01, 8)
    assert (lim.send_buffer, lim.min_metrics_interval) == (10, 5.0)
    # goharvest's fixed sizes become adaptive when left out; a value that is set is the cap
    assert (lim.mark_query_records, lim.max_in_flight_records, lim.txn_max_records) == (None, None, None)
    assert (lim.mark_ceiling, lim.in_flight_limit, lim.txn_ceiling) == (
        AUTO_MARK_RECORDS,
        AUTO_MAX_IN_FLIGHT,
        AUTO_TXN_RECORDS,
    )
    set_ = Limits(mark_query_records=100, max_in_flight_records=1000, txn_max_records=50)
    assert (set_.mark_ceiling, set_.in_flight_limit, set_.txn_ceiling) == (100, 1000, 50)
    cfg = HarvestConfig()
    assert cfg.outbox_table == "outbox" and cfg.base_kafka_config["bootstrap.servers"] == "localhost:9092"


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"harvest": {"leaderTopik": "x"}}, "harvest.leaderTopik: unknown key; valid keys are: baseKafkaConfig"),
        ({"harvest": {"limits": {"markQueryRecs": 5}}}, "harvest.limits.markQueryRecs: unknown key"),
        ({"harvest": {"limits": {"heartbeatTimeout": 5}}}, "harvest.limits.heartbeatTimeout: 5 is not a duration"),
        ({"harvest": {"limits": {"heartbeatTimeout": "5 sec"}}}, "is not a duration; use Go syntax"),
        (
            {"harvest": {"limits": {"maxInFlightRecords": 0}}},
            "limits.maxInFlightRecords: 0 is invalid; it must be >= 1",
        ),
        ({"harvest": {"limits": {"maxInFlightRecords": "many"}}}, "maxInFlightRecords: 'many' is not an integer"),
        (
            {"harvest": {"limits": {"minPollInterval": "1s", "maxPollInterval": "500ms"}}},
            "maxPollInterval: 500ms is invalid; it must be >= limits.minPollInterval (1s)",
        ),
        ({"harvest": {"leaderTopic": "bad topic!"}}, "leaderTopic: 'bad topic!' is not a valid Kafka name"),
        ({"harvest": {"outboxTable": "a.b.c"}}, "must be 'table' or 'schema.table'"),
        ({"harvest": {"outboxTable": "out box"}}, "is not a plain identifier; quote it"),
        (
            {"harvest": {"producerKafkaConfig": {"enable.idempotence": False}}},
            "producerKafkaConfig.enable.idempotence: False is not allowed",
        ),
        ({"harvest": {"producerKafkaConfig": {"acks": 1}}}, "acks: 1 is not allowed"),
        ({"harvest": {"prometheusPort": 70000}}, "prometheusPort: 70000 must be a TCP port"),
        ({"harvest": {"name": "a%b"}}, "must not contain '%'"),
        ({"harvest": {"dataSource": 5}}, "harvest.dataSource: <redacted> must be a string"),
        ({"harvest": {"baseKafkaConfig": ["x"]}}, "baseKafkaConfig: expected a mapping"),
        ({"harvest": {}, "extra": 1}, "extra: unknown top-level key"),
        ({"logging": {"level": "loud"}}, "logging.level: 'LOUD' is not a level"),
        (
            {"harvest": {"leaderElection": "zookeeper"}},
            "harvest.leaderElection: 'zookeeper' is not a leader election; use one of neli, postgres",
        ),
        ({"harvest": {"leaderLockCheckInterval": 1}}, "harvest.leaderLockCheckInterval: 1 is not a duration"),
        ({"harvest": {"leaderLockCheckInterval": "0"}}, "leaderLockCheckInterval: 0.0 must be a duration between 10ms"),
        (
            {"harvest": {"prometheusBindAddress": ""}},
            "harvest.prometheusBindAddress: '' is not an address to listen on",
        ),
        ({"harvest": {"prometheusBindAddress": 127}}, "harvest.prometheusBindAddress: 127 must be a string"),
        (
            {"harvest": {"prometheusBindAddress": "0.0.0.0:9090"}},
            "prometheusBindAddress: '0.0.0.0:9090' contains a port; put the port in prometheusPort",
        ),
        ({"harvest": {"prometheusBindAddress": "[::1]"}}, "write the IPv6 address without brackets"),
        ({"harvest": {"prometheusBindAddress": "256.1.1.1"}}, "'256.1.1.1' is neither an IP address nor a host name"),
        ({"harvest": {"prometheusBindAddress": "my host"}}, "'my host' is neither an IP address nor a host name"),
        (
            {"harvest": {"limits": {"livenessTimeout": "1s"}}},
            "limits.livenessTimeout: 1s is invalid; it must be > limits.minMetricsInterval (5s)",
        ),
        ({"harvest": {"limits": {"livenessTimeout": 30}}}, "limits.livenessTimeout: 30 is not a duration"),
    ],
)
def test_bad_config_is_a_clear_error(data: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_mapping(data)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("text", "seconds"), [("500ms", 0.5), ("1m30s", 90.0), ("0", 0.0), ("1.5h", 5400.0), ("250us", 0.00025)]
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "x") == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("outbox", (None, "outbox")),
        ("App.Outbox", ("app", "outbox")),
        ('"My Schema"."Out.Box"', ("My Schema", "Out.Box")),
        ('"a""b"', (None, 'a"b')),
    ],
)
def test_table_names(name: str, parsed: tuple) -> None:
    assert parse_table_name(name) == parsed


def test_secrets_never_in_repr() -> None:
    cfg = HarvestConfig(
        data_source="host=db user=relay password=hunter22 dbname=app",
        base_kafka_config={"bootstrap.servers": "k:9092", "sasl.password": "kpass77", "sasl.username": "relay"},
    )
    text = repr(cfg) + str(cfg)
    assert "hunter22" not in text and "kpass77" not in text and "relay" in text
    assert redact_dsn("postgresql://u:pw123@h/db?sslmode=require") == "postgresql://u:<redacted>@h/db?sslmode=require"
    assert "pw9" not in redact_dsn("host=h password='pw9 x' dbname=d")


def test_cli_flags_override_file_and_bad_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "h.yaml"
    path.write_text(GOHARVEST_EXAMPLE)
    cfg = load_yaml(path, {"outbox_table": "app.outbox", "bootstrap_servers": "other:1"})
    assert cfg.harvest.outbox_table == "app.outbox"
    assert cfg.harvest.base_kafka_config["bootstrap.servers"] == "other:1"
    path.write_text("harvest:\n  dataSource: host=x password=topsecret1\n  bogus: 1\n")
    assert main(["-f", str(path)]) == 2
    err = capsys.readouterr().err
    assert "harvest.bogus: unknown key" in err and "topsecret1" not in err


@pytest.mark.parametrize(
    ("address", "kept"),
    [
        ("0.0.0.0", "0.0.0.0"),
        ("127.0.0.1", "127.0.0.1"),
        ("::", "::"),
        ("::1", "::1"),
        (" localhost ", "localhost"),
        ("metrics.internal.example", "metrics.internal.example"),
    ],
)
def test_prometheus_bind_address(address: str, kept: str) -> None:
    assert HarvestConfig().prometheus_bind_address == "0.0.0.0"  # reachable by a scraper on another host
    cfg = from_mapping({"harvest": {"prometheusBindAddress": address, "prometheusPort": 0}}).harvest
    assert cfg.prometheus_bind_address == kept and f"prometheus_bind_address={kept!r}" in repr(cfg)


def test_liveness_timeout_default_follows_the_metrics_period() -> None:
    assert Limits().liveness_timeout == 20.0  # 3 x 5s + 5s heartbeat
    assert Limits(min_metrics_interval=0.5, heartbeat_timeout=2.0).liveness_timeout == 15.0  # floor
    assert Limits(min_metrics_interval=30.0).liveness_timeout == 95.0
    assert Limits(min_metrics_interval=0.2, liveness_timeout=1.0).liveness_timeout == 1.0


def test_leader_election_backend() -> None:
    assert HarvestConfig().leader_election == "neli" and HarvestConfig().leader_lock_check_interval == 1.0
    cfg = from_mapping({"harvest": {"leaderElection": "postgres", "leaderLockCheckInterval": "250ms"}}).harvest
    assert (cfg.leader_election, cfg.leader_lock_check_interval) == ("postgres", 0.25)
    assert "leader_election='postgres'" in repr(cfg)
    from harvest_outbox.producer.election.neli import NeliElection
    from harvest_outbox.producer.election.postgres import PostgresElection
    from harvest_outbox.producer.harvest import _make_election

    pg = _make_election(cfg)
    assert isinstance(pg, PostgresElection) and pg.check_interval == 0.25 and pg.lease == 0.5
    assert isinstance(_make_election(HarvestConfig()), NeliElection)
    flags = from_mapping({}, {"leader_election": "postgres"}).harvest
    assert flags.leader_election == "postgres"


@pytest.mark.parametrize(
    ("harvest", "needle"),
    [
        # NELI: session.timeout.ms = 3 x heartbeatTimeout must be within the broker's 6 s .. 30 min
        (
            {"limits": {"heartbeatTimeout": "1999ms"}},
            "limits.heartbeatTimeout: 1.999s is too short for leaderElection neli",
        ),
        ({"limits": {"heartbeatTimeout": "10m1s"}}, "limits.heartbeatTimeout: 10.0167m is too long"),
        (
            {"limits": {"heartbeatTimeout": "1431657766ms"}},
            "limits.heartbeatTimeout: 397.683h is invalid; it must be at most 24h",
        ),
        ({"limits": {"heartbeatTimeout": "25h"}, "leaderElection": "postgres"}, "it must be at most 24h"),
        ({"limits": {"queueTimeout": "24h1s"}}, "limits.queueTimeout: 24.0003h is invalid; it must be at most 24h"),
        ({"limits": {"ioErrorBackoff": "0s"}}, "limits.ioErrorBackoff: 0 is invalid; it must be >= 10ms"),
        ({"limits": {"ioErrorBackoff": "9ms"}}, "limits.ioErrorBackoff: 9ms is invalid; it must be >= 10ms"),
        (
            {"limits": {"markQueryRecords": 1_000_001}},
            "markQueryRecords: 1000001 is invalid; it must be at most 1,000,000",
        ),
        ({"limits": {"purgeBatchRecords": 10**12}}, "purgeBatchRecords: 1000000000000 is invalid; it must be at most"),
        ({"limits": {"txnMaxRecords": 2**40}}, "txnMaxRecords: 1099511627776 is invalid"),
        ({"limits": {"maxInFlightRecords": 2**31}}, "maxInFlightRecords: 2147483648 is invalid"),
        ({"limits": {"producerRing": 257}}, "producerRing: 257 is invalid; it must be at most 256"),
        (
            {"limits": {"maxDeliveryAttempts": 2**31}},
            "maxDeliveryAttempts: 2147483648 is invalid; it must be at most 2,147,483,647 (a 32-bit integer)",
        ),
        ({"leaderTopicReplicationFactor": 0}, "leaderTopicReplicationFactor: 0 must be -1"),
        ({"leaderTopicReplicationFactor": 40000}, "leaderTopicReplicationFactor: 40000 must be -1"),
    ],
)
def test_limits_are_bounded_by_what_kafka_and_postgres_accept(harvest: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_mapping({"harvest": harvest})
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("harvest", "check"),
    [
        (
            {"limits": {"heartbeatTimeout": "2s"}},
            lambda h: h.limits.heartbeat_timeout == 2.0,
        ),  # 6 s session: the minimum
        ({"limits": {"heartbeatTimeout": "10m"}}, lambda h: h.limits.heartbeat_timeout == 600.0),  # 30 min: the maximum
        (
            {"limits": {"heartbeatTimeout": "500ms"}, "leaderElection": "postgres"},  # no Kafka group: no NELI bound
            lambda h: h.limits.heartbeat_timeout == 0.5,
        ),
        ({"limits": {"ioErrorBackoff": "10ms", "queueTimeout": "24h"}}, lambda h: h.limits.io_error_backoff == 0.01),
        ({"limits": {"markQueryRecords": 1_000_000, "producerRing": 256}}, lambda h: h.limits.producer_ring == 256),
        ({"leaderTopicReplicationFactor": 3}, lambda h: h.leader_topic_replication_factor == 3),
    ],
)
def test_limits_at_their_bounds_are_accepted(harvest: dict, check) -> None:
    assert check(from_mapping({"harvest": harvest}).harvest)


def test_kafka_properties_are_judged_by_librdkafka() -> None:
    HarvestConfig(producer_kafka_config={"linger.ms": 5, "compression.type": "lz4"}).check_kafka_properties()
    for cfg, needle in [
        (
            HarvestConfig(producer_kafka_config={"lingr.ms": 5}),
            'producerKafkaConfig: No such configuration property: "lingr.ms"',
        ),
        (
            HarvestConfig(base_kafka_config={"bootstrap.servers": "k:1", "security.protocol": "tcp"}),
            'baseKafkaConfig: Invalid value "tcp" for configuration property "security.protocol"',
        ),
        (HarvestConfig(base_kafka_config={"sasl.pasword": "kafkasecret"}), "baseKafkaConfig: No such configuration"),
    ]:
        with pytest.raises(ConfigError) as info:
            cfg.check_kafka_properties()
        assert needle in str(info.value) and "kafkasecret" not in str(info.value)


@pytest.mark.parametrize("heartbeat", ["2s", "5s", "100s", "101s", "10m"])
def test_neli_consumer_accepts_every_heartbeat_timeout_the_config_accepts(heartbeat: str) -> None:
    """session.timeout.ms = 3 x heartbeatTimeout, and librdkafka refuses a session longer than
    max.poll.interval.ms (default 5 min): the election raises that along (heartbeatTimeout > 100s)."""
    from confluent_kafka import Consumer

    from harvest_outbox.producer.election.neli import neli_consumer_config

    cfg = from_mapping({"harvest": {"limits": {"heartbeatTimeout": heartbeat}}}).harvest
    conf = neli_consumer_config(
        dict(cfg.base_kafka_config), cfg.leader_group_id, cfg.name, cfg.limits.heartbeat_timeout
    )
    assert conf["session.timeout.ms"] == round(cfg.limits.heartbeat_timeout * 3000)
    assert conf["max.poll.interval.ms"] >= conf["session.timeout.ms"]
    Consumer({**conf, "bootstrap.servers": "", "log_level": 0}).close()
    cfg.check_kafka_properties()


def test_row_timeout_sets_the_delivery_timeout_and_caps_user_values() -> None:
    cfg = HarvestConfig(limits=Limits(row_timeout=12.0))
    assert cfg.producer_config()["message.timeout.ms"] == 12000
    assert cfg.producer_config()["topic.metadata.propagation.max.ms"] == 12000
    assert HarvestConfig().producer_config()["message.timeout.ms"] == 30000  # default rowTimeout 30s
    assert (
        HarvestConfig(producer_kafka_config={"delivery.timeout.ms": 5000}).producer_config()["delivery.timeout.ms"]
        == 5000
    )  # shorter is fine
    with pytest.raises(
        ConfigError, match=r"producerKafkaConfig\.message\.timeout\.ms: 300000 exceeds limits\.rowTimeout"
    ):
        HarvestConfig(producer_kafka_config={"message.timeout.ms": 300000})
    with pytest.raises(ConfigError, match=r"limits\.rowTimeout"):
        Limits(row_timeout=0.5)


def test_missing_topic_policy() -> None:
    assert HarvestConfig().missing_topic_policy == "deadLetter"
    assert HarvestConfig.from_mapping({"missingTopicPolicy": "hold"}).missing_topic_policy == "hold"
    with pytest.raises(ConfigError, match=r"missingTopicPolicy: 'park' is not a policy"):
        HarvestConfig.from_mapping({"missingTopicPolicy": "park"})


def _billion_laughs(levels: int = 9) -> str:
    """Nine nested aliases of nine: ~10^9 values once expanded, a few hundred bytes of YAML."""
    names = "abcdefghijklmnop"[:levels]
    nodes = ['&a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    nodes += [f"&{n} [{', '.join([f'*{p}'] * 9)}]" for p, n in itertools.pairwise(names)]
    return f"harvest:\n  dataSource: host=db\n  limits:\n    heartbeatTimeout: [{', '.join(nodes)}]\n"


@pytest.mark.parametrize(
    "text",
    [
        _billion_laughs(),
        # the bomb defined in one place, the mistyped value elsewhere refers to it
        "harvest:\n  producerKafkaConfig: {x: "
        + _billion_laughs().split("heartbeatTimeout: ")[1].strip()
        + "}\n  limits: {heartbeatTimeout: *i}\n",
        # deep rather than wide: 2 aliases per level, 20 levels
        "harvest:\n  limits:\n    heartbeatTimeout: [&a0 [x, x], "
        + ", ".join(f"&a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, 21))
        + "]\n",
    ],
    ids=["billion-laughs", "alias-elsewhere", "deep"],
)
def test_alias_bomb_is_refused_fast_with_small_memory(tmp_path: Path, text: str) -> None:
    import time
    import tracemalloc

    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(ConfigError) as info:
            load_yaml(path)
        elapsed = time.monotonic() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert elapsed < 1.0 and peak < 20 * 2**20, (elapsed, peak)
    message = str(info.value)
    assert "not valid YAML: line " in message and "expand to more than 10,000 values" in message, message
    assert len(message) < 400


def test_aliases_that_share_a_block_still_work(tmp_path: Path) -> None:
    path = tmp_path / "h.yaml"
    path.write_text(
        "harvest:\n  baseKafkaConfig: &kafka\n    bootstrap.servers: k:9092\n    client.id: relay\n"
        "  producerKafkaConfig:\n    <<: *kafka\n    client.id: relay-producer\n"
        "  limits:\n    heartbeatTimeout: &beat 5s\n    livenessTimeout: 30s\n"
        "    queueTimeout: *beat\n"
    )
    h = load_yaml(path).harvest
    assert h.producer_kafka_config["client.id"] == "relay-producer"  # a merged key may be overridden
    assert h.limits.queue_timeout == 5.0


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "harvest:\n  dataSource: host=a\n  outboxTable: o\n  dataSource: host=b\n",
            "line 4, column 3: duplicate key 'dataSource' (first on line 2); keep one of them",
        ),
        (
            "harvest:\n  limits:\n    heartbeatTimeout: 5s\n    heartbeatTimeout: 6s\n",
            "line 4, column 5: duplicate key 'heartbeatTimeout' (first on line 3)",
        ),
        (
            "harvest:\n  dataSource: host=a\nlogging: {level: Info}\nharvest:\n  dataSource: host=b\n",
            "line 4, column 1: duplicate key 'harvest' (first on line 1)",
        ),
        (
            "harvest: {baseKafkaConfig: {linger.ms: 1, linger.ms: 2}}\n",
            "line 1, column 43: duplicate key 'linger.ms' (first on line 1)",
        ),
    ],
    ids=["harvest-key", "limit", "section", "flow-mapping"],
)
def test_duplicate_keys_are_refused_with_their_lines(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "h.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_yaml(path)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("harvest", "needle"),
    [
        ({"leaderElection": "n" * 5000}, "leaderElection: 'nnnnn"),
        ({"limits": {"heartbeatTimeout": list(range(10**6))}}, "limits.heartbeatTimeout: [0, 1, 2, 3, ...]"),
        ({"limits": {"maxInFlightRecords": "9" * 1000}}, "limits.maxInFlightRecords: '99999"),
        ({"x" * 500: 1}, "harvest.'xxxxx"),
        ({"outboxTable": "a b" * 1000}, "outboxTable: 'a ba b"),
        ({"shards": "8" * 1000}, "shards: '8888"),
    ],
    ids=["long-string", "long-list", "long-int-string", "long-key", "long-table", "long-shards"],
)
def test_error_messages_show_at_most_80_characters_of_a_value(harvest: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_mapping({"harvest": harvest})
    message = str(info.value)
    # the bound leaves room for the list of valid keys an unknown key's message ends with (~550 chars)
    assert needle in message and len(message) < 800, message
    if "[0, 1" not in needle:
        assert "more chars)" in message


def test_a_value_python_will_not_build_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "h.yaml"
    path.write_text("harvest:\n  prometheusPort: " + "9" * 5000 + "\n")
    with pytest.raises(ConfigError, match=r"a value cannot be read: .*more chars"):
        load_yaml(path)


@pytest.mark.parametrize(
    ("base", "needle"),
    [
        (
            {"bootstrap.servers": 12345},
            "harvest.baseKafkaConfig.bootstrap.servers: 12345 is not a string (librdkafka "
            "would read 12345 as an IPv4 address and connect to it); quote it",
        ),
        ({"bootstrap.servers": ["k1:9092"]}, "harvest.baseKafkaConfig.bootstrap.servers: Kafka properties take scalar"),
        ({"bootstrap.servers": ""}, "harvest.baseKafkaConfig.bootstrap.servers: '' is empty; list the brokers"),
        ({"bootstrap.servers": None}, "harvest.baseKafkaConfig.bootstrap.servers: None is empty; list the brokers"),
        ({"metadata.broker.list": 9092}, "harvest.baseKafkaConfig.metadata.broker.list: 9092 is not a string"),
    ],
    ids=["int", "list", "empty", "null", "alias-int"],
)
def test_bootstrap_servers_must_be_a_non_empty_string(base: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_mapping({"harvest": {"baseKafkaConfig": base}})
    assert needle in str(info.value)


def test_bootstrap_default_is_goharvests_and_said_at_start() -> None:
    import logging

    cfg = from_mapping({"harvest": {}})
    assert cfg.harvest.base_kafka_config["bootstrap.servers"] == "localhost:9092"  # goharvest's SetDefaults
    assert cfg.notes == (
        (
            logging.WARNING,
            "baseKafkaConfig sets no bootstrap.servers: connecting to "
            "localhost:9092 (goharvest's default); set "
            "harvest.baseKafkaConfig.bootstrap.servers or --bootstrap-servers",
            True,
        ),
    )
    assert not from_mapping({"harvest": {"baseKafkaConfig": {"bootstrap.servers": "k:9092"}}}).notes
    assert not from_mapping({"harvest": {}}, {"bootstrap_servers": "k:9092"}).notes
    alias = from_mapping({"harvest": {"baseKafkaConfig": {"metadata.broker.list": "k:9092"}}})
    assert "bootstrap.servers" not in alias.harvest.base_kafka_config and not alias.notes


def test_data_source_override_is_said_without_secrets() -> None:
    import logging

    data = {
        "harvest": {
            "dataSource": "host=filedb user=relay password=filepw1",
            "baseKafkaConfig": {"bootstrap.servers": "k:9092"},
        }
    }
    cfg = from_mapping(
        data, {"data_source": "host=envdb user=relay password=envpw2"}, sources={"data_source": "HARVEST_DATA_SOURCE"}
    )
    assert cfg.harvest.data_source == "host=envdb user=relay password=envpw2"
    assert cfg.notes == (
        (
            logging.INFO,
            "dataSource: HARVEST_DATA_SOURCE ('host=envdb user=relay "
            "password=<redacted>') is used; it overrides the file's harvest.dataSource "
            "('host=filedb user=relay password=<redacted>')",
            False,
        ),
    )
    same = from_mapping(data, {"data_source": data["harvest"]["dataSource"]}, sources={"data_source": "x"})
    assert not same.notes  # nothing was overridden
    flag = from_mapping(data, {"data_source": "host=flagdb"})
    assert flag.notes[0][1].startswith("dataSource: an override ('host=flagdb') is used")
