"""Optional check at stash time: ``Stasher(table, validate=StashValidator(serialization))``.

The relay validates every row it encodes (producer/encode/serialization.py) and parks the ones that do not
fit; this lets a writer fail fast instead, in its own transaction, with a
:class:`~producer.errors.RecordError` that names the field and the rule, before the row is written.

It never calls the registry inside the writer's transaction: :meth:`StashValidator.check` reads a
local cache of parsed schemas only. The cache is filled by :meth:`StashValidator.refresh` (network),
which the application calls outside any transaction (at start-up, say), and which a background
thread repeats every ``refresh_interval`` seconds (default 60; ``None``: only when called). A record
of a topic whose schema is not cached yet passes (the relay still checks it) and the topic is fetched
on the next refresh. Off by default: a Stasher without ``validate`` checks nothing against schemas.

Invariants (tests/test_producer/stash/test_registry_stash.py): ``check`` makes no network call; a record
that does not fit raises RecordError naming the field and the rule; tombstones and topics without a
serializer pass; the same rules as the relay's (strict Avro, JSON Schema with its ``$`` paths,
Protobuf by proto3's JSON mapping).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from harvest_outbox.producer.config.serialization import SerializationConfig, TopicSerialization
from harvest_outbox.producer.encode.serialization import validation_reason
from harvest_outbox.producer.errors import ConfigError, RecordError

log = logging.getLogger(__name__)


class StashValidator:
    """Checks record values against cached registry schemas; see the module docstring."""

    def __init__(
        self,
        serialization: SerializationConfig,
        *,
        refresh_interval: float | None = 60.0,
        client_factory: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        if serialization.registry is None:
            raise ConfigError("validate: the serialization config has no registry to take schemas from")
        self.serialization = serialization
        self._client_conf = serialization.registry.client_conf()
        self._client_factory = client_factory
        self._client: Any = None
        #: topic -> a callable that raises on a value that does not fit (jsonschema / fastavro), or None
        self._checks: dict[str, Callable[[Any], None] | None] = {}
        self._wanted: set[str] = {t.topic for t in serialization.topics if t.topic and t.serializer != "none"}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if refresh_interval is not None:
            self._thread = threading.Thread(
                target=self._refresh_every, args=(refresh_interval,), name="harvest-stash-schemas", daemon=True
            )
            self._thread.start()

    def __repr__(self) -> str:
        return f"StashValidator(topics={sorted(self._checks)})"

    def close(self) -> None:
        self._stop.set()

    def refresh(self, topics: Iterable[str] = ()) -> None:
        """Fetch the current schema of ``topics`` and of every topic met so far (network: call it
        outside any transaction). A registry error propagates; the cache keeps what it had."""
        with self._lock:
            wanted = set(self._wanted) | set(self._checks) | set(topics)
        for topic in wanted:
            entry = self.serialization.for_topic(topic)
            check = self._build(entry, topic) if entry is not None else None
            with self._lock:
                self._checks[topic] = check
                self._wanted.discard(topic)

    def check(self, topic: str, value: str | bytes | None) -> None:
        """Raise :class:`RecordError` if ``value`` does not fit ``topic``'s cached schema (no network)."""
        if value is None:
            return
        try:
            check = self._checks[topic]
        except KeyError:
            if self.serialization.for_topic(topic) is not None:
                with self._lock:
                    self._wanted.add(topic)  # fetched by the next refresh; the relay checks it meanwhile
            else:
                self._checks[topic] = None
            return
        if check is None:
            return
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            raise RecordError(f"value: not JSON ({exc}); topic {topic!r} is encoded from a JSON value") from None
        try:
            check(parsed)
        except Exception as exc:
            raise RecordError(f"value: {validation_reason(exc, 'value')} (topic {topic!r})") from exc

    # ------------------------------------------------------------------ internals
    @property
    def client(self) -> Any:
        if self._client is None:
            if self._client_factory is not None:
                self._client = self._client_factory(self._client_conf)
            else:
                from confluent_kafka.schema_registry import SchemaRegistryClient

                self._client = SchemaRegistryClient(self._client_conf)
        return self._client

    def _build(self, entry: TopicSerialization, topic: str) -> Callable[[Any], None] | None:
        if entry.serializer == "none":
            return None
        subject = entry.subject(topic)
        if entry.schema_id is not None:
            schema = self.client.get_schema(entry.schema_id)
        elif entry.schema_version != "latest":
            schema = self.client.get_version(subject, entry.schema_version).schema
        else:
            schema = self.client.get_latest_version(subject).schema
        if entry.serializer == "protobuf":  # the registry's .proto text (harvest_outbox/protobuf_schema.py)
            from harvest_outbox.protobuf_schema import message_class, parse_json

            cls = message_class(schema.schema_str, entry.record_name)
            return lambda value: parse_json(cls, value)
        document = json.loads(schema.schema_str)
        if entry.serializer == "avro":
            from fastavro import parse_schema
            from fastavro.validation import validate

            parsed = parse_schema(document)

            def check(value: Any) -> None:
                validate(value, parsed, raise_errors=True)

            return check
        from jsonschema.validators import validator_for

        validator = validator_for(document)(document)
        check_value: Callable[[Any], None] = validator.validate  # (jsonschema's validators are untyped)
        return check_value

    def _refresh_every(self, interval: float) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception as exc:  # the cache keeps what it had; the relay validates regardless
                log.warning("refreshing the stash-time schemas failed: %s", exc)
            self._stop.wait(interval)
