"""Subprocess for the kill -9 test: applies committed records to a Postgres
table, saving the reader's checkpoint in the same transaction.

usage: eo_worker.py DSN SCHEMA BOOTSTRAP TOPIC NAME EXPECTED SEED
Exits 0 once the table holds EXPECTED rows and nothing more arrives.
"""

from __future__ import annotations

import random
import sys

import psycopg
from psycopg import sql

from harvest_outbox.consumer import PostgresCheckpointStore, ReadCommittedIter


def main() -> int:
    dsn, schema, bootstrap, topic, name, expected, seed = sys.argv[1:]
    rnd = random.Random(int(seed))
    store = PostgresCheckpointStore(name, schema=schema)
    table = sql.Identifier(schema, "applied")
    insert = sql.SQL("INSERT INTO {} (journal, kafka_offset, value) VALUES (%s, %s, %s)").format(table)
    with psycopg.connect(dsn) as conn:
        cp = store.load(conn)
        conn.commit()
        with ReadCommittedIter({"bootstrap.servers": bootstrap}, topics=[topic], checkpoint=cp, ring_size=16) as it:
            while True:
                batch = []
                for _ in range(rnd.randint(1, 4)):
                    rec = it.poll(1.0)
                    if rec is None:
                        break
                    batch.append((rec.journal, rec.offset, rec.value))
                if batch:
                    with conn.transaction():
                        with conn.cursor() as cur:
                            cur.executemany(insert, batch)
                        store.save(conn, it.checkpoint())
                    continue
                (n,) = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
                conn.commit()
                if n >= int(expected):
                    print(f"done: {n} rows", flush=True)
                    return 0


if __name__ == "__main__":
    sys.exit(main())
