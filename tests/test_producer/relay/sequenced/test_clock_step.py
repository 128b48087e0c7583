"""``--uuid-sequencing``: a leader whose wall clock stepped backwards still stamps rising clocks.

UUID clocks follow the wall clock (``Clock.update(time.time_ns())``); within a view the Clock never
goes back (``update`` is a max), and across views the state row's ``last_clock`` — raised to each
committed transaction's ACK clock by the fenced commit — is the floor every new view starts from.
Here view 1 (a relay on the real clock) commits; then view 2 (another relay, its wall clock two
days behind — an NTP step, a VM restored from a snapshot) commits more. Every clock view 2 stamps
is above every ACK clock of view 1, the state row holds the largest committed ACK clock, and the
whole topic still reads exactly once in per-key order. (Without the floor, view 2's clocks would be
two days behind: a reader's per-journal pruning horizon, 24 h behind the newest commit, would drop
its producers' state as stale, open spans included.)
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg
import pytest
from psycopg import sql
from relaylib import relay_config
from seqcheck import Expected, check_exactly_once, count_rows, wait_for

from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher
from harvest_outbox.sequencer import Flags, clock_of, flags_of, parse_uuid, producer_of

pytestmark = pytest.mark.integration

TWO_DAYS_NS = 2 * 86400 * 10**9


def _stash(dsn: str, table: str, topic: str, exp: Expected, start: int, n: int) -> None:
    recs = [OutboxRecord(topic, f"k{i % 5}", f"v{i}") for i in range(start, start + n)]
    with psycopg.connect(dsn) as conn:
        Stasher(table).stash_many(conn, recs)
    for r in recs:
        exp.by_key.setdefault(r.key, []).append(r.value.encode())  # type: ignore[union-attr]
        exp.headers[r.value.encode()] = []  # type: ignore[union-attr]


def _run_view(cfg, dsn: str, table: str, clock: Callable[[], int] | None) -> None:  # type: ignore[no-untyped-def]
    relay = Harvest(cfg)
    if clock is not None:
        relay.mode.wall_clock_ns = clock  # type: ignore[attr-defined]
    relay.start()
    try:
        wait_for(lambda: count_rows(dsn, table) == 0, 60, "drained")
    finally:
        relay.stop()
        relay.wait(30)


def test_views_keep_clocks_rising_when_the_wall_clock_steps_back(
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic = topic_factory(partitions=2)
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table)
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(uuid_sequencing=True)
    exp = Expected()
    _stash(pg_dsn, table, topic, exp, 0, 60)
    _run_view(cfg, pg_dsn, table, None)
    res1 = check_exactly_once(kafka_bootstrap, topic, 2, exp)
    first_producers = {producer_of(parse_uuid(r.uuid)) for r in res1.raw if r.uuid}
    acks1 = [clock_of(parse_uuid(r.uuid)) for r in res1.raw if r.uuid and flags_of(parse_uuid(r.uuid)) == Flags.ACK_TXN]
    assert acks1
    _stash(pg_dsn, table, topic, exp, 60, 60)
    _run_view(cfg, pg_dsn, table, lambda: time.time_ns() - TWO_DAYS_NS)  # the wall clock stepped back 2 days
    res2 = check_exactly_once(kafka_bootstrap, topic, 2, exp)
    later = [
        clock_of(parse_uuid(r.uuid))
        for r in res2.raw
        if r.uuid and producer_of(parse_uuid(r.uuid)) not in first_producers
    ]
    assert later, "the second view produced nothing"
    assert min(later) > max(acks1), "a later view stamped a clock below an ACK clock readers had already seen"
    all_acks = [
        clock_of(parse_uuid(r.uuid)) for r in res2.raw if r.uuid and flags_of(parse_uuid(r.uuid)) == Flags.ACK_TXN
    ]
    with psycopg.connect(pg_dsn) as conn:
        floor = conn.execute(sql.SQL("SELECT last_clock FROM {}").format(names.state)).fetchone()[0]  # type: ignore[index]
    assert floor == max(all_acks)
