"""Decoding registry-encoded values in the Spark readers (``readCommitted(..., value_format="avro")``).

The relay's ``serialization:`` publishes values in the Confluent wire format (magic byte 0, 4-byte
schema id, encoded record). :func:`decode_values` turns a readers' DataFrame (batch or streaming)
into one whose ``value`` is the decoded record as JSON text, with the stored bytes kept as
``raw_value``; ``from_json(value, schema)`` then gives typed columns.

Why JSON text from an Arrow-batched Python UDF and not Spark's ``from_avro``: ``from_avro`` needs the
spark-avro jar (not in the pyspark wheel), does not read the 5-byte wire-format prefix, and takes
one reader schema up front, while a topic's records carry the ids of whichever writer schemas
encoded them. Decoding on the executors with confluent-kafka's deserializers handles every id, for
Avro and JSON Schema alike, at the cost of a Python hop per batch. Protobuf likewise (not
``from_protobuf``, which needs a descriptor file up front): the writer schema's message class is
built at run time (harvest_outbox/protobuf_schema.py) and the message written as JSON. Decoding runs after sequencing
(which reads the ``uuid`` header only), so it never changes which records are delivered.

Invariants (tests/test_spark_reader/test_spark_registry_values.py): a tombstone's value stays null; a
value not in the wire format fails the query with an error naming topic, partition and offset.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from harvest_outbox.spark_reader.errors import ReaderConfigError, SparkReaderError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

VALUE_FORMATS = ("avro", "protobuf", "jsonSchema")


def decode_values(df: DataFrame, value_format: str, schema_registry: Mapping[str, Any]) -> DataFrame:
    """``df`` with ``value`` decoded to JSON text and the stored bytes as ``raw_value``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    if value_format not in VALUE_FORMATS:
        raise ReaderConfigError(
            f"value_format: {value_format!r} is not a format; use one of {', '.join(VALUE_FORMATS)} (or omit it: bytes)"
        )
    if not schema_registry or "url" not in schema_registry:
        raise ReaderConfigError(
            f"schema_registry: value_format={value_format!r} needs the registry's client settings, "
            f"e.g. schema_registry={{'url': 'http://registry:8081'}}"
        )
    conf = dict(schema_registry)

    def decode_one(value: bytes | None, topic: str, partition: int, offset: int) -> str | None:
        return _decoder(value_format, conf)(value, topic, partition, offset)

    # Arrow-batched Python UDF: one registry client and deserializer cache per executor process.
    decode = F.udf(decode_one, StringType(), useArrow=True)

    out = df.withColumn("raw_value", F.col("value"))
    return out.withColumn("value", decode(F.col("value"), F.col("topic"), F.col("partition"), F.col("offset")))


_DECODERS: dict[tuple[str, tuple[tuple[str, Any], ...]], Any] = {}  # per executor process


def _decoder(value_format: str, conf: Mapping[str, Any]) -> Any:
    key = (value_format, tuple(sorted(conf.items())))
    got = _DECODERS.get(key)
    if got is None:
        got = _DECODERS[key] = _Decoder(value_format, conf)
    return got


class _Decoder:
    def __init__(self, value_format: str, conf: Mapping[str, Any]) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.serialization import MessageField, SerializationContext

        self._client = SchemaRegistryClient(dict(conf))
        self._ctx, self._field = SerializationContext, MessageField.VALUE
        self._format = value_format
        self._by_id: dict[int, Any] = {}

    def _deserializer(self, schema_id: int) -> Any:
        des = self._by_id.get(schema_id)
        if des is None:
            if self._format == "avro":
                from confluent_kafka.schema_registry.avro import AvroDeserializer

                des = AvroDeserializer(self._client)
            elif self._format == "protobuf":
                from harvest_outbox.protobuf_schema import ProtobufDictDecoder

                des = _ignoring_ctx(ProtobufDictDecoder(self._client))
            else:
                from confluent_kafka.schema_registry.json_schema import JSONDeserializer

                des = JSONDeserializer(self._client.get_schema(schema_id), schema_registry_client=self._client)
            self._by_id[schema_id] = des
        return des

    def __call__(self, raw: bytes | None, topic: str, partition: int, offset: int) -> str | None:
        import json

        if raw is None:
            return None
        raw = bytes(raw)
        if len(raw) < 5 or raw[0] != 0:
            raise SparkReaderError(
                f"record {topic}/{partition}@{offset}: value is not in the registry wire format "
                f"(magic byte 0 + schema id); was it published with serialization: for this topic?"
            )
        schema_id = int.from_bytes(raw[1:5], "big")
        try:
            value = self._deserializer(schema_id)(raw, self._ctx(topic, self._field))
        except Exception as exc:
            raise SparkReaderError(
                f"record {topic}/{partition}@{offset} (schema id {schema_id}): {type(exc).__name__}: {exc}"
            ) from exc
        return json.dumps(value, default=_jsonable, separators=(",", ":"))


def _jsonable(value: Any) -> Any:
    """Avro types json does not know (bytes, decimals, dates) as text."""
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def _ignoring_ctx(decode: Any) -> Any:
    return lambda raw, _ctx: decode(raw)
