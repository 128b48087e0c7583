"""Secrets never printed: DSNs in both libpq forms, however malformed, the errors libpq makes of them,
YAML errors, Kafka credentials (pure logic, plus libpq's own parser via psycopg; no services)."""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import subprocess
import sys
from pathlib import Path

import confluent_kafka
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from harvest_outbox.librdkafka_properties import LIBRDKAFKA_PROPERTIES
from harvest_outbox.producer.config import HarvestConfig, load_yaml
from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.redact import (
    REDACTED,
    SECRET_KAFKA_PROPERTIES,
    redact_dsn,
    redact_error,
    redact_kafka_config,
)

# (DSN, the secret(s) that must not survive, what must survive)
DSNS = [
    ("host=h password=s3cr3t dbname=d", ["s3cr3t"], "host=h password=<redacted> dbname=d"),
    ("host=h passwd=hunter22 dbname=d", ["hunter22"], "host=h passwd=<redacted> dbname=d"),  # a typo'd key
    ("host=h pasword=hunter22", ["hunter22"], "host=h pasword=<redacted>"),
    (r"host=h password=a\ bcdef dbname=d", ["bcdef", "a\\ b"], "host=h password=<redacted> dbname=d"),
    (r"host=h password='it\'s a secret' dbname=d", ["secret", "it\\'s"], "dbname=d"),
    ("host=h password='two words' dbname=d", ["two", "words"], "dbname=d"),
    ("host=h password = spaced dbname=d", ["spaced"], "dbname=d"),
    ("host=h password=first second dbname=d", ["first", "second"], "host=h password=<redacted>"),  # unquoted space
    ("host=h password='unterminated dbname=d", ["unterminated"], "host=h password=<redacted>"),
    ("host=h PASSWORD=Upper1", ["Upper1"], "host=h"),
    ("host=h sslpassword=keypass2 user=relay", ["keypass2"], "user=relay"),
    ("host=h password=", [], "host=h password="),
    ("postgresql://u:pw123@h/db?sslmode=require", ["pw123"], "postgresql://u:<redacted>@h/db?sslmode=require"),
    ("postgresql://u:p@ss/w?rd@h:5432/db", ["p@ss", "w?rd", "ss/w"], "postgresql://u:"),  # libpq cannot parse it
    ("postgresql://u@h/db?password=qpw1&sslmode=require", ["qpw1"], "password=<redacted>&sslmode=require"),
    ("postgres://u@h/db?sslpassword=keypw&application_name=x", ["keypw"], "application_name=x"),
    ("postgresql://u@h/db?passwrd=typo1", ["typo1"], "passwrd=<redacted>"),
    ("POSTGRESQL://u:Caps99@h/db", ["Caps99"], "@h/db"),
    ("postgresql://u:pw%20x@h/db", ["pw%20x"], "@h/db"),
    # issue #38 item 4: libpq ends the userinfo at the first '@', so the password's tail lands in the host
    ("postgresql://u:Pw@Secret9@127.0.0.1:1/db", ["Secret9"], "postgresql://u:<redacted>@"),
    ("postgresql://u@h:1/db?password=Pw@Secret9", ["Secret9", "Pw@"], "postgresql://u@h:1/db?password=<redacted>"),
    ("postgresql://u:pa:ss99@h/db", ["pa:ss", "ss99"], "postgresql://u:<redacted>@h/db"),
    ("postgresql://u:p/ass99@h/db", ["ass99"], "postgresql://u:"),  # libpq: host u, port p, dbname ass99@h/db
    ("postgresql://u:p?ass99@h/db", ["ass99"], "postgresql://u:<redacted>@h/db"),
    ("postgresql://u:pw%40Sec%3Aret@h/db", ["Sec", "pw%40", "pw@"], "postgresql://u:<redacted>@h/db"),
    ("postgresql://u:p%zzSecret9@h/db", ["Secret9"], "postgresql://u:<redacted>@h/db"),  # bad %: libpq refuses it
    ("postgresql://h1:1,h2:2/db?user=u&password=multi9", ["multi9"], "host=h1,h2&port=1,2"),
    # a dbname holding a connection string or URI (libpq expands it): its password is redacted
    ("host=h dbname='user=u password=Inner9' sslmode=disable", ["Inner9"], "dbname='user=u password=<redacted>'"),
    ("host=h dbname=postgresql://u:Inner9@h/db", ["Inner9"], "dbname=postgresql://u:<redacted>@h/db"),
    ("postgresql://h/postgresql%3A%2F%2Fu%3AInner9%40h%2Fdb", ["Inner9"], "postgresql://h/"),
    ("host=h dbname='host=x dbname=''y'' password=Inner9'", ["Inner9"], "host=h"),
    ("host=h password='Pas5 Wor6\\9' dbname=d", ["Pas5", "Wor6"], "host=h password=<redacted> dbname=d"),
    (
        "host=h port=1 passfile=/tmp/pgpass sslpassword='key pass9' service=svc",
        ["pass9"],
        "host=h port=1 passfile=/tmp/pgpass sslpassword=<redacted> service=svc",
    ),
    ("host=h password= dbname=x", ["dbname=x"], "host=h password=<redacted>"),  # libpq: the password is dbname=x
]


@pytest.mark.parametrize(("dsn", "secrets", "kept"), DSNS, ids=[d[0][:40] for d in DSNS])
def test_redact_dsn(dsn: str, secrets: list[str], kept: str) -> None:
    out = redact_dsn(dsn)
    for secret in secrets:
        assert secret not in out
    assert kept in out
    if secrets:
        assert REDACTED in out


@pytest.mark.parametrize(("dsn", "secrets", "kept"), DSNS, ids=[d[0][:40] for d in DSNS])
def test_config_never_shows_the_secret_whether_libpq_accepts_the_dsn_or_not(
    dsn: str, secrets: list[str], kept: str
) -> None:
    """libpq judges the DSN at config time; its error (it quotes what it cannot parse) and the
    config's repr are both free of the secret."""
    try:
        conninfo_to_dict(dsn)
    except psycopg.Error:
        with pytest.raises(ConfigError) as info:
            HarvestConfig(data_source=dsn)
        text = str(info.value)
        assert text.startswith("dataSource: ")
    else:
        text = repr(HarvestConfig(data_source=dsn))
    for secret in secrets:
        assert secret not in text


@pytest.mark.parametrize(
    ("dsn", "secret", "needle"),
    [
        ("host=h password=first second dbname=d", "second", 'missing "=" after'),
        ("host=h passwd=hunter22", "hunter22", 'invalid connection option "passwd"'),
        ("host=h password='opensesame", "opensesame", "unterminated quoted string"),
        ("postgresql://u@h/db?password=a b", "a b", "unexpected spaces"),
    ],
)
def test_bad_dsn_is_a_config_error_without_the_secret(dsn: str, secret: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        HarvestConfig(data_source=dsn)
    text = str(info.value)
    assert text.startswith("dataSource: ") and needle in text and secret not in text
    assert "libpq connection string" in text


def test_free_text_is_scrubbed_without_a_dsn() -> None:
    text = "failed for host=h password=s3cret9 and postgresql://u:pw777@h/db and sasl.password=kafkapw1"
    out = redact_error(text)
    assert "s3cret9" not in out and "pw777" not in out and "kafkapw1" not in out and "host=h" in out
    assert (
        redact_error('FATAL: password authentication failed for user "relay"')
        == 'FATAL: password authentication failed for user "relay"'
    )


def test_kafka_credentials_are_redacted() -> None:
    conf = {
        "bootstrap.servers": "k:9092",
        "sasl.username": "relay",
        "sasl.password": "p1",
        "sasl.jaas.config": 'org.apache... password="p2"',
        "ssl.key.password": "p3",
        "sasl.oauthbearer.client.secret": "p4",
        "ssl.keystore.password": "p5",
        "sasl.pasword": "p6",
    }
    out = redact_kafka_config(conf)
    assert out["bootstrap.servers"] == "k:9092" and out["sasl.username"] == "relay"
    assert all(out[k] == REDACTED for k in conf if k not in ("bootstrap.servers", "sasl.username"))


@pytest.mark.parametrize(
    "text",
    [
        'harvest:\n  dataSource: "host=x password=hunter22\n  outboxTable: o\n',  # unterminated quote
        "harvest:\n  dataSource: host=x password=hunter22\n   bad: indent\n",
        "harvest:\n  dataSource: host=x password=hunter22\n\tleaderTopic: t\n",  # a tab
        "harvest:\n  dataSource: [host=x password=hunter22\n",
        "harvest:\n  dataSource: host=x password=hunter22 \x07\n",  # a control character
        "harvest: {dataSource: host=x password=hunter22, outboxTable: o\n",
    ],
)
def test_yaml_errors_do_not_quote_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "h.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_yaml(path)
    message = str(info.value)
    assert ("hunter22" not in message and "not valid YAML" in message and "line" in message) or "position" in message
    assert "\n" not in message


# What a credential property's name says, per librdkafka's CONFIGURATION.md (written out here, not
# imported: the test is the specification the package's one pattern must meet).
CREDENTIAL_NAME = re.compile(
    r"password|secret|key|pem|extensions|passphrase|token|credentials|jaas|"
    r"oauthbearer\.config",
    re.IGNORECASE,
)
# Issue #38 item 5: printed in clear at start before.
MISSED_BEFORE = (
    "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem",
    "sasl.oauthbearer.extensions",
)
NOT_SECRET = (
    "bootstrap.servers",
    "sasl.username",
    "client.id",
    "security.protocol",
    "sasl.mechanism",
    "ssl.endpoint.identification.algorithm",
    "linger.ms",
)


def _installed_librdkafka_properties(tmp_path: Path) -> set[str]:
    """Property names of the librdkafka confluent-kafka loaded, from its own table (the one CONFIGURATION.md
    is printed from): ``rd_kafka_conf_properties_show(FILE *)``, into a file (~100 kB: more than a pipe holds)."""
    libs = Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
    found = sorted(libs.glob("librdkafka*.so*")) if libs.is_dir() else []
    lib = ctypes.CDLL(str(found[0]) if found else ctypes.util.find_library("rdkafka"))
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    out = tmp_path / "properties.md"
    fp = libc.fopen(str(out).encode(), b"w")
    assert fp
    lib.rd_kafka_conf_properties_show(ctypes.c_void_p(fp))
    libc.fclose(ctypes.c_void_p(fp))
    return {m.group(1) for m in re.finditer(r"^([a-z][\w.]*)\s+\|", out.read_text(), re.MULTILINE)}


def test_the_shipped_property_list_holds_every_property_of_the_installed_librdkafka(tmp_path: Path) -> None:
    installed = _installed_librdkafka_properties(tmp_path)
    assert len(installed) > 150 and "sasl.password" in installed
    missing = installed - LIBRDKAFKA_PROPERTIES
    assert not missing, f"add to harvest_outbox/librdkafka_properties.py: {sorted(missing)}"


def _credential_properties() -> list[str]:
    names = sorted(p for p in LIBRDKAFKA_PROPERTIES if CREDENTIAL_NAME.search(p))
    assert set(MISSED_BEFORE) <= set(names) and len(names) >= 20
    assert set(names) <= SECRET_KAFKA_PROPERTIES
    return names


def test_every_credential_property_of_librdkafka_is_redacted_in_the_config_repr() -> None:
    names = _credential_properties()
    conf = {name: f"value{i}-of-{name}" for i, name in enumerate(names)} | {k: f"shown-{k}" for k in NOT_SECRET}
    for text in (repr(HarvestConfig(base_kafka_config=conf)), repr(HarvestConfig(producer_kafka_config=conf))):
        leaked = [name for name in names if f"value{names.index(name)}-of-" in text]
        assert not leaked
        assert all(f"shown-{k}" in text for k in NOT_SECRET)
    assert all(redact_kafka_config(conf)[name] == REDACTED for name in names)


def test_the_start_up_log_and_the_error_show_no_kafka_credential(tmp_path: Path) -> None:
    """``harvest run`` logs its config at start; the three properties of the issue were printed in clear."""
    secrets = {
        "sasl.oauthbearer.extensions": "tenant=SecretTenant7",
        "sasl.password": "SaslSecret7",
        "sasl.oauthbearer.assertion.private.key.passphrase": "Passphrase7",
        "sasl.oauthbearer.assertion.private.key.pem": "PemSecret7",
        "sasl.oauthbearer.client.secret": "Client7",
    }
    lines = "".join(f"    {k}: {v}\n" for k, v in secrets.items())
    path = tmp_path / "h.yaml"
    path.write_text(
        f"harvest:\n  baseKafkaConfig:\n    bootstrap.servers: 127.0.0.1:1\n{lines}"
        f"  dataSource: host=127.0.0.1 port=1 user=relay connect_timeout=2\n  leaderElection: postgres\n"
        f"logging:\n  level: Info\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "harvest_outbox.producer", "run", "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and "starting: HarvestConfig(" in proc.stderr, proc.stderr
    assert "sasl.oauthbearer.extensions': '<redacted>'" in proc.stderr
    for value in secrets.values():
        assert value not in proc.stderr + proc.stdout


def test_the_credential_rule_has_one_owner_and_the_readers_use_it() -> None:
    """Issue #32: one definition of which Kafka property is a credential, in harvest_outbox/redact.py."""
    from harvest_outbox.consumer.config import is_secret_key
    from harvest_outbox.consumer.config import redact as reader_redact
    from harvest_outbox.redact import is_secret_kafka_key

    assert is_secret_key is is_secret_kafka_key
    assert all(v == REDACTED for v in reader_redact({k: "x" for k in MISSED_BEFORE}).values())
    root = Path(__file__).resolve().parents[3]
    folders = ("harvest_outbox", "producer", "consumer", "spark_reader", "sequencer", "harvest_local")
    owners = [
        str(p.relative_to(root))
        for folder in folders
        for p in (root / folder).rglob("*.py")
        if "pas+w" in p.read_text(encoding="utf-8")
    ]
    assert owners == ["harvest_outbox/redact.py"]
