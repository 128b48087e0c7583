"""The light path by default (issue #47, item 5): ``outboxLayout`` unset follows the table and gives a new
outbox the cursor layout (producer/layouts/choice.py), and ``harvest init-db --migrate --online`` moves a
mark-layout outbox to the cursor layout while writers write and a relay runs (producer/layouts/cursor/migrate.py,
producer/relay/layout_change.py; docs/migrating.md).

Pure: which layout a new outbox gets and why, what an unset, an explicit and a refused ``outboxLayout`` do with
``--migrate``, which relay errors restart a relay on the new layout, the CLI's usage errors. On Postgres:
``init-db`` through the CLI (a new outbox in the cursor layout, goharvest's existing table kept as it is, a
config the cursor layout refuses given the mark layout with the reason), an online attempt that cannot take the
lock or would copy too many rows changing nothing, a second migration refused, and the migrated table refusing
a mark relay's statements as :class:`~producer.errors.LayoutChanged`. The scenario (Postgres + Kafka,
``--uuid-sequencing``): three writers commit throughout, a relay with ``outboxLayout`` unset relays the mark
layout, a burst is waiting when the online migration swaps the tables, the relay stops on the swap and starts
again on the cursor layout (as ``harvest run`` does), and the readers see every committed row exactly once, in
per-key commit order; the writers' longest commit during the swap is measured and bounded.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from relaylib import assert_per_key_order, consume_all, covers, relay_config
from seqcheck import Expected, check_exactly_once, read_intents, stash_or_roll_back, wait_for

from harvest_outbox.producer.config import HarvestConfig
from harvest_outbox.producer.errors import ConfigError, DatabaseError, HarvestError, LayoutChanged, SchemaError
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.layouts.choice import CURSOR, MARK, migration_target, new_outbox_layout
from harvest_outbox.producer.layouts.cursor.database import cursor_backlog
from harvest_outbox.producer.layouts.cursor.migrate import migrate_online
from harvest_outbox.producer.layouts.mark.database import MarkDatabase
from harvest_outbox.producer.mapping.table import table_mapping
from harvest_outbox.producer.ops.cli import main
from harvest_outbox.producer.relay.layout_change import layout_changed, restarts_on, run_following_layout
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

log = logging.getLogger(__name__)
PARTITION_IDS = 1000
DEBEZIUM = table_mapping("debezium", None, "tableMapping")


# ---------------------------------------------------------------------------- the default (no services)
@pytest.mark.parametrize(
    ("settings", "server", "layout", "why"),
    [
        ({}, None, CURSOR, None),
        ({}, 150000, CURSOR, None),
        ({}, 120000, MARK, "the server is Postgres 12, the cursor layout needs 13 or later"),
        ({"missing_topic_policy": "hold"}, 150000, MARK, "does not support missingTopicPolicy: hold"),
        ({"dead_letter_policy": "haltKey"}, 150000, CURSOR, None),
        (
            {"dead_letter_policy": "haltKey", "table_mapping": DEBEZIUM},
            150000,
            MARK,
            "does not support deadLetterPolicy: haltKey with tableMapping: debezium",
        ),
    ],
    ids=["default", "pg15", "pg12", "hold", "halt-key", "halt-key-debezium"],
)
def test_a_new_outbox_gets_the_cursor_layout_unless_the_config_or_server_cannot_have_it(
    settings: dict[str, object], server: int | None, layout: object, why: str | None
) -> None:
    config = HarvestConfig(**settings)  # type: ignore[arg-type]
    assert config.outbox_layout is None  # unset: accepted whatever the cursor layout refuses
    got, reason = new_outbox_layout(config, server)
    assert got is layout
    if why is None:
        assert reason is None
    else:
        assert reason is not None and why in reason


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({}, None),
        ({"outbox_layout": "cursor"}, None),
        ({"outbox_layout": "mark"}, "outboxLayout: mark is the layout migrated from"),
        ({"missing_topic_policy": "hold"}, "does not support missingTopicPolicy: hold"),
    ],
    ids=["unset", "cursor", "mark", "unset-hold"],
)
def test_migrate_moves_to_the_cursor_layout_named_or_unset(settings: dict[str, object], error: str | None) -> None:
    config = HarvestConfig(**settings)  # type: ignore[arg-type]
    if error is None:
        assert migration_target(config) is CURSOR
    else:
        with pytest.raises(ConfigError, match=error):
            migration_target(config)


def _chained(inner: BaseException) -> HarvestError:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise HarvestError("relay r failed") from exc
    except HarvestError as outer:
        return outer


@pytest.mark.parametrize(
    ("error", "layout", "changed", "restarts"),
    [
        (LayoutChanged("purge refused"), None, True, True),
        (_chained(LayoutChanged("mark refused")), None, True, True),
        (_chained(_chained(LayoutChanged("sharded"))), None, True, True),
        (_chained(LayoutChanged("mark refused")), "mark", True, False),
        (_chained(DatabaseError("connection lost")), None, False, False),
        (_chained(SchemaError("no table")), None, False, False),
    ],
    ids=["direct", "chained", "sharded", "explicit-mark", "database", "schema"],
)
def test_only_a_layout_change_restarts_a_relay_and_only_with_the_layout_unset(
    error: BaseException, layout: str | None, changed: bool, restarts: bool
) -> None:
    config = HarvestConfig(outbox_layout=layout)
    assert (layout_changed(error) is not None) is changed
    assert restarts_on(error, config) is restarts


def test_the_layout_is_unset_by_default_and_validated_when_set() -> None:
    assert HarvestConfig().outbox_layout is None
    assert HarvestConfig.from_mapping({}).outbox_layout is None
    assert HarvestConfig.from_mapping({"outboxLayout": "mark"}).outbox_layout == "mark"
    with pytest.raises(ConfigError, match=r"'Cursor' is not a layout.*or leave it unset"):
        HarvestConfig.from_mapping({"outboxLayout": "Cursor"})


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--online"], "--online is a way to --migrate; add --migrate"),
        (["--migrate", "--print-grants"], "--print-grants and --migrate are two runs"),
        (["--migrate", "--online", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ],
    ids=["online-alone", "migrate-grants", "unknown-flag"],
)
def test_init_db_usage_errors(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before any connection (the DSN names no server)."""
    path = tmp_path / "h.yaml"
    path.write_text('harvest:\n  dataSource: "host=/nonexistent dbname=x"\n  outboxTable: app.outbox\n')
    try:
        code = main(["init-db", "-f", str(path), *argv])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code  # type: ignore[assignment]
    assert code == 2
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------------------- init-db, the migration's guards (Postgres)
def _yaml(tmp_path: Path, pg_dsn: str, table: str, extra: str = "") -> str:
    path = tmp_path / f"{uuid.uuid4().hex}.yaml"
    path.write_text(f'harvest:\n  dataSource: "{pg_dsn}"\n  outboxTable: {table}\n{extra}')
    return str(path)


def _relkind(pg_dsn: str, table: str) -> str:
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("SELECT relkind::text FROM pg_class WHERE oid = to_regclass(%s)", (table,)).fetchone()
    return str(row[0]) if row else ""


@pytest.mark.integration
def test_init_db_gives_a_new_outbox_the_cursor_layout_and_keeps_an_existing_tables(
    pg_dsn: str, pg_schema: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new, old, held = f"{pg_schema}.fresh", f"{pg_schema}.goharvest", f"{pg_schema}.held"
    assert main(["init-db", "-f", _yaml(tmp_path, pg_dsn, new)]) == 0
    assert "ready in the cursor layout" in capsys.readouterr().out and _relkind(pg_dsn, new) == "p"
    init_db(pg_dsn, old)  # goharvest's table, as a goharvest deployment has it
    assert main(["init-db", "-f", _yaml(tmp_path, pg_dsn, old)]) == 0  # unchanged: still goharvest's table
    assert "cursor layout" not in capsys.readouterr().out and _relkind(pg_dsn, old) == "r"
    assert main(["init-db", "-f", _yaml(tmp_path, pg_dsn, held, "  missingTopicPolicy: hold\n")]) == 0
    out = capsys.readouterr().out
    assert "note: the new outbox is in the mark layout because the cursor layout does not support " in out
    assert "missingTopicPolicy: hold" in out and _relkind(pg_dsn, held) == "r"
    # an explicit layout that disagrees with the table is refused, with the fix
    assert main(["init-db", "-f", _yaml(tmp_path, pg_dsn, old, "  outboxLayout: cursor\n")]) == 1
    assert "harvest init-db --migrate" in capsys.readouterr().err
    # a relay with the layout unset opens the layout the table has
    for table, layout in ((old, MARK), (new, CURSOR)):
        relay = Harvest(HarvestConfig(data_source=pg_dsn, outbox_table=table), lambda e: None)
        try:
            relay.core.open()
            assert relay.core.layout is layout
        finally:
            relay.core.close()
    # unset, the detected layout refuses what it cannot keep, naming the table's layout
    with pytest.raises(ConfigError, match=r"is in the cursor layout: outboxLayout: cursor does not support"):
        relay = Harvest(
            HarvestConfig(data_source=pg_dsn, outbox_table=new, missing_topic_policy="hold"), lambda e: None
        )
        relay.core.open()


@pytest.mark.integration
def test_an_online_attempt_that_cannot_lock_or_would_copy_too_much_changes_nothing(pg_dsn: str, pg_schema: str) -> None:
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        Stasher(table).stash_many(conn, [OutboxRecord("t", f"k{i}", f"v{i}") for i in range(30)])
        with pytest.raises(SchemaError, match=r"after \d+ attempt\(s\): more than the 20 unrelayed rows"):
            migrate_online(conn, table, max_rows=20, give_up_after=0.3, pause=0.1)
        with psycopg.connect(pg_dsn) as holder:  # a transaction that holds the outbox's lock
            holder.execute(sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(names.outbox))
            began = time.monotonic()
            with pytest.raises(
                SchemaError, match=r"the outbox's, or a companion table's\) was not free within 50 ms.*nothing changed"
            ):
                migrate_online(conn, table, lock_wait_ms=50, give_up_after=0.3, pause=0.1)
            assert time.monotonic() - began < 2.0
        assert _relkind(pg_dsn, table) == "r"  # still goharvest's table, rows and all
        assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(names.outbox)).fetchone() == (30,)
        done = migrate_online(conn, table, partition_ids=PARTITION_IDS)
        assert (done.copied, done.attempts) == (30, 1) and _relkind(pg_dsn, table) == "p"
        with pytest.raises(SchemaError, match="already in the cursor layout"):
            migrate_online(conn, table)
        # a mark relay's statements on the migrated table: refused, as LayoutChanged
        db = MarkDatabase(pg_dsn, names)
        try:
            with pytest.raises(LayoutChanged, match="in the cursor layout"):
                db.mark_with_attempts(uuid.uuid4(), 10)
            with pytest.raises(LayoutChanged):
                db.purge([1, 2])
        finally:
            db.close()


# ---------------------------------------------------------------------------- the scenario (Postgres + Kafka)
class _Writer(threading.Thread):
    """Commits transactions of 1-4 rows of its own keys (one in eight rolled back) until stopped, timing
    each commit: the longest is how long the migration blocked it."""

    def __init__(self, n: int, dsn: str, table: str, topic: str, exp: Expected) -> None:
        super().__init__(name=f"writer-{n}")
        self.n, self.dsn, self.table, self.topic, self.exp = n, dsn, table, topic, exp
        self.stop = threading.Event()
        self.timings: list[tuple[float, float]] = []  # (start, seconds)
        self.failure: BaseException | None = None

    def run(self) -> None:
        st, seq = Stasher(self.table), 0
        try:
            with psycopg.connect(self.dsn) as conn:
                while not self.stop.is_set():
                    batch = [
                        OutboxRecord(self.topic, f"w{self.n}-k{(seq + i) % 7}", f"w{self.n}-{seq + i}")
                        for i in range(1 + seq % 4)
                    ]
                    seq += len(batch)
                    began = time.monotonic()
                    if stash_or_roll_back(conn, st, batch, seq % 8 == 0, self.exp):
                        self.timings.append((began, time.monotonic() - began))
                        time.sleep(0.005)
        except BaseException as exc:  # fails the test
            self.failure = exc


class _Relays(threading.Thread):
    """``harvest run`` (producer/ops/cli.py): :func:`run_following_layout` on one relay; ``stop()`` is the
    signal handler's."""

    def __init__(self, config: HarvestConfig) -> None:
        super().__init__(name="relays")
        self.config = config
        self.stopped = threading.Event()
        self.started: list[Harvest] = []
        self.failure: BaseException | None = None

    def _attach(self, relay: object) -> None:
        assert isinstance(relay, Harvest)
        self.started.append(relay)
        if self.stopped.is_set():
            relay.stop()

    def run(self) -> None:
        try:
            run_following_layout(self.config, lambda c: Harvest(c, lambda e: None), self._attach, self.stopped)
        except BaseException as exc:  # fails the test
            self.failure = exc

    def stop(self) -> None:
        self.stopped.set()
        if self.started:
            self.started[-1].stop()


@pytest.mark.integration
@pytest.mark.parametrize("sequenced", [True, False], ids=["sequenced", "at-least-once"])
def test_an_online_migration_under_writers_and_a_running_relay_delivers_every_row(
    sequenced: bool,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    topic = topic_factory(partitions=4)
    table = f"{pg_schema}.outbox"
    names = init_db(pg_dsn, table)  # goharvest's table
    config = relay_config(
        pg_dsn,
        kafka_bootstrap,
        table,
        unique_name("g"),
        mark_query_records=200,
        txn_max_records=100,
        txn_max_duration=0.02,
        producer_ring=4,
    ).replace(uuid_sequencing=sequenced, leader_election="postgres", leader_lock_check_interval=0.2)
    assert config.outbox_layout is None
    exp = Expected()
    writers = [_Writer(n, pg_dsn, table, topic, exp) for n in range(3)]
    relays = _Relays(config)
    relays.start()
    try:
        wait_for(lambda: bool(relays.started) and relays.started[0].is_leader, 30, "the mark relay leads")
        for w in writers:
            w.start()
        wait_for(lambda: exp.total >= 150, 30, "writers under way")
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            # a burst the relay has not drained yet when the swap comes: rows copied under the lock
            burst = [OutboxRecord(topic, f"burst-k{i % 11}", f"burst-{i}") for i in range(3000)]
            with conn.transaction():
                Stasher(table).stash_many(conn, burst)
            for r in burst:
                exp.by_key.setdefault(r.key, []).append(r.value.encode())  # type: ignore[union-attr]
            began = time.monotonic()
            done = migrate_online(conn, table, partition_ids=PARTITION_IDS)
            ended = time.monotonic()
        wait_for(lambda: len(relays.started) == 2 and relays.started[1].is_leader, 60, "the relay restarted, leading")
        wait_for(lambda: exp.total >= 3000 + 600, 30, "writers go on into the new table")
        for w in writers:
            w.stop.set()
        for w in writers:
            w.join()
        assert not [w.failure for w in writers if w.failure], "a writer failed"
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            wait_for(lambda: cursor_backlog(conn, names) == 0, 60, "every row relayed from the new table")
        if sequenced:
            wait_for(lambda: not read_intents(pg_dsn, table), 60, "ACK intents confirmed")
    finally:
        for w in writers:
            w.stop.set()
        relays.stop()
        relays.join(60)
    # the mark relay stopped on the swap (and only it), its successor ran the cursor layout until stopped
    assert relays.failure is None and len(relays.started) == 2, relays.failure
    with pytest.raises(HarvestError) as first:
        relays.started[0].wait(0)
    assert restarts_on(first.value, config) and relays.started[1].wait(0)
    assert relays.started[0].core.layout is MARK and relays.started[1].core.layout is CURSOR
    assert 0 < done.copied <= 3000 + exp.total
    during = [s for w in writers for b, s in w.timings if b <= ended and b + s >= began]
    longest = max(s for w in writers for _b, s in w.timings)
    log.warning(
        "online migration: %d rows copied, lock %.1f ms (%d attempt(s)); longest writer commit %.1f ms "
        "(%.1f ms among the %d overlapping the swap); %d rows committed",
        done.copied,
        done.locked_s * 1000,
        done.attempts,
        longest * 1000,
        max(during, default=0) * 1000,
        len(during),
        exp.total,
    )
    # the bound: 100 ms of lock wait plus the swap (40-602 ms in 17 runs); 5 s leaves room for a saturated machine (at a
    # load average of 40 on the 2 cores, the swap alone took 0.3-1.8 s)
    assert longest < 5.0, f"a writer waited {longest:.2f}s"
    with psycopg.connect(pg_dsn) as conn:  # the old table is kept, with its rows
        kept = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(names.qualified("outbox_goharvest"))).fetchone()
    assert kept is not None and kept[0] >= done.copied
    if sequenced:  # exactly once for readers, in per-key commit order
        res = check_exactly_once(kafka_bootstrap, topic, 4, exp)
        assert res.committed == exp.total
    else:  # at least once: none lost, none rolled back, first arrivals in per-key commit order
        got = consume_all(kafka_bootstrap, topic, covers(exp.by_key))  # type: ignore[arg-type]
        assert not {g.value for g in got} & exp.rolled_back
        assert_per_key_order(got, dict(exp.by_key), allow_dups=True)  # type: ignore[arg-type]
