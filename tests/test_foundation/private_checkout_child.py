"""Run from a fresh clone by test_private_checkout.py: embedded services + stash -> relay -> read.

Prints one JSON line (``RESULT {...}``) describing where things ran and what was read. It imports
the clone's packages (``PYTHONPATH`` is a folder whose ``harvest_outbox/`` links to the clone's
folders) with the tests' interpreter, so nothing is installed again.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import uuid
from pathlib import Path

import psycopg

from harvest_outbox import harvest_local
from harvest_outbox.consumer import ReadCommittedIter
from harvest_outbox.harvest_local import LocalServices
from harvest_outbox.harvest_local.kafka import create_topic
from harvest_outbox.harvest_local.relays import RelayProcess, current_leader, wait_for, write_config
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

ROWS = 20


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result: dict[str, object] = {"harvest_local": harvest_local.__file__}
    with LocalServices() as services:
        pg = services.postgres
        assert pg is not None and services.kafka is not None, "the embedded services must be ours"
        link = pg.link
        result.update(
            pg_root=str(pg.root),
            pg_user=pg.os_user,
            pg_root_uid=pg.root.stat().st_uid,
            pg_link=str(link) if link else None,
            pg_link_target=os.readlink(link) if link else None,
            kafka_root=str(services.kafka.root),
        )
        ends = services.endpoints
        topic, table = f"private-{uuid.uuid4().hex[:8]}", "private.outbox"
        with psycopg.connect(ends.pg_dsn, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA private")
        init_db(ends.pg_dsn, table)
        create_topic(ends.kafka_bootstrap, topic, 1)
        stasher = Stasher(table)
        with psycopg.connect(ends.pg_dsn) as conn:
            stasher.stash_many(conn, [OutboxRecord(topic, f"k{i % 3}", f"v{i}") for i in range(ROWS)])
        logs = Path(tempfile.mkdtemp(prefix="relay-", dir=harvest_local.work_dir()))
        cfg = write_config(
            logs / "harvest.yaml",
            dsn=ends.pg_dsn,
            bootstrap=ends.kafka_bootstrap,
            outbox_table=table,
            group=f"private-{uuid.uuid4().hex[:6]}",
        )
        relay = RelayProcess(cfg, "relay", logs).start()
        try:
            wait_for(lambda: current_leader([relay]) is not None or not relay.alive, 60, "the relay's election")
            assert relay.alive, relay.text()[-2000:]
            values: list[str] = []
            kafka = {
                "bootstrap.servers": ends.kafka_bootstrap,
                "group.id": f"g-{uuid.uuid4().hex[:6]}",
                "auto.offset.reset": "earliest",
            }
            with ReadCommittedIter(kafka, topics=[topic], idle_timeout=15.0) as it:
                for record in it:
                    values.append(record.value.decode())
                    if len(values) == ROWS:
                        break
        finally:
            relay.stop()
        result["values"] = values
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
