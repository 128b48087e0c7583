"""Kafka OAUTHBEARER token providers (harvest_outbox/kafka_token.py), their config keys (kafkaOAuthTokenCommand,
kafkaOAuthTokenProvider; a reader's oauth_cb and kafka.oauth_cb) and a reader's refused login
(harvest_outbox/kafka_access.py), without a broker: what is accepted, every refusal naming the key, the value
and the fix, and no token or password in any message, repr or log line."""

from __future__ import annotations

import base64
import json
import logging
import re
import sys
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError

from harvest_outbox import kafka_token
from harvest_outbox.consumer.config import ReaderConfig
from harvest_outbox.consumer.errors import ConfigError as ReaderConfigErrorPy
from harvest_outbox.kafka_access import AccessWatch, access_error
from harvest_outbox.kafka_token import KafkaTokenError, KafkaTokenProvider, parse_token_output
from harvest_outbox.producer.config import HarvestConfig, from_mapping
from harvest_outbox.producer.election.neli import neli_consumer_config
from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.spark_reader import ReaderConfigError
from harvest_outbox.spark_reader.batch import _check_source
from harvest_outbox.spark_reader.offsets import client_config

PY = sys.executable
SECRET = "s3cr3t-T0KEN-value"
OAUTH = {"bootstrap.servers": "k:9093", "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}
_calls: list[str] = []


def _jwt(claims: dict[str, Any]) -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none'})}.{part(claims)}."


def _token() -> tuple[str, float]:
    _calls.append("token")
    return SECRET, time.time() + 60


def _raises() -> tuple[str, float]:
    raise RuntimeError(f"vault said no to {SECRET}")


def _three() -> tuple[str, float, str]:
    return SECRET, time.time() + 60, "principal"


def _stale() -> tuple[str, float]:
    return SECRET, time.time() - 30


def _milliseconds() -> tuple[str, float]:
    return SECRET, (time.time() + 60) * 1000


def _spaced() -> tuple[str, float]:
    return f"{SECRET} {SECRET}", time.time() + 60


def test_a_command_prints_a_jwt_or_json_with_the_expiry() -> None:
    exp = int(time.time()) + 300
    jwt = _jwt({"sub": "relay", "exp": exp})
    assert parse_token_output(f"  {jwt}\n", "o") == (jwt, float(exp))
    assert parse_token_output(json.dumps({"token": SECRET, "expires_at": exp}), "o") == (SECRET, float(exp))
    provider = KafkaTokenProvider(command=f"{PY} -c \"print('{jwt}')\"")
    assert provider("ignored sasl.oauthbearer.config") == (jwt, float(exp))
    assert provider.tokens_given == 1


@pytest.mark.parametrize(
    ("output", "said"),
    [
        ("", "printed nothing"),
        (SECRET, "printed neither a JWT nor JSON"),
        ("{" + SECRET, "does not start JSON"),
        (json.dumps({"token": SECRET}), 'without a string "token" and a number "expires_at"'),
        (json.dumps({"token": SECRET, "expires_at": "soon"}), 'without a string "token" and a number "expires_at"'),
        (_jwt({"sub": SECRET}), 'without a numeric "exp" claim'),
    ],
    ids=["empty", "opaque", "broken-json", "no-expiry", "text-expiry", "jwt-without-exp"],
)
def test_unusable_command_output_is_named_never_shown(output: str, said: str) -> None:
    with pytest.raises(KafkaTokenError) as refused:
        parse_token_output(output, "kafkaOAuthTokenCommand (tool)")
    message = str(refused.value)
    assert message.startswith("kafkaOAuthTokenCommand (tool) ") and said in message, message
    assert SECRET not in message and "JWT" in message


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (f"{PY} -c \"import sys; print('{SECRET}'); sys.stderr.write('{SECRET}'); sys.exit(3)\"", "exited with code 3"),
        (f"/nonexistent/token-tool --client-secret {SECRET}", "cannot run: No such file or directory"),
        (f"{PY} -c 'import time; time.sleep(30)' {SECRET}", "did not finish within 0.3s"),
    ],
    ids=["exit-code", "missing-program", "hangs"],
)
def test_a_failing_command_is_logged_and_raised_naming_its_program_only(
    command: str, said: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(kafka_token, "COMMAND_TIMEOUT", 0.3)
    provider = KafkaTokenProvider(command=command)
    with pytest.raises(KafkaTokenError) as refused, caplog.at_level(logging.ERROR):
        provider(None)
    message = str(refused.value)
    assert message.startswith(f"kafkaOAuthTokenCommand ({command.split()[0]}) ") and said in message, message
    assert refused.value.__cause__ is None and provider.tokens_given == 0
    assert said in caplog.text and "asks again in 10 s" in caplog.text
    assert SECRET not in message and SECRET not in caplog.text and SECRET not in repr(provider)


@pytest.mark.parametrize(
    ("function", "said"),
    [
        ("_raises", "raised RuntimeError"),
        ("_three", "returned a tuple; it must return a tuple (token, expires_at)"),
        ("_stale", "gave a token that expired 30 s ago"),
        ("_milliseconds", "gave an expiry in milliseconds"),
        ("_spaced", "gave an empty token or one holding whitespace"),
    ],
)
def test_a_failing_function_is_named_never_its_message_nor_token(function: str, said: str) -> None:
    provider = KafkaTokenProvider(function=f"{__name__}:{function}")
    with pytest.raises(KafkaTokenError) as refused:
        provider(None)
    message = str(refused.value)
    assert message.startswith(f"kafkaOAuthTokenProvider ({__name__}:{function}) {said}"), message
    assert SECRET not in message and refused.value.__cause__ is None


def _harvest(**keys: Any) -> dict[str, Any]:
    return {"harvest": {"baseKafkaConfig": dict(OAUTH), **keys}}


@pytest.mark.parametrize(
    ("harvest", "said"),
    [
        (
            _harvest(kafkaOAuthTokenCommand="echo a", kafkaOAuthTokenProvider=f"{__name__}:_token"),
            "kafkaOAuthTokenCommand and kafkaOAuthTokenProvider are both set; keep one of them",
        ),
        (
            {"harvest": {"kafkaOAuthTokenCommand": "echo a"}},
            "kafkaOAuthTokenCommand needs a token-based login, but in baseKafkaConfig sasl.mechanism is unset, not "
            "'OAUTHBEARER' (no other mechanism uses a token); set sasl.mechanism: OAUTHBEARER",
        ),
        (
            {
                "harvest": {
                    "kafkaOAuthTokenProvider": f"{__name__}:_token",
                    "baseKafkaConfig": {"sasl.mechanism": "PLAIN"},
                }
            },
            "kafkaOAuthTokenProvider needs a token-based login, but in baseKafkaConfig sasl.mechanism is 'PLAIN'",
        ),
        (
            {"harvest": {"kafkaOAuthTokenCommand": "echo a", "baseKafkaConfig": {**OAUTH, "security.protocol": "SSL"}}},
            "security.protocol is 'SSL', which does no SASL; set security.protocol: SASL_SSL",
        ),
        (
            {
                "harvest": {
                    "kafkaOAuthTokenCommand": "echo a",
                    "baseKafkaConfig": {**OAUTH, "sasl.oauthbearer.method": "oidc"},
                }
            },
            "sasl.oauthbearer.method is 'oidc': librdkafka then fetches tokens itself",
        ),
        (
            _harvest(kafkaOAuthTokenCommand="echo a", producerKafkaConfig={"sasl.mechanism": "PLAIN"}),
            "in producerKafkaConfig sasl.mechanism is 'PLAIN'",
        ),
        (
            _harvest(kafkaOAuthTokenCommand="echo 'unclosed-secret"),
            "kafkaOAuthTokenCommand: the command (program 'echo') cannot be split into arguments (No closing",
        ),
        (_harvest(kafkaOAuthTokenCommand="   "), "kafkaOAuthTokenCommand: empty; give a command that prints a token"),
        (_harvest(kafkaOAuthTokenCommand=7), "kafkaOAuthTokenCommand: 7 must be a string"),
        (_harvest(kafkaOAuthTokenProvider="no_colon"), "kafkaOAuthTokenProvider: 'no_colon' is not 'module:function'"),
        (
            _harvest(kafkaOAuthTokenProvider="no_such_module_9:f"),
            "kafkaOAuthTokenProvider: 'no_such_module_9:f' cannot be imported (ModuleNotFoundError); give "
            "'package.module:function', a function of no arguments that returns (token, expires_at epoch seconds)",
        ),
        (_harvest(kafkaOAuthTokenProvider="os:sep"), "kafkaOAuthTokenProvider: 'os:sep' is not callable"),
        (
            {"harvest": {"baseKafkaConfig": {**OAUTH, "oauth_cb": "pkg.mod:token"}}},
            "baseKafkaConfig.oauth_cb: 'pkg.mod:token' is not a callable; in a file give kafkaOAuthTokenProvider",
        ),
    ],
    ids=[
        "both",
        "no-mechanism",
        "plain",
        "ssl-only",
        "oidc",
        "producer-overrides",
        "unsplittable",
        "empty",
        "not-text",
        "no-colon",
        "not-importable",
        "not-callable",
        "oauth_cb-as-text",
    ],
)
def test_a_malformed_token_setting_is_refused_when_the_config_is_read(harvest: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError, match=r"^harvest\.") as refused:
        from_mapping(harvest)
    assert said in str(refused.value), str(refused.value)
    assert "secret" not in str(refused.value)  # a command's arguments are never shown


def test_the_token_provider_is_the_oauth_cb_of_every_client_config_and_never_called_by_the_check(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _calls.clear()
    config = from_mapping(_harvest(kafkaOAuthTokenProvider=f"{__name__}:_token")).harvest
    provider = config.kafka_token_provider
    assert provider is not None and config.base_kafka_config["oauth_cb"] is provider
    assert config.producer_config()["oauth_cb"] is provider  # the relay's producer
    election = neli_consumer_config(dict(config.base_kafka_config), "g", "n", 2.0)
    assert election["oauth_cb"] is provider  # NELI's consumer; the admin clients take the base as it is
    config.check_kafka_properties()  # librdkafka judges the properties without the callback
    assert _calls == []
    assert config.replace(name="copy").kafka_token_provider == provider
    assert "oauth_cb" not in config.replace(kafka_oauth_token_provider="").base_kafka_config
    shown = repr(from_mapping(_harvest(kafkaOAuthTokenCommand=f"vault-token --secret {SECRET}")).harvest)
    assert "KafkaTokenProvider(kafkaOAuthTokenCommand (vault-token))" in shown and SECRET not in shown


def test_an_embedders_oauth_cb_callable_serves_every_client() -> None:
    config = HarvestConfig(base_kafka_config={**OAUTH, "oauth_cb": _token})
    assert config.kafka_token_provider is None and config.producer_config()["oauth_cb"] is _token
    with pytest.raises(
        ConfigError, match=re.escape("kafkaOAuthTokenCommand and baseKafkaConfig.oauth_cb are both set")
    ):
        HarvestConfig(base_kafka_config={**OAUTH, "oauth_cb": _token}, kafka_oauth_token_command="echo a")
    with pytest.raises(ConfigError, match=re.escape("baseKafkaConfig.oauth_cb needs a token-based login")):
        HarvestConfig(base_kafka_config={"oauth_cb": _token})


def test_a_readers_oauth_cb_is_a_callable_or_a_function_spec_given_to_both_consumers() -> None:
    for given in (lambda _config: _token(), f"{__name__}:_token"):
        reader = ReaderConfig({**OAUTH, "oauth_cb": given})
        callback = reader.main_config()["oauth_cb"]
        assert reader.replay_config()["oauth_cb"] is callback and callable(callback)
        assert callback(None)[0] == SECRET
        assert SECRET not in repr(reader)
    with pytest.raises(ReaderConfigErrorPy, match="a int is not a token callback; give a callable"):
        ReaderConfig({**OAUTH, "oauth_cb": 5})
    with pytest.raises(ReaderConfigErrorPy, match="'oauth_cb': 'nope' is not 'module:function'"):
        ReaderConfig({**OAUTH, "oauth_cb": "nope"})
    with pytest.raises(
        ReaderConfigErrorPy, match=re.escape("'oauth_cb' gives OAUTHBEARER tokens, but sasl.mechanism is unset")
    ):
        ReaderConfig({"bootstrap.servers": "k:9093", "oauth_cb": _token})


def test_the_spark_readers_resolve_kafka_oauth_cb_where_the_client_is_made() -> None:
    options = {f"kafka.{k}": v for k, v in OAUTH.items()}
    conf = client_config({**options, "kafka.oauth_cb": f"{__name__}:_token"})
    assert conf["oauth_cb"](None)[0] == SECRET
    with pytest.raises(ReaderConfigError, match=r"kafka_options\['kafka.oauth_cb'\]: 'x:y' cannot be imported"):
        client_config({**options, "kafka.oauth_cb": "x:y"})
    with pytest.raises(ReaderConfigError, match=re.escape("security.protocol is 'SSL', which does no SASL")):
        client_config({**options, "kafka.security.protocol": "SSL", "kafka.oauth_cb": f"{__name__}:_token"})
    with pytest.raises(ReaderConfigError, match=r"Spark's Kafka source .* Fix: pass source='harvest'"):
        _check_source("spark", {**options, "kafka.oauth_cb": f"{__name__}:_token"})


def test_a_refused_login_is_the_readers_error_after_the_grace_without_the_password() -> None:
    seen: list[Any] = []
    watch = AccessWatch(seen.append)
    watch(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert watch.failure(grace=0) is None  # not a login failure
    refused = KafkaError(KafkaError._AUTHENTICATION, f"SASL authentication error: invalid credentials {SECRET}")
    watch(refused)
    assert len(seen) == 2  # the application's error_cb gets every error
    assert watch.failure(grace=60) is None  # within the grace: credentials made a moment ago may still arrive
    failure = watch.failure(grace=0)
    assert failure is not None
    message = str(access_error(failure, {"sasl.username": "reader", "sasl.password": SECRET}))
    assert message.startswith("Kafka refused the login: SASL authentication error: invalid credentials")
    assert "check sasl.mechanism, sasl.username and sasl.password" in message and SECRET not in message
    watch.cleared()
    assert watch.failure(grace=0) is None
    watch(KafkaError(KafkaError._SSL, "SSL handshake failed: certificate verify failed"))
    tls = watch.failure(grace=0)
    assert tls is not None and "check ssl.ca.location" in str(access_error(tls, {}))
