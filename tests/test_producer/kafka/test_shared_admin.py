"""``producer/kafka/shared_admin.py``: one Kafka admin client per cluster for a fleet's relays. Each
invariant of the module is a test here (pure, a counting factory), and a fleet on a real Postgres and Kafka
relays three outboxes through one admin client.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from relaylib import consume_all, postgres_fleet

from harvest_outbox.producer.fleet.supervisor import Fleet
from harvest_outbox.producer.kafka.shared_admin import SharedAdmins
from harvest_outbox.producer.schema.ddl import init_db


class _Client:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.polls = 0

    def poll(self, timeout: float = 0) -> int:
        self.polls += 1
        return 0


def test_equal_settings_share_a_client_and_other_settings_get_their_own() -> None:
    made: list[_Client] = []
    admins = SharedAdmins(lambda config: made.append(_Client(config)) or made[-1])
    a = admins.get({"bootstrap.servers": "k:9092", "security.protocol": "SASL_SSL", "sasl.username": "relay"})
    b = admins.get({"sasl.username": "relay", "bootstrap.servers": "k:9092", "security.protocol": "SASL_SSL"})
    other_principal = admins.get({"bootstrap.servers": "k:9092", "security.protocol": "SASL_SSL", "sasl.username": "x"})
    other_cluster = admins.get({"bootstrap.servers": "k2:9092"})
    assert a is b and len({id(a), id(other_principal), id(other_cluster)}) == 3
    assert len(admins) == 3 == len(made)


def test_a_client_is_made_once_when_many_relays_ask_at_once() -> None:
    made: list[_Client] = []

    def slow(config: dict[str, Any]) -> _Client:
        time.sleep(0.05)
        made.append(_Client(config))
        return made[-1]

    admins = SharedAdmins(slow)
    got: list[Any] = []
    threads = [threading.Thread(target=lambda: got.append(admins.get({"bootstrap.servers": "k"}))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and all(g is made[0] for g in got)


def test_close_drops_every_client_after_serving_its_log_lines() -> None:
    made: list[_Client] = []
    admins = SharedAdmins(lambda config: made.append(_Client(config)) or made[-1])
    admins.get({"bootstrap.servers": "a"})
    admins.get({"bootstrap.servers": "b"})
    admins.close()
    assert len(admins) == 0 and [c.polls for c in made] == [1, 1]
    assert admins.get({"bootstrap.servers": "a"}) is not made[0]  # a new one after close


def test_a_fleets_outboxes_relay_through_one_admin_client(
    pg_dsn: str, kafka_bootstrap: str, topic_factory: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    topic = topic_factory()
    schemas = [unique_name("adm") for _ in range(3)]
    for schema in schemas:
        init_db(pg_dsn, f"{schema}.outbox")
    file = postgres_fleet(
        pg_dsn, kafka_bootstrap, unique_name("fleet"), [{"id": s, "outboxTable": f"{s}.outbox"} for s in schemas]
    )
    fleet = Fleet(file).start()
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for schema in schemas:
                conn.execute(
                    f'INSERT INTO "{schema}".outbox (kafka_topic, kafka_key, kafka_value, kafka_header_keys, '
                    f"kafka_header_values) VALUES (%s, %s, %s, '{{}}', '{{}}')",
                    (topic, schema, "v"),
                )
        got = consume_all(kafka_bootstrap, topic, lambda got: set(schemas) <= {g.key for g in got})
        assert {g.key for g in got} == set(schemas)
        guards = [status.relay.core.guard for status in fleet.statuses()]
        assert len(fleet.admins) == 1
        assert all(g._admin is not None and g._admin is guards[0]._admin for g in guards)
    finally:
        fleet.stop()
        assert fleet.wait(60)
    assert len(fleet.admins) == 0
