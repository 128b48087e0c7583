"""Registry encoding of marked rows, before they are produced (``serialization:``, docs/schemas.md).

The relay hands every mark to :meth:`RowEncoder.after`, which encodes its rows on the encoder's own
thread (while the mark worker runs the next mark), off the relay thread, before the rows reach either
mode's send path; so both modes, every table mapping and every shard layout encode the same way. For
each row whose topic has a serializer (:class:`~producer.config.serialization.SerializationConfig`)
the JSON value is parsed and encoded in the Confluent wire format (magic byte 0, the 4-byte schema
id, the encoded record) as confluent-kafka's serializer of that format encodes it. The writer schema
is resolved once per batch and topic through confluent-kafka's registry client (which caches it for
``latestTtl``); a schema id's first row goes through the serializer, and once its bytes are seen to
be what the direct writer gives (Avro: producer/encode/_avro_batch.py; JSON Schema:
producer/encode/_json_schema_writer.py; Protobuf: the serializer's header and ``SerializeToString``,
producer/encode/_protobuf_encoder.py), the id's later rows skip the serializer's per-call lookups and
are written in one pass after the batch's loop; a value a direct writer does not take goes through the
serializer, which encodes it or refuses it in its own words. With
``encodeWorker`` a batch's Avro values are encoded in a child process (producer/encode/worker.py).

Decide, then return the decision (the rows), never a half-encoded batch:
- a row whose value does not fit its schema (or is not JSON) keeps its stored value and gets the
  validation error as its ``bad`` reason: both modes dead-letter such a row before producing it
  ("bad row: ..."), like the other preflight refusals; the reason names the field and the rule;
- a registry that cannot be reached or answers with an error (no such subject, 5xx), or whose
  Protobuf schema does not compile, is an outage, not a verdict on the row: :class:`RegistryUnavailable` is raised for the whole batch, which the
  relay treats like a database outage (backs off, re-marks): rows wait in the outbox, nothing is
  dead-lettered, and the relay carries on when the registry answers again;
- tombstones (``value`` NULL) stay tombstones; rows of topics without a serializer are untouched.

Protobuf takes a message class, which a JSON row does not name: ProtobufEncoder (producer/encode/_protobuf_encoder.py) builds it
at run time from the registered ``.proto`` (harvest_outbox/protobuf_schema.py) and parses the row into it.

confluent-kafka's registry client and serializers are imported on first use (the ``registry``
extra), so a relay without ``serialization:`` never imports them.
Invariants: tests/test_producer/encode/test_registry_encode.py, test_registry_outage.py, test_registry_protobuf.py,
test_json_schema_writer.py, test_protobuf_fast.py.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from harvest_outbox.producer.config.serialization import SerializationConfig, TopicSerialization
from harvest_outbox.producer.db import MarkedRow
from harvest_outbox.producer.encode._avro_batch import AvroWriter, encode_values, loads
from harvest_outbox.producer.encode._json_schema_writer import JsonSchemaWriter
from harvest_outbox.producer.encode._protobuf_encoder import ProtobufEncoder, ProtobufWriter
from harvest_outbox.producer.encode.worker import EncodeWorker
from harvest_outbox.producer.errors import ConfigError, DatabaseError
from harvest_outbox.producer.relay.marked_row import ROW_BAD, ROW_KEY, ROW_TOPIC, ROW_VALUE, with_bad, with_encoded
from harvest_outbox.producer.schema.reasons import not_json_reason, validation_reason

__all__ = ["RegistryUnavailable", "RowEncoder", "validation_reason"]  # validation_reason: stash_validation's

log = logging.getLogger(__name__)
_yield = time.sleep
#: Rows encoded between two GIL hand-overs to the relay thread (a mask: every 256 rows, ~2.5 ms of
#: encoding, inside the 5 ms switch interval; a sleep(0) costs ~1 ms of wall time on a loaded machine).
YIELD_EVERY = 255

#: confluent-kafka serializer classes by config name (module, class).
_SERIALIZERS = {
    "avro": ("confluent_kafka.schema_registry.avro", "AvroSerializer"),
    "jsonSchema": ("confluent_kafka.schema_registry.json_schema", "JSONSerializer"),
}


#: writers whose checked rows are written in one pass after a batch's loop; refusals go the serializer's way
_Lane = JsonSchemaWriter | ProtobufWriter
_Writer = AvroWriter | JsonSchemaWriter | ProtobufWriter


def _chunks(values: list[bytes]) -> Iterator[tuple[int, list[bytes]]]:
    """``values`` in slices of ``YIELD_EVERY + 1`` with their start, handing the relay thread the GIL between two
    (as encode's loop does every 256 rows)."""
    step = YIELD_EVERY + 1
    for start in range(0, len(values), step):
        if start:
            _yield(0)
        yield start, values[start : start + step]


class RegistryUnavailable(DatabaseError):
    """The schema registry did not answer (or answered with an error) while rows were encoded: an
    outage of a dependency the relay needs before it produces. A :class:`DatabaseError` so the relay
    handles it as it handles the database's: back off, re-mark, rows wait; nothing is dead-lettered."""


def _is_outage(exc: BaseException) -> bool:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    from harvest_outbox.protobuf_schema import ProtoSchemaError

    # a registered .proto that does not compile (or lacks recordName) is the registry's to fix, not the
    # row's: rows wait until a usable version is registered, like an outage
    if isinstance(exc, (SchemaRegistryError, ProtoSchemaError, OSError, ConnectionError, TimeoutError)):
        return True
    # the client's HTTP library (httpx, or its vendored copy) raises its own transport errors
    return any(cls.__name__ in ("TransportError", "HTTPError") for cls in type(exc).__mro__)


class _TopicEncoder:
    """The value (and key) serializers of one topic; built on the topic's first row."""

    def __init__(self, entry: TopicSerialization, topic: str, client: Any) -> None:
        from confluent_kafka.serialization import MessageField, SerializationContext

        self.entry = entry
        self.client = client
        self.subject = entry.subject(topic)
        self.avro = entry.serializer == "avro"
        self.json = entry.serializer == "jsonSchema"
        # schema id -> its direct writer (producer/encode/_avro_batch.py, _json_schema_writer.py), or None:
        # a JSON Schema jsonschema refuses to build a validator for (the serializer refuses every row)
        self._writers: dict[int, AvroWriter | JsonSchemaWriter | None] = {}
        self.value = self._serializer(entry.serializer, entry, topic, client, False)
        self.key = self._serializer(entry.key_serializer, entry, topic, client, True)
        self.value_ctx = SerializationContext(topic, MessageField.VALUE)
        self.key_ctx = SerializationContext(topic, MessageField.KEY)

    def resolve(self) -> AvroWriter | JsonSchemaWriter | None:
        """The writer schema of this batch's rows, looked up once per batch (the client caches the
        subject's latest for registry.latestTtl, a pinned version or id for good), so one batch is
        written with one schema version. None: every row goes through the serializer (a schema with
        references, which the serializer resolves)."""
        entry = self.entry
        if entry.schema_id is not None:
            schema_id, schema = entry.schema_id, self.client.get_schema(entry.schema_id)
        else:
            registered = (
                self.client.get_version(self.subject, entry.schema_version)
                if entry.schema_version != "latest"
                else self.client.get_latest_version(self.subject)
            )
            schema_id, schema = registered.schema_id, registered.schema
        if schema.references:
            return None
        if schema_id in self._writers:
            return self._writers[schema_id]
        writer: AvroWriter | JsonSchemaWriter | None
        if self.avro:
            writer = AvroWriter(schema_id, schema.schema_str)
        else:
            from confluent_kafka.schema_registry.json_schema import _resolve_named_schema

            try:  # the validator the serializer builds: the same class, the same reference registry
                writer = JsonSchemaWriter(schema_id, schema.schema_str, _resolve_named_schema(schema, self.client))
            except Exception as exc:
                if _is_outage(exc):
                    raise
                log.warning("schema id %d: no direct JSON Schema writer (%s); using the serializer", schema_id, exc)
                writer = None
        if writer is not None and schema.rule_set:  # data-contract rules run in the serializer only
            writer.checked = False
        self._writers[schema_id] = writer
        return writer

    def encode_json(self, writer: JsonSchemaWriter | None, value: Any) -> bytes:
        """``value`` in the wire format as confluent-kafka's JSONSerializer writes it: by ``writer``
        (producer/encode/_json_schema_writer.py) once the serializer's bytes for that schema id have been
        seen to equal its own; by the serializer until then, for good if they differed, and for every
        value the writer does not accept (the serializer refuses it with jsonschema's words)."""
        if writer is not None and writer.checked:
            got = writer.encode(value)
            if got is not None:
                return got
        encoded: bytes = self.value(value, self.value_ctx)
        if writer is not None and writer.checked is None and encoded[:5] == writer.prefix:
            try:
                writer.checked = writer.write(value) == encoded
            except Exception:
                writer.checked = False
            if not writer.checked:
                log.warning(
                    "schema id %d: direct JSON Schema bytes differ from the serializer's; using the serializer",
                    writer.schema_id,
                )
        return encoded

    def encode_avro(self, writer: AvroWriter | None, value: Any) -> bytes:
        """``value`` validated strictly against the writer's schema (fastavro's writer alone coerces
        some mismatches: 1.5 written to a long field as 1, a changed value published), then encoded.

        The bytes are confluent-kafka's AvroSerializer's: written directly by ``writer``
        (producer/encode/_avro_batch.py) once the serializer's bytes for that schema id have been seen to equal
        them on a real row (:attr:`AvroWriter.checked`); through the serializer until then, or for good
        if they differed."""
        if writer is None:  # references: the serializer resolves them; its own checks apply
            serialized: bytes = self.value(value, self.value_ctx)
            return serialized
        if writer.checked:
            return writer.encode(value)
        writer.validate(value)
        encoded: bytes = self.value(value, self.value_ctx)
        # compared only when the serializer wrote the same schema id (its latest may have moved on)
        if writer.checked is None and encoded[:5] == writer.prefix:
            writer.checked = writer.write(value) == encoded
            if not writer.checked:
                log.warning(
                    "schema id %d: direct Avro bytes differ from the serializer's; using the serializer",
                    writer.schema_id,
                )
        return encoded

    @staticmethod
    def _serializer(kind: str, entry: TopicSerialization, topic: str, client: Any, is_key: bool) -> Any:
        if kind == "none":
            return None
        subject = entry.subject(topic, is_key)
        conf: dict[str, Any] = {
            "auto.register.schemas": False,  # the writer's schema is the registry's, never the row's
            "subject.name.strategy": lambda _ctx, _record_name: subject,
        }
        if entry.schema_id is not None and not is_key:
            conf["use.schema.id"] = entry.schema_id
        elif entry.schema_version != "latest" and not is_key:
            conf["use.schema.id"] = client.get_version(subject, entry.schema_version).schema_id
        else:
            conf["use.latest.version"] = True
        if kind == "protobuf":
            # recordName names the value's message; a key is its subject's first message
            return ProtobufEncoder(client, subject, "" if is_key else entry.record_name, conf)
        module, name = _SERIALIZERS[kind]
        cls = getattr(importlib.import_module(module), name)
        if kind == "avro":
            return cls(client, None, None, conf)
        # jsonSchema: confluent-kafka's JSONSerializer takes the schema up front
        schema = client.get_schema(conf["use.schema.id"]) if "use.schema.id" in conf else None
        if schema is None:
            schema = client.get_latest_version(subject).schema
        return cls(schema, client, None, conf)


class RowEncoder:
    """Encodes marked rows per :class:`SerializationConfig`; see the module docstring."""

    def __init__(
        self, config: SerializationConfig, client_factory: Callable[[dict[str, Any]], Any] | None = None
    ) -> None:
        if config.registry is None:
            raise ConfigError("serialization.registry: required when a topic has a serializer (give its url)")
        try:  # fail at start-up, not on the first row of an encoded topic
            importlib.import_module("confluent_kafka.schema_registry.avro")
            importlib.import_module("confluent_kafka.schema_registry.json_schema")
            if any("protobuf" in (t.serializer, t.key_serializer) for t in config.topics):
                importlib.import_module("confluent_kafka.schema_registry.protobuf")
                importlib.import_module("grpc_tools.protoc")  # reads the registry's .proto text
        except ImportError as exc:
            raise ConfigError(
                f"serialization: the registry serializers are not installed ({exc}); install the extra: "
                f"pip install 'harvest-outbox[registry]'"
            ) from exc
        self.config = config
        self._client_conf = config.registry.client_conf()
        self._client_factory = client_factory
        self._client: Any = None
        self._topics: dict[str, _TopicEncoder | None] = {}
        self._worker = EncodeWorker() if config.encode_worker else None
        self._encode_exec: ThreadPoolExecutor | None = None  # after(): encodes while the next mark runs
        if self._worker is not None:
            self._worker.start()  # while the relay starts up, not in its first batch
        self.encoded = 0  # values encoded (the bench's cache figures)
        self.refused = 0  # rows given a validation reason

    def __repr__(self) -> str:
        return f"RowEncoder(registry={self.config.registry!r}, topics={len(self.config.topics)})"

    def close(self) -> None:
        """Stop the encode thread and the encode worker process, if any (both start again on the next
        batch; the process also stops when this encoder is garbage-collected)."""
        executor, self._encode_exec = self._encode_exec, None
        if executor is not None:
            executor.shutdown(wait=True)
        if self._worker is not None:
            self._worker.close()

    def after(self, marked: Future[tuple[list[MarkedRow], Any]]) -> Future[tuple[list[MarkedRow], Any]]:
        """A future of the mark ``marked``'s rows, encoded on this encoder's own thread: the mark worker
        goes on to the next mark (a database round trip, the lock released) while this one's rows are
        encoded, instead of marking and encoding in turn. One thread, fed in mark order, so marks come
        out encoded in the order they were marked; a mark's error (a DatabaseError) passes through."""
        if self._encode_exec is None:
            self._encode_exec = ThreadPoolExecutor(1, thread_name_prefix="harvest-encode")
        return self._encode_exec.submit(self._encode_marked, marked)

    def _encode_marked(self, marked: Future[tuple[list[MarkedRow], Any]]) -> tuple[list[MarkedRow], Any]:
        rows, attempts = marked.result()
        return self.encode(rows), attempts

    @property
    def client(self) -> Any:
        if self._client is None:
            if self._client_factory is not None:
                self._client = self._client_factory(self._client_conf)
            else:
                from confluent_kafka.schema_registry import SchemaRegistryClient

                self._client = SchemaRegistryClient(self._client_conf)
        return self._client

    def _encoder(self, topic: str) -> _TopicEncoder | None:
        if topic in self._topics:
            return self._topics[topic]
        entry = self.config.for_topic(topic)
        encoder = None if entry is None else _TopicEncoder(entry, topic, self.client)
        self._topics[topic] = encoder
        return encoder

    def encode(self, rows: list[MarkedRow]) -> list[MarkedRow]:
        """``rows`` with their values (and keys) encoded or their validation error as ``bad``;
        raises :class:`RegistryUnavailable` (for the whole batch) when the registry does not answer."""
        out: list[MarkedRow] = []
        # topic -> (its encoder, this batch's direct writer), or None (published as stored): the writer
        # schema is resolved once per batch and topic, not once per row
        batch: dict[str, tuple[_TopicEncoder, _Writer | None] | None] = {}
        # the rows a checked writer encodes directly, in one pass after this loop:
        # writer -> (their topic's encoder, their places in ``out``, their stored values)
        direct: dict[_Writer, tuple[_TopicEncoder, list[int], list[bytes]]] = {}
        for row in rows:
            if not len(out) & YIELD_EVERY:
                # This runs in the mark worker while the relay thread produces: hand it the GIL now and
                # then, or it waits a whole switch interval (5 ms) for every turn it gets.
                _yield(0)
            topic = row[ROW_TOPIC]
            if row[ROW_BAD] is not None or topic is None:
                out.append(row)
                continue
            try:
                if topic in batch:
                    got = batch[topic]
                else:
                    got = batch[topic] = self._for_batch(topic)
                if got is None:
                    out.append(row)
                    continue
                encoder, writer = got
                value = row[ROW_VALUE]
                if writer is not None and writer.checked and encoder.key is None and value is not None:
                    lane = direct.get(writer)
                    if lane is None:
                        lane = direct[writer] = (encoder, [], [])
                    lane[1].append(len(out))
                    lane[2].append(value)
                    out.append(row)  # replaced by _write_direct or _write_lane
                    continue
                out.append(self._encode_row(row, encoder, writer))
            except RegistryUnavailable:
                raise
            except Exception as exc:
                outage = self._outage(exc, topic)
                if outage is not None:
                    raise outage from exc
                raise
        for writer, (encoder, places, values) in direct.items():
            if isinstance(writer, AvroWriter):
                self._write_direct(writer, places, values, out)
            else:
                self._write_lane(writer, encoder, places, values, out)
        return out

    def _write_lane(
        self,
        writer: _Lane,
        encoder: _TopicEncoder,
        places: list[int],
        values: list[bytes],
        out: list[MarkedRow],
    ) -> None:
        """The values of ``places`` in ``out`` encoded by ``writer`` (producer/encode/_json_schema_writer.py,
        _protobuf_encoder.py); a value it does not take goes the serializer's way (:meth:`_encode_row`),
        which encodes or refuses it."""
        for start, chunk in _chunks(values):
            results = writer.encode_values(chunk)
            for i, result in zip(places[start : start + len(chunk)], results, strict=True):
                row = out[i]
                if result is not None:
                    out[i] = with_encoded(row, row[ROW_KEY], result)
                    self.encoded += 1
                else:
                    out[i] = self._encode_guarded(row, encoder, writer)

    def _encode_guarded(self, row: MarkedRow, encoder: _TopicEncoder, writer: _Lane) -> MarkedRow:
        """:meth:`_encode_row` for a row of the direct pass: a registry outage fails the batch."""
        try:
            return self._encode_row(row, encoder, writer)
        except Exception as exc:
            outage = self._outage(exc, row[ROW_TOPIC])
            if outage is not None:
                raise outage from exc
            raise

    def _outage(self, exc: Exception, topic: Any) -> RegistryUnavailable | None:
        """The batch's error when ``exc`` says the registry is out (not a verdict on the row), else None."""
        if not _is_outage(exc):
            return None
        url = self.config.registry.url if self.config.registry else "?"
        return RegistryUnavailable(
            f"schema registry {url} unavailable while encoding topic {topic!r}: "
            f"{type(exc).__name__}: {exc}; rows wait in the outbox"
        )

    def _write_direct(self, writer: AvroWriter, places: list[int], values: list[bytes], out: list[MarkedRow]) -> None:
        """The values of ``places`` in ``out`` encoded by ``writer`` (producer/encode/_avro_batch.py), or refused."""
        results: list[bytes | str] = []
        if self._worker is not None:  # serialization.encodeWorker: in a child process, off this interpreter
            results = self._worker.encode(writer, values)
        else:
            for _start, chunk in _chunks(values):
                results += encode_values(writer, chunk)
        refused = 0
        for i, result in zip(places, results, strict=True):
            row = out[i]
            if isinstance(result, bytes):
                out[i] = with_encoded(row, row[ROW_KEY], result)
            else:
                out[i] = with_bad(row, result)
                refused += 1
        self.encoded += len(values) - refused
        self.refused += refused

    def _for_batch(self, topic: str) -> tuple[_TopicEncoder, _Writer | None] | None:
        encoder = self._encoder(topic)
        if encoder is None:
            return None
        if isinstance(encoder.key, ProtobufEncoder):
            encoder.key.start_batch()
        if isinstance(encoder.value, ProtobufEncoder):
            return encoder, encoder.value.start_batch()
        direct = (encoder.avro or encoder.json) and encoder.value is not None
        return encoder, encoder.resolve() if direct else None

    def _encode_row(self, row: MarkedRow, encoder: _TopicEncoder, writer: _Writer | None) -> MarkedRow:
        key, value = row[ROW_KEY], row[ROW_VALUE]
        bad: str | None = None
        if encoder.key is not None and key is not None:
            try:
                parsed_key = loads(key)
            except ValueError as exc:
                bad = f'key is not JSON ({exc}); the key serializer takes a JSON row key, e.g. "k1" for a string'
            else:
                try:
                    key = encoder.key(parsed_key, encoder.key_ctx)
                except Exception as exc:
                    if _is_outage(exc):
                        raise
                    bad = validation_reason(exc, "key")
        if bad is None and encoder.value is not None and value is not None:
            try:
                parsed = loads(value)
            except ValueError as exc:
                bad = not_json_reason(exc, value)
            else:
                try:
                    if encoder.json:
                        value = encoder.encode_json(writer if isinstance(writer, JsonSchemaWriter) else None, parsed)
                    elif encoder.avro:
                        value = encoder.encode_avro(writer if isinstance(writer, AvroWriter) else None, parsed)
                    else:
                        value = encoder.value(parsed, encoder.value_ctx)
                    self.encoded += 1
                except Exception as exc:
                    if _is_outage(exc):
                        raise
                    bad = validation_reason(exc, "value")
        if bad is not None:
            self.refused += 1
            return with_bad(row, bad)
        return with_encoded(row, key, value)
