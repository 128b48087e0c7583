"""Config: goharvest's YAML keys and defaults, strict parsing, clear errors, no secrets in reprs."""

from __future__ import annotations

from pathlib import Path

import pytest

from producer.cli import main
from producer.config import (AUTO_MARK_RECORDS, AUTO_MAX_IN_FLIGHT, AUTO_TXN_RECORDS, HarvestConfig, Limits, from_mapping,
                             load_yaml, parse_duration)
from producer.errors import ConfigError
from producer.redact import redact_dsn
from producer.schema import parse_table_name

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
    assert (lim.io_error_backoff, lim.poll_duration, lim.min_poll_interval, lim.heartbeat_timeout) == (0.5, 0.001,
                                                                                                      0.1, 5.0)
    assert (lim.queue_timeout, lim.mark_backoff, lim.send_concurrency) == (30.0, 0.01, 8)
    assert (lim.send_buffer, lim.min_metrics_interval) == (10, 5.0)
    # goharvest's fixed sizes become adaptive when left out; a value that is set is the cap
    assert (lim.mark_query_records, lim.max_in_flight_records, lim.txn_max_records) == (None, None, None)
    assert (lim.mark_ceiling, lim.in_flight_limit, lim.txn_ceiling) == (AUTO_MARK_RECORDS, AUTO_MAX_IN_FLIGHT,
                                                                         AUTO_TXN_RECORDS)
    set_ = Limits(mark_query_records=100, max_in_flight_records=1000, txn_max_records=50)
    assert (set_.mark_ceiling, set_.in_flight_limit, set_.txn_ceiling) == (100, 1000, 50)
    cfg = HarvestConfig()
    assert cfg.outbox_table == "outbox" and cfg.base_kafka_config["bootstrap.servers"] == "localhost:9092"


@pytest.mark.parametrize(("data", "needle"), [
    ({"harvest": {"leaderTopik": "x"}}, "harvest.leaderTopik: unknown key; valid keys are: baseKafkaConfig"),
    ({"harvest": {"limits": {"markQueryRecs": 5}}}, "harvest.limits.markQueryRecs: unknown key"),
    ({"harvest": {"limits": {"heartbeatTimeout": 5}}}, "harvest.limits.heartbeatTimeout: 5 is not a duration"),
    ({"harvest": {"limits": {"heartbeatTimeout": "5 sec"}}}, "is not a duration; use Go syntax"),
    ({"harvest": {"limits": {"maxInFlightRecords": 0}}}, "limits.maxInFlightRecords: 0 is invalid; it must be >= 1"),
    ({"harvest": {"limits": {"maxInFlightRecords": "many"}}}, "maxInFlightRecords: 'many' is not an integer"),
    ({"harvest": {"limits": {"minPollInterval": "1s", "maxPollInterval": "500ms"}}},
     "maxPollInterval: 0.5 is invalid; it must be >= limits.minPollInterval (1s)"),
    ({"harvest": {"leaderTopic": "bad topic!"}}, "leaderTopic: 'bad topic!' is not a valid Kafka name"),
    ({"harvest": {"outboxTable": "a.b.c"}}, "must be 'table' or 'schema.table'"),
    ({"harvest": {"outboxTable": "out box"}}, "is not a plain identifier; quote it"),
    ({"harvest": {"producerKafkaConfig": {"enable.idempotence": False}}},
     "producerKafkaConfig.enable.idempotence: False is not allowed"),
    ({"harvest": {"producerKafkaConfig": {"acks": 1}}}, "acks: 1 is not allowed"),
    ({"harvest": {"prometheusPort": 70000}}, "prometheusPort: 70000 must be a TCP port"),
    ({"harvest": {"name": "a%b"}}, "must not contain '%'"),
    ({"harvest": {"dataSource": 5}}, "harvest.dataSource: <redacted> must be a string"),
    ({"harvest": {"baseKafkaConfig": ["x"]}}, "baseKafkaConfig: expected a mapping"),
    ({"harvest": {}, "extra": 1}, "extra: unknown top-level key"),
    ({"logging": {"level": "loud"}}, "logging.level: 'LOUD' is not a level"),
    ({"harvest": {"leaderElection": "zookeeper"}},
     "harvest.leaderElection: 'zookeeper' is not a leader election; use one of neli, postgres"),
    ({"harvest": {"leaderLockCheckInterval": 1}}, "harvest.leaderLockCheckInterval: 1 is not a duration"),
    ({"harvest": {"leaderLockCheckInterval": "0"}}, "leaderLockCheckInterval: 0.0 must be a duration between 10ms"),
])
def test_bad_config_is_a_clear_error(data: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_mapping(data)
    assert needle in str(info.value)


@pytest.mark.parametrize(("text", "seconds"), [("500ms", 0.5), ("1m30s", 90.0), ("0", 0.0), ("1.5h", 5400.0),
                                                ("250us", 0.00025)])
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "x") == pytest.approx(seconds)


@pytest.mark.parametrize(("name", "parsed"), [("outbox", (None, "outbox")), ("App.Outbox", ("app", "outbox")),
                                              ('"My Schema"."Out.Box"', ("My Schema", "Out.Box")),
                                              ('"a""b"', (None, 'a"b'))])
def test_table_names(name: str, parsed: tuple) -> None:
    assert parse_table_name(name) == parsed


def test_secrets_never_in_repr() -> None:
    cfg = HarvestConfig(data_source="host=db user=relay password=hunter22 dbname=app",
                        base_kafka_config={"bootstrap.servers": "k:9092", "sasl.password": "kpass77",
                                           "sasl.username": "relay"})
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


def test_leader_election_backend() -> None:
    assert HarvestConfig().leader_election == "neli" and HarvestConfig().leader_lock_check_interval == 1.0
    cfg = from_mapping({"harvest": {"leaderElection": "postgres", "leaderLockCheckInterval": "250ms"}}).harvest
    assert (cfg.leader_election, cfg.leader_lock_check_interval) == ("postgres", 0.25)
    assert "leader_election='postgres'" in repr(cfg)
    from producer.election import NeliElection
    from producer.election_postgres import PostgresElection
    from producer.harvest import _make_election

    pg = _make_election(cfg)
    assert isinstance(pg, PostgresElection) and pg.check_interval == 0.25 and pg.lease == 0.5
    assert isinstance(_make_election(HarvestConfig()), NeliElection)
    flags = from_mapping({}, {"leader_election": "postgres"}).harvest
    assert flags.leader_election == "postgres"


def test_row_timeout_sets_the_delivery_timeout_and_caps_user_values() -> None:
    cfg = HarvestConfig(limits=Limits(row_timeout=12.0))
    assert cfg.producer_config()["message.timeout.ms"] == 12000
    assert cfg.producer_config()["topic.metadata.propagation.max.ms"] == 12000
    assert HarvestConfig().producer_config()["message.timeout.ms"] == 30000  # default rowTimeout 30s
    assert HarvestConfig(producer_kafka_config={"delivery.timeout.ms": 5000}).producer_config()[
        "delivery.timeout.ms"] == 5000  # shorter is fine
    with pytest.raises(ConfigError, match=r"producerKafkaConfig\.message\.timeout\.ms: 300000 exceeds limits\.rowTimeout"):
        HarvestConfig(producer_kafka_config={"message.timeout.ms": 300000})
    with pytest.raises(ConfigError, match=r"limits\.rowTimeout"):
        Limits(row_timeout=0.5)


def test_missing_topic_policy() -> None:
    assert HarvestConfig().missing_topic_policy == "deadLetter"
    assert HarvestConfig.from_mapping({"missingTopicPolicy": "hold"}).missing_topic_policy == "hold"
    with pytest.raises(ConfigError, match=r"missingTopicPolicy: 'park' is not a policy"):
        HarvestConfig.from_mapping({"missingTopicPolicy": "park"})
