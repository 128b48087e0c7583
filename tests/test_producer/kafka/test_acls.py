"""producer/kafka/acls.py: the Kafka ACLs of the relay's and a reader's principal, and ``harvest acls``
printing them (the relay holding exactly these, each removed in turn: tests/test_security/test_relay_sasl.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from confluent_kafka.admin import AclOperation, AclPermissionType, ResourcePatternType, ResourceType

from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.producer.kafka.acls import Topics, acl_script, reader_acls, relay_acls
from harvest_outbox.producer.ops.cli import main


def _rows(acls: list) -> list[tuple[str, str, str, str]]:
    return [(a.resource, a.name, a.pattern, a.operation) for a in acls]


def test_the_relay_needs_write_and_describe_configs_per_topic_and_nothing_for_the_postgres_election() -> None:
    acls = relay_acls(
        "User:relay", Topics(("orders",), ("billing.",)), leader_election="postgres", leader_topic="x", leader_group="g"
    )
    assert _rows(acls) == [
        ("TOPIC", "orders", "LITERAL", "WRITE"),
        ("TOPIC", "orders", "LITERAL", "DESCRIBE_CONFIGS"),
        ("TOPIC", "billing.", "PREFIXED", "WRITE"),
        ("TOPIC", "billing.", "PREFIXED", "DESCRIBE_CONFIGS"),
    ]
    assert all(a.why and a.principal == "User:relay" and a.component == "relay" for a in acls)


def test_neli_adds_its_leader_topic_and_group_and_old_brokers_idempotent_write() -> None:
    acls = relay_acls(
        "User:relay", Topics(("orders",)), leader_election="neli", leader_topic="o.neli", leader_group="o", legacy=True
    )
    assert _rows(acls)[2:] == [
        ("CLUSTER", "kafka-cluster", "LITERAL", "IDEMPOTENT_WRITE"),
        ("TOPIC", "o.neli", "LITERAL", "READ"),
        ("TOPIC", "o.neli", "LITERAL", "WRITE"),
        ("GROUP", "o", "LITERAL", "READ"),
    ]
    assert not any(a.resource == "TRANSACTIONAL_ID" or a.operation == "CREATE" for a in acls)


def test_readers_read_the_topics_and_their_group() -> None:
    acls = reader_acls("User:reader", Topics(("orders",), ("billing.",)), group="readers")
    assert _rows(acls) == [
        ("TOPIC", "orders", "LITERAL", "READ"),
        ("TOPIC", "billing.", "PREFIXED", "READ"),
        ("GROUP", "readers", "LITERAL", "READ"),
    ]
    assert _rows(reader_acls("User:reader", Topics(("orders",)))) == [("TOPIC", "orders", "LITERAL", "READ")]


def test_command_lines_are_shell_quoted_and_bindings_match() -> None:
    [write, _configs] = relay_acls(
        "User:a b'; rm -rf /", Topics(prefixes=("o.",)), leader_election="postgres", leader_topic="", leader_group=""
    )
    words = shlex.split(write.command())
    assert words[words.index("--allow-principal") + 1] == "User:a b'; rm -rf /"
    assert words[-5:] == ["Write", "--topic", "o.", "--resource-pattern-type", "prefixed"]
    binding = write.binding()
    assert (binding.restype, binding.name, binding.resource_pattern_type) == (
        ResourceType.TOPIC,
        "o.",
        ResourcePatternType.PREFIXED,
    )
    assert (binding.operation, binding.permission_type) == (AclOperation.WRITE, AclPermissionType.ALLOW)
    [cluster] = [
        a
        for a in relay_acls(
            "User:r", Topics(("t",)), leader_election="postgres", leader_topic="", leader_group="", legacy=True
        )
        if a.resource == "CLUSTER"
    ]
    assert (
        cluster.command().endswith("--operation IdempotentWrite --cluster")
        and cluster.binding().restype == ResourceType.BROKER
    )


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: Topics(), "no topic given; .* --topic NAME .* --topic-prefix PREFIX"),
        (lambda: Topics(("bad topic",)), "--topic 'bad topic' is not a legal Kafka topic name"),
        (lambda: Topics(prefixes=("a/b",)), "--topic-prefix 'a/b' is not a legal Kafka topic name"),
        (
            lambda: relay_acls("relay", Topics(("t",)), leader_election="postgres", leader_topic="", leader_group=""),
            "--principal 'relay' is not a Kafka principal; give Type:name",
        ),
        (lambda: reader_acls(":x", Topics(("t",))), "--reader-principal ':x' is not a Kafka principal"),
    ],
)
def test_bad_arguments_name_the_flag_and_the_fix(call: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        call()  # type: ignore[operator]


def test_the_script_gives_each_acl_its_reason_and_escapes_control_characters() -> None:
    with pytest.raises(ConfigError, match="is not a consumer group id"):
        reader_acls("User:r", Topics(("t",)), group="g\nrm -rf /")
    acls = relay_acls(
        "User:r", Topics(("t",)), leader_election="neli", leader_topic="l.neli", leader_group="g\nrm -rf /"
    )
    script = acl_script(acls, "made for", leader_topic="l.neli", partitions=2)
    lines = script.splitlines()
    assert lines[0].endswith(": made for") and "--topic l.neli --partitions 2" in lines[3]
    commands = [x for x in lines if x.startswith("kafka-acls.sh")]
    assert len(commands) == 5 and all(lines[lines.index(c) - 1].startswith("# ") for c in commands)
    assert not any(x.startswith("rm") for x in lines) and "g\\nrm -rf /" in script


def test_harvest_acls_prints_the_config_s_acls_and_no_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "h.yaml"
    path.write_text(
        "harvest:\n  dataSource: host=127.0.0.1 port=1 user=relay password=hunter2secret\n"
        "  baseKafkaConfig:\n    bootstrap.servers: k:9093\n    security.protocol: SASL_SSL\n"
        "    sasl.mechanism: SCRAM-SHA-512\n    sasl.username: relay\n    sasl.password: kafkasecret9\n"
        "  leaderGroupID: orders\n  shards: 2\n"
    )
    args = ["acls", "-f", str(path), "--principal", "User:relay", "--topic", "orders"]
    assert main([*args, "--reader-principal", "User:reader", "--reader-group", "rg"]) == 0
    out, err = capsys.readouterr()
    want = relay_acls(
        "User:relay",
        Topics(("orders",)),
        leader_election="neli",
        leader_topic="orders.neli.shards2",
        leader_group="orders",
    ) + reader_acls("User:reader", Topics(("orders",)), "rg")
    assert out == acl_script(
        want, "leaderElection: neli (group 'orders'), at least once, shards: 2", "orders.neli.shards2", 2
    )
    assert "hunter2secret" not in out + err and "kafkasecret9" not in out + err
    assert main(["acls", "-f", str(path), "--principal", "User:relay"]) == 2
    assert "no topic given" in capsys.readouterr().err
    assert main([*args, "--reader-group", "rg"]) == 2
    assert "--reader-group is the reader's; add --reader-principal" in capsys.readouterr().err
