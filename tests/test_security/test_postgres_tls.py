"""TLS to Postgres, proven on a server that takes TCP over verified TLS only (the ``secure_pg`` fixture:
``hostssl`` + scram-sha-256, plaintext rejected): every component connects with ``sslmode=verify-full
sslrootcert=<CA>`` as its least-privilege role (producer/schema/grants.py, as ``harvest init-db
--print-grants`` prints it) and works -- the stasher writes as the writer, the relay delivers as the relay
(its Postgres-lock election too), ``harvest check`` and ``harvest dead-letters list`` run as their roles, a
reader keeps its checkpoint as the reader -- each session on TLS; and each way a connection can be wrong
(another CA in sslrootcert, an expired server certificate, a wrong password, a plaintext attempt) fails at
the relay's start-up (``harvest check``, the in-process relay) and at the stasher's connection with a
message naming what to fix (producer/db/connect_errors.py), the password in none of them, in no log line.
"""

from __future__ import annotations

import json
import logging
import pwd
import stat
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from grantlib import Roles, granted_outbox, login_roles
from kafka_acls import Principal
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from relaylib import consume_all, covers, relay_config

from harvest_outbox.consumer import PostgresCheckpointStore
from harvest_outbox.harvest_local.kafka import EmbeddedKafka
from harvest_outbox.harvest_local.postgres import CERT_FILE, KEY_FILE, EmbeddedPostgres
from harvest_outbox.harvest_local.tls import TlsFiles, make_server_files
from harvest_outbox.producer.db.connect_errors import PostgresConnectError, connect_explained
from harvest_outbox.producer.errors import HarvestError
from harvest_outbox.producer.kafka.acls import Topics, relay_acls
from harvest_outbox.producer.ops.cli import main
from harvest_outbox.producer.relay.sharded import relay_for
from harvest_outbox.producer.schema import OutboxNames
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher
from harvest_outbox.sequencer import ProducerState, decode_checkpoint, encode_checkpoint

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Outbox:
    table: str
    roles: Roles
    other_ca: TlsFiles  # a CA that did not sign the server's certificate
    expired: TlsFiles  # an expired server certificate signed by the server's CA


@pytest.fixture(scope="module")
def outbox(secure_pg: EmbeddedPostgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outbox]:
    """The five roles and an outbox granted to them, on the TLS-only server; every DSN verify-full."""
    schema = f"tls_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(secure_pg.socket_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    folder = tmp_path_factory.mktemp("pgtls")
    with login_roles(secure_pg.dsn, schema) as roles:
        table = f"{schema}.outbox"
        granted_outbox(secure_pg.dsn, roles, table)
        yield Outbox(
            table,
            roles,
            make_server_files(folder / "other", ca_name="other-ca"),
            make_server_files(folder / "expired", expired=True, signed_by=secure_pg.tls),
        )


def _config(tmp_path: Path, dsn: str, table: str) -> Path:
    path = tmp_path / f"harvest-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(f"harvest:\n  dataSource: {json.dumps(dsn)}\n  outboxTable: {table}\n")
    return path


def _password(dsn: str) -> str:
    return str(conninfo_to_dict(dsn)["password"])


def _on_tls(conn: psycopg.Connection) -> bool:
    row = conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
    return bool(conn.pgconn.ssl_in_use and row and row[0])


def test_every_component_works_over_verify_full_as_its_role(
    secure_pg: EmbeddedPostgres,
    outbox: Outbox,
    secure_kafka: EmbeddedKafka,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.INFO)
    roles, table = outbox.roles, outbox.table
    for component in ("writer", "relay", "admin", "reader"):
        assert conninfo_to_dict(roles.dsn(component))["sslmode"] == "verify-full"
    # the server: its certificate and key its OS user's alone, TCP over TLS only (the socket for our admin work)
    for name in (CERT_FILE, KEY_FILE):
        got = (secure_pg.data / name).stat()
        assert (got.st_uid, stat.S_IMODE(got.st_mode)) == (pwd.getpwnam(secure_pg.os_user).pw_uid, 0o600), name
    with psycopg.connect(secure_pg.socket_dsn, autocommit=True) as conn:
        assert conn.execute("SHOW ssl").fetchone() == ("on",)
        rules = conn.execute("SELECT DISTINCT type, auth_method FROM pg_hba_file_rules WHERE type <> 'local'")
        assert set(rules.fetchall()) == {("hostnossl", "reject"), ("hostssl", "scram-sha-256")}
    # the whole deployment secured at once: the relay is also a SCRAM principal over verified TLS to Kafka,
    # holding exactly `harvest acls`' lines (tests/test_security/test_relay_sasl.py tries each one missing)
    topic = f"pgtls-{uuid.uuid4().hex[:8]}"
    secure_kafka.create_topic(topic, 2)
    principal = Principal(secure_kafka)
    cfg = relay_config(roles.dsn("relay"), secure_kafka.bootstrap, table, f"g-{uuid.uuid4().hex[:6]}").replace(
        leader_election="postgres", leader_lock_check_interval=0.2, base_kafka_config=principal.client
    )
    principal.grant(
        relay_acls(
            principal.name,
            Topics((topic,)),
            leader_election=cfg.leader_election,
            leader_topic=cfg.leader_topic,
            leader_group=cfg.leader_group_id,
        )
    )

    # the stasher, as the writer, on the application's connection
    with connect_explained(roles.dsn("writer")) as conn:
        assert _on_tls(conn)
        Stasher(table).stash_many(conn, [OutboxRecord(topic, f"k{i % 3}", f"v{i}") for i in range(12)])
    with psycopg.connect(secure_pg.socket_dsn, autocommit=True) as conn:  # a dead letter for the admin
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (id, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values, "
                "error, attempts) VALUES (0, %s, 'parked', 'v', '{{}}', '{{}}', 'broker said no', 3)"
            ).format(OutboxNames.parse(table).dead_letters),
            (topic,),
        )

    # harvest check, then the relay (its Postgres-lock election too), as the relay
    checked = main(["check", "-f", str(_config(tmp_path, roles.dsn("relay"), table))])
    check_out, check_err = capsys.readouterr()
    assert checked == 0, check_out + check_err
    relay = relay_for(cfg, lambda e: None)
    relay.start()
    try:
        want = {f"k{k}": [f"v{i}".encode() for i in range(k, 12, 3)] for k in range(3)}
        assert covers(want)(consume_all(secure_kafka.bootstrap, topic, covers(want), timeout=30))
        with psycopg.connect(secure_pg.socket_dsn, autocommit=True) as conn:
            sessions = conn.execute(
                "SELECT count(*), bool_and(s.ssl) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
                "WHERE a.usename = %s",
                (roles.names.relay,),
            ).fetchone()
        assert sessions is not None and sessions[0] >= 2 and sessions[1] is True, sessions
    finally:
        relay.stop()
        relay.wait(30)

    # an admin verb, as the admin
    assert main(["dead-letters", "list", "-f", str(_config(tmp_path, roles.dsn("admin"), table))]) == 0
    out, err = capsys.readouterr()
    assert "parked" in out and "1 dead letter(s)" in out, out + err

    # a reader's checkpoint store, as the reader
    store = PostgresCheckpointStore("billing", schema=table.split(".")[0])
    cp = encode_checkpoint({f"{topic}/0": 10}, [ProducerState(f"{topic}/0", bytes(6), 160, -1)])
    with connect_explained(roles.dsn("reader")) as conn:
        assert _on_tls(conn)
        store.save(conn, cp)
        conn.commit()
        assert decode_checkpoint(store.load(conn)) == decode_checkpoint(cp)
        store.delete(conn)
        conn.commit()

    secrets = [_password(roles.dsn(c)) for c in ("writer", "relay", "admin", "reader")]
    secrets += [secure_pg.password, principal.password]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert not [s for s in secrets if s in logged + out + err + check_out + check_err]


#: case -> (the DSN made wrong, given the outbox's set-up; what the error says, given the set-up and the role)
WRONG: dict[str, tuple[Callable[[str, Outbox], str], Callable[[Outbox, str], str]]] = {
    "another CA in sslrootcert": (
        lambda dsn, o: make_conninfo(dsn, sslrootcert=str(o.other_ca.ca)),
        lambda o, user: (
            f"the server's certificate is not signed by the CA in sslrootcert={o.other_ca.ca}: "
            "point sslrootcert at the CA that signed it"
        ),
    ),
    "an expired server certificate": (
        lambda dsn, o: dsn,
        lambda o, user: "the server's certificate expired on ",
    ),
    "a wrong password": (
        lambda dsn, o: make_conninfo(dsn, password="Wr0ng-" + _password(dsn)[::-1]),
        lambda o, user: f"password authentication failed for user {user!r}: check the password",
    ),
    "a plaintext connection": (
        lambda dsn, o: make_conninfo(dsn, sslmode="disable"),
        lambda o, user: (
            "the server accepts TLS connections only (pg_hba hostssl) and this connection was plaintext "
            "(sslmode=disable): set sslmode=verify-full with sslrootcert="
        ),
    ),
}


@pytest.mark.parametrize("case", list(WRONG))
def test_a_wrong_connection_fails_at_start_up_and_at_the_stasher_naming_the_fix(
    case: str,
    secure_pg: EmbeddedPostgres,
    outbox: Outbox,
    kafka_bootstrap: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.INFO)
    wrong, says = WRONG[case]
    roles = outbox.roles
    relay_dsn, writer_dsn = wrong(roles.dsn("relay"), outbox), wrong(roles.dsn("writer"), outbox)
    secrets = {_password(d) for d in (roles.dsn("relay"), roles.dsn("writer"), relay_dsn, writer_dsn)}
    if case == "an expired server certificate":
        secure_pg.serve_certificate(outbox.expired)
    try:
        # the relay's start-up: harvest check, then the relay itself
        config = _config(tmp_path, relay_dsn, outbox.table)
        capsys.readouterr()
        assert main(["check", "-f", str(config)]) == 1
        err = capsys.readouterr().err
        assert says(outbox, roles.names.relay) in err, err
        relay = relay_for(relay_config(relay_dsn, kafka_bootstrap, outbox.table, "g-" + uuid.uuid4().hex[:6]))
        with pytest.raises(HarvestError) as started:
            relay.start()
        assert says(outbox, roles.names.relay) in str(started.value)

        # the stasher's: the application's connection, as the writer
        with pytest.raises(PostgresConnectError) as stashing:
            connect_explained(writer_dsn)
        assert says(outbox, roles.names.writer) in str(stashing.value)
        assert isinstance(stashing.value.__cause__, psycopg.OperationalError)  # libpq's, chained
    finally:
        if case == "an expired server certificate":
            secure_pg.serve_certificate(secure_pg.tls)  # type: ignore[arg-type]
    shown = "\n".join([err, str(started.value), str(stashing.value), caplog.text])
    assert not [s for s in secrets if s in shown]


def test_a_standby_takes_its_primarys_set_up_not_tls_of_its_own(tmp_path: Path) -> None:
    files = TlsFiles(*(tmp_path / name for name in ("ca.pem", "server.crt", "server.key", "server.pem", "ca.key")))
    with pytest.raises(ValueError, match="give tls to the primary only"):
        EmbeddedPostgres(tls=files, standby_of=object())  # type: ignore[arg-type]
