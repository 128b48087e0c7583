"""The ``harvest`` command line.

    harvest -f harvest.yaml [flags]          run the relay (goharvest reaper compatible); same as `harvest run`
    harvest init-db -f harvest.yaml [--value-type bytea]
    harvest init-db -f harvest.yaml --print-grants [--relay-role NAME ...]   least-privilege SQL, no connection
    harvest acls -f harvest.yaml --principal User:relay --topic T [--topic-prefix P] [--reader-principal User:r]
                                             least-privilege Kafka ACLs (kafka-acls.sh lines), no connection
    harvest check -f harvest.yaml            the outbox's queue-table hygiene and the role's privileges: OK / WARN / FAIL with fixes
    harvest dead-letters list|keys|export|requeue|discard -f harvest.yaml ...   (producer/ops/_deadletters_cli.py)

Flags (``--data-source``, ``--bootstrap-servers``, ``--outbox-table``, ``--leader-topic``,
``--leader-group-id``, ``--leader-election``, ``--name``, ``--prometheus-port``,
``--prometheus-bind-address``, ``--log-level``,
``--uuid-sequencing``) override the file and the environment; with no file, defaults apply. Environment:
``HARVEST_<KEY>`` for every key of ``harvest:`` (``HARVEST_DATA_SOURCE`` carries the DSN so the password
stays out of ``ps``) and ``HARVEST_LOG_LEVEL`` override the file; the file's values may use ``${VAR}``,
``${VAR:-default}`` and ``${file:/run/secrets/dsn}`` (:mod:`producer.config._env`).

Exit codes: 0 success / stopped by SIGTERM, SIGINT or SIGHUP; 1 runtime failure (database, Kafka,
election); 2 usage or configuration error; 3 a second stop signal ended the relay without waiting
for its drain (:mod:`producer.relay.signals`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

# Only light modules here: main() installs the stop-signal handlers before the relay's dependencies
# load (the config pulls in psycopg), see producer/relay/signals.py.
from harvest_outbox import producer
from harvest_outbox.producer.errors import ConfigError, HarvestError
from harvest_outbox.producer.ops import _deadletters_cli as cli_deadletters
from harvest_outbox.producer.relay.signals import StopSignals
from harvest_outbox.redact import is_secret_kafka_key, redact_error

if TYPE_CHECKING:
    from harvest_outbox.producer.config import FileConfig
    from harvest_outbox.producer.ops._check import Finding

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_FORCED = 0, 1, 2, 3
MAX_LIST_LIMIT = cli_deadletters.MAX_LIST_LIMIT
_COMMANDS = ("run", "init-db", "acls", "check", "shards", "dead-letters", "deadletters")
log = logging.getLogger("harvest")


def _version() -> str:
    from harvest_outbox import sequencer
    from harvest_outbox.consumer import record
    from harvest_outbox.producer.db import header_arrays_path
    from harvest_outbox.producer.relay import at_least_once, sequenced

    readers = "native" if record._native is not None else "python"
    paths = {at_least_once.fast_path(), sequenced.fast_path(), header_arrays_path()}
    relay = paths.pop() if len(paths) == 1 else "partly native"
    return (
        f"harvest {producer.__version__} (sequencer: {sequencer.IMPLEMENTATION}, reader fast path: {readers}, "
        f"relay fast path: {relay})"
    )


class _Version(argparse.Action):
    """``--version``: one unwrapped line (argparse's own action wraps it at the terminal's width), made
    only when asked (it imports the compiled modules to name them)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any, **_kwargs: Any) -> None:
        print(_version())
        parser.exit()


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-f", "--file", help="YAML config (goharvest reaper format: harvest: {...}, logging: {...})")
    p.add_argument("--data-source", help="Postgres DSN (overrides harvest.dataSource; or env HARVEST_DATA_SOURCE)")
    p.add_argument("--outbox-table", help="outbox table, optionally schema-qualified")
    p.add_argument("--log-level", help="TRACE/DEBUG/INFO/WARNING/ERROR")
    p.add_argument(
        "--outbox",
        metavar="ID",
        help="with a fleet file (outboxes: / discover:): the one outbox this command works on, by its id "
        "(docs/fleet.md); `run` without it relays every outbox of the file",
    )


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line naming the argument and the fix, exit 2 (argparse's own prints the whole
    usage block first). Subcommand parsers are of this class too (``add_subparsers`` uses ``type(self)``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: usage error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="harvest",
        description="Transactional-outbox relay: moves outbox rows from Postgres to Kafka "
        "(goharvest's mark-purge/reset with NELI leader election).",
        epilog="Exit codes: 0 ok or stopped by SIGTERM/SIGINT/SIGHUP, 1 runtime failure, 2 usage/config error, "
        "3 a second stop signal ended the drain.",
    )
    parser.add_argument("--version", action=_Version, help="show the version and the fast paths in use, then exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser("run", help="run the relay (default when no command is given)")
    _common(run)
    run.add_argument("--bootstrap-servers", help="Kafka bootstrap servers (overrides baseKafkaConfig)")
    run.add_argument("--leader-topic")
    run.add_argument("--leader-group-id")
    run.add_argument(
        "--leader-election",
        choices=("neli", "postgres"),
        help="harvest.leaderElection: neli (Kafka group, default) or postgres (advisory lock in the outbox's database)",
    )
    run.add_argument("--name", help="this relay's name (default host_pid_time)")
    run.add_argument("--prometheus-port", type=int, help="serve /metrics, /healthz and /readyz on this port")
    run.add_argument(
        "--prometheus-bind-address",
        help="address those endpoints listen on (harvest.prometheusBindAddress, default 0.0.0.0)",
    )
    # A fleet's worker process (fleet.workers), started by its supervisor: not for users.
    run.add_argument("--fleet-worker", help=argparse.SUPPRESS)
    run.add_argument("--fleet-worker-port-file", help=argparse.SUPPRESS)
    run.add_argument(
        "--uuid-sequencing",
        action="store_true",
        default=None,
        help="exactly-once mode (harvest.uuidSequencing): Gazette UUIDs, harvest transactions, "
        "fenced commits, ACK_TXN messages; readers sequence with the `sequencer` package",
    )
    init = sub.add_parser(
        "init-db",
        help="create the outbox, dead-letter table and NOTIFY trigger (dropped instead with wakeup: poll, "
        "for two-phase-commit writers; and, with shards: S in the config, the shard index and fence rows)",
    )
    _common(init)
    init.add_argument(
        "--value-type",
        choices=("varchar", "bytea"),
        default="varchar",
        help="kafka_value column type (varchar = goharvest's)",
    )
    init.add_argument(
        "--migrate",
        action="store_true",
        help="move goharvest's (or Debezium's) mark-layout table to the cursor layout (outboxLayout: cursor or "
        "unset): renamed to <table>_goharvest and its rows copied, in order, into the new partitioned outbox, in "
        "one transaction; every relay stopped, or add --online",
    )
    init.add_argument(
        "--online",
        action="store_true",
        help="with --migrate: while writers write and relays run (docs/migrating.md): the swap waits for the "
        "outbox's lock at most 100 ms at a time and copies at most 10,000 unrelayed rows under it, retried "
        "until the relays have drained the backlog below that; mark-layout relays stop at the swap "
        "(started again on the cursor layout when their outboxLayout is unset)",
    )
    init.add_argument(
        "--print-grants",
        action="store_true",
        help="print, instead, the GRANT statements of each component's role for this config's outbox, "
        "layout, mode and shards (docs/security.md); connects to nothing",
    )
    for component, what in (
        ("owner", "runs init-db (DDL)"),
        ("relay", "runs the relay"),
        ("writer", "the applications' stashers"),
        ("admin", "the dead-letters verbs"),
        ("reader", "a reader's Postgres checkpoint store"),
    ):
        init.add_argument(
            f"--{component}-role",
            metavar="NAME",
            help=f"with --print-grants: the role that {what} (default harvest_{component})",
        )
    init.add_argument(
        "--checkpoint-table",
        metavar="[SCHEMA.]TABLE",
        help="with --print-grants: the readers' checkpoint table (default harvest_consumer_checkpoints)",
    )
    acl = sub.add_parser(
        "acls",
        help="print the Kafka ACLs of the relay's principal (and a reader's) for this config, as kafka-acls.sh "
        "lines with their reasons (docs/security.md, Kafka ACLs); connects to nothing",
    )
    _common(acl)
    acl.add_argument("--principal", required=True, help="the relay's Kafka principal, e.g. User:harvest-relay")
    acl.add_argument("--topic", action="append", default=[], metavar="NAME", help="a topic the rows name (repeat)")
    acl.add_argument(
        "--topic-prefix", action="append", default=[], metavar="PREFIX", help="every topic named PREFIX... (repeat)"
    )
    acl.add_argument("--reader-principal", help="also a reader's ACLs, for this principal (e.g. User:orders-reader)")
    acl.add_argument("--reader-group", metavar="GROUP", help="with --reader-principal: the reader's group.id")
    acl.add_argument(
        "--kafka-before-3",
        action="store_true",
        help="the brokers run Kafka before 3.0: IDEMPOTENT_WRITE on the cluster too",
    )
    chk = sub.add_parser(
        "check",
        help="report the outbox's fillfactor, autovacuum, indexes, NOTIFY trigger, "
        "companion tables, backlog and dead rows, and the DSN role's privileges against the relay's, "
        "each OK / WARN / FAIL with the fix "
        "(exit 1 on a FAIL)",
    )
    _common(chk)
    chk.add_argument(
        "--kafka",
        action="store_true",
        help="also connect to Kafka with baseKafkaConfig: the TLS handshake, the SASL login (as the relay's start "
        "does; docs/security.md)",
    )
    sh = sub.add_parser("shards", help="show who leads which shard and each shard's backlog (shards: S > 1)")
    _common(sh)
    sh.add_argument("--bootstrap-servers", help="Kafka bootstrap servers (overrides baseKafkaConfig; NELI election)")
    cli_deadletters.add_parser(sub, _common, _bounded_int)
    return parser


def _bounded_int(what: str, low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an int in [low, high], else a usage error naming the argument and the range."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range; give {low}-{high:,}")
        return value

    parse.__name__ = what  # argparse names the type in some messages
    return parse


def printable(text: object) -> str:
    """``text`` with control and other non-printable characters escaped (``\\x1b``, ``\\n``): row data
    comes from applications and must not drive the operator's terminal."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)


def _setup_logging(level: str, tag: str = "") -> None:
    """``tag``: what starts each line's text (a fleet worker's ``[w1]``: its lines share the supervisor's stream)."""
    level = level.upper()
    py_level = {"TRACE": logging.DEBUG, "WARN": logging.WARNING}.get(level, getattr(logging, level, logging.INFO))
    logging.basicConfig(
        level=py_level, stream=sys.stderr, format=f"%(asctime)s %(levelname)s {tag}%(name)s: %(message)s"
    )


def _load(args: argparse.Namespace, extra: dict[str, Any] | None = None, kafka: bool = True) -> FileConfig:
    """The config (flags over file), checked, with logging set up and the config's notes logged (those
    about the Kafka connection only when ``kafka``: the command talks to Kafka)."""
    from harvest_outbox.producer.config import FileConfig, from_mapping

    # HARVEST_<KEY> variables (HARVEST_DATA_SOURCE among them) are the config's: flags win over them.
    overrides: dict[str, Any] = {"data_source": args.data_source, "outbox_table": args.outbox_table, **(extra or {})}
    sources = {"data_source": "--data-source"}
    read = _read_file(args, overrides) if args.file else None
    if isinstance(read, FileConfig):
        if args.outbox is not None:
            raise ConfigError(
                f"--outbox: {args.file} is one relay's file, not a fleet file (outboxes: / discover:); drop --outbox"
            )
        cfg = read
    elif read is not None:  # a fleet file: the outbox --outbox names
        from harvest_outbox.producer.fleet.discovery import select_outbox

        outbox = select_outbox(read, args.outbox)
        cfg = FileConfig(outbox.config, read.log_level, read.notes)
    else:
        cfg = from_mapping({}, overrides, args.log_level, sources, os.environ)
    if args.outbox is not None and not args.file:
        raise ConfigError("--outbox: names an outbox of a fleet file; give the file with -f")
    args.loaded_config = cfg  # main() redacts error messages with its secrets
    from harvest_outbox.producer.db.credentials import provide

    provide(cfg.harvest.data_source, cfg.harvest.password_provider)  # every command's connections
    cfg.harvest.check_kafka_properties()  # a file is valid or not whatever the command reads of it
    _setup_logging(cfg.log_level)
    for note in cfg.notes:
        if kafka or not note.kafka:
            log.log(note.level, "%s", note.message)
    return cfg


def _run(args: argparse.Namespace, signals: StopSignals) -> int:
    from harvest_outbox.producer.relay.layout_change import run_following_layout
    from harvest_outbox.producer.relay.sharded import relay_for

    flags = {
        "bootstrap_servers": args.bootstrap_servers,
        "leader_topic": args.leader_topic,
        "leader_group_id": args.leader_group_id,
        "leader_election": args.leader_election,
        "name": args.name,
        "prometheus_port": args.prometheus_port,
        "prometheus_bind_address": args.prometheus_bind_address,
        "uuid_sequencing": args.uuid_sequencing,
    }
    if args.file and args.outbox is None:  # with --outbox: that outbox's relay alone
        args.worker_role = _worker_role(args)
        fleet = _load_fleet(args, flags)
        if fleet is not None:
            if fleet.options.workers > 1 and args.worker_role is None:
                return _run_workers(args, signals, flags, fleet)
            return _run_fleet(args, signals, flags, fleet)
    cfg = _load(args, flags)
    log.info("harvest %s starting: %r", producer.__version__, cfg.harvest)
    if signals.requested.is_set():
        log.info("stopped before the relay started")
        return EXIT_OK
    run_following_layout(cfg.harvest, relay_for, signals.attach, signals.requested)
    return EXIT_OK


def _read_file(args: argparse.Namespace, overrides: dict[str, Any], again: bool = False) -> Any:
    """The file ``-f`` names, read once per command (``again``: a reload): a fleet file
    (:class:`~producer.fleet.spec.FleetFile`) or one relay's (:class:`~producer.config.FileConfig`)."""
    from harvest_outbox.producer.fleet.spec import load_config

    key = tuple(sorted(overrides.items(), key=lambda kv: kv[0]))
    cached = getattr(args, "read_file", None)
    if cached is None or cached[0] != key or again:
        read = load_config(args.file, overrides, args.log_level, {"data_source": "--data-source"}, os.environ)
        args.read_file = cached = (key, read)
    return cached[1]


def _load_fleet(args: argparse.Namespace, flags: dict[str, Any], again: bool = False) -> Any:
    """The fleet file ``args.file`` (outboxes / discover sections), checked, logging set up; None when
    it is one relay's file."""
    from harvest_outbox.producer.fleet.spec import FleetFile

    overrides: dict[str, Any] = {"data_source": args.data_source, "outbox_table": args.outbox_table, **flags}
    fleet = _read_file(args, overrides, again)
    if not isinstance(fleet, FleetFile):
        return None
    for outbox in fleet.listed:
        outbox.config.check_kafka_properties()
    role = getattr(args, "worker_role", None)
    _setup_logging(fleet.log_level, f"[w{role.index}] " if role is not None else "")
    for note in fleet.notes:
        log.log(note.level, "%s", note.message)
    return fleet


def _run_fleet(args: argparse.Namespace, signals: StopSignals, flags: dict[str, Any], fleet: Any) -> int:
    from harvest_outbox.producer.fleet.run import run_fleet

    _said_starting(fleet, "a fleet")
    return run_fleet(
        fleet, lambda: _load_fleet(args, flags, again=True), signals.attach, signals.requested, args.worker_role
    )


def _run_workers(args: argparse.Namespace, signals: StopSignals, flags: dict[str, Any], fleet: Any) -> int:
    from harvest_outbox.producer.fleet.run import run_workers

    _said_starting(fleet, f"a fleet of {fleet.options.workers} worker processes")
    return run_workers(
        fleet, args.argv, lambda: _load_fleet(args, flags, again=True), signals.attach, signals.requested
    )


def _worker_role(args: argparse.Namespace) -> Any:
    """This process's place among a supervisor's workers (``--fleet-worker``), or None."""
    if args.fleet_worker is None:
        return None
    from harvest_outbox.producer.fleet.workers import WorkerRole

    try:
        return WorkerRole.parse(args.fleet_worker, args.fleet_worker_port_file)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _said_starting(fleet: Any, what: str) -> None:
    n = len(fleet.discoveries)
    log.info(
        "harvest %s starting %s: %d listed outbox(es), %d discovery entr%s",
        producer.__version__,
        what,
        len(fleet.listed),
        n,
        "y" if n == 1 else "ies",
    )


def _init_db(args: argparse.Namespace) -> int:
    from harvest_outbox.producer.db import connect
    from harvest_outbox.producer.layouts.choice import init_layout
    from harvest_outbox.producer.relay.two_phase import TWO_PHASE_FIX, notify_breaks_two_phase, prepared_transactions
    from harvest_outbox.producer.schema import OutboxNames, unrelayed_rows
    from harvest_outbox.producer.schema.ddl import init_db

    cfg = _load(args, kafka=False)
    if args.print_grants:
        return _print_grants(args, cfg)
    for flag in _GRANT_FLAGS:
        if getattr(args, flag.lstrip("-").replace("-", "_")) is not None:
            raise ConfigError(
                f"init-db: {flag} names a role of --print-grants' SQL; add --print-grants (it creates nothing)"
            )
    if args.migrate:
        return _migrate(cfg, args.online)
    if args.online:
        raise ConfigError("init-db: --online is a way to --migrate; add --migrate (docs/migrating.md)")
    with connect(cfg.harvest.data_source) as conn:
        layout, why_mark = init_layout(
            conn, OutboxNames.parse(cfg.harvest.outbox_table, cfg.harvest.table_mapping), cfg.harvest
        )
        names = init_db(
            conn,
            cfg.harvest.outbox_table,
            args.value_type,
            cfg.harvest.shards,
            cfg.harvest.table_mapping,
            layout=layout.name,
            wakeup=cfg.harvest.wakeup_mode,
        )
        risk = None if cfg.harvest.wakeup else notify_breaks_two_phase(prepared_transactions(conn), names.display)
        fix = layout.storage_note(conn, names)
        earlier = unrelayed_rows(conn, names)
    sharded = f"; {cfg.harvest.shards} shards" if cfg.harvest.shards > 1 else ""
    wake = (
        "no NOTIFY trigger (wakeup: poll)" if cfg.harvest.wakeup_mode == "poll" else f"NOTIFY channel {names.channel}"
    )
    print(layout.init_summary(names, args.value_type, wake, sharded))
    if why_mark is not None:  # outboxLayout unset, a new outbox: the mark layout, not the default's cursor
        print(
            f"note: the new outbox is in the mark layout because {why_mark} (docs/design.md, Which layout a new outbox gets)"
        )
    if risk is not None:
        # stderr: the line is a warning, and scripts that read init-db's output keep their stdout
        print(f"warning: {risk}; {TWO_PHASE_FIX}", file=sys.stderr)
    if earlier:
        print(
            f"note: {earlier} row(s) were written before the relay's columns existed; harvest leaves them to the "
            f"relay that had the table until now (docs/debezium.md, Migrating)"
        )
    if fix is not None:  # an outbox that existed before (init-db never changes a goharvest table's fillfactor)
        print(f"note: {fix}")
    return EXIT_OK


_GRANT_FLAGS = ("--owner-role", "--relay-role", "--writer-role", "--admin-role", "--reader-role", "--checkpoint-table")


def _print_grants(args: argparse.Namespace, cfg: FileConfig) -> int:
    """``init-db --print-grants``: the SQL of producer/schema/grants.py for the config (its DSN is not read)."""
    from harvest_outbox.producer.layouts.choice import new_outbox_layout
    from harvest_outbox.producer.schema import OutboxNames
    from harvest_outbox.producer.schema.grants import CHECKPOINT_TABLE, RoleNames, grants_script, needs

    if args.migrate:
        raise ConfigError("init-db: --print-grants and --migrate are two runs; print the grants after the migration")
    given = {c: getattr(args, f"{c}_role") for c in ("owner", "relay", "writer", "admin", "reader")}
    roles = RoleNames(**{c: name for c, name in given.items() if name is not None})
    h = cfg.harvest
    names = OutboxNames.parse(h.outbox_table, h.table_mapping)
    # outboxLayout unset: the layout init-db gives a new outbox (this command reads no table)
    layout = h.outbox_layout or new_outbox_layout(h)[0].name
    wanted = needs(
        names,
        layout=layout,
        sequenced=h.uuid_sequencing,
        shards=h.shards,
        checkpoint_table=args.checkpoint_table or CHECKPOINT_TABLE,
    )
    mode = "--uuid-sequencing" if h.uuid_sequencing else "at least once"
    print(
        grants_script(
            wanted,
            roles,
            f"outbox {names.display}, outboxLayout: "
            f"{h.outbox_layout or f'{layout} (unset: a new outbox; set it for an existing table)'}, {mode}, "
            f"shards: {h.shards}",
        ),
        end="",
    )
    return EXIT_OK


def _migrate(cfg: FileConfig, online: bool) -> int:
    from harvest_outbox.producer.db import connect
    from harvest_outbox.producer.layouts.choice import migration_target
    from harvest_outbox.producer.layouts.cursor.migrate import migrate_online, migrate_to_cursor

    migration_target(cfg.harvest)
    h = cfg.harvest
    with connect(h.data_source) as conn:
        if online:
            done = migrate_online(conn, h.outbox_table, shards=h.shards, mapping=h.table_mapping, wakeup=h.wakeup_mode)
        else:
            done = migrate_to_cursor(
                conn, h.outbox_table, shards=h.shards, mapping=h.table_mapping, wakeup=h.wakeup_mode
            )
    print(
        f"outbox {h.outbox_table} migrated to the cursor layout: {done.copied} row(s) copied with ids from "
        f"{done.first_id}; the old table is {done.old_table} (kept: drop it once satisfied)"
        + (
            f"; the swap held the outbox's lock {done.locked_s * 1000:.0f} ms (attempt {done.attempts})"
            if online
            else ""
        )
    )
    return EXIT_OK


def _acls(args: argparse.Namespace) -> int:
    """``harvest acls``: the ACLs of producer/kafka/acls.py for the config (nothing connects)."""
    from harvest_outbox.producer.kafka.acls import Topics, acl_script, reader_acls, relay_acls

    cfg = _load(args, kafka=False)
    h = cfg.harvest
    topics = Topics(tuple(args.topic), tuple(args.topic_prefix))
    acls = relay_acls(
        args.principal,
        topics,
        leader_election=h.leader_election,
        leader_topic=h.leader_topic,
        leader_group=h.leader_group_id,
        legacy=args.kafka_before_3,
    )
    if args.reader_principal:
        acls += reader_acls(args.reader_principal, topics, args.reader_group)
    elif args.reader_group is not None:
        raise ConfigError("acls: --reader-group is the reader's; add --reader-principal")
    neli = h.leader_election == "neli"
    election = f"leaderElection: {h.leader_election}" + (f" (group {h.leader_group_id!r})" if neli else "")
    print(
        acl_script(
            acls,
            f"{election}, {'--uuid-sequencing' if h.uuid_sequencing else 'at least once'}, shards: {h.shards}",
            leader_topic=h.leader_topic if neli else None,
            partitions=h.shards,
        ),
        end="",
    )
    return EXIT_OK


def _check(args: argparse.Namespace) -> int:
    from harvest_outbox.producer.db import connect
    from harvest_outbox.producer.ops._check import exit_code
    from harvest_outbox.producer.ops._privileges import check_outbox_and_role

    if args.file and args.outbox is None:
        fleet = _load_fleet(args, {})
        if fleet is not None:
            return _check_fleet(args, fleet)
    cfg = _load(args, kafka=args.kafka)
    with connect(cfg.harvest.data_source) as conn:
        findings = check_outbox_and_role(conn, cfg.harvest)
    if args.kafka:
        findings.append(_kafka_finding(cfg.harvest.base_kafka_config))
    for finding in findings:
        print(printable(finding.line()))
    levels = [f.level for f in findings]
    print(f"{levels.count('OK')} OK, {levels.count('WARN')} WARN, {levels.count('FAIL')} FAIL")
    return exit_code(findings)


def _check_fleet(args: argparse.Namespace, fleet: Any) -> int:
    """``harvest check -f fleet.yaml``: every outbox of the fleet, each line prefixed with its id; the
    exit code of the worst finding."""
    from harvest_outbox.producer.db import connect
    from harvest_outbox.producer.errors import DatabaseError
    from harvest_outbox.producer.fleet.discovery import every_outbox
    from harvest_outbox.producer.ops._check import Finding, exit_code
    from harvest_outbox.producer.ops._privileges import check_outbox_and_role

    everything: list[Finding] = []
    outboxes = every_outbox(fleet)
    for oid, outbox in sorted(outboxes.items()):
        try:
            with connect(outbox.config.data_source) as conn:
                findings = check_outbox_and_role(conn, outbox.config)
        except DatabaseError as exc:
            findings = [Finding("FAIL", "database", str(exc), "check the outbox's dataSource and the server")]
        for finding in findings:
            print(printable(f"{oid}: {finding.line()}"))
        everything += findings
    if args.kafka and outboxes:
        finding = _kafka_finding(next(iter(outboxes.values())).config.base_kafka_config)
        print(printable(finding.line()))
        everything.append(finding)
    levels = [f.level for f in everything]
    print(
        f"{len(outboxes)} outbox(es): {levels.count('OK')} OK, {levels.count('WARN')} WARN, {levels.count('FAIL')} FAIL"
    )
    return exit_code(everything)


def _kafka_finding(base: Mapping[str, Any]) -> Finding:
    """``harvest check --kafka``: the relay's start-up check of its Kafka connection, as a finding."""
    from harvest_outbox.producer.errors import KafkaSecurityError
    from harvest_outbox.producer.kafka.probe import check_connection
    from harvest_outbox.producer.ops._check import Finding

    servers = base.get("bootstrap.servers", "")
    protocol = base.get("security.protocol", "PLAINTEXT")
    try:
        answered = check_connection(base, what="the relay")
    except KafkaSecurityError as exc:
        return Finding("FAIL", "kafka", str(exc))
    if not answered:
        return Finding(
            "FAIL",
            "kafka",
            f"no answer from {servers} within 5s ({protocol})",
            "check bootstrap.servers and that the brokers run and are reachable from here",
        )
    return Finding("OK", "kafka", f"{servers} answered over {protocol} with baseKafkaConfig's settings")


def _shards(args: argparse.Namespace) -> int:
    from harvest_outbox.producer.observe.shard_status import format_status, shard_status

    cfg = _load(args, {"bootstrap_servers": args.bootstrap_servers})
    print(format_status(shard_status(cfg.harvest)))
    return EXIT_OK


def _dead_letters(args: argparse.Namespace) -> int:
    return cli_deadletters.run(args, _load, printable)


def main(argv: Sequence[str] | None = None) -> int:
    signals = StopSignals(forced_exit=EXIT_FORCED).install()  # first: `harvest run` may be stopped at once
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in _COMMANDS and argv[0] not in ("-h", "--help", "--version"):
        argv = ["run", *argv]  # goharvest's reaper: `harvest -f harvest.yaml`
    try:
        args = build_parser().parse_args(argv)
        args.argv = argv  # a fleet's supervisor starts its workers with these
        if args.command != "run":
            signals.release()  # the other commands are short: a signal ends them as it would any process
    except SystemExit:
        signals.release()
        raise
    if args.command is None:
        build_parser().print_help()
        return EXIT_OK
    try:
        if args.command == "run":
            return _run(args, signals)
        if args.command == "init-db":
            return _init_db(args)
        if args.command == "acls":
            return _acls(args)
        if args.command == "check":
            return _check(args)
        if args.command == "shards":
            return _shards(args)
        return _dead_letters(args)
    except ConfigError as exc:
        print(f"harvest: configuration error: {_redacted(str(exc), args)}", file=sys.stderr)
        return EXIT_USAGE
    except HarvestError as exc:
        cause = str(exc.__cause__ or "").strip()
        cause = f" (caused by: {cause})" if cause and cause not in str(exc) else ""
        print(f"harvest: error: {_redacted(str(exc) + cause, args)}", file=sys.stderr)
        return EXIT_FAILURE


def _redacted(text: str, args: argparse.Namespace) -> str:
    """``text`` without the DSN's or the Kafka config's secrets (whatever of them is known by now)."""
    cfg: FileConfig | None = getattr(args, "loaded_config", None)
    dsn = cfg.harvest.data_source if cfg else (args.data_source or os.environ.get("HARVEST_DATA_SOURCE"))
    secrets: tuple[str, ...] = ()
    if cfg is not None:
        secrets = tuple(
            str(v)
            for conf in (cfg.harvest.base_kafka_config, cfg.harvest.producer_kafka_config)
            for k, v in conf.items()
            if is_secret_kafka_key(k)
        )
        # the endpoint's and the registry's basic-auth passwords (user:password), whole and alone
        registry = cfg.harvest.serialization.registry
        for auth in (cfg.harvest.prometheus_basic_auth, registry.basic_auth if registry else ""):
            if auth:
                secrets += (auth, auth.partition(":")[2])
    return " ".join(redact_error(text, dsn, secrets).split())  # one line


if __name__ == "__main__":
    sys.exit(main())
