"""The Postgres password provider (producer/db/credentials.py, docs/security.md "Rotating Postgres
credentials"): a command runs without a shell and its stdout, stripped, is the password; a function's
return value is; each failure (exit code, timeout, missing program, empty output, an exception, a non-str)
is a connection error naming the provider, never the output or the secret; a config with both or a
malformed one is refused at construction; a relay whose provider fails does not start, and says why."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import psycopg
import pytest
from relaylib import relay_config

from harvest_outbox.producer.config import HarvestConfig, from_mapping
from harvest_outbox.producer.db import connect, credentials
from harvest_outbox.producer.db.credentials import PasswordProvider, PasswordProviderError, provide
from harvest_outbox.producer.errors import ConfigError, DatabaseError, HarvestError
from harvest_outbox.producer.harvest import Harvest

SECRET = "S3cretOut9"
PY = shutil.which("python3") or sys.executable


def _password() -> str:
    return f"  {SECRET}\n"


def _raises() -> str:
    raise RuntimeError(f"vault said no to {SECRET}")


def _not_text() -> bytes:
    return SECRET.encode()


def _refusal(provider: PasswordProvider) -> str:
    with pytest.raises(PasswordProviderError) as refused:
        provider.password()
    assert isinstance(refused.value, psycopg.OperationalError)  # every connection site retries it as one
    assert refused.value.__cause__ is None  # a chained exception could carry the secret into a traceback
    message = str(refused.value)
    assert SECRET not in message
    return message


def test_a_command_runs_without_a_shell_and_its_stdout_stripped_is_the_password(tmp_path: Path) -> None:
    script = tmp_path / "pw.py"
    script.write_text("import sys; print('  ' + ' '.join(sys.argv[1:]) + '  ')\n")
    assert PasswordProvider(command=f"{PY} {script} 'two words' $HOME;x").password() == "two words $HOME;x"


def test_a_function_returns_the_password() -> None:
    assert PasswordProvider(function=f"{__name__}:_password").password() == SECRET


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (f"{PY} -c \"import sys; print('{SECRET}'); sys.stderr.write('{SECRET}'); sys.exit(3)\"", "exited with code 3"),
        (f"{PY} -c \"print('   ')\"", "returned an empty password"),
        (f"/nonexistent/token-tool --secret {SECRET}", "cannot run: No such file or directory"),
    ],
    ids=["exit-code", "empty", "missing-program"],
)
def test_a_failing_command_is_named_with_its_program_never_its_output(command: str, said: str) -> None:
    message = _refusal(PasswordProvider(command=command))
    program = command.split()[0]
    assert message.startswith(f"dataSourcePasswordCommand ({program}) ") and said in message, message


def test_a_command_that_hangs_is_ended_at_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(credentials, "COMMAND_TIMEOUT", 0.3)
    message = _refusal(PasswordProvider(command=f"{PY} -c 'import time; time.sleep(30)'"))
    assert "did not finish within 0.3s" in message


@pytest.mark.parametrize(("function", "said"), [("_raises", "raised RuntimeError"), ("_not_text", "returned a bytes")])
def test_a_failing_function_is_named_never_its_message(function: str, said: str) -> None:
    message = _refusal(PasswordProvider(function=f"{__name__}:{function}"))
    assert message == f"dataSourcePasswordProvider ({__name__}:{function}) {said}" + (
        "; it must return a str" if "returned" in said else ""
    )


@pytest.mark.parametrize(
    ("harvest", "said"),
    [
        (
            {"dataSourcePasswordCommand": "echo a", "dataSourcePasswordProvider": "os:getcwd"},
            "dataSourcePasswordCommand and dataSourcePasswordProvider are both set",
        ),
        ({"dataSourcePasswordCommand": "echo 'unclosed"}, "dataSourcePasswordCommand: "),
        ({"dataSourcePasswordCommand": "   "}, "dataSourcePasswordCommand: empty"),
        ({"dataSourcePasswordProvider": "no_colon"}, "is not 'module:function'"),
        ({"dataSourcePasswordProvider": "no_such_module_9:f"}, "cannot be imported (ModuleNotFoundError)"),
        ({"dataSourcePasswordProvider": "os:sep"}, "is not callable"),
        ({"dataSourcePasswordCommand": 7}, "dataSourcePasswordCommand: 7 must be a string"),
    ],
)
def test_a_malformed_provider_is_refused_when_the_config_is_read(harvest: dict[str, object], said: str) -> None:
    with pytest.raises(ConfigError, match=r"^harvest\.") as refused:
        from_mapping({"harvest": harvest})
    assert said in str(refused.value)


def test_the_config_shows_the_program_only() -> None:
    config = HarvestConfig(data_source_password_command=f"vault-token --secret-id {SECRET}")
    assert "PasswordProvider(dataSourcePasswordCommand (vault-token))" in repr(config)
    assert SECRET not in repr(config) and SECRET not in repr(config.password_provider)
    assert config.replace(name="other").password_provider == config.password_provider


def test_a_connection_whose_provider_fails_is_a_database_error_naming_it(pg_dsn: str) -> None:
    provide(pg_dsn + " ", PasswordProvider(command=f"{PY} -c 'import sys; print(\"{SECRET}\"); sys.exit(2)'"))
    try:
        with pytest.raises(DatabaseError) as refused:
            connect(pg_dsn + " ")
    finally:
        provide(pg_dsn + " ", None)
    assert f"dataSourcePasswordCommand ({PY}) exited with code 2" in str(refused.value)
    assert SECRET not in str(refused.value)


def test_a_relay_whose_provider_fails_does_not_start(pg_dsn: str, pg_schema: str) -> None:
    config = relay_config(pg_dsn, "127.0.0.1:1", f"{pg_schema}.outbox", "g-cred").replace(
        data_source_password_command=f"{PY} -c 'import sys; sys.exit(5)'"
    )
    relay = Harvest(config)
    with pytest.raises(HarvestError) as refused:
        relay.start()
    assert f"dataSourcePasswordCommand ({PY}) exited with code 5" in str(refused.value)
    provide(config.data_source, None)
