"""An exactly-once consumer: ReadCommittedIter -> a Postgres table, checkpoint in the same transaction.

This is the pattern the docs recommend (docs/reading-python.md), run as its own process so that fault tests can kill it:
each batch of committed records is inserted into ``<schema>.applied`` and the reader's checkpoint
is saved with :class:`consumer.PostgresCheckpointStore` in the same transaction; on start the
checkpoint is loaded, so a restart (after kill -9 or anything else) applies every committed record
exactly once.

    HARVEST_DATA_SOURCE=<dsn> python -m harvest_outbox.harvest_local.applier --bootstrap HOST:PORT --topic T --schema S

The DSN comes from the environment, not the command line (``ps`` shows command lines).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import psycopg
from psycopg import sql

from harvest_outbox.consumer import CheckpointStoreError, PostgresCheckpointStore, ReadCommittedIter

log = logging.getLogger("harvest.applier")

BATCH = 500
BATCH_SECONDS = 0.2


def create_tables(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (seq bigserial PRIMARY KEY, key text NOT NULL, version bigint NOT NULL, "
                "partition int NOT NULL, kafka_offset bigint NOT NULL, written_at double precision, "
                "applied_at double precision NOT NULL)"
            ).format(sql.Identifier(schema, "applied"))
        )
        with conn.transaction():
            PostgresCheckpointStore("applier", schema=schema).create_table(conn)


def applied_rows(dsn: str, schema: str) -> list[tuple[str, int, float | None, float]]:
    """(key, version, written_at, applied_at) in the order they were applied."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            sql.SQL("SELECT key, version, written_at, applied_at FROM {} ORDER BY seq").format(
                sql.Identifier(schema, "applied")
            )
        ).fetchall()


def run(dsn: str, bootstrap: str, topic: str, schema: str, idle_exit: float | None = None) -> int:
    """Apply until idle for ``idle_exit`` seconds (forever when None). Survives database restarts:
    on a lost connection it reconnects and resumes from the checkpoint stored with the effects, which
    is exactly the crash-recovery path, so nothing is applied twice."""
    applied = 0
    while True:
        try:
            return applied + _session(dsn, bootstrap, topic, schema, idle_exit)
        except (psycopg.OperationalError, CheckpointStoreError) as exc:
            lost = exc if isinstance(exc, psycopg.OperationalError) else exc.__cause__
            if not isinstance(lost, psycopg.OperationalError):
                raise
            log.warning("database connection lost (%s); resuming from the stored checkpoint", lost)
            time.sleep(1.0)


def _session(dsn: str, bootstrap: str, topic: str, schema: str, idle_exit: float | None) -> int:
    store = PostgresCheckpointStore("applier", schema=schema)
    insert = sql.SQL(
        "INSERT INTO {} (key, version, partition, kafka_offset, written_at, applied_at) VALUES (%s, %s, %s, %s, %s, %s)"
    ).format(sql.Identifier(schema, "applied"))
    applied = 0
    with psycopg.connect(dsn, connect_timeout=5) as conn:
        checkpoint = store.load(conn)
        conn.commit()
        with ReadCommittedIter({"bootstrap.servers": bootstrap}, topics=[topic], checkpoint=checkpoint) as it:
            batch: list[tuple[object, ...]] = []
            deadline = time.monotonic() + BATCH_SECONDS
            idle_since = time.monotonic()
            while True:
                rec = it.poll(0.1)
                if rec is not None:
                    body = json.loads(rec.value) if rec.value else {}
                    batch.append(
                        (
                            rec.key.decode() if rec.key else "",
                            int(body.get("version", -1)),
                            rec.partition,
                            rec.offset,
                            body.get("ts"),
                            time.time(),
                        )
                    )
                    idle_since = time.monotonic()
                if batch and (len(batch) >= BATCH or time.monotonic() >= deadline):
                    with conn.cursor() as cur:
                        cur.executemany(insert, batch)
                    store.save(conn, it.checkpoint())
                    conn.commit()
                    applied += len(batch)
                    batch.clear()
                    deadline = time.monotonic() + BATCH_SECONDS
                elif not batch:
                    deadline = time.monotonic() + BATCH_SECONDS
                if idle_exit is not None and not batch and time.monotonic() - idle_since > idle_exit:
                    return applied


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harvest_outbox.harvest_local.applier", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--idle-exit", type=float, default=None, help="exit after this many idle seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    dsn = os.environ.get("HARVEST_DATA_SOURCE")
    if not dsn:
        parser.error("set HARVEST_DATA_SOURCE to the Postgres DSN")
    applied = run(dsn, args.bootstrap, args.topic, args.schema, args.idle_exit)
    log.info("applied %d records", applied)
    return 0


if __name__ == "__main__":
    sys.exit(main())
