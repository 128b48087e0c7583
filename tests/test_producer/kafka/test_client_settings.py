"""producer/kafka/client_settings.py: each kind of client gets the base's properties less the other kinds' own;
security settings always pass; the base is left as it was."""

from __future__ import annotations

from harvest_outbox.producer.kafka.client_settings import CONSUMER_ONLY, PRODUCER_ONLY, for_admin, for_consumer

SECURITY = {
    "bootstrap.servers": "b:9093",
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "relay",
    "sasl.password": "s3cret",
    "ssl.ca.location": "/ca.pem",
    "ssl.endpoint.identification.algorithm": "https",
    "oauth_cb": print,
}


def test_each_client_drops_the_other_kinds_own_and_keeps_security() -> None:
    base = {**SECURITY, **dict.fromkeys(PRODUCER_ONLY, "p"), **dict.fromkeys(CONSUMER_ONLY, "c")}
    before = dict(base)
    assert for_consumer(base) == {**SECURITY, **dict.fromkeys(CONSUMER_ONLY, "c")}
    assert for_admin(base) == SECURITY
    assert base == before


def test_the_lists_do_not_overlap_and_name_no_shared_setting() -> None:
    assert not PRODUCER_ONLY & CONSUMER_ONLY
    assert not (PRODUCER_ONLY | CONSUMER_ONLY) & set(SECURITY)
