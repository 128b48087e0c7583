"""Protobuf schemas from the registry as runtime message classes, for JSON rows (no generated code).

confluent-kafka's ``ProtobufSerializer`` takes a generated message class and its
``ProtobufDeserializer`` a registry schema in Confluent's ``format=serialized`` form (a base64
``FileDescriptorProto``). A JSON row names no class, and Apicurio Registry's Confluent-compatible
API (2.0.2, the one the tests run) ignores ``format=serialized`` and answers with the ``.proto`` text
it stored (tried: ``/schemas/ids/N?format=serialized`` and ``/subjects/S/versions/latest?format=serialized``).
So this module:

- compiles ``.proto`` text to a ``FileDescriptorProto`` with ``grpc_tools.protoc`` (the registry
  extra's ``grpcio-tools``; in process, no protoc binary), cached by text;
- builds the message class at run time (``DescriptorPool`` + ``message_factory.GetMessageClass``);
- wraps the registry client (:class:`SerializedProtobufClient`) so that every schema confluent-kafka
  asks for comes back in the serialized form its Protobuf serializer and deserializer parse, whatever
  the registry returns: so the wire format (magic byte, schema id, message indexes) stays
  confluent-kafka's own, and its ``ProtobufDeserializer`` reads the result.

Invariants (tests/test_producer/encode/test_registry_protobuf.py): a schema already in serialized form is
passed through unchanged; ``.proto`` text that does not compile raises :class:`ProtoSchemaError`
with protoc's message; the message is ``record_name`` (full or simple name) or the file's first.
"""

from __future__ import annotations

import base64
import binascii
import os
import tempfile
import threading
from typing import Any

from harvest_outbox.errors import HarvestOutboxError

_FILE_NAME = "registry_schema.proto"


# Rooted here, not in a subpackage: the relay's encoder and both readers' decoders use this module, and a
# reader must not import the relay's package for an error class.
class ProtoSchemaError(HarvestOutboxError, ValueError):
    """A registered Protobuf schema that does not compile, or has no message of the configured name."""


class ProtobufToolsMissing(HarvestOutboxError, ValueError):
    """grpcio-tools, which compiles a registered ``.proto``, is not installed (the ``registry`` extra)."""


_compiled: dict[str, bytes] = {}  # .proto text -> serialized FileDescriptorProto
_lock = threading.Lock()


def _include_dir() -> str:
    import grpc_tools  # type: ignore[import-untyped,unused-ignore]

    return os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")  # google/protobuf/*.proto


def _is_serialized(schema_str: str) -> bool:
    try:
        raw = base64.b64decode(schema_str.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return False
    from google.protobuf import descriptor_pb2  # type: ignore[import-untyped,unused-ignore]
    from google.protobuf.message import DecodeError  # type: ignore[import-untyped,unused-ignore]

    try:
        descriptor_pb2.FileDescriptorProto().ParseFromString(raw)
    except DecodeError:
        return False
    return True


def compile_proto(text: str) -> bytes:
    """``text`` (a ``.proto`` file) as a serialized ``FileDescriptorProto``; imports of Google's
    well-known types resolve, other imports (registry references) are not supported."""
    with _lock:
        got = _compiled.get(text)
        if got is not None:
            return got
        try:
            from grpc_tools import protoc  # type: ignore[import-untyped,unused-ignore]
        except ImportError as exc:
            raise ProtobufToolsMissing(
                f"serialization: protobuf needs grpcio-tools to read .proto schemas ({exc}); install the extra: "
                f"pip install 'harvest-outbox[registry]'"
            ) from exc
        from google.protobuf import descriptor_pb2  # type: ignore[import-untyped,unused-ignore]

        with tempfile.TemporaryDirectory(prefix="harvest-proto-") as tmp:
            with open(os.path.join(tmp, _FILE_NAME), "w", encoding="utf-8") as f:
                f.write(text)
            out = os.path.join(tmp, "set.pb")
            err = os.path.join(tmp, "err.txt")
            # protoc writes its diagnostics to fd 2: route them to a file to quote them
            saved = os.dup(2)
            fd = os.open(err, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.dup2(fd, 2)
                code = protoc.main(
                    ["protoc", f"-I{tmp}", f"-I{_include_dir()}", f"--descriptor_set_out={out}", _FILE_NAME]
                )
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                os.close(fd)
            if code != 0:
                with open(err, encoding="utf-8", errors="replace") as f:
                    message = f.read().replace(tmp + os.sep, "").strip()[:500]
                raise ProtoSchemaError(
                    f"registered Protobuf schema does not compile: {message or f'protoc exit {code}'}"
                )
            files = descriptor_pb2.FileDescriptorSet()
            with open(out, "rb") as f:
                files.ParseFromString(f.read())
        compiled: bytes = files.file[-1].SerializeToString()
        _compiled[text] = compiled
        return compiled


def to_serialized(schema_str: str) -> str:
    """The registry's schema string in confluent-kafka's ``format=serialized`` form (base64)."""
    if _is_serialized(schema_str):
        return schema_str
    return base64.standard_b64encode(compile_proto(schema_str)).decode("ascii")


def _top_messages(schema_str: str) -> list[Any]:
    """The schema's top-level message descriptors in declaration order (the order message indexes
    count in), from a pool of its own (with the well-known types)."""
    from confluent_kafka.schema_registry.common.protobuf import _init_pool, _str_to_proto
    from google.protobuf import descriptor_pool  # type: ignore[import-untyped,unused-ignore]

    fd_proto = _str_to_proto(_FILE_NAME, to_serialized(schema_str))
    pool = descriptor_pool.DescriptorPool()
    _init_pool(pool)
    pool.Add(fd_proto)
    file = pool.FindFileByName(_FILE_NAME)
    return [file.message_types_by_name[m.name] for m in fd_proto.message_type]


def message_class(schema_str: str, record_name: str = "") -> Any:
    """The message class of ``record_name`` (full name, or simple name) in the schema, else of its
    first message, built at run time."""
    from google.protobuf import message_factory  # type: ignore[import-untyped,unused-ignore]

    messages = _top_messages(schema_str)
    if not messages:
        raise ProtoSchemaError("registered Protobuf schema has no message")
    if record_name:
        found = [m for m in messages if record_name in (m.full_name, m.name)]
        if not found:
            names = ", ".join(m.full_name for m in messages)
            raise ProtoSchemaError(f"recordName {record_name!r} is not a top-level message of the schema ({names})")
        return message_factory.GetMessageClass(found[0])
    return message_factory.GetMessageClass(messages[0])


def parse_json(cls: Any, value: Any) -> Any:
    """``value`` (parsed JSON) as a ``cls`` message by proto3's JSON mapping; a ValueError naming the
    field (one line) when it does not fit: unknown fields are refused, not dropped."""
    from google.protobuf import json_format  # type: ignore[import-untyped,unused-ignore]

    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object for message {cls.DESCRIPTOR.full_name}, got {type(value).__name__}")
    try:
        return json_format.ParseDict(value, cls())
    except json_format.ParseError as exc:
        raise ValueError(" ".join(str(exc).split())) from exc


class ProtobufDictDecoder:
    """Wire-format Protobuf values (magic byte, schema id, message indexes, message) as dicts (field
    names as in the .proto, scalar fields present even when unset, unset message fields left out,
    int64 as a string: proto3's JSON mapping), whatever message of whichever writer schema encoded
    them: the class is built from the registry's schema of the value's id, found by its indexes."""

    def __init__(self, client: Any) -> None:
        self._client = SerializedProtobufClient(client)
        self._classes: dict[tuple[int | None, tuple[int, ...]], Any] = {}

    def __call__(self, raw: bytes) -> dict[str, Any]:
        import io

        from confluent_kafka.schema_registry.common.serde import SchemaId
        from google.protobuf import json_format, message_factory  # type: ignore[import-untyped,unused-ignore]

        header = SchemaId("PROTOBUF")
        payload = header.from_bytes(io.BytesIO(raw))
        key = (header.id, tuple(header.message_indexes or [0]))
        cls = self._classes.get(key)
        if cls is None:
            desc = _top_messages(self._client.get_schema(header.id).schema_str)[key[1][0]]
            for i in key[1][1:]:
                desc = desc.nested_types[i]
            cls = self._classes[key] = message_factory.GetMessageClass(desc)
        message = cls.FromString(payload.read())
        out: dict[str, Any] = json_format.MessageToDict(
            message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
        return out


class SerializedProtobufClient:
    """A registry client whose Protobuf schemas come back in ``format=serialized`` form (see the
    module docstring); every other call goes to the wrapped client."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._originals: dict[str, Any] = {}  # serialized form -> the registry's Schema (for lookups)
        # the wrapped client hands out its cached objects: convert each once (a serializer asks per row)
        self._converted: dict[int, tuple[Any, Any]] = {}  # id(original) -> (original, converted)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def __repr__(self) -> str:  # the wrapped client's settings may hold credentials
        return "SerializedProtobufClient()"

    def _memo(self, original: Any, convert: Any) -> Any:
        got = self._converted.get(id(original))
        if got is not None and got[0] is original:
            return got[1]
        if len(self._converted) > 1000:  # the client's caches hand out new objects after latestTtl
            self._converted.clear()
        converted = convert(original)
        self._converted[id(original)] = (original, converted)  # holds original: its id stays unique
        return converted

    def _schema(self, schema: Any) -> Any:
        def convert(schema: Any) -> Any:
            import attrs

            serialized = to_serialized(schema.schema_str)
            if serialized == schema.schema_str:
                return schema
            self._originals[serialized] = schema
            return attrs.evolve(schema, schema_str=serialized, schema_type="PROTOBUF")

        return self._memo(schema, convert)

    def _registered(self, registered: Any) -> Any:
        import attrs

        if registered is None:
            return None
        return self._memo(registered, lambda r: attrs.evolve(r, schema=self._schema(r.schema)))

    @property
    def _cache(self) -> Any:
        # confluent-kafka's serde reads a pinned id's registered schema from the client's cache
        return _ConvertingCache(self._client._cache, self)

    def lookup_schema(self, subject_name: str, schema: Any, *args: Any, **kwargs: Any) -> Any:
        """Looks up the registry's own text for a schema this client handed out serialized."""
        original = self._originals.get(schema.schema_str, schema)
        return self._registered(self._client.lookup_schema(subject_name, original, *args, **kwargs))

    def get_schema(self, *args: Any, **kwargs: Any) -> Any:
        return self._schema(self._client.get_schema(*args, **kwargs))

    def get_latest_version(self, *args: Any, **kwargs: Any) -> Any:
        return self._registered(self._client.get_latest_version(*args, **kwargs))

    def get_version(self, *args: Any, **kwargs: Any) -> Any:
        return self._registered(self._client.get_version(*args, **kwargs))

    def get_latest_with_metadata(self, *args: Any, **kwargs: Any) -> Any:
        return self._registered(self._client.get_latest_with_metadata(*args, **kwargs))


class _ConvertingCache:
    def __init__(self, cache: Any, client: SerializedProtobufClient) -> None:
        self._cache, self._client = cache, client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cache, name)

    def get_registered_by_subject_id(self, *args: Any, **kwargs: Any) -> Any:
        return self._client._registered(self._cache.get_registered_by_subject_id(*args, **kwargs))
