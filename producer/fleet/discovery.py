"""Finding a fleet's outboxes on a server: every schema matching a glob that holds the outbox table, in
the ``dataSource``'s database or in every database of the server matching the ``databases`` globs.

Invariants (``tests/test_producer/fleet/test_fleet_discovery.py``):
- a discovery either answers the whole set of outboxes its entry names or raises
  :class:`DiscoveryError`; the fleet keeps a failed entry's previous set (an unreachable server
  stops no relay and starts none), so a database that is briefly away drops no tenant;
- names come back in a stable order (database, schema), and are quoted as identifiers where needed
  (``"Tenant A".outbox``), so what is found is always a valid ``outboxTable``;
- only what the connecting role can see is found: ``pg_namespace`` / ``pg_class`` rows with USAGE on
  the schema (``has_schema_privilege``), databases it may connect to.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable
from typing import Any

from harvest_outbox.producer.errors import ConfigError, HarvestError, shown
from harvest_outbox.producer.fleet.spec import Discovery, FleetFile, Outbox, merged
from harvest_outbox.redact import redact_dsn, redact_error

#: Seconds a discovery waits for a server before it counts as failed.
CONNECT_TIMEOUT = 5

_PLAIN = re.compile(r"[a-z_][a-z0-9_$]*")


class DiscoveryError(HarvestError):
    """A discovery could not look (server unreachable, no privilege): its previous set stays."""


def quoted(name: str) -> str:
    """An identifier as ``outboxTable`` takes it: plain when it is, else in double quotes."""
    return name if _PLAIN.fullmatch(name) else '"' + name.replace('"', '""') + '"'


def matches(name: str, globs: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, glob) for glob in globs)


Connect = Callable[[str], Any]


def _connect(dsn: str) -> Any:
    from harvest_outbox.producer.db.credentials import open_connection

    return open_connection(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT, application_name="harvest-discovery")


def discover(entry: Discovery, connect: Connect = _connect) -> list[tuple[str, str]]:
    """``[(dataSource, outboxTable)]`` of every outbox ``entry`` names now."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    found: list[tuple[str, str]] = []
    try:
        if entry.databases:
            with connect(entry.data_source) as conn:
                rows = conn.execute(
                    "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate "
                    "AND has_database_privilege(datname, 'CONNECT') ORDER BY datname"
                ).fetchall()
            databases = [name for (name,) in rows if matches(name, entry.databases)]
            targets = [make_conninfo(entry.data_source, dbname=name) for name in databases]
        else:
            targets = [entry.data_source]
        for dsn in targets:
            with connect(dsn) as conn:
                schemas = conn.execute(
                    "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE c.relname = %s AND c.relkind IN ('r', 'p') "
                    "AND has_schema_privilege(n.oid, 'USAGE') ORDER BY n.nspname",
                    (entry.table,),
                ).fetchall()
            for (schema,) in schemas:
                if fnmatch.fnmatchcase(schema, entry.schemas):
                    found.append((dsn, f"{quoted(schema)}.{quoted(entry.table)}"))
    except Exception as exc:
        database = conninfo_to_dict(entry.data_source).get("dbname", "")
        raise DiscoveryError(
            f"{entry.origin}: cannot look for outboxes on {redact_dsn(entry.data_source)!r} "
            f"(database {database!r}): {redact_error(str(exc), entry.data_source)}; the outboxes found before keep running"
        ) from None
    return found


def every_outbox(fleet: FleetFile) -> dict[str, Outbox]:
    """The listed outboxes and those the discoveries find now, by id (a listed one wins)."""
    known = {o.id: o for o in fleet.listed}
    targets = {o.target for o in fleet.listed}
    for entry in fleet.discoveries:
        for dsn, table in discover(entry):
            found = fleet.outbox(entry.origin, merged(entry.section, {"dataSource": dsn, "outboxTable": table}))
            if found.target not in targets:
                known.setdefault(found.id, found)
                targets.add(found.target)
    return known


def select_outbox(fleet: FleetFile, outbox_id: str | None) -> Outbox:
    """The outbox ``outbox_id`` names among the listed ones and those the discoveries find now (for the
    commands that work on one outbox: ``--outbox``)."""
    known = {o.id: o for o in fleet.listed}
    if outbox_id not in known:
        known = every_outbox(fleet)
    if outbox_id is None or outbox_id not in known:
        ids = sorted(known)
        listed = ", ".join(ids[:20]) + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")
        said = (
            "missing: the file is a fleet file" if outbox_id is None else f"{shown(outbox_id)} is not an outbox of it"
        )
        raise ConfigError(f"--outbox: {said}; name one of its {len(ids)} outboxes: {listed or 'none found now'}")
    return known[outbox_id]
