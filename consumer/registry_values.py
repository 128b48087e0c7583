"""Decoding registry-encoded values for the readers (``value_format="avro"`` / ``"protobuf"`` / ``"jsonSchema"``).

The relay's ``serialization:`` (producer/encode/serialization.py) publishes values in the Confluent wire
format: magic byte 0, the 4-byte schema id, the encoded record. A reader given ``value_format`` and
``schema_registry`` (confluent-kafka ``SchemaRegistryClient`` settings, e.g. ``{"url": ...}``)
delivers :class:`DecodedRecord`s: the record's ``value`` is the decoded object (a dict for Avro
records, Protobuf messages and JSON objects; a Protobuf message as ``json_format.MessageToDict`` with
the .proto's field names and unset scalars present), ``raw_value`` the bytes as stored in Kafka; every other attribute is the
underlying record's. Sequencing is unaffected: it reads the ``uuid`` header only, and a record is
decoded after the Sequencer has decided to deliver it.

Invariants (tests/test_consumer/test_registry_values.py): ``value_format="raw"`` (the default)
changes nothing and imports nothing; a tombstone's value stays None; a value that is not in the
wire format, or whose schema id the registry does not know, raises :class:`ValueDecodeError` naming
the record (topic, partition, offset) and carrying it (``.record``), so a reader can skip it knowingly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harvest_outbox.consumer.errors import ConfigError, ConsumerError

VALUE_FORMATS = ("raw", "avro", "protobuf", "jsonSchema")


class ValueDecodeError(ConsumerError):
    """A delivered record's value could not be decoded; ``.record`` is the record (raw value)."""

    def __init__(self, message: str, record: Any) -> None:
        super().__init__(message)
        self.record = record


class DecodedRecord:
    """A delivered record whose ``value`` is decoded; see the module docstring."""

    __slots__ = ("_record", "value")

    def __init__(self, record: Any, value: Any) -> None:
        self._record = record
        self.value = value

    @property
    def raw_value(self) -> bytes | None:
        return self._record.value  # type: ignore[no-any-return]

    @property
    def record(self) -> Any:
        """The record as the reader delivered it (raw value)."""
        return self._record

    def __getattr__(self, name: str) -> Any:
        return getattr(self._record, name)

    def __repr__(self) -> str:
        return f"DecodedRecord({self._record!r}, value={self.value!r})"


class ValueDecoder:
    """Decodes the values of delivered records in one format against one registry."""

    def __init__(self, value_format: str, schema_registry: Mapping[str, Any] | None) -> None:
        if value_format not in VALUE_FORMATS:
            raise ConfigError(f"value_format: {value_format!r} is not a format; use one of {', '.join(VALUE_FORMATS)}")
        if not schema_registry or "url" not in schema_registry:
            raise ConfigError(
                f"schema_registry: value_format={value_format!r} needs the registry's client settings, "
                f"e.g. schema_registry={{'url': 'http://registry:8081'}}"
            )
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.serialization import MessageField, SerializationContext

        self._client = SchemaRegistryClient(dict(schema_registry))
        self._ctx = SerializationContext
        self._field = MessageField.VALUE
        if value_format == "avro":
            from confluent_kafka.schema_registry.avro import AvroDeserializer

            self._deserialize: Any = AvroDeserializer(self._client)
        elif value_format == "protobuf":
            from harvest_outbox.protobuf_schema import ProtobufDictDecoder

            decode_protobuf = ProtobufDictDecoder(self._client)
            self._deserialize = lambda raw, _ctx: decode_protobuf(raw)
        else:
            from confluent_kafka.schema_registry.json_schema import JSONDeserializer

            self._deserialize = _JsonByWriterSchema(self._client, JSONDeserializer)
        self.value_format = value_format

    def __repr__(self) -> str:  # the client settings may hold credentials
        return f"ValueDecoder(value_format={self.value_format!r})"

    def decode(self, record: Any) -> DecodedRecord:
        raw = record.value
        if raw is None:
            return DecodedRecord(record, None)
        if len(raw) < 5 or raw[0] != 0:
            raise ValueDecodeError(
                f"record {record.topic}/{record.partition}@{record.offset}: value is not in the registry wire "
                f"format (magic byte 0 + schema id); was it published with serialization: for this topic?",
                record,
            )
        try:
            value = self._deserialize(raw, self._ctx(record.topic, self._field))
        except Exception as exc:
            schema_id = int.from_bytes(raw[1:5], "big")
            raise ValueDecodeError(
                f"record {record.topic}/{record.partition}@{record.offset} (schema id {schema_id}): "
                f"{type(exc).__name__}: {exc}",
                record,
            ) from exc
        return DecodedRecord(record, value)


class _JsonByWriterSchema:
    """confluent-kafka's JSONDeserializer takes one schema up front; values carry their writer's id,
    so one deserializer per id, built from the registry's schema of that id."""

    def __init__(self, client: Any, cls: Any) -> None:
        self._client, self._cls = client, cls
        self._by_id: dict[int, Any] = {}

    def __call__(self, raw: bytes, ctx: Any) -> Any:
        schema_id = int.from_bytes(raw[1:5], "big")
        des = self._by_id.get(schema_id)
        if des is None:
            des = self._by_id[schema_id] = self._cls(
                self._client.get_schema(schema_id), schema_registry_client=self._client
            )
        return des(raw, ctx)
