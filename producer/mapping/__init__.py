"""The outbox table's shape: the names of its objects and which of its columns make a record (goharvest's, Debezium's event router)."""
