"""Least privilege: what each component of harvest may do in the outbox's database, decided once here and
printed as SQL by ``harvest init-db --print-grants`` (docs/security.md).

The components, each a role of its own (names are parameters, :class:`RoleNames`):
- ``owner``: runs ``harvest init-db`` (DDL) and owns what it creates; nothing else runs as it;
- ``relay``: ``harvest run``, exactly the reads, writes and locks of its layout, delivery mode and shards;
- ``writer``: the applications' stashers: INSERT into the outbox, and SELECT of the ``id`` column alone
  (``INSERT … RETURNING id``), nothing else;
- ``admin``: the ``harvest dead-letters`` verbs (list, keys, export, requeue, discard);
- ``reader``: a reader's Postgres checkpoint store (consumer/pg_store.py), its one table.

:func:`needs` is the decision (a pure function of the outbox's names, layout, mode and shards): one
:class:`Need` per (component, object), each with why it is needed; each layout decides on its own objects
(:meth:`~producer.layouts.layout.OutboxLayout.grants`); :func:`grant_statements` renders it.

Invariants (tests/test_producer/schema/test_grants.py, test_grants_pg.py):
- every identifier is composed with :class:`psycopg.sql.Identifier` and every role name too; the one
  dynamic statement (the cursor layout's hand-over of the partitions) reads them as literals;
- a privilege is here only because a statement of that component needs it (the statements named in each
  ``why``); each component, run as its role with exactly these grants, works, and is refused what lies
  outside them (test_grants_pg.py: enough, and not everything; that none is superfluous is this list's word);
- no grant depends on the leader election: the Postgres-lock election's advisory locks and its reads of
  ``pg_locks``/``pg_stat_activity``, like LISTEN/NOTIFY, need no privilege (Postgres grants them to every role);
- the cursor layout's relay owns the partitioned outbox, its partitions and its id sequence: partition
  maintenance (producer/layouts/cursor/partitions.py) ATTACHes and DROPs partitions, which Postgres allows
  only to a table's owner; so there, unlike the mark layout, the relay role could drop the outbox. The owner
  joins the relay's role there, so that ``init-db`` run again (an upgrade) may still alter the outbox.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from psycopg import sql

from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.producer.layouts.choice import layout_for
from harvest_outbox.producer.mapping.names import OutboxNames, Statement, parse_table_name
from harvest_outbox.producer.schema.need import Component, Need, schema_of

COMPONENTS: tuple[Component, ...] = ("owner", "relay", "writer", "admin", "reader")
#: consumer/pg_store.py's DEFAULT_TABLE (not imported: the readers' package stays off producer/'s imports).
CHECKPOINT_TABLE = "harvest_consumer_checkpoints"
#: The dollar quote of the ownership hand-over's DO block: no literal in it may contain it.
_QUOTE = "$harvest_grants$"


@dataclass(frozen=True)
class RoleNames:
    """The role each component runs as (``harvest init-db --print-grants --relay-role NAME ...``)."""

    owner: str = "harvest_owner"
    relay: str = "harvest_relay"
    writer: str = "harvest_writer"
    admin: str = "harvest_admin"
    reader: str = "harvest_reader"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, str) or not value.strip() or not value.isprintable() or len(value.encode()) > 63:
                raise ConfigError(
                    f"--{f.name}-role: {value!r} is not a role name; give 1-63 bytes of printable text, e.g. harvest_{f.name}"
                )
            if _QUOTE in value:
                raise ConfigError(f"--{f.name}-role: {value!r} contains {_QUOTE}; choose another name")
        if len({getattr(self, f.name) for f in fields(self)}) != len(fields(self)):
            raise ConfigError(
                f"the roles must differ (owner {self.owner!r}, relay {self.relay!r}, writer {self.writer!r}, "
                f"admin {self.admin!r}, reader {self.reader!r}): one role would get the union of their grants; "
                f"give each --<component>-role its own name"
            )

    def of(self, component: Component) -> str:
        name: str = getattr(self, component)
        return name


def needs(
    names: OutboxNames,
    *,
    layout: str = "mark",
    sequenced: bool = False,
    shards: int = 1,
    checkpoint_table: str = CHECKPOINT_TABLE,
) -> list[Need]:
    """What each component needs on ``names``' outbox (``outboxLayout`` ``layout``, ``--uuid-sequencing``
    ``sequenced``, ``shards``; the reader's ``checkpoint_table``): the layout's own objects' needs
    (:meth:`~producer.layouts.layout.OutboxLayout.grants`) and the companions' both layouts keep."""
    if shards < 1:
        raise ConfigError(f"shards: {shards} must be 1 or more")
    own = layout_for(layout).grants(names)
    schema = schema_of(names)
    crud = ("SELECT", "INSERT", "UPDATE", "DELETE")
    out = [Need("owner", "SCHEMA", schema, ("USAGE", "CREATE"), "init-db creates the outbox and its companions here")]
    out += [n for n in own if n.component == "owner"]
    # ------------------------------------------------------------------ the relay
    out += [n for n in own if n.component == "relay"]
    out.append(Need("relay", "TABLE", names.dead_letters, crud, "the dead-letter move, the meter, haltKey, retention"))
    out.append(Need("relay", "TABLE", names.delivery_attempts, crud, "failed-attempt counts (upserted, forgotten)"))
    out.append(
        Need("relay", "TABLE", names.layout, ("SELECT", "INSERT", "UPDATE"), "admission: the running relays' layout")
    )
    if sequenced:
        fence = names.shard_state if shards > 1 else names.state
        out.append(Need("relay", "TABLE", fence, ("SELECT", "UPDATE"), "--uuid-sequencing's fence (epoch, clock)"))
        out.append(Need("relay", "TABLE", names.ack_intents, crud, "--uuid-sequencing's persisted ACK intents"))
    elif shards > 1:  # producer/schema/checks.py require_shards, at every connect
        out.append(Need("relay", "TABLE", names.shard_state, ("SELECT",), "the relay counts the shards' fence rows"))
    # ------------------------------------------------------------------ the writers
    out.append(Need("writer", "SCHEMA", schema, ("USAGE",), ""))
    out.append(Need("writer", "TABLE", names.outbox, ("INSERT",), "the stasher's INSERT and COPY"))
    out.append(
        Need(
            "writer",
            "TABLE",
            names.outbox,
            ("SELECT",),
            "Stasher.stash returns the row's id (INSERT … RETURNING id): that column only",
            (names.mapping.id_column,),
        )
    )
    out.append(Need("writer", "SEQUENCE", names.id_sequence, ("USAGE",), "the id column's default draws from it"))
    # ------------------------------------------------------------------ the dead-letter verbs
    out.append(Need("admin", "SCHEMA", schema, ("USAGE",), ""))
    out.append(
        Need("admin", "TABLE", names.dead_letters, ("SELECT", "DELETE"), "list, keys, export; requeue and discard")
    )
    out.append(
        Need("admin", "TABLE", names.outbox, ("SELECT", "INSERT"), "requeue writes rows back; keys counts waiting rows")
    )
    out.append(Need("admin", "SEQUENCE", names.id_sequence, ("USAGE",), "a requeued row draws a new id"))
    out += [n for n in own if n.component == "admin"]
    # ------------------------------------------------------------------ a reader's checkpoint store
    store_schema, store_table = parse_table_name(checkpoint_table)
    store = sql.Identifier(store_schema, store_table) if store_schema else sql.Identifier(store_table)
    out.append(Need("reader", "SCHEMA", sql.Identifier(store_schema) if store_schema else schema, ("USAGE",), ""))
    out.append(Need("reader", "TABLE", store, crud, "load, save (upsert) and delete its checkpoints"))
    return out


def grant_sql(need: Need, roles: RoleNames) -> list[Statement]:
    """The statement(s) granting ``need`` to its component's role."""
    if need.kind == "MEMBER":
        assert need.member_of is not None, need
        joined = sql.Identifier(roles.of(need.member_of))
        return [sql.SQL("GRANT {} TO {}").format(joined, sql.Identifier(roles.of(need.component)))]
    return grant_to(need, roles.of(need.component))


def grant_to(need: Need, role_name: str) -> list[Statement]:
    """The statement(s) granting ``need`` (not a ``MEMBER``ship: :func:`grant_sql`) to the role ``role_name``
    (``harvest check`` names the connected role)."""
    if need.kind == "MEMBER":
        raise ValueError(f"grant_to: {need} is a role membership; use grant_sql")
    role = sql.Identifier(role_name)
    if need.kind == "OWNER":
        return [
            sql.SQL("ALTER TABLE {} OWNER TO {}").format(need.target, role),
            _partitions_owned_by(need.target, role_name),
        ]
    columns = sql.SQL(" ({})").format(sql.SQL(", ").join(map(sql.Identifier, need.columns)))
    privileges = sql.SQL(", ").join(sql.SQL(p) + (columns if need.columns else sql.SQL("")) for p in need.privileges)
    return [sql.SQL("GRANT {} ON {} {} TO {}").format(privileges, sql.SQL(need.kind), need.target, role)]


def _partitions_owned_by(table: sql.Identifier, role: str) -> sql.Composed:
    """A DO block handing ``table``'s partitions to ``role`` (ALTER TABLE … OWNER does not recurse to them).
    Table and role go in as literals, quoted again by format(): the block never reads raw text as SQL."""
    text = table.as_string(None)
    if _QUOTE in text + role:
        raise ConfigError(f"table {text} or role {role!r} contains {_QUOTE}: rename it to print its grants")
    target = sql.Literal(text)
    return sql.SQL(
        "DO " + _QUOTE + " DECLARE part regclass; BEGIN "
        "FOR part IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = {}::regclass LOOP "
        "EXECUTE format('ALTER TABLE %s OWNER TO %I', part, {}); END LOOP; END " + _QUOTE
    ).format(target, sql.Literal(role))


def grant_statements(all_needs: Sequence[Need], roles: RoleNames) -> list[Statement]:
    """Every statement of ``all_needs``, in order."""
    return [stmt for need in all_needs for stmt in grant_sql(need, roles)]


def grants_script(all_needs: Sequence[Need], roles: RoleNames, made_for: str = "") -> str:
    """The SQL script ``--print-grants`` prints: per component a comment naming its role, each statement
    with why; ``made_for`` says which config it is for (the outbox, layout, mode, shards: never the DSN)."""
    lines = [
        _comment(f"harvest's least-privilege grants (docs/security.md){': ' + made_for if made_for else ''}"),
        "-- Create the roles first (CREATE ROLE <name> LOGIN; a password each, e.g. with psql's \\password),",
        "-- run the owner's lines (before init-db: it creates in the schema), `harvest init-db` as the owner,",
        "-- then the whole script as a superuser. Every statement can run again. The reader's table is made by",
        "-- the owner (PostgresCheckpointStore.create_table) before its grant runs.",
    ]
    for component in COMPONENTS:
        mine = [n for n in all_needs if n.component == component]
        if not mine:
            continue
        lines.append("")
        lines.append(_comment(f"{component}: {roles.of(component)}"))
        for need in mine:
            if need.why:
                lines.append(_comment(need.why))
            for stmt in grant_sql(need, roles):
                lines.append(stmt.as_string(None) + ";")
    return "\n".join(lines) + "\n"


def _comment(text: str) -> str:
    """``text`` as one SQL comment line: a line break in it (a quoted table name may hold one) would end the
    comment and run the rest as SQL, so control characters are escaped."""
    return "-- " + "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
