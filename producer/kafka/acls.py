"""Least privilege on Kafka: the ACLs the relay's principal and a reader's principal need, decided once here
from the config and printed as ``kafka-acls.sh`` command lines by ``harvest acls`` (docs/security.md,
"Kafka ACLs"), as ``harvest init-db --print-grants`` does for Postgres (:mod:`producer.schema.grants`).

The outbox's rows name their topic, so the topics are not in the config: ``harvest acls --topic NAME`` (one
topic, LITERAL) and ``--topic-prefix PREFIX`` (every topic whose name starts so, PREFIXED) name them.

What the relay does on Kafka, and the ACL each needs (:func:`relay_acls`; a Kafka ACL implies DESCRIBE with
READ, WRITE, DELETE or ALTER, so no DESCRIBE is listed beside them):

- produce each row's record with an idempotent producer: WRITE on the topic. Since Kafka 3.0 (KIP-679) WRITE
  on a topic also lets an idempotent producer get its producer id, so no IDEMPOTENT_WRITE on the cluster
  (``tests/test_security/test_relay_sasl.py`` runs the relay on Kafka 4.2 without it); ``legacy=True`` adds it
  for older brokers;
- the preflight (:mod:`producer.ops.preflight`) describes each topic (DESCRIBE, implied by WRITE) and reads
  its ``max.message.bytes``: DESCRIBE_CONFIGS on the topic;
- NELI (``leaderElection: neli``, sharded or not): its consumer joins ``leaderGroupID`` (READ on the group,
  which implies the coordinator lookup's DESCRIBE) and consumes ``leaderTopic`` (READ: fetch, offsets,
  metadata), its heartbeat producer writes to it (WRITE). The relay creates the leader topic when it is
  missing, which needs CREATE: not granted here, the topic is created once beforehand (``harvest acls`` prints
  the ``kafka-topics.sh`` line). The Postgres-lock election needs no ACL;
- no Kafka transaction (``--uuid-sequencing``'s transactions are harvest's own, in the records' headers): no
  TransactionalId ACL; no dead-letter topic (dead letters are a Postgres table): no ACL for one.

A reader (:func:`reader_acls`) consumes the topics (READ) and, with a ``group.id``, commits to and joins its
group (READ on the group).

Invariants (``tests/test_producer/kafka/test_acls.py``; ``tests/test_security/test_relay_sasl.py`` runs the
relay as a principal holding exactly these ACLs and removes each in turn):
- every ACL has a reason naming what needs it; nothing is granted that no call of the relay uses;
- the rendered command lines are shell-quoted: a topic or principal is never read as shell syntax;
- a principal must be ``Type:name`` and a topic a legal Kafka topic name, or :class:`ConfigError` names the
  argument and the fix.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from harvest_outbox.producer._kafka_names import LEGAL_NAME, NAME_RULE
from harvest_outbox.producer.errors import ConfigError

Resource = Literal["TOPIC", "GROUP", "CLUSTER", "TRANSACTIONAL_ID"]
Pattern = Literal["LITERAL", "PREFIXED"]
Component = Literal["relay", "reader"]

#: kafka-acls.sh's option for each resource type.
_RESOURCE_OPTION = {
    "TOPIC": "--topic",
    "GROUP": "--group",
    "CLUSTER": "--cluster",
    "TRANSACTIONAL_ID": "--transactional-id",
}
#: kafka-acls.sh spells operations in CamelCase.
_OPERATION_WORD = {
    "READ": "Read",
    "WRITE": "Write",
    "DESCRIBE": "Describe",
    "DESCRIBE_CONFIGS": "DescribeConfigs",
    "IDEMPOTENT_WRITE": "IdempotentWrite",
    "CREATE": "Create",
}
#: What the ``--bootstrap-server`` and ``--command-config`` of the printed lines are (set by the user).
BOOTSTRAP_VAR, ADMIN_CONFIG_VAR = "$KAFKA_BOOTSTRAP", "$KAFKA_ADMIN_CONFIG"


@dataclass(frozen=True)
class Acl:
    """One ALLOW ACL: ``principal`` may ``operation`` on the resource, ``why``."""

    component: Component
    principal: str
    resource: Resource
    name: str
    pattern: Pattern
    operation: str
    why: str

    def describe(self) -> str:
        """``WRITE on TOPIC 'orders'`` (``… topics prefixed 'orders.'``): how errors name the ACL."""
        if self.resource == "CLUSTER":
            return f"{self.operation} on the CLUSTER"
        if self.pattern == "PREFIXED":
            return f"{self.operation} on {self.resource} names prefixed {self.name!r}"
        return f"{self.operation} on {self.resource} {self.name!r}"

    def command(self) -> str:
        """The ``kafka-acls.sh`` line adding it (run with an admin's client config)."""
        parts = [
            "kafka-acls.sh",
            "--bootstrap-server",
            f'"{BOOTSTRAP_VAR}"',
            "--command-config",
            f'"{ADMIN_CONFIG_VAR}"',
            "--add",
            "--allow-principal",
            shlex.quote(self.principal),
            "--operation",
            _OPERATION_WORD[self.operation],
            _RESOURCE_OPTION[self.resource],
        ]
        if self.resource != "CLUSTER":
            parts.append(shlex.quote(self.name))
        if self.pattern == "PREFIXED":
            parts += ["--resource-pattern-type", "prefixed"]
        return " ".join(parts)

    def binding(self) -> Any:
        """The ACL as confluent-kafka's ``AclBinding`` (AdminClient.create_acls / delete_acls)."""
        from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

        return AclBinding(
            getattr(ResourceType, "BROKER" if self.resource == "CLUSTER" else self.resource),
            "kafka-cluster" if self.resource == "CLUSTER" else self.name,
            getattr(ResourcePatternType, self.pattern),
            self.principal,
            "*",
            getattr(AclOperation, self.operation),
            AclPermissionType.ALLOW,
        )


@dataclass(frozen=True)
class Topics:
    """The topics the outbox's rows name: exact ``names`` and name ``prefixes`` (``--topic``, ``--topic-prefix``)."""

    names: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.names and not self.prefixes:
            raise ConfigError(
                "harvest acls: no topic given; the outbox's rows name their topics, so name them: "
                "--topic NAME (repeatable) or --topic-prefix PREFIX (e.g. --topic-prefix orders.)"
            )
        for flag, values in (("--topic", self.names), ("--topic-prefix", self.prefixes)):
            for value in values:
                if not isinstance(value, str) or not LEGAL_NAME.match(value) or value in (".", ".."):
                    raise ConfigError(f"harvest acls: {flag} {value!r} is not a legal Kafka topic name ({NAME_RULE})")

    def each(self) -> list[tuple[str, Pattern]]:
        return [(n, "LITERAL") for n in self.names] + [(p, "PREFIXED") for p in self.prefixes]


def principal(value: str, flag: str = "--principal") -> str:
    """``value`` if it is a Kafka principal (``User:name``), else :class:`ConfigError` naming ``flag``."""
    kind, sep, name = value.partition(":")
    if not sep or not kind or not name or not value.isprintable():
        raise ConfigError(
            f"harvest acls: {flag} {value!r} is not a Kafka principal; give Type:name, e.g. User:harvest-relay "
            f"(a SCRAM user's principal is User:<sasl.username>)"
        )
    return value


def topic_write(relay: str, topic: str, pattern: Pattern = "LITERAL") -> Acl:
    """The relay principal's WRITE on ``topic`` (the reason the preflight quotes when it is missing)."""
    return Acl(
        "relay",
        relay,
        "TOPIC",
        topic,
        pattern,
        "WRITE",
        "the relay produces the rows' records (WRITE implies DESCRIBE: the preflight's and the producer's "
        "metadata; and, since Kafka 3.0, the idempotent producer's id)",
    )


def topic_describe_configs(relay: str, topic: str, pattern: Pattern = "LITERAL") -> Acl:
    """The relay principal's DESCRIBE_CONFIGS on ``topic``."""
    return Acl(
        "relay",
        relay,
        "TOPIC",
        topic,
        pattern,
        "DESCRIBE_CONFIGS",
        "the preflight reads max.message.bytes, to dead-letter a record too large before producing it",
    )


def relay_acls(
    relay: str, topics: Topics, *, leader_election: str, leader_topic: str, leader_group: str, legacy: bool = False
) -> list[Acl]:
    """The ACLs of the relay's principal ``relay`` (module doc) for a relay with this election, producing
    to ``topics``; ``legacy``: a broker before Kafka 3.0 (IDEMPOTENT_WRITE on the cluster too)."""
    relay = principal(relay)
    out: list[Acl] = []
    for name, pattern in topics.each():
        out += [topic_write(relay, name, pattern), topic_describe_configs(relay, name, pattern)]
    if legacy:
        out.append(
            Acl(
                "relay",
                relay,
                "CLUSTER",
                "kafka-cluster",
                "LITERAL",
                "IDEMPOTENT_WRITE",
                "a broker before Kafka 3.0 gives an idempotent producer its id only with it",
            )
        )
    if leader_election == "neli":
        out.append(
            Acl(
                "relay",
                relay,
                "TOPIC",
                leader_topic,
                "LITERAL",
                "READ",
                "NELI's consumer reads the leader topic's heartbeats (READ implies DESCRIBE: its metadata and offsets)",
            )
        )
        out.append(
            Acl("relay", relay, "TOPIC", leader_topic, "LITERAL", "WRITE", "NELI's leader writes its heartbeats to it")
        )
        out.append(
            Acl(
                "relay",
                relay,
                "GROUP",
                leader_group,
                "LITERAL",
                "READ",
                "NELI's consumer joins the leader group (READ implies DESCRIBE: the coordinator lookup)",
            )
        )
    return out


def reader_acls(reader: str, topics: Topics, group: str | None = None) -> list[Acl]:
    """The ACLs of a reader's principal ``reader`` consuming ``topics``, in consumer group ``group`` if any."""
    reader = principal(reader, "--reader-principal")
    out = [
        Acl("reader", reader, "TOPIC", name, pattern, "READ", "the reader fetches the records (READ implies DESCRIBE)")
        for name, pattern in topics.each()
    ]
    if group is not None:
        if not group or not group.isprintable():
            raise ConfigError(f"harvest acls: --reader-group {group!r} is not a consumer group id; give its group.id")
        out.append(
            Acl(
                "reader",
                reader,
                "GROUP",
                group,
                "LITERAL",
                "READ",
                "the reader's group.id: join, fetch and commit offsets",
            )
        )
    return out


def acl_script(acls: Sequence[Acl], made_for: str, leader_topic: str | None = None, partitions: int = 1) -> str:
    """What ``harvest acls`` prints: a header, then per ACL its reason as a comment and its command line."""
    lines = [
        f"# harvest's least-privilege Kafka ACLs (docs/security.md, Kafka ACLs): {made_for}",
        f"# Set {BOOTSTRAP_VAR} and {ADMIN_CONFIG_VAR} (an admin's client properties), then run every line.",
    ]
    if leader_topic is not None:
        lines.append(
            "# Create NELI's leader topic once first (the relay creates it only with CREATE, not granted here):"
        )
        lines.append(
            f'# kafka-topics.sh --bootstrap-server "{BOOTSTRAP_VAR}" --command-config "{ADMIN_CONFIG_VAR}" --create '
            f"--if-not-exists --topic {shlex.quote(leader_topic)} --partitions {partitions}"
        )
    component = None
    for acl in acls:
        if acl.component != component:
            component = acl.component
            lines += ["", f"# {component}: {acl.principal}"]
        lines.append(f"# {acl.describe()}: {acl.why}")
        lines.append(acl.command())
    return "\n".join(_one_line(line) for line in lines) + "\n"


def _one_line(text: str) -> str:
    """Control characters escaped: a line break in a group id would start a shell command of its own."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
