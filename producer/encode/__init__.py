"""Registry encodings of outbox rows (Avro, Protobuf, JSON Schema) at the relay."""
