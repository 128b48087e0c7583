"""``harvest dead-letters …`` (alias ``deadletters``): the operator's verbs over the dead-letter table.

    harvest dead-letters list    -f harvest.yaml [filters] [--limit N]
    harvest dead-letters keys    -f harvest.yaml [--limit N]       stuck keys: topic, key, since, reason, rows waiting
    harvest dead-letters export  -f harvest.yaml [filters] [-o FILE]   JSON lines
    harvest dead-letters requeue -f harvest.yaml (ID ... | filters | --all) [--actor NAME]
    harvest dead-letters discard -f harvest.yaml (ID ... | filters | --all) [--actor NAME]

Filters: ``--topic``, ``--key``, ``--reason TEXT`` (in the error, any case), ``--older-than`` /
``--newer-than`` DURATION (``30m``, ``2h``). ``requeue`` and ``discard`` write one audit line each
(who: ``--actor``, else the OS user; what: the ids and keys), as does ``export``.
Under ``deadLetterPolicy: haltKey`` a requeued row gets its original id back, so it goes out before
the rows of its key that waited (docs/dead-letters.md).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from harvest_outbox.producer.errors import ConfigError

MAX_LIST_LIMIT = 1_000_000


def add_parser(sub: Any, common: Any, bounded_int: Any) -> None:
    """The ``dead-letters`` subcommand and its verbs, on ``sub`` (the top-level subparsers)."""
    dl = sub.add_parser(
        "dead-letters", aliases=["deadletters"], help="inspect, requeue, discard or export dead letters"
    )
    verbs = dl.add_subparsers(dest="dl_command", metavar="ACTION", required=True)
    limit = bounded_int("--limit", 1, MAX_LIST_LIMIT)
    ls = verbs.add_parser("list", help="list dead letters (filters narrow the list)")
    keys = verbs.add_parser("keys", help="stuck keys: topic, key, since, reason, rows waiting in the outbox")
    ex = verbs.add_parser("export", help="write dead letters as JSON lines")
    rq = verbs.add_parser("requeue", help="move dead letters back into the outbox")
    dc = verbs.add_parser("discard", help="delete dead letters for good (releases their keys under haltKey)")
    for p in (ls, keys, ex, rq, dc):
        common(p)
    for p in (ls, keys):
        p.add_argument(
            "--limit", type=limit, default=100, help=f"at most this many, 1-{MAX_LIST_LIMIT:,} (default 100)"
        )
    ex.add_argument("-o", "--output", help="file to write (default: standard output)")
    ex.add_argument("--actor", help="who acts, for the audit line (default: the OS user)")
    for p in (rq, dc):
        p.add_argument("ids", nargs="*", type=bounded_int("id", 1, 2**63 - 1), help="dead-letter ids")
        p.add_argument("--all", action="store_true", help="every dead letter (or every one the filters select)")
        p.add_argument("--actor", help="who acts, for the audit line (default: the OS user)")
    for p in (ls, ex, rq, dc):
        p.add_argument("--topic", help="only dead letters of this topic")
        p.add_argument("--key", help="only dead letters with this key")
        p.add_argument("--reason", help="only dead letters whose error contains this text (any case)")
        p.add_argument("--older-than", metavar="DURATION", help="only dead letters parked longer ago, e.g. 1h")
        p.add_argument("--newer-than", metavar="DURATION", help="only dead letters parked within, e.g. 30m")
    rq.add_argument(
        "--bootstrap-servers",
        help="Kafka bootstrap servers (overrides baseKafkaConfig) for the check that the rows' topics exist",
    )
    rq.add_argument(
        "--skip-topic-check", action="store_true", help="requeue without checking that the rows' topics exist in Kafka"
    )


def run(args: argparse.Namespace, load: Any, printable: Any) -> int:
    """Run the verb; 0 on success, 1 when a requeue left rows behind (listed on stderr)."""
    from harvest_outbox.producer.db import connect
    from harvest_outbox.producer.ops import _deadletter_admin as admin

    verb = args.dl_command
    # the arguments first: a usage error is one line, before the config's notes are logged
    sel = _selection(args)
    if verb in ("requeue", "discard"):
        _require_selection(verb, args, sel)
    who = admin.actor(getattr(args, "actor", None)) if verb in ("requeue", "discard", "export") else ""
    asks_kafka = verb == "requeue" and not args.skip_topic_check
    cfg = load(args, {"bootstrap_servers": getattr(args, "bootstrap_servers", None)}, kafka=asks_kafka)
    h = cfg.harvest
    with connect(h.data_source) as conn:
        if verb == "keys":
            stuck = admin.stuck_keys(conn, h.outbox_table, h.table_mapping, args.limit)
            print(f"{'topic':<24} {'key':<20} {'since':<25} {'dead':>5} {'waiting':>8}  reason")
            for k in stuck:
                since = k.since.isoformat(timespec="seconds")
                print(
                    f"{printable(k.topic):<24} {printable(k.key):<20} {since:<25} {k.dead_letters:>5} "
                    f"{k.waiting:>8}  {printable(k.reason)}"
                )
            policy = (
                "halted: their rows wait"
                if h.dead_letter_policy == "haltKey"
                else "not halted (deadLetterPolicy: skip)"
            )
            print(f"{len(stuck)} key(s) with dead letters, {policy}")
            return 0
        if verb == "list":
            return _list(conn, h.outbox_table, sel, args.limit, printable)
        if verb == "export":
            if args.output:
                with open(args.output, "w", encoding="utf-8") as out:
                    n = admin.export(conn, h.outbox_table, sel, out)
            else:
                n = admin.export(conn, h.outbox_table, sel, sys.stdout)
            admin.audit(who, "export", f"{n} dead letter(s) to {args.output or 'standard output'}")
            print(f"exported {n} dead letter(s)", file=sys.stderr)
            return 0
        if verb == "discard":
            gone = admin.discard(conn, h.outbox_table, sel, who, all_rows=True, mapping=h.table_mapping)
            print(f"discarded {len(gone)} dead letter(s)")
            return 0
        return _requeue(conn, h, sel, who, args, printable)


def _selection(args: argparse.Namespace) -> Any:
    from harvest_outbox.producer.config import parse_duration
    from harvest_outbox.producer.ops._deadletter_admin import Selection

    ids = getattr(args, "ids", None) or None
    return Selection(
        ids=tuple(ids) if ids else None,
        topic=getattr(args, "topic", None),
        key=getattr(args, "key", None),
        reason=getattr(args, "reason", None),
        older_than=_duration(parse_duration, getattr(args, "older_than", None), "--older-than"),
        newer_than=_duration(parse_duration, getattr(args, "newer_than", None), "--newer-than"),
    )


def _duration(parse: Any, text: str | None, flag: str) -> float | None:
    return None if text is None else float(parse(text, flag))


def _require_selection(verb: str, args: argparse.Namespace, sel: Any) -> None:
    if args.all and args.ids:
        raise ConfigError(f"dead-letters {verb}: give ids or --all, not both")
    if sel.empty and not args.all:
        raise ConfigError(
            f"dead-letters {verb}: give dead-letter ids or --all, or select with a filter (--topic, --key, "
            f"--reason, --older-than, --newer-than)"
        )


def _list(conn: Any, table: str, sel: Any, limit: int, printable: Any) -> int:
    from harvest_outbox.producer.ops._deadletters import list_dead_letters

    rows = list_dead_letters(conn, table, limit, sel)
    print(f"{'id':>10}  {'attempts':>8}  {'dead since':<25} {'topic':<24} {'key':<20} error")
    for r in rows:
        print(
            f"{r.id:>10}  {r.attempts:>8}  {r.dead_time.isoformat(timespec='seconds'):<25} "
            f"{printable(r.kafka_topic):<24} {printable(r.kafka_key):<20} {printable(r.error)}"
        )
    print(f"{len(rows)} dead letter(s)")
    return 0


def _requeue(conn: Any, h: Any, sel: Any, who: str, args: argparse.Namespace, printable: Any) -> int:
    from harvest_outbox.producer.ops._deadletter_admin import audit, selected_ids
    from harvest_outbox.producer.ops._deadletters import requeue_what_can_be

    ids = None if sel.empty else selected_ids(conn, h.outbox_table, sel)
    if ids == []:
        print("requeued 0 dead letter(s) (none matched)")
        return 0
    kafka = None if args.skip_topic_check else h.base_kafka_config
    keep_ids = h.dead_letter_policy == "haltKey"
    result = requeue_what_can_be(conn, h.outbox_table, ids, kafka, h.table_mapping, keep_ids)
    shown = (
        "all"
        if ids is None
        else ", ".join(map(str, ids[:10])) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
    )
    audit(
        who,
        "requeue",
        f"{result.moved} dead letter(s) moved back to {h.outbox_table} ({'original ids' if keep_ids else 'new ids'}; "
        f"selected: {shown}), {result.left} left",
    )
    print(f"requeued {result.moved} dead letter(s)")
    if not result.held:
        return 0
    print(
        f"harvest: {result.left} dead letter(s) not requeued (they would only be dead-lettered again):", file=sys.stderr
    )
    for group in result.held:
        print(f"  {printable(group)}", file=sys.stderr)
    return 1
