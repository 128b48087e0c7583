"""The relay over the session broker's SASL_SSL listener as a SCRAM principal holding exactly the ACLs
``harvest acls`` prints (producer/kafka/acls.py): every row delivered once (and read by a reader's principal
holding exactly its own); each ACL missing in turn: a
clear error naming it (resource, operation, principal) and the fix, and no row lost or wrongly
dead-lettered; TLS and SASL settings that cannot work refused at start-up within seconds
(producer/kafka/probe.py), never showing the password."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer
from psycopg import sql

from harvest_outbox.harvest_local.kafka import EmbeddedKafka, read_to_end
from harvest_outbox.harvest_local.tls import make_server_files
from harvest_outbox.producer.config import HarvestConfig
from harvest_outbox.producer.errors import HarvestError, KafkaSecurityError
from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.kafka.acls import Acl, Topics, reader_acls, relay_acls
from harvest_outbox.producer.relay.sharded import relay_for
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test_producer"))
from kafka_acls import Principal
from relaylib import relay_config, wait_drained
from seqcheck import Expected, check_exactly_once, write_traffic

pytestmark = pytest.mark.integration


def _config(pg_dsn: str, table: str, principal: Principal, **changes: object) -> HarvestConfig:
    cfg = relay_config(pg_dsn, principal.kafka.bootstrap, table, f"g-{uuid.uuid4().hex[:8]}")
    return cfg.replace(base_kafka_config=principal.client, **changes)


def _acls(cfg: HarvestConfig, principal: Principal, *topics: str) -> list[Acl]:
    return relay_acls(
        principal.name,
        Topics(tuple(topics)),
        leader_election=cfg.leader_election,
        leader_topic=cfg.leader_topic,
        leader_group=cfg.leader_group_id,
    )


def _stash(pg_dsn: str, table: str, rows: list[tuple[str, str, str]]) -> None:
    with psycopg.connect(pg_dsn) as conn:
        Stasher(table).stash_many(conn, [OutboxRecord(t, k, v) for t, k, v in rows])


def _dead_letters(pg_dsn: str, names: OutboxNames) -> list[tuple[str, str]]:
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(sql.SQL("SELECT kafka_topic, error FROM {}").format(names.dead_letters)).fetchall()
    return [(str(t), str(r)) for t, r in rows]


@pytest.mark.parametrize("mode", ["at-least-once, postgres election, shards 1", "uuid-sequencing, NELI, shards 2"])
def test_relay_over_sasl_ssl_with_exactly_the_generated_acls(
    mode: str, secure_kafka: EmbeddedKafka, pg_dsn: str, pg_schema: str
) -> None:
    sequenced = mode.startswith("uuid")
    table, topic = f"{pg_schema}.outbox", f"sasl-{uuid.uuid4().hex[:8]}"
    principal = Principal(secure_kafka)
    cfg = _config(pg_dsn, table, principal).replace(
        uuid_sequencing=sequenced,
        leader_election="neli" if sequenced else "postgres",
        shards=2 if sequenced else 1,
        leader_lock_check_interval=0.2,
    )
    secure_kafka.create_topic(topic, 2)
    if sequenced:
        secure_kafka.create_topic(cfg.leader_topic, 2)  # as `harvest acls` says: created beforehand
    principal.grant(_acls(cfg, principal, topic))
    init_db(pg_dsn, table, shards=cfg.shards)
    exp = Expected()
    if sequenced:
        write_traffic(pg_dsn, table, topic, exp, writer=0, txs=15, max_batch=20)
    else:
        rows = [(topic, f"k{i % 10}", f"v{i}") for i in range(150)]
        _stash(pg_dsn, table, rows)
    relay = relay_for(cfg).start()
    try:
        wait_drained(pg_dsn, table, 60)
    finally:
        relay.stop()
        relay.wait(30)
    names = OutboxNames.parse(table)
    assert _dead_letters(pg_dsn, names) == []
    if sequenced:
        check_exactly_once(secure_kafka.bootstrap, topic, 2, exp)  # every committed row once, per-key order
    else:
        got = [(r.key, r.value) for r in read_to_end(secure_kafka.bootstrap, [topic], 30)]
        assert sorted(got) == sorted((k.encode(), v.encode()) for _t, k, v in rows)  # each row exactly once
        # a reader's principal with exactly its printed ACLs reads them in its group and commits
        reader, group = Principal(secure_kafka), f"readers-{uuid.uuid4().hex[:8]}"
        reader.grant(reader_acls(reader.name, Topics((topic,)), group))
        assert sorted(_read_as(reader, topic, group, len(rows))) == sorted(got)


def _read_as(reader: Principal, topic: str, group: str, count: int) -> list[tuple[bytes | None, bytes | None]]:
    """``count`` records of ``topic`` read by ``reader`` in consumer group ``group``, its offsets committed."""
    consumer = Consumer(
        {**reader.client, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    got: list[tuple[bytes | None, bytes | None]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(got) < count:
            assert time.monotonic() < deadline, f"the reader got {len(got)} of {count} records"
            for m in consumer.consume(500, 0.5):
                assert m.error() is None, m.error()
                got.append((m.key(), m.value()))
        consumer.commit(asynchronous=False)  # READ on the group
    finally:
        consumer.close()
    return got


# ---------------------------------------------------------------------------------------------- one ACL missing
# (acl to drop: (resource, operation, which name), election, a second topic the principal may write, sequenced)
_MISSING = {
    "WRITE on the only topic": ("TOPIC", "WRITE", "topic", "postgres", False, False),
    "WRITE on one topic of two": ("TOPIC", "WRITE", "topic", "postgres", True, False),
    "WRITE on the only topic, uuid-sequencing": ("TOPIC", "WRITE", "topic", "postgres", False, True),
    "WRITE on one topic of two, uuid-sequencing": ("TOPIC", "WRITE", "topic", "postgres", True, True),
    "DESCRIBE_CONFIGS on the topic": ("TOPIC", "DESCRIBE_CONFIGS", "topic", "postgres", False, False),
    "READ on the NELI group": ("GROUP", "READ", "group", "neli", False, False),
    "READ on the leader topic": ("TOPIC", "READ", "leader", "neli", False, False),
    "WRITE on the leader topic": ("TOPIC", "WRITE", "leader", "neli", False, False),
}


@pytest.mark.parametrize("case", list(_MISSING))
def test_each_missing_acl_is_named_with_its_fix_and_no_row_is_lost(
    case: str, secure_kafka: EmbeddedKafka, pg_dsn: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    resource, operation, which, election, two_topics, sequenced = _MISSING[case]
    table, topic, other = f"{pg_schema}.outbox", f"acl-{uuid.uuid4().hex[:8]}", f"acl-ok-{uuid.uuid4().hex[:8]}"
    principal = Principal(secure_kafka)
    cfg = _config(pg_dsn, table, principal).replace(
        leader_election=election, leader_lock_check_interval=0.2, uuid_sequencing=sequenced
    )
    for t in (topic, other) if two_topics else (topic,):
        secure_kafka.create_topic(t)
    if election == "neli":
        secure_kafka.create_topic(cfg.leader_topic)
    acls = _acls(cfg, principal, topic, *((other,) if two_topics else ()))
    target = {"topic": topic, "group": cfg.leader_group_id, "leader": cfg.leader_topic}[which]
    dropped = next(a for a in acls if (a.resource, a.operation, a.name) == (resource, operation, target))
    principal.grant([a for a in acls if a != dropped])
    init_db(pg_dsn, table)
    rows = [(topic, f"k{i % 5}", f"v{i}") for i in range(20)]
    rows += [(other, f"o{i % 5}", f"w{i}") for i in range(20)] if two_topics else []
    _stash(pg_dsn, table, rows)
    names = OutboxNames.parse(table)
    named = [
        dropped.describe(),
        principal.name,
        "kafka-acls.sh",
        f"--operation {dropped.command().split('--operation ')[1]}",
    ]
    relay = Harvest(cfg)
    with caplog.at_level("ERROR"):
        relay.start()
        try:
            if operation == "DESCRIBE_CONFIGS" or two_topics:  # about one topic's rows: the relay carries on
                wait_drained(pg_dsn, table, 30)
                failure = None
            else:
                relay.wait(30)
                failure = None
        except HarvestError as exc:
            failure = str(exc)
        finally:
            relay.stop()
            try:
                relay.wait(30)
            except HarvestError:
                pass
    dead = _dead_letters(pg_dsn, names)
    delivered = {  # (--uuid-sequencing's ACK records have no key: not rows)
        (r.key.decode(), (r.value or b"").decode())
        for r in read_to_end(secure_kafka.bootstrap, [topic, other] if two_topics else [topic], 20)
        if r.key
    }
    with psycopg.connect(pg_dsn) as conn:
        waiting = conn.execute(sql.SQL("SELECT kafka_key, kafka_value FROM {}").format(names.outbox)).fetchall()
    left = len(waiting)
    if operation == "DESCRIBE_CONFIGS":  # the size check is skipped, said once; every row goes out
        assert delivered == {(k, v) for _t, k, v in rows} and not dead
        text = caplog.text
    elif two_topics:  # the principal writes the other topic: this topic's rows alone are dead letters
        assert delivered == {(k, v) for t, k, v in rows if t == other}
        assert sorted(t for t, _ in dead) == [topic] * 20 and left == 0
        text = dead[0][1]
    else:  # the relay stopped: nothing dead-lettered, every row delivered or still in the outbox
        assert failure is not None and not dead
        # (a leader-topic ACL fails after the group made the relay leader: it may have delivered rows meanwhile)
        assert delivered | {(str(k), str(v)) for k, v in waiting} == {(k, v) for _t, k, v in rows}
        assert which == "leader" or left == len(rows)
        text = failure
    assert principal.password not in caplog.text + text + (failure or "")
    for part in named:
        assert part in text, (part, text)


# ---------------------------------------------------------------------------------------------- TLS and SASL
@pytest.fixture
def expired_tls_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A real TLS server on a free port serving an expired certificate (its CA valid): (address, CA)."""
    files = make_server_files(tmp_path / "expired", expired=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(files.cert, files.key)
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            try:
                ctx.wrap_socket(conn, server_side=True).close()
            except (OSError, ssl.SSLError):
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}", files.ca
    stop.set()
    thread.join(5)
    server.close()


def test_tls_and_sasl_settings_that_cannot_work_fail_the_start_at_once_naming_the_fix(
    secure_kafka: EmbeddedKafka, pg_dsn: str, pg_schema: str, tmp_path: Path, expired_tls_server: tuple[str, Path]
) -> None:
    """Scenario: each wrong setting in turn; the relay's start raises within seconds (no database work is
    reached: the check runs first), naming the fix and never the password."""
    principal = Principal(secure_kafka)
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    good = principal.client
    other_ca = make_server_files(tmp_path / "other").ca
    expired_at, expired_ca = expired_tls_server
    cases: list[tuple[str, dict[str, object], Callable[[str], bool]]] = [
        (
            "wrong CA",
            {"ssl.ca.location": str(other_ca)},
            lambda m: f"is not signed by the CA in ssl.ca.location={other_ca}" in m and "set ssl.ca.location" in m,
        ),
        (
            "expired certificate",
            {"bootstrap.servers": expired_at, "ssl.ca.location": str(expired_ca)},
            lambda m: "certificate at " + expired_at + " has expired" in m and "renew it" in m,
        ),
        (
            "wrong SCRAM password",
            {"sasl.password": "not-" + principal.password},
            lambda m: f"SASL authentication failed for user {principal.user!r}" in m and "sasl.password" in m,
        ),
        (
            "plaintext client on the SASL_SSL port",
            {"security.protocol": "PLAINTEXT"},
            lambda m: "speaks TLS" in m and "set security.protocol=SASL_SSL" in m,
        ),
    ]
    for label, change, says in cases:
        settings = {**good, **change}
        if change.get("security.protocol") == "PLAINTEXT":
            settings = {"bootstrap.servers": good["bootstrap.servers"], "security.protocol": "PLAINTEXT"}
        cfg = _config(pg_dsn, table, principal).replace(base_kafka_config=settings, leader_election="postgres")
        began = time.monotonic()
        with pytest.raises(KafkaSecurityError) as caught:
            Harvest(cfg).start()
        took = time.monotonic() - began
        message = str(caught.value)
        assert says(message), (label, message)
        assert took < 5.0, (label, took)
        assert principal.password not in message and "not-" + principal.password not in message, label
    # `harvest run` as a process: exit 1, the explanation on stderr, the password nowhere in its output
    wrong = {**good, "sasl.password": "not-" + principal.password}
    path = tmp_path / "harvest.yaml"
    harvest = {"outboxTable": table, "leaderElection": "postgres", "baseKafkaConfig": wrong}
    path.write_text(json.dumps({"harvest": harvest}))  # (JSON is YAML)
    proc = subprocess.run(
        [sys.executable, "-m", "harvest_outbox.producer", "run", "-f", str(path), "--log-level", "DEBUG"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HARVEST_DATA_SOURCE": pg_dsn},
        stdin=subprocess.DEVNULL,
    )
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and last.startswith("harvest: error: "), proc.stderr[-2000:]
    assert f"SASL authentication failed for user {principal.user!r}" in last and "sasl.password" in last
    assert principal.password not in proc.stdout + proc.stderr
    # `harvest check --kafka` makes the same check before a rollout: a FAIL naming the fix, then OK once right
    for base, level, says in (
        (wrong, "FAIL", f"SASL authentication failed for user {principal.user!r}"),
        (good, "OK", f"{good['bootstrap.servers']} answered over SASL_SSL"),
    ):
        path.write_text(json.dumps({"harvest": {**harvest, "baseKafkaConfig": base}}))
        checked = subprocess.run(
            [sys.executable, "-m", "harvest_outbox.producer", "check", "--kafka", "-f", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "HARVEST_DATA_SOURCE": pg_dsn},
            stdin=subprocess.DEVNULL,
        )
        line = next((x for x in checked.stdout.splitlines() if x.split()[1:2] == ["kafka:"]), "")
        assert line.startswith(level) and says in line, checked.stdout + checked.stderr[-2000:]
        assert principal.password not in checked.stdout + checked.stderr
