"""``serialization:`` (producer/config/serialization.py): typed, frozen, unknown keys fail naming the
valid ones, bad values fail naming the field, the value and the fix; credentials never show."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from harvest_outbox.producer.config import HarvestConfig
from harvest_outbox.producer.config.serialization import SerializationConfig
from harvest_outbox.producer.errors import ConfigError

REGISTRY = {"url": "http://registry:8081"}


def load(serialization: Any) -> HarvestConfig:
    return HarvestConfig.from_mapping({"serialization": serialization})


@pytest.mark.parametrize(
    "data, says",
    [
        (
            {"registy": {}},
            "harvest.serialization.registy: unknown key; valid keys are: encodeWorker, registry, topics",
        ),
        ({"registry": REGISTRY, "encodeWorker": "yes"}, "serialization.encodeWorker: 'yes' must be true or false"),
        ({"registry": {"url": "registry:8081"}}, "is not an http(s) URL"),
        (
            {"registry": {"url": "http://u:p@registry"}},
            "holds credentials; move them to serialization.registry.basicAuth",
        ),
        ({"registry": {"url": "http://r", "basicAuth": "nocolon"}}, "must be a 'user:password' string"),
        ({"registry": {"url": "http://r", "latestTtl": 0}}, "latestTtl: 0 must be a number of seconds above 0"),
        ({"registry": {}}, "harvest.serialization.registry.url: required"),
        ({"topics": [{"topic": "o", "serializer": "avro"}]}, "serialization.registry: required when a topic has"),
        ({"registry": REGISTRY, "topics": [{"serializer": "avro"}]}, "give exactly one of topic"),
        ({"registry": REGISTRY, "topics": [{"topic": "o", "topicPattern": "o.*"}]}, "give exactly one of topic"),
        (
            {"registry": REGISTRY, "topics": [{"topicPattern": "(", "serializer": "avro"}]},
            "is not a regular expression",
        ),
        (
            {"registry": REGISTRY, "topics": [{"topic": "o", "serializer": "xml"}]},
            "serializer: 'xml' is not a serializer",
        ),
        (
            {"registry": REGISTRY, "topics": [{"topic": "o", "serializer": "Protobuf"}]},
            "'Protobuf' is not a serializer",
        ),
        (
            {"registry": REGISTRY, "topics": [{"topic": "o", "serializer": "avro", "subjectNameStrategy": "x"}]},
            "subjectNameStrategy: 'x' is not a strategy",
        ),
        (
            {"registry": REGISTRY, "topics": [{"topic": "o", "serializer": "avro", "subjectNameStrategy": "record"}]},
            "recordName: required with subjectNameStrategy record",
        ),
        ({"registry": REGISTRY, "topics": [{"topic": "o", "schemaVersion": 0}]}, "must be latest or a version number"),
        ({"registry": REGISTRY, "topics": [{"topic": "o", "schemaId": "42"}]}, "must be a registered schema id"),
        ({"registry": REGISTRY, "topics": [{"topic": "o", "schemaId": 4, "schemaVersion": 2}]}, "not both"),
        ({"registry": REGISTRY, "topics": [{"topic": "o", "sereliazer": "avro"}]}, "topics[0].sereliazer: unknown key"),
        ({"registry": REGISTRY, "topics": {"topic": "o"}}, "expected a list"),
    ],
)
def test_bad_config_is_named(data: Any, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(data)
    assert says in str(err.value)


def test_credentials_never_show() -> None:
    secret = "s3cr3t-pass"
    cfg = load({"registry": {"url": "http://r:8081", "basicAuth": f"svc:{secret}"}, "topics": [{"topic": "o"}]})
    assert secret not in repr(cfg) and secret not in str(cfg.serialization)
    with pytest.raises(ConfigError) as err:
        load({"registry": {"url": "http://r", "basicAuth": secret}})
    assert secret not in str(err.value)
    assert cfg.serialization.registry is not None
    assert cfg.serialization.registry.client_conf()["basic.auth.user.info"] == f"svc:{secret}"


def test_first_matching_entry_applies_and_subjects_follow_the_strategy() -> None:
    s = SerializationConfig.from_mapping(
        {
            "registry": REGISTRY,
            "topics": [
                {"topic": "orders.raw", "serializer": "none"},
                {"topicPattern": r"orders\..*", "serializer": "avro"},
                {"topic": "inv", "serializer": "avro", "subjectNameStrategy": "topicRecord", "recordName": "b.Inv"},
                {"topic": "pay", "serializer": "jsonSchema", "subjectNameStrategy": "record", "recordName": "p.Pay"},
            ],
        }
    )
    assert s.enabled
    assert s.for_topic("orders.raw") is None  # an explicit none wins over the later pattern
    entry = s.for_topic("orders.eu")
    assert entry is not None and entry.subject("orders.eu") == "orders.eu-value"
    assert entry.subject("orders.eu", is_key=True) == "orders.eu-key"
    assert s.for_topic("ordersXeu") is None  # the pattern matches the whole name
    assert s.for_topic("inv").subject("inv") == "inv-b.Inv"  # type: ignore[union-attr]
    assert s.for_topic("pay").subject("pay") == "p.Pay"  # type: ignore[union-attr]
    assert s.for_topic("other") is None


def test_without_serialization_the_registry_client_is_never_imported() -> None:
    cfg = load(None)
    assert not cfg.serialization.enabled
    import subprocess

    code = (
        "import sys; from harvest_outbox.producer.harvest import Harvest; "
        "from harvest_outbox.producer.config import HarvestConfig; HarvestConfig(); "
        "print('confluent_kafka.schema_registry' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
