"""Least privilege on real Postgres (producer/schema/grants.py): every component, run as its own LOGIN role with
exactly the grants ``harvest init-db --print-grants`` prints, does its work -- the owner runs ``init-db``, a
stasher writes as the writer, the relay drains as the relay, a poison row dead-lettered (the mark layout at least once; the cursor layout
with ``--uuid-sequencing`` and haltKey, a held row released after its dead letter's requeue; the mark layout
with two shards, sequenced, haltKey; the cursor layout with two shards), all with the Postgres-lock election, the
dead-letter verbs list, keys, export, requeue and discard as the admin, a reader keeps its checkpoints as
the reader -- and each is refused what lies outside its grants: the relay cannot drop the mark layout's outbox,
drop or truncate a companion table or read a table not granted; the writer cannot read or delete the outbox's
rows. ``harvest check``'s privileges finding on these roles: tests/test_producer/ops/test_privileges.py.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterator

import psycopg
import pytest
from grantlib import Roles, checkpoint_table, granted_outbox, login_roles
from psycopg import sql
from relaylib import consume_all, covers, relay_config
from seqcheck import wait_for

from harvest_outbox.consumer import PostgresCheckpointStore
from harvest_outbox.producer.layouts.choice import layout_for
from harvest_outbox.producer.layouts.cursor.schema import range_partitions
from harvest_outbox.producer.ops._deadletter_admin import Selection, discard, export, stuck_keys
from harvest_outbox.producer.ops._deadletters import list_dead_letters, requeue
from harvest_outbox.producer.relay.sharded import relay_for
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher
from harvest_outbox.sequencer import ProducerState, decode_checkpoint, encode_checkpoint

pytestmark = pytest.mark.integration

DENIED = psycopg.errors.InsufficientPrivilege
#: A topic the broker does not have (nor creates): the relay dead-letters its rows (missingTopicPolicy: deadLetter).
POISON = "harvest-grants-no-such-topic"


@pytest.fixture
def roles(pg_dsn: str, pg_schema: str, unique_name: Callable[[str], str]) -> Iterator[Roles]:
    with login_roles(pg_dsn, unique_name("r")) as made:
        yield made


def _refused(dsn: str, statement: sql.Composable) -> str:
    """The error text of ``statement`` run as ``dsn``'s role (it must be refused for lack of a privilege)."""
    with psycopg.connect(dsn, autocommit=True) as conn, pytest.raises(DENIED) as refused:
        conn.execute(statement)
    return str(refused.value)


def _dead_letters(pg_dsn: str, names: OutboxNames) -> list[str]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        return [k for (k,) in conn.execute(sql.SQL("SELECT kafka_key FROM {} ORDER BY id").format(names.dead_letters))]


def _backlog(pg_dsn: str, names: OutboxNames, layout: str) -> int:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        return layout_for(layout).backlog(conn, names)


@pytest.mark.parametrize(
    ("layout", "sequenced", "shards", "policy"),
    [
        ("mark", False, 1, "skip"),
        ("cursor", True, 1, "haltKey"),
        ("mark", True, 2, "haltKey"),
        ("cursor", False, 2, "skip"),
    ],
    ids=["mark-at-least-once", "cursor-sequenced-haltKey", "mark-sequenced-2-shards-haltKey", "cursor-2-shards"],
)
def test_each_component_works_as_its_role_and_is_refused_the_rest(
    layout: str,
    sequenced: bool,
    shards: int,
    policy: str,
    pg_dsn: str,
    pg_schema: str,
    roles: Roles,
    kafka_bootstrap: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    table = f"{pg_schema}.outbox"
    names = granted_outbox(pg_dsn, roles, table, layout=layout, sequenced=sequenced, shards=shards)
    topic = topic_factory(partitions=2)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # a table of the application's, granted to nobody
        conn.execute(sql.SQL("CREATE TABLE {} (secret text)").format(sql.Identifier(pg_schema, "payroll")))
        # a dead letter for the admin, parked by an earlier relay (id 0: before every row the writer adds);
        # under haltKey its key's later row waits for it (the mark layout: in the outbox; the cursor's: held)
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (id, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values, "
                "error, attempts) VALUES (0, %s, 'dead', 'again', '{{}}', '{{}}', 'broker said no', 3)"
            ).format(names.dead_letters),
            (topic,),
        )

    # the writer: both stasher paths (RETURNING id; COPY), and nothing more
    writer = Stasher(table)
    with psycopg.connect(roles.dsn("writer")) as conn:
        assert writer.stash(conn, OutboxRecord(topic, "dead", "after")) > 0
        writer.stash_many(conn, [OutboxRecord(topic, f"k{i % 3}", f"v{i}") for i in range(20)])
        writer.stash(conn, OutboxRecord(POISON, "poison", "never sent"))  # the relay dead-letters it
    assert "permission denied" in _refused(
        roles.dsn("writer"), sql.SQL("SELECT kafka_value FROM {}").format(names.outbox)
    )
    _refused(roles.dsn("writer"), sql.SQL("DELETE FROM {}").format(names.outbox))
    _refused(roles.dsn("writer"), sql.SQL("SELECT * FROM {}").format(names.dead_letters))

    # the relay, as its role, with the Postgres-lock election
    cfg = (
        relay_config(roles.dsn("relay"), kafka_bootstrap, table, unique_name("g"))
        .replace(leader_election="postgres", leader_lock_check_interval=0.2, uuid_sequencing=sequenced)
        .replace(outbox_layout=layout, shards=shards, dead_letter_policy=policy)
    )
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        ahead = range_partitions(conn, names)[-1][1] if layout == "cursor" else 0
    writes = {f"k{k}": [f"v{i}".encode() for i in range(k, 20, 3)] for k in range(3)}
    everything = {**writes, "dead": [b"again", b"after"]}
    relay = relay_for(cfg, lambda e: None)
    relay.start()
    try:
        consume_all(kafka_bootstrap, topic, covers(writes), timeout=30)
        wait_for(lambda: len(_dead_letters(pg_dsn, names)) == 2, 30, "the poison row dead-lettered")

        # the admin: list, keys, export, requeue (the relay delivers it, then its key's row), discard
        with psycopg.connect(roles.dsn("admin"), autocommit=True) as conn:
            assert [d.kafka_key for d in list_dead_letters(conn, table)] == ["dead", "poison"]
            assert {(k.topic, k.key) for k in stuck_keys(conn, table)} == {(topic, "dead"), (POISON, "poison")}
            assert export(conn, table, Selection(), io.StringIO()) == 2
            assert requeue(conn, table, [0], keep_ids=policy == "haltKey") == 1  # as the CLI does
            assert [d.kafka_key for d in list_dead_letters(conn, table)] == ["poison"]
        got = consume_all(kafka_bootstrap, topic, covers(everything), timeout=30)
        wait_for(lambda: _backlog(pg_dsn, names, layout) == 0, 30, "every row relayed")
    finally:
        relay.stop()
        relay.wait(30)
    records = [(g.key, g.value) for g in got if g.key]  # --uuid-sequencing's ACKs have no key
    assert covers(everything)(got) and len(set(records)) == 22
    if policy == "haltKey":  # the requeued dead letter went first, then the row its key held back
        assert [v for k, v in records if k == "dead"][:2] == [b"again", b"after"], records
    # nothing refused on the way (a meter query or partition maintenance is logged, then tried again)
    complaints = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING
        and r.name.startswith("harvest_outbox.producer")  # not librdkafka's
        and POISON not in r.getMessage()  # the poison row's own, expected
    ]
    assert not complaints, complaints

    with psycopg.connect(roles.dsn("admin"), autocommit=True) as conn:
        assert [(t, k) for _, t, k in discard(conn, table, Selection(key="poison"), "test")] == [(POISON, "poison")]
        assert list_dead_letters(conn, table) == []

    # what the relay may not do
    assert "permission denied" in _refused(
        roles.dsn("relay"), sql.SQL("SELECT * FROM {}").format(sql.Identifier(pg_schema, "payroll"))
    )
    _refused(roles.dsn("relay"), sql.SQL("DROP TABLE {}").format(names.dead_letters))
    _refused(roles.dsn("relay"), sql.SQL("TRUNCATE {}").format(names.delivery_attempts))
    if layout == "cursor":  # partition maintenance ran as the relay: it owns the outbox
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            assert range_partitions(conn, names)[-1][1] > ahead
    else:
        assert "must be owner" in _refused(roles.dsn("relay"), sql.SQL("DROP TABLE {}").format(names.outbox))
    # the admin and the reader neither
    _refused(roles.dsn("admin"), sql.SQL("DELETE FROM {}").format(names.outbox))
    _refused(roles.dsn("reader"), sql.SQL("SELECT * FROM {}").format(names.outbox))

    # the reader's checkpoint store
    store = PostgresCheckpointStore("billing", schema=pg_schema)
    cp = encode_checkpoint({f"{topic}/0": 10}, [ProducerState(f"{topic}/0", bytes(6), 160, -1)])
    with psycopg.connect(roles.dsn("reader")) as conn:
        store.save(conn, cp)
        conn.commit()
        assert decode_checkpoint(store.load(conn)) == decode_checkpoint(cp)
        store.delete(conn)
    assert checkpoint_table(table).endswith("harvest_consumer_checkpoints")
