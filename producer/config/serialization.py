"""YAML ``serialization:``: which topics the relay encodes with a schema registry, and how.

::

    serialization:
      registry:
        url: http://registry:8081          # a Confluent-compatible API (Apicurio: .../apis/ccompat/v6)
        basicAuth: ${REGISTRY_USER_INFO}   # optional "user:password"; never logged
      topics:
        - topic: orders                    # an exact topic name, or
          # topicPattern: "orders\\..*"    # a regular expression the whole topic name must match
          serializer: avro                 # avro | protobuf | jsonSchema | none (default)
          subjectNameStrategy: topic       # topic (default) | record | topicRecord
          # recordName: shop.Order         # the record's full name (record and topicRecord; protobuf: the
          #                                # message, default the schema's first)
          schemaVersion: latest            # latest (default) or a registered version number, or
          # schemaId: 42                   # a registered schema id
          # keySerializer: none            # none (default) or like serializer (the key subject's latest)
      # encodeWorker: false                # true: encode Avro values in a child process (docs/schemas.md, Cost)

The first entry whose ``topic`` equals, or ``topicPattern`` fully matches, a row's topic applies;
a topic no entry matches is published as stored (``none``). The row's value must be JSON (an
object for Avro and Protobuf): the relay parses it and hands the result to confluent-kafka's
serializer of that format (Protobuf: parsed into a message class built from the registered
``.proto`` at run time, harvest_outbox/protobuf_schema.py).

Invariants (tests/test_producer/config/test_registry_config.py): unknown keys fail naming the key and the
valid ones; a bad value fails naming the field, the value and the fix; credentials never appear in
a repr, a log line or an error message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from harvest_outbox.producer.errors import ConfigError, shown

SERIALIZERS = ("none", "avro", "protobuf", "jsonSchema")
SUBJECT_NAME_STRATEGIES = ("topic", "record", "topicRecord")


def _unknown(path: str, data: Mapping[str, Any], keys: Mapping[str, str]) -> None:
    for key in data:
        if key not in keys:
            name = key if isinstance(key, str) and key.isprintable() and len(key) <= 64 else shown(key)
            raise ConfigError(f"{path}.{name}: unknown key; valid keys are: {', '.join(sorted(keys))}")


@dataclass(frozen=True)
class RegistryConfig:
    """Where the schema registry is: ``url`` (http or https) and optional ``basic_auth`` ("user:password")."""

    #: The registry's base URL (http or https), a Confluent-compatible API; credentials go in basicAuth.
    url: str
    #: ``user:password`` for the registry (HTTP basic auth); redacted in every repr and message.
    basic_auth: str = field(default="", repr=False)
    #: Seconds a subject's latest version is cached before it is asked again (new versions show up).
    latest_ttl: float = 300.0

    def __post_init__(self) -> None:
        parts = urlsplit(self.url) if isinstance(self.url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(
                f"serialization.registry.url: {shown(self.url)} is not an http(s) URL; give the registry's "
                f"Confluent-compatible base URL, e.g. http://registry:8081"
            )
        if parts.username or parts.password:
            raise ConfigError(
                "serialization.registry.url: holds credentials; move them to serialization.registry.basicAuth"
            )
        if not isinstance(self.basic_auth, str) or (self.basic_auth and ":" not in self.basic_auth):
            raise ConfigError("serialization.registry.basicAuth: <redacted> must be a 'user:password' string")
        ttl = self.latest_ttl
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl <= 0:
            raise ConfigError(f"serialization.registry.latestTtl: {shown(ttl)} must be a number of seconds above 0")

    def __repr__(self) -> str:
        auth = ", basic_auth=<redacted>" if self.basic_auth else ""
        return f"RegistryConfig(url={self.url!r}{auth}, latest_ttl={self.latest_ttl!r})"

    def client_conf(self) -> dict[str, Any]:
        """confluent-kafka ``SchemaRegistryClient`` settings (holds the credentials: never log it)."""
        conf: dict[str, Any] = {
            "url": self.url,
            "cache.latest.ttl.sec": self.latest_ttl,
            "max.retries": 1,  # an outage is the relay's to wait out (rows wait), not the client's
            "timeout": 5,
        }
        if self.basic_auth:
            conf["basic.auth.user.info"] = self.basic_auth
        return conf

    @classmethod
    def from_mapping(cls, data: Any, path: str) -> RegistryConfig:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: expected a mapping such as {{url: http://registry:8081}}, got {shown(data)}")
        keys = {"url": "url", "basicAuth": "basic_auth", "latestTtl": "latest_ttl"}
        _unknown(path, data, keys)
        if data.get("url") is None:
            raise ConfigError(f"{path}.url: required (the registry's base URL)")
        return cls(**{keys[k]: v for k, v in data.items() if v is not None})


@dataclass(frozen=True)
class TopicSerialization:
    """How the records of one topic (or of every topic a pattern matches) are encoded."""

    #: The topic this entry applies to (give this or topicPattern).
    topic: str = ""
    #: A regular expression the whole topic name must match (give this or topic); the first matching entry wins.
    topic_pattern: str = ""
    #: ``avro``, ``protobuf``, ``jsonSchema`` or ``none`` (published as stored); the row's value must be JSON.
    serializer: str = "none"
    #: The subject of the writer schema: ``topic`` (``<topic>-value``), ``record`` (``<recordName>``) or
    #: ``topicRecord`` (``<topic>-<recordName>``).
    subject_name_strategy: str = "topic"
    #: The record's full name (e.g. ``shop.Order``), required by the record strategies; for protobuf also
    #: the message of the schema to encode (default: the schema's first message).
    record_name: str = ""
    #: ``latest`` (the subject's latest version, cached for registry.latestTtl) or a registered version number.
    schema_version: str | int = "latest"
    #: A registered schema id to encode with, instead of schemaVersion.
    schema_id: int | None = None
    #: ``none`` or a serializer for the key (the key subject's latest schema; the row's key must be JSON).
    key_serializer: str = "none"

    def __post_init__(self) -> None:
        where = f"serialization.topics[{self.topic or self.topic_pattern}]"
        if bool(self.topic) == bool(self.topic_pattern):
            raise ConfigError(f"{where}: give exactly one of topic (a name) and topicPattern (a regular expression)")
        if self.topic_pattern:
            try:
                re.compile(self.topic_pattern)
            except re.error as exc:
                raise ConfigError(
                    f"{where}.topicPattern: {shown(self.topic_pattern)} is not a regular expression ({exc})"
                ) from None
        for name, value in (("serializer", self.serializer), ("keySerializer", self.key_serializer)):
            if value not in SERIALIZERS:
                raise ConfigError(
                    f"{where}.{name}: {shown(value)} is not a serializer; use one of {', '.join(SERIALIZERS)}"
                )
        if self.subject_name_strategy not in SUBJECT_NAME_STRATEGIES:
            raise ConfigError(
                f"{where}.subjectNameStrategy: {shown(self.subject_name_strategy)} is not a strategy; use one of "
                f"{', '.join(SUBJECT_NAME_STRATEGIES)}"
            )
        if self.subject_name_strategy != "topic" and not self.record_name:
            raise ConfigError(
                f"{where}.recordName: required with subjectNameStrategy {self.subject_name_strategy} "
                f"(the record's full name, e.g. shop.Order, names the subject)"
            )
        version = self.schema_version
        if not (version == "latest" or (isinstance(version, int) and not isinstance(version, bool) and version > 0)):
            raise ConfigError(f"{where}.schemaVersion: {shown(version)} must be latest or a version number (1, 2, ...)")
        if self.schema_id is not None:
            if isinstance(self.schema_id, bool) or not isinstance(self.schema_id, int) or self.schema_id <= 0:
                raise ConfigError(
                    f"{where}.schemaId: {shown(self.schema_id)} must be a registered schema id (1, 2, ...)"
                )
            if version != "latest":
                raise ConfigError(f"{where}: give schemaVersion or schemaId, not both")

    def matches(self, topic: str) -> bool:
        return topic == self.topic if self.topic else re.fullmatch(self.topic_pattern, topic) is not None

    def subject(self, topic: str, is_key: bool = False) -> str:
        """The subject the strategy names for ``topic``'s values (or keys)."""
        if self.subject_name_strategy == "record":
            return self.record_name
        if self.subject_name_strategy == "topicRecord":
            return f"{topic}-{self.record_name}"
        return f"{topic}-{'key' if is_key else 'value'}"

    @classmethod
    def from_mapping(cls, data: Any, path: str) -> TopicSerialization:
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"{path}: expected a mapping such as {{topic: orders, serializer: avro}}, got {shown(data)}"
            )
        keys = {
            "topic": "topic",
            "topicPattern": "topic_pattern",
            "serializer": "serializer",
            "subjectNameStrategy": "subject_name_strategy",
            "recordName": "record_name",
            "schemaVersion": "schema_version",
            "schemaId": "schema_id",
            "keySerializer": "key_serializer",
        }
        _unknown(path, data, keys)
        return cls(**{keys[k]: v for k, v in data.items() if v is not None})


@dataclass(frozen=True)
class SerializationConfig:
    """``serialization:``; empty (the default) publishes every value as stored."""

    #: The schema registry: ``{url, basicAuth, latestTtl}``; required when a topic has a serializer.
    registry: RegistryConfig | None = None
    #: Per topic or topic pattern: ``{topic | topicPattern, serializer, subjectNameStrategy, ...}``.
    topics: tuple[TopicSerialization, ...] = ()
    #: Encode Avro values in a child process (producer/encode/worker.py) instead of the relay's own
    #: interpreter: off by default; worth it when the relay has a core to spare (docs/schemas.md, Cost).
    encode_worker: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "topics", tuple(self.topics))
        if not isinstance(self.encode_worker, bool):
            raise ConfigError(f"serialization.encodeWorker: {shown(self.encode_worker)} must be true or false")
        if any(t.serializer != "none" or t.key_serializer != "none" for t in self.topics) and self.registry is None:
            raise ConfigError("serialization.registry: required when a topic has a serializer (give its url)")

    @property
    def enabled(self) -> bool:
        return any(t.serializer != "none" or t.key_serializer != "none" for t in self.topics)

    def for_topic(self, topic: str) -> TopicSerialization | None:
        """The first entry that applies to ``topic``, or None (published as stored)."""
        for entry in self.topics:
            if entry.matches(topic):
                return entry if entry.serializer != "none" or entry.key_serializer != "none" else None
        return None

    @classmethod
    def from_mapping(cls, data: Any, path: str = "serialization") -> SerializationConfig:
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: expected a mapping with registry and topics, got {shown(data)}")
        _unknown(path, data, {"registry": "", "topics": "", "encodeWorker": ""})
        topics = data.get("topics") or []
        if not isinstance(topics, list):
            raise ConfigError(f"{path}.topics: expected a list of {{topic, serializer, ...}} entries")
        registry = (
            RegistryConfig.from_mapping(data["registry"], f"{path}.registry")
            if data.get("registry") is not None
            else None
        )
        return cls(
            registry,
            tuple(TopicSerialization.from_mapping(t, f"{path}.topics[{i}]") for i, t in enumerate(topics)),
            data.get("encodeWorker", False),
        )
