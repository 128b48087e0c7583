"""The words of a refusal: why a row's key or value cannot be encoded with its schema.

A row refused by the relay's encoder (producer/encode/serialization.py, producer/encode/_avro_batch.py, the encode
worker) is dead-lettered with one of these as its reason, and the stash-time check
(producer/stash/validation.py) raises with them: the same row gets the same words wherever it is
checked. Kept apart from the encoders so the encode worker process imports no more than it needs.

Invariant (tests/test_producer/encode/test_registry_encode.py, test_avro_batch.py): a reason names the field
and the rule when the validator reports them (jsonschema's path and keyword, fastavro's field lines).
"""

from __future__ import annotations

from harvest_outbox.producer.errors import shown

__all__ = ["not_json_reason", "validation_reason"]


def validation_reason(exc: BaseException, what: str) -> str:
    """Which field, which rule: jsonschema's error carries both; Avro's message names the field."""
    for cause in (exc, exc.__cause__, exc.__context__):
        path = getattr(cause, "json_path", None)
        if path is not None:
            rule = getattr(cause, "validator", "?")
            message = getattr(cause, "message", str(cause))
            return f"{what} does not match its schema: field {path}: {message} (rule: {rule})"
    errors = getattr(exc, "errors", None)  # fastavro's ValidationError: one line per failed field
    if errors:
        return f"{what} does not match its schema: {'; '.join(str(e) for e in errors)}"
    return f"{what} does not match its schema: {exc}"


def not_json_reason(exc: BaseException, raw: bytes | str) -> str:
    """A value the serializer cannot take because it is not JSON."""
    return f"value is not JSON ({exc}; starts {shown(raw[:40])}); the serializer takes a JSON row value"
