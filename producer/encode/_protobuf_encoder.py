"""JSON rows as the registered Protobuf message, in the Confluent wire format (``serializer: protobuf``).

Used by producer/encode/serialization.py's RowEncoder for a topic (or key) whose serializer is ``protobuf``.
The message class is built at run time from the registered ``.proto`` (harvest_outbox/protobuf_schema.py),
since a JSON row names no generated class.

Invariants (tests/test_producer/encode/test_registry_protobuf.py): a value's bytes are confluent-kafka's
``ProtobufSerializer``'s for the same message, byte for byte (the direct path starts only after a schema
id's first row was written by the serializer and is never used for a schema with data-contract rules);
a value that does not fit the message raises ValueError naming the field.
"""

from __future__ import annotations

from typing import Any

from harvest_outbox.producer.encode._avro_batch import wire_prefix

__all__ = ["ProtobufEncoder"]


class ProtobufEncoder:
    """A JSON value as the registered Protobuf message: the message class is built from the schema the
    serializer encodes with (the subject's latest, or the pinned id), so a new latest version brings its
    own class; ``json_format.ParseDict`` refuses a value that does not fit (naming the field), and
    confluent-kafka's ProtobufSerializer writes the wire format (magic byte, schema id, message indexes).

    The schema is resolved once per batch (:meth:`start_batch`). The serializer's header (magic byte,
    id, the message's indexes) depends on the schema id and message class only, so once the serializer
    has written a schema id's first row, later rows are that header plus ``SerializeToString()``, what
    the serializer writes, without its per-call lookups (not for a schema with data-contract rules)."""

    def __init__(self, client: Any, subject: str, record_name: str, conf: dict[str, Any]) -> None:
        from harvest_outbox.protobuf_schema import SerializedProtobufClient

        self.client = SerializedProtobufClient(client)
        self.subject, self.record_name, self.conf = subject, record_name, conf
        # schema id -> [message class, serializer, header: None until seen, b"" when never direct]
        self._by_id: dict[int, list[Any]] = {}
        self._batch: int | None = None  # this batch's schema id

    def start_batch(self) -> None:
        """Resolve the schema of the rows of the batch about to be encoded, once."""
        self._batch = None
        self._batch = self._resolve()

    def _resolve(self) -> int:
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

        from harvest_outbox.protobuf_schema import message_class

        schema_id, schema = self.conf.get("use.schema.id"), None
        if schema_id is None:  # the subject's latest, cached by the client for registry.latestTtl
            registered = self.client.get_latest_version(self.subject)
            schema_id, schema = registered.schema_id, registered.schema
        if schema_id not in self._by_id:
            if schema is None:
                schema = self.client.get_schema(schema_id)
            cls = message_class(schema.schema_str, self.record_name)
            conf = {**self.conf, "use.schema.id": schema_id}
            conf.pop("use.latest.version", None)
            header = b"" if schema.rule_set else None
            self._by_id[schema_id] = [cls, ProtobufSerializer(cls, self.client, conf), header]
        return int(schema_id)  # (the registry client's answers are untyped: its ids are ints)

    def __call__(self, value: Any, ctx: Any) -> bytes:
        from harvest_outbox.protobuf_schema import parse_json

        schema_id = self._batch if self._batch is not None else self._resolve()
        got = self._by_id[schema_id]
        cls, serializer, header = got
        message = parse_json(cls, value)
        if header:
            framed: bytes = header + message.SerializeToString()  # (a class built at run time: untyped)
            return framed
        encoded: bytes = serializer(message, ctx)
        if header is None:
            body = message.SerializeToString()
            direct = encoded.endswith(body) and encoded[:5] == wire_prefix(schema_id)
            got[2] = encoded[: len(encoded) - len(body)] if direct else b""
        return encoded
