"""The roles of producer/schema/grants.py on the session's Postgres: five LOGIN roles with passwords, each
component's DSN, and an outbox set up as docs/security.md says (the owner's grants, ``init-db`` as the owner,
then everyone else's grants)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.schema.grants import RoleNames, grant_statements, needs
from harvest_outbox.producer.schema.need import Component


@dataclass(frozen=True)
class Roles:
    names: RoleNames
    dsns: dict[str, str] = field(repr=False)  # they hold the passwords

    def dsn(self, component: Component) -> str:
        return self.dsns[component]


@contextmanager
def login_roles(pg_dsn: str, prefix: str) -> Iterator[Roles]:
    """Five LOGIN roles ``<prefix>_<component>`` (roles are the cluster's: the prefix is unique per test);
    what they own and were granted is dropped with them afterwards."""
    names = RoleNames(**{f.name: f"{prefix}_{f.name}" for f in fields(RoleNames)})
    dsns = {}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for f in fields(RoleNames):
            password = os.urandom(9).hex()
            role = names.of(f.name)  # type: ignore[arg-type]
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), password))
            dsns[f.name] = make_conninfo(pg_dsn, user=role, password=password)
    try:
        yield Roles(names, dsns)
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for f in fields(RoleNames):
                role = sql.Identifier(names.of(f.name))  # type: ignore[arg-type]
                conn.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(role))
                conn.execute(sql.SQL("DROP ROLE {}").format(role))


def granted_outbox(
    pg_dsn: str, roles: Roles, table: str, *, layout: str = "mark", sequenced: bool = False, shards: int = 1
) -> OutboxNames:
    """The outbox as an operator sets it up: the owner's grants, ``init-db`` as the owner, the other grants
    (by the superuser), and the reader's checkpoint table, made by the owner."""
    names = OutboxNames.parse(table)
    wanted = needs(names, layout=layout, sequenced=sequenced, shards=shards, checkpoint_table=checkpoint_table(table))
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for stmt in grant_statements([n for n in wanted if n.component == "owner"], roles.names):
            conn.execute(stmt)
    init_db(roles.dsn("owner"), table, shards=shards, layout=layout, partition_ids=100)
    with psycopg.connect(roles.dsn("owner"), autocommit=True) as conn:
        from harvest_outbox.consumer import PostgresCheckpointStore

        PostgresCheckpointStore("billing", schema=names.schema).create_table(conn)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for stmt in grant_statements([n for n in wanted if n.component != "owner"], roles.names):
            conn.execute(stmt)
    return names


def checkpoint_table(table: str) -> str:
    """The reader's checkpoint table, next to the outbox ``schema.table``."""
    return f"{table.split('.')[0]}.harvest_consumer_checkpoints"
