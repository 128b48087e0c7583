"""The HTTP endpoint (``/metrics``, ``/healthz``, ``/readyz``) as a security reviewer probes it (issue #49
item 5, docs/security.md): no body, whatever the path, method or credential, holds a secret of the config
(the DSN's password, a SASL password, the registry's credentials, the endpoint's own password, a password
command's argument); with ``prometheusBasicAuth`` a missing or wrong credential gets ``401`` and a fixed body
that says nothing more, the right one the endpoint; unknown paths are ``404``; the bind address default is
the one the docs state. ``/readyz`` runs its database probe for real, against the test Postgres with a
wrong password, so the probe's error is in the body scanned; running relays (one leader, sharded) serve only
with the config's credentials; the harvest command's error redaction knows the basic-auth passwords."""

from __future__ import annotations

import argparse
import base64
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import make_conninfo
from relaylib import relay_config

from harvest_outbox.producer.config import FileConfig, HarvestConfig, from_mapping
from harvest_outbox.producer.config._values import DEFAULT_BIND_ADDRESS
from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.producer.observe.metrics import Metrics, start_prometheus
from harvest_outbox.producer.ops.cli import _redacted
from harvest_outbox.producer.relay.sharded import relay_for
from harvest_outbox.producer.schema.ddl import init_db

pytestmark = pytest.mark.integration

DOCS = Path(__file__).resolve().parents[3] / "docs"
DSN_PASSWORD = "DsnPw7xQ"
SASL_PASSWORD = "SaslPw8zR"
REGISTRY_PASSWORD = "RegPw9kT"
ENDPOINT_PASSWORD = "ScrapePw3mV"
COMMAND_SECRET = "CmdArg4nW"
SECRETS = (DSN_PASSWORD, SASL_PASSWORD, REGISTRY_PASSWORD, ENDPOINT_PASSWORD, COMMAND_SECRET)
PATHS = ("/metrics", "/healthz", "/readyz", "/", "/nope", "/metrics/../config", "/debug/vars")


@dataclass
class _RunningRelay:
    """A relay as health sees it (producer.observe.health.RelayView): running, its loop live, so that
    ``/readyz`` goes on to probe the database."""

    config: HarvestConfig
    metrics: Metrics = field(default_factory=Metrics)
    state: str = "running"
    is_leader: bool = True
    leader_id: Any = None


def _config(pg_dsn: str) -> HarvestConfig:
    return _file_config(pg_dsn).harvest


def _file_config(pg_dsn: str) -> FileConfig:
    return from_mapping(
        {
            "harvest": {
                "dataSource": make_conninfo(pg_dsn, password=DSN_PASSWORD),  # wrong: the probe fails
                "baseKafkaConfig": {
                    "bootstrap.servers": "127.0.0.1:1",
                    "security.protocol": "SASL_SSL",
                    "sasl.mechanism": "PLAIN",
                    "sasl.username": "relay",
                    "sasl.password": SASL_PASSWORD,
                },
                "serialization": {
                    "registry": {"url": "http://127.0.0.1:1", "basicAuth": f"reg:{REGISTRY_PASSWORD}"},
                },
                "prometheusBasicAuth": f"prometheus:{ENDPOINT_PASSWORD}",
                "dataSourcePasswordCommand": f"/bin/echo {COMMAND_SECRET}",
            }
        }
    )


@pytest.fixture(scope="module")
def endpoint(pg_dsn: str) -> Iterator[tuple[int, HarvestConfig]]:
    config = _config(pg_dsn)
    relay = _RunningRelay(config)
    relay.metrics.read_at = time.monotonic() + 3600  # the loop "just ran" for the whole module
    server, thread = start_prometheus(
        relay.metrics, config.name, 0, "127.0.0.1", relay=relay, basic_auth=config.prometheus_basic_auth
    )
    try:
        yield int(server.server_port), config
    finally:
        server.shutdown()
        thread.join(10)


def _get(port: int, path: str, auth: str | None, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    headers = {} if auth is None else {"Authorization": auth}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _basic(user_password: str) -> str:
    return "Basic " + base64.b64encode(user_password.encode()).decode()


GOOD = _basic(f"prometheus:{ENDPOINT_PASSWORD}")
WRONG = {
    "none": None,
    "wrong password": _basic("prometheus:guess"),
    "password as prefix": _basic(f"prometheus:{ENDPOINT_PASSWORD[:-1]}"),
    "password with more": _basic(f"prometheus:{ENDPOINT_PASSWORD}x"),
    "wrong user": _basic(f"admin:{ENDPOINT_PASSWORD}"),
    "bearer": f"Bearer {ENDPOINT_PASSWORD}",
    "not base64": "Basic !!!",
    "empty": "Basic ",
}


def _leaks(body: bytes, headers: dict[str, str]) -> list[str]:
    text = body.decode("utf-8", "replace") + repr(headers)
    return [s for s in SECRETS if s in text]


def test_no_path_method_or_credential_shows_a_secret(endpoint: tuple[int, HarvestConfig]) -> None:
    port, _config = endpoint
    seen = 0
    for auth in (GOOD, *WRONG.values()):
        for path in PATHS:
            for method in ("GET", "HEAD", "POST"):
                status, headers, body = _get(port, path, auth, method)
                assert not _leaks(body, headers), f"{method} {path} ({status}) shows {_leaks(body, headers)}"
                seen += len(body)
    assert seen > 1000  # the scan read real bodies (the metrics page, the health verdicts)


def test_readyz_probe_error_is_in_the_body_and_holds_no_secret(endpoint: tuple[int, HarvestConfig]) -> None:
    """The probe reached Postgres and failed on the (wrong) password: the error is shown, the password not."""
    port, _config = endpoint
    status, headers, body = _get(port, "/readyz", GOOD)
    assert status == 503
    assert b"database unreachable" in body and b"password authentication failed" in body
    assert not _leaks(body, headers)


@pytest.mark.parametrize("case", list(WRONG))
def test_a_missing_or_wrong_credential_gets_401_and_no_detail(endpoint: tuple[int, HarvestConfig], case: str) -> None:
    port, _config = endpoint
    answers = set()
    for path in ("/metrics", "/readyz", "/nope"):
        status, headers, body = _get(port, path, WRONG[case])
        answers.add((status, headers.get("WWW-Authenticate", ""), body))
    # one answer whatever the path: a refusal does not say which paths exist
    assert answers == {(401, 'Basic realm="harvest", charset="UTF-8"', b"unauthorized\n")}


def test_the_right_credential_gets_the_endpoint_and_unknown_paths_404(endpoint: tuple[int, HarvestConfig]) -> None:
    port, _config = endpoint
    status, _headers, body = _get(port, "/metrics", GOOD)
    assert status == 200 and b"harvest_delivered_records_total" in body
    assert _get(port, "/healthz", GOOD)[0] == 200
    for path in ("/", "/nope", "/metrics/x", "/debug/vars"):
        assert _get(port, path, GOOD)[0] == 404, path


def test_config_reprs_and_errors_hold_no_endpoint_password(pg_dsn: str) -> None:
    config = _config(pg_dsn)
    assert not [s for s in SECRETS if s in repr(config)]
    for bad in ("no-colon", ":password-only", "user-only:", 42):
        with pytest.raises(ConfigError) as refused:
            from_mapping({"harvest": {"prometheusBasicAuth": bad}})
        message = str(refused.value)
        assert message.startswith("harvest.prometheusBasicAuth: <redacted> must be a"), message
        assert str(bad) not in message


def test_the_bind_address_default_is_the_documented_one() -> None:
    assert HarvestConfig().prometheus_bind_address == DEFAULT_BIND_ADDRESS
    for page in ("health.md", "security.md"):
        stated = re.findall(r"default bind address\s+is\s+`([^`]+)`", (DOCS / page).read_text())
        assert stated == [DEFAULT_BIND_ADDRESS], f"docs/{page} states {stated}"


@pytest.mark.parametrize("shards", [1, 2])
def test_a_running_relay_serves_only_with_its_credentials(
    pg_dsn: str, pg_schema: str, kafka_bootstrap: str, shards: int
) -> None:
    """The config's ``prometheusBasicAuth`` reaches the endpoint of both relays (one leader, sharded)."""
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table, shards=shards)
    config = relay_config(pg_dsn, kafka_bootstrap, table, f"g-auth-{shards}").replace(
        shards=shards,
        leader_election="postgres",
        prometheus_port=0,
        prometheus_bind_address="127.0.0.1",
        prometheus_basic_auth=f"prometheus:{ENDPOINT_PASSWORD}",
    )
    with relay_for(config) as relay:
        port = relay.prometheus_port
        assert port is not None
        assert _get(port, "/metrics", None)[0] == 401
        assert _get(port, "/healthz", WRONG["wrong password"])[0] == 401
        status, _headers, body = _get(port, "/metrics", GOOD)
        assert status == 200 and b"harvest_is_leader" in body


def test_cli_errors_never_show_a_basic_auth_password(pg_dsn: str) -> None:
    """Whatever error the harvest command prints goes through its redaction, which knows these passwords."""
    args = argparse.Namespace(loaded_config=_file_config(pg_dsn), data_source=None)
    said = _redacted(f"boom: prometheus:{ENDPOINT_PASSWORD} and {REGISTRY_PASSWORD} and {DSN_PASSWORD}", args)
    assert said.startswith("boom: ") and not [s for s in SECRETS if s in said], said
