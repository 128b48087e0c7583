"""PostgresCheckpointStore: reader checkpoints in Postgres, in the caller's transaction.

Exactly-once effects come from saving the checkpoint in the same database
transaction as the effects of the records it covers::

    store = PostgresCheckpointStore("billing")            # consumer name
    with psycopg.connect(dsn) as conn:
        store.create_table(conn)
        it = ReadCommittedIter(cfg, ["orders"], checkpoint=store.load(conn))
    for rec in it:
        with conn.transaction():
            apply(conn, rec)
            store.save(conn, it.checkpoint())

The table holds one row per (consumer name, journal): a checkpoint split by
partition, so members of a consumer group, each saving the partitions it
owns, never overwrite each other. ``load`` merges the rows back into one
checkpoint (optionally only some journals, e.g. from ``on_assign``).

This is the only module of the package that imports psycopg (lazily, when a
store is used). Identifiers are always composed with ``psycopg.sql.Identifier``.

Invariants (backed by ``tests/test_consumer/test_pg_store.py`` and the kill -9 test):

* ``save`` issues statements on the given connection and never commits, rolls
  back or opens its own connection: the caller's transaction decides.
* ``load(save(cp)) == cp`` as decoded checkpoints (offsets and states).
* Saving a checkpoint replaces the rows of the journals it covers and leaves
  other journals' rows alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from harvest_outbox.sequencer import CheckpointError, ProducerState, decode_checkpoint, encode_checkpoint

from .errors import CheckpointStoreError, ConfigError

__all__ = ["DEFAULT_TABLE", "PostgresCheckpointStore"]

DEFAULT_TABLE = "harvest_consumer_checkpoints"


class PostgresCheckpointStore:
    """Checkpoints of the reader named ``name`` in ``schema.table`` (see module doc)."""

    __slots__ = ("_sql", "_table", "name")

    def __init__(self, name: str, table: str = DEFAULT_TABLE, schema: str | None = None) -> None:
        try:
            from psycopg import sql
        except ImportError as exc:  # pragma: no cover - psycopg is a project dependency
            raise CheckpointStoreError(
                "PostgresCheckpointStore needs psycopg 3 (pip install 'psycopg[binary]')"
            ) from exc
        if not isinstance(name, str) or not name:
            raise ConfigError(f"checkpoint store name must be a non-empty str, got {name!r}")
        if not isinstance(table, str) or not table:
            raise ConfigError(f"checkpoint table must be a non-empty str, got {table!r}")
        self.name = name
        self._sql = sql
        self._table = sql.Identifier(schema, table) if schema else sql.Identifier(table)

    def create_table(self, conn: Any) -> None:
        """Create the table if missing (in the caller's transaction)."""
        q = self._sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} ("
            " name text NOT NULL,"
            " journal text NOT NULL,"
            " read_through bigint,"
            " checkpoint bytea NOT NULL,"
            " updated_at timestamptz NOT NULL DEFAULT now(),"
            " PRIMARY KEY (name, journal))"
        ).format(self._table)
        self._run(conn, "create the checkpoint table", lambda cur: cur.execute(q))

    def save(self, conn: Any, checkpoint: bytes) -> None:
        """Upsert ``checkpoint`` (bytes from ``ReadCommittedIter.checkpoint()``) in conn's transaction."""
        try:
            offsets, states = decode_checkpoint(checkpoint)
        except CheckpointError as exc:
            raise CheckpointStoreError(f"refusing to save an invalid checkpoint: {exc}") from exc
        by_journal: dict[str, list[ProducerState]] = {}
        for st in states:
            by_journal.setdefault(st.journal, []).append(st)
        rows = []
        for journal in sorted(set(offsets) | set(by_journal)):
            off = offsets.get(journal)
            part = encode_checkpoint({journal: off} if off is not None else {}, by_journal.get(journal, []))
            rows.append((self.name, journal, off, part))
        if not rows:
            return
        q = self._sql.SQL(
            "INSERT INTO {} (name, journal, read_through, checkpoint) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (name, journal) DO UPDATE SET read_through = EXCLUDED.read_through, "
            "checkpoint = EXCLUDED.checkpoint, updated_at = now()"
        ).format(self._table)
        self._run(conn, "save the checkpoint", lambda cur: cur.executemany(q, rows))

    def load(self, conn: Any, journals: Iterable[str] | None = None) -> bytes | None:
        """The stored checkpoint (all journals, or only ``journals``), or None if there is none."""
        if journals is None:
            q = self._sql.SQL("SELECT journal, checkpoint FROM {} WHERE name = %s ORDER BY journal").format(self._table)
            params: tuple[Any, ...] = (self.name,)
        else:
            q = self._sql.SQL(
                "SELECT journal, checkpoint FROM {} WHERE name = %s AND journal = ANY(%s) ORDER BY journal"
            ).format(self._table)
            params = (self.name, list(journals))
        rows = self._run(conn, "load the checkpoint", lambda cur: cur.execute(q, params).fetchall())
        if not rows:
            return None
        offsets: dict[str, int] = {}
        states: list[ProducerState] = []
        for journal, blob in rows:
            try:
                o, s = decode_checkpoint(bytes(blob))
            except CheckpointError as exc:
                raise CheckpointStoreError(
                    f"stored checkpoint of {self.name!r} journal {journal!r} is corrupt: {exc}"
                ) from exc
            offsets.update(o)
            states.extend(s)
        return encode_checkpoint(offsets, states)

    def delete(self, conn: Any) -> None:
        """Forget every checkpoint row of this reader name (in conn's transaction)."""
        q = self._sql.SQL("DELETE FROM {} WHERE name = %s").format(self._table)
        self._run(conn, "delete the checkpoint", lambda cur: cur.execute(q, (self.name,)))

    def _run(self, conn: Any, what: str, fn: Any) -> Any:
        import psycopg

        try:
            with conn.cursor() as cur:
                return fn(cur)
        except psycopg.Error as exc:
            raise CheckpointStoreError(f"cannot {what} ({self.name!r}): {type(exc).__name__}: {exc}") from exc

    def __repr__(self) -> str:
        return f"PostgresCheckpointStore({self.name!r}, table={self._table.as_string(None) if hasattr(self._table, 'as_string') else self._table!r})"
