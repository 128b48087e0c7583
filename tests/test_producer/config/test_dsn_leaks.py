"""A DSN's secrets never reach the terminal through the CLI (issue #38 item 4): neither the start-up log
line of ``harvest run`` nor the errors of ``run`` / ``init-db`` / ``dead-letters list``, for the DSN forms
libpq reads differently from how they look (a userinfo password holding '@' ends at the first '@', a
password in the URI query, a dbname holding a connection string that libpq expands). The relay runs for
real against a closed port, and once against the test Postgres with a wrong password."""

from __future__ import annotations

import logging

import pytest
from psycopg.conninfo import conninfo_to_dict

from harvest_outbox.producer.ops.cli import main

CLOSED = "127.0.0.1"  # port 1: connection refused at once
# (DSN, secret that must not appear)
DSNS = [
    (f"postgresql://u:Pw@Secret9@{CLOSED}:1/db", "Secret9"),
    (f"postgresql://u@{CLOSED}:1/db?password=Pw@Secret9", "Secret9"),
    (f"postgresql://u@{CLOSED}:1/db?sslmode=disable&password=QuerySecret9", "QuerySecret9"),
    (f"postgresql://u:pa:ss99@{CLOSED}:1/db", "ss99"),
    (f"postgresql://u:p/ass99@{CLOSED}:1/db", "ass99"),
    (f"postgresql://u:p?ass99@{CLOSED}:1/db", "ass99"),
    (f"postgresql://u:pw%40Sec%3Aret9@{CLOSED}:1/db", "ret9"),
    (f"postgresql://u:p%zzSecret9@{CLOSED}:1/db", "Secret9"),
    (f"host={CLOSED} port=1 user=u password='Pas5 Wor6'", "Wor6"),
    (f"host={CLOSED} port=1 dbname='user=u password=Inner9'", "Inner9"),
    (f"host={CLOSED} port=1 dbname=postgresql://u:Inner9@{CLOSED}:1/db", "Inner9"),
    (f"host={CLOSED} port=1 passfile=/nonexistent/pgpass sslpassword=KeyPass9", "KeyPass9"),
    (f"host={CLOSED} port=1 sslpassword=KeyPass9 service=nosuchservice", "KeyPass9"),
    (f"host={CLOSED} port=1 password=first Second9", "Second9"),  # libpq cannot parse it
]
COMMANDS = [
    ["run", "--leader-election", "postgres", "--bootstrap-servers", "127.0.0.1:1"],
    ["init-db"],
    ["dead-letters", "list"],
]


def _run(command: list[str], dsn: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> str:
    caplog.set_level(logging.DEBUG)
    code = main([*command, "--data-source", dsn])
    out = capsys.readouterr()
    assert code in (1, 2), out.err  # 1: the database refused or was not there; 2: libpq cannot parse the DSN
    assert out.err.startswith("harvest: ") and out.err.count("\n") == 1
    return out.out + out.err + caplog.text


@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
@pytest.mark.parametrize(("dsn", "secret"), DSNS, ids=[d for d, _ in DSNS])
def test_no_secret_in_the_start_up_log_or_the_error(
    command: list[str], dsn: str, secret: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    text = _run(command, dsn, capsys, caplog)
    assert secret not in text
    if command[0] == "run" and "configuration error" not in text:
        assert "starting: HarvestConfig(data_source=" in text  # the start-up line was checked too


@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_wrong_password_on_the_real_postgres(
    command: list[str], pg_dsn: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    real = conninfo_to_dict(pg_dsn)
    secret = "Wrong@Pass9"
    for dsn in (
        f"postgresql://{real['user']}@{real['host']}:{real['port']}/{real['dbname']}?password={secret}",
        f"postgresql://{real['user']}:{secret}@{real['host']}:{real['port']}/{real['dbname']}",
    ):
        text = _run(command, dsn, capsys, caplog)
        assert "Pass9" not in text
        caplog.clear()
