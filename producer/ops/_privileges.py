"""``harvest check``'s privileges finding: the connected role against what the relay needs
(producer/schema/grants.py's decision for the config's layout, mode and shards).

- a privilege the relay needs and the role lacks is a FAIL naming the exact statement to run (the relay
  would fail on it, some statements only when a dead letter, a view start or a maintenance round comes);
- more than it needs is a WARN: a superuser; the owner of a table the relay only reads and writes (it could
  DROP it: the mark layout's outbox, a companion); TRUNCATE, REFERENCES or TRIGGER on them; CREATE on the
  outbox's schema when the layout creates nothing there. Other tables are not looked at: a role's reach
  beyond the outbox is the database's business, and too broad to judge here.

Reads the catalog only (``has_table_privilege``, ``has_schema_privilege``, ``pg_has_role``); changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import psycopg
from psycopg import sql

from harvest_outbox.producer.config import HarvestConfig
from harvest_outbox.producer.layouts.choice import layout_of
from harvest_outbox.producer.ops._check import Finding, check_outbox
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.grants import grant_to, needs
from harvest_outbox.producer.schema.need import Need

SUBJECT = "privileges"
_PRINT = "`harvest init-db --print-grants` prints the relay's grants (docs/security.md)"
#: Table privileges no component's statement uses: each lets the relay's role do what it never should.
_TOO_MUCH = ("TRUNCATE", "REFERENCES", "TRIGGER")


def check_outbox_and_role(conn: psycopg.Connection, config: HarvestConfig) -> list[Finding]:
    """``harvest check``'s findings: the outbox's (:func:`~producer.ops._check.check_outbox`), then the connected
    role's privileges as the relay's (none for an outbox that is missing or of the other layout). A role
    refused what the check reads is a FAIL of its own, followed by the privileges finding naming the GRANTs."""
    try:
        found = check_outbox(conn, config)
    except psycopg.errors.InsufficientPrivilege as exc:
        role = conn.execute("SELECT current_user").fetchone()
        return [
            Finding(
                "FAIL",
                "table",
                f"reading the outbox {config.outbox_table!r} and its tables as role {role[0] if role else '?'} was "
                f"refused ({str(exc).strip().splitlines()[0]}): its hygiene cannot be judged",
                "grant the role what the privileges finding below names",
            ),
            *check_privileges(conn, config),
        ]
    if any(f.level == "FAIL" and f.subject in ("table", "layout") for f in found):
        return found
    return found + check_privileges(conn, config)


def check_privileges(conn: psycopg.Connection, config: HarvestConfig) -> list[Finding]:
    """The privileges findings of the connected role, as the relay of ``config`` (module doc)."""
    names = OutboxNames.parse(config.outbox_table, config.table_mapping)
    layout = layout_of(conn, names, config).name  # outboxLayout unset: the table's
    relay = [
        n
        for n in needs(names, layout=layout, sequenced=config.uuid_sequencing, shards=config.shards)
        if n.component == "relay"
    ]
    row = conn.execute("SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    role, superuser = (str(row[0]), bool(row[1])) if row else ("?", False)
    if superuser:
        return [
            Finding(
                "WARN",
                SUBJECT,
                f"connected as {role}, a superuser: a relay running so may drop, read or change anything in the "
                f"cluster",
                f"run the relay as a role with only its grants; {_PRINT}",
            )
        ]
    missing: list[str] = []
    grants: list[str] = []
    extra: list[str] = []
    undo: list[str] = []
    for need in relay:
        gap = _compare(conn, need, role)
        if gap.lacks:
            missing.append(gap.lacks_text)
            grants += [stmt.as_string(conn) for stmt in grant_to(replace(need, privileges=gap.lacks), role)]
        if gap.more_text:
            extra.append(gap.more_text)
            undo.append(gap.revoke)
    found = []
    if missing:
        found.append(
            Finding(
                "FAIL",
                SUBJECT,
                f"role {role} lacks what the relay needs: {'; '.join(missing)}",
                "; ".join(grants) + f" (or {_PRINT})",
            )
        )
    if extra:
        found.append(
            Finding("WARN", SUBJECT, f"role {role} has more than the relay needs: {'; '.join(extra)}", "; ".join(undo))
        )
    if not found:
        found.append(
            Finding(
                "OK",
                SUBJECT,
                f"role {role} has what the relay needs ({layout} layout, "
                f"{'--uuid-sequencing' if config.uuid_sequencing else 'at least once'}, shards: {config.shards}), "
                f"and is no superuser, owner or holder of {', '.join(_TOO_MUCH)} beyond it",
            )
        )
    return found


@dataclass(frozen=True)
class _Gap:
    """One need against the role: the privileges it lacks (``OWNER`` for an ownership), and what it has beyond."""

    lacks: tuple[str, ...] = ()
    lacks_text: str = ""
    more_text: str = ""
    revoke: str = ""


def _compare(conn: psycopg.Connection, need: Need, role: str) -> _Gap:
    """What ``need`` lacks, what the role has beyond it and the statement taking that back. A table that does
    not exist is the tables finding's (``harvest init-db``), not this one's."""
    target = need.target.as_string(conn)
    if need.kind == "SCHEMA":
        row = conn.execute(
            "SELECT has_schema_privilege(oid, 'USAGE'), has_schema_privilege(oid, 'CREATE') "
            "FROM pg_namespace WHERE oid = to_regnamespace(%s)",
            (target,),
        ).fetchone()
        if row is None:
            return _Gap()
        have = {"USAGE": bool(row[0]), "CREATE": bool(row[1])}
        lacks = tuple(p for p in need.privileges if not have[p])
        creates = have["CREATE"] and "CREATE" not in need.privileges
        return _Gap(
            lacks,
            f"{', '.join(lacks)} on schema {target}" if lacks else "",
            f"CREATE on schema {target} (it could create tables there)" if creates else "",
            sql.SQL("REVOKE CREATE ON SCHEMA {} FROM {}").format(need.target, sql.Identifier(role)).as_string(conn)
            if creates
            else "",
        )
    row = conn.execute(
        "SELECT pg_has_role(c.relowner, 'USAGE'), coalesce(bool_and(pg_has_role(p.relowner, 'USAGE')), true), "
        "has_table_privilege(c.oid, 'SELECT'), has_table_privilege(c.oid, 'INSERT'), "
        "has_table_privilege(c.oid, 'UPDATE'), has_table_privilege(c.oid, 'DELETE'), "
        "has_table_privilege(c.oid, 'TRUNCATE'), has_table_privilege(c.oid, 'REFERENCES'), "
        "has_table_privilege(c.oid, 'TRIGGER') "
        "FROM pg_class c LEFT JOIN pg_inherits i ON i.inhparent = c.oid LEFT JOIN pg_class p ON p.oid = i.inhrelid "
        "WHERE c.oid = to_regclass(%s) GROUP BY c.oid, c.relowner",
        (target,),
    ).fetchone()
    if row is None:
        return _Gap()
    owns, owns_parts = bool(row[0]), bool(row[1])
    if need.kind == "OWNER":  # the cursor layout's outbox: the relay must own it and its partitions
        if owns and owns_parts:
            return _Gap()
        what = f"the partitions of {target}" if owns else f"{target} and its partitions"
        return _Gap(("OWNER",), f"the ownership of {what} ({need.why})")
    if owns:
        return _Gap(
            (),
            "",
            f"owns {target} (it could DROP or ALTER it)",
            f"ALTER TABLE {target} OWNER TO <the role that ran init-db>",
        )
    have = dict(zip(("SELECT", "INSERT", "UPDATE", "DELETE", *_TOO_MUCH), map(bool, row[2:]), strict=True))
    lacks = tuple(p for p in need.privileges if not have[p])
    more = [p for p in _TOO_MUCH if have[p]]
    return _Gap(
        lacks,
        f"{', '.join(lacks)} on {target}" if lacks else "",
        f"{', '.join(more)} on {target}" if more else "",
        sql.SQL("REVOKE {} ON TABLE {} FROM {}")
        .format(sql.SQL(", ").join(map(sql.SQL, more)), need.target, sql.Identifier(role))
        .as_string(conn)
        if more
        else "",
    )
