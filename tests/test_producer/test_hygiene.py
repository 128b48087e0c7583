"""Queue-table hygiene (README, Queue-table hygiene): the outbox's autovacuum settings set by ``init-db``
(never over a value the owner set), ``deadLetterRetention`` enforced by the leader, and ``harvest check``."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from harvest_outbox.producer.schema import OUTBOX_AUTOVACUUM, OutboxNames, init_db, table_reloptions
from harvest_outbox.producer.table_mapping import table_mapping

# goharvest's own DDL (sh/init-outbox.sh): no storage parameters.
_GOHARVEST_DDL = """
    CREATE TABLE {} (
      id BIGSERIAL PRIMARY KEY, create_time TIMESTAMP WITH TIME ZONE NOT NULL, kafka_topic VARCHAR(249) NOT NULL,
      kafka_key VARCHAR(100) NOT NULL, kafka_value VARCHAR(10000), kafka_header_keys TEXT[] NOT NULL,
      kafka_header_values TEXT[] NOT NULL, leader_id UUID)"""
# A Debezium outbox as its users create it (the router's default columns).
_DEBEZIUM_DDL = """
    CREATE TABLE {} (id UUID PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL, aggregateid VARCHAR(255) NOT NULL,
                     type VARCHAR(255) NOT NULL, payload JSONB)"""


def _reloptions(pg_dsn: str, names: OutboxNames) -> dict[str, str]:
    with psycopg.connect(pg_dsn) as conn:
        return table_reloptions(conn, names.outbox)


# ---------------------------------------------------------------------------------------- init-db


@pytest.mark.integration
def test_init_db_gives_a_new_outbox_the_queue_table_autovacuum_settings(pg_dsn: str, pg_schema: str) -> None:
    names = init_db(pg_dsn, f"{pg_schema}.outbox")
    options = _reloptions(pg_dsn, names)
    assert options == {"fillfactor": "50", **OUTBOX_AUTOVACUUM}, options
    assert OUTBOX_AUTOVACUUM["autovacuum_vacuum_scale_factor"] == "0"  # dead rows counted, not a share of the table
    init_db(pg_dsn, f"{pg_schema}.outbox")  # idempotent
    assert _reloptions(pg_dsn, names) == options


@pytest.mark.integration
@pytest.mark.parametrize("kind, ddl, fillfactor_after", [
    # goharvest's table: init-db never changes its fillfactor (a backlog would take twice the disk): it says so.
    ("goharvest", _GOHARVEST_DDL, None),
    # Debezium's: init-db ALTERs it anyway (its columns), and gives it the half-empty pages when it has no fillfactor.
    ("debezium", _DEBEZIUM_DDL, "50"),
])
def test_init_db_sets_on_an_existing_outbox_only_the_settings_it_lacks(
        pg_dsn: str, pg_schema: str, kind: str, ddl: str, fillfactor_after: str | None) -> None:
    names = OutboxNames.parse(f"{pg_schema}.outbox", table_mapping(kind))
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(ddl).format(names.outbox))
    init_db(pg_dsn, names.display, mapping=names.mapping)
    options = _reloptions(pg_dsn, names)
    assert options.get("fillfactor") == fillfactor_after, options
    assert {k: options[k] for k in OUTBOX_AUTOVACUUM} == OUTBOX_AUTOVACUUM, options
    # The owner's own values (here: a larger threshold and a fillfactor of 70) are kept on every later init-db.
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_vacuum_threshold = 5000, fillfactor = 70)").format(
            names.outbox))
        conn.execute(sql.SQL("ALTER TABLE {} RESET (autovacuum_analyze_threshold)").format(names.outbox))
    init_db(pg_dsn, names.display, mapping=names.mapping)
    options = _reloptions(pg_dsn, names)
    assert options == {**OUTBOX_AUTOVACUUM, "autovacuum_vacuum_threshold": "5000", "fillfactor": "70"}, options
