"""The relay's Kafka client properties (YAML ``baseKafkaConfig``, ``producerKafkaConfig``): their checks and
the producer properties they make.

Invariants:
- the producer's properties always end up with ``enable.idempotence=true`` and ``acks=all``: a user value
  that contradicts them is refused (:func:`checked_sections`) rather than silently overridden;
- the producer's delivery timeout is at most ``limits.rowTimeout`` (derived from it unless set lower);
- ``bootstrap.servers`` is a non-empty string, goharvest's default :data:`DEFAULT_BOOTSTRAP` when left out;
- :func:`check_with_librdkafka` lets librdkafka judge the properties without connecting (without the
  token callback: a client calls it at start), and its errors never show a secret property's value;
- a token provider (``kafkaOAuthTokenCommand`` / ``kafkaOAuthTokenProvider``, or an embedder's
  ``oauth_cb`` callable in ``baseKafkaConfig``) is the ``oauth_cb`` of ``baseKafkaConfig``, so every
  client the relay makes from it has it (:func:`with_token_provider`); it requires
  ``sasl.mechanism=OAUTHBEARER`` and a SASL ``security.protocol`` there, which are not set for the user.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harvest_outbox.kafka_token import KafkaTokenProvider, oauth_config_problem
from harvest_outbox.producer.config._limits import Limits
from harvest_outbox.producer.errors import ConfigError, shown
from harvest_outbox.redact import is_secret_kafka_key, redact_error
from harvest_outbox.secret_providers import SpecError

DEFAULT_BOOTSTRAP = "localhost:9092"
DEFAULT_PARTITIONER = "murmur2_random"  # Java client's default key placement
DEFAULT_LINGER_MS = 1
FORCED_PRODUCER = {"enable.idempotence": True, "acks": "all"}
DELIVERY_TIMEOUT_KEYS = ("message.timeout.ms", "delivery.timeout.ms")  # librdkafka aliases
BOOTSTRAP_KEYS = ("bootstrap.servers", "metadata.broker.list")  # librdkafka aliases
#: confluent-kafka's token callback property (not librdkafka's: it takes a Python callable).
OAUTH_CB = "oauth_cb"


def kafka_map(value: Any, path: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path}: expected a mapping of Kafka client properties, got {type(value).__name__}")
    out: dict[str, Any] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not k:
            raise ConfigError(f"{path}: property names must be non-empty strings, got {shown(k)}")
        if isinstance(v, (dict, list)):
            raise ConfigError(f"{path}.{k}: Kafka properties take scalar values, got {type(v).__name__}")
        out[k] = v
    return out


def check_bootstrap(base: Mapping[str, Any]) -> None:
    for key in BOOTSTRAP_KEYS:
        if key not in base:
            continue
        value = base[key]
        if value is None or (isinstance(value, str) and not value.strip()):
            raise ConfigError(
                f"baseKafkaConfig.{key}: {shown(value)} is empty; list the brokers, e.g. "
                f"'kafka1:9092,kafka2:9092' (or leave the key out for goharvest's default "
                f"{DEFAULT_BOOTSTRAP})"
            )
        if not isinstance(value, str):
            raise ConfigError(
                f"baseKafkaConfig.{key}: {shown(value)} is not a string (librdkafka would read "
                f"{shown(value)} as an IPv4 address and connect to it); quote it, e.g. "
                f"'kafka1:9092,kafka2:9092'"
            )


def checked_sections(base_config: Any, producer_config: Any, limits: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``baseKafkaConfig`` (with goharvest's default brokers when it names none) and ``producerKafkaConfig``
    as checked mappings; refuses a value that contradicts the forced producer properties, or a delivery
    timeout beyond ``limits.rowTimeout`` (``limits``: checked only when it is a :class:`Limits`)."""
    base = dict(kafka_map(base_config, "baseKafkaConfig"))
    if not any(key in base for key in BOOTSTRAP_KEYS):  # goharvest's default (FileConfig.notes says so)
        base["bootstrap.servers"] = DEFAULT_BOOTSTRAP
    check_bootstrap(base)
    prod = kafka_map(producer_config, "producerKafkaConfig")
    for key, forced in FORCED_PRODUCER.items():
        for where, conf in (("baseKafkaConfig", base), ("producerKafkaConfig", prod)):
            if key in conf and str(conf[key]).lower() not in {str(forced).lower(), "-1" if key == "acks" else ""}:
                raise ConfigError(
                    f"{where}.{key}: {shown(conf[key])} is not allowed; the relay needs "
                    f"{key}={forced} for ordered, duplicate-free retries — remove the property"
                )
    if isinstance(limits, Limits):
        # The delivery timeout derives from limits.rowTimeout; a longer one would let a row hold
        # others up longer than the documented bound.
        bound = int(limits.row_timeout * 1000)
        for where, conf in (("baseKafkaConfig", base), ("producerKafkaConfig", prod)):
            for key in DELIVERY_TIMEOUT_KEYS:
                if key in conf:
                    try:
                        ms = int(conf[key])
                    except (TypeError, ValueError):
                        raise ConfigError(
                            f"{where}.{key}: {shown(conf[key])} is not a whole number of milliseconds"
                        ) from None
                    if ms <= 0 or ms > bound:
                        raise ConfigError(
                            f"{where}.{key}: {ms} exceeds limits.rowTimeout ({bound} ms) or is "
                            f"infinite; the producer's delivery timeout derives from "
                            f"limits.rowTimeout — set that instead and remove {key}"
                        )
    return base, prod


def with_token_provider(
    base: dict[str, Any], producer: Mapping[str, Any], command: Any, function: Any
) -> KafkaTokenProvider | None:
    """The token provider of ``kafkaOAuthTokenCommand`` / ``kafkaOAuthTokenProvider`` (None: neither),
    made ``base``'s ``oauth_cb`` (so that every client made from ``base`` asks it); checks that ``base``
    and ``producer`` let a token be used. ``base`` may already hold it (a config copied by ``replace``)."""
    for key, value in (("kafkaOAuthTokenCommand", command), ("kafkaOAuthTokenProvider", function)):
        if not isinstance(value, str):
            raise ConfigError(f"{key}: {shown(value)} must be a string")
    if command and function:
        raise ConfigError("kafkaOAuthTokenCommand and kafkaOAuthTokenProvider are both set; keep one of them")
    if OAUTH_CB in producer:
        raise ConfigError(
            f"producerKafkaConfig.{OAUTH_CB}: every Kafka client of the relay needs the token, not only the "
            f"producer; give kafkaOAuthTokenCommand or kafkaOAuthTokenProvider (or {OAUTH_CB} in baseKafkaConfig)"
        )
    provider = None
    if command or function:
        try:
            provider = KafkaTokenProvider(command=command, function=function)
        except SpecError as exc:
            raise ConfigError(str(exc)) from None
    given = base.get(OAUTH_CB)
    if given is not None and not callable(given):
        raise ConfigError(
            f"baseKafkaConfig.{OAUTH_CB}: {shown(given)} is not a callable; in a file give "
            f"kafkaOAuthTokenProvider: 'package.module:function' (or kafkaOAuthTokenCommand) instead"
        )
    if provider is not None and given is not None and given != provider:
        key = "kafkaOAuthTokenCommand" if command else "kafkaOAuthTokenProvider"
        raise ConfigError(f"{key} and baseKafkaConfig.{OAUTH_CB} are both set; keep one of them")
    if provider is not None:
        base[OAUTH_CB] = provider
    if base.get(OAUTH_CB) is not None:
        key = (
            "kafkaOAuthTokenCommand"
            if command
            else "kafkaOAuthTokenProvider"
            if function
            else f"baseKafkaConfig.{OAUTH_CB}"
        )
        for where, conf in (("baseKafkaConfig", base), ("producerKafkaConfig", {**base, **producer})):
            problem = oauth_config_problem(conf)
            if problem is not None:
                raise ConfigError(f"{key} needs a token-based login, but in {where} {problem}")
    return provider


def without_token_provider(conf: Mapping[str, Any]) -> dict[str, Any]:
    """``conf`` without ``oauth_cb``: for clients made only to check properties (a client with it asks
    the provider for a token at start, and waits for it)."""
    return {k: v for k, v in conf.items() if k != OAUTH_CB}


def producer_properties(base: Mapping[str, Any], producer: Mapping[str, Any], row_timeout: float) -> dict[str, Any]:
    """Effective confluent-kafka producer properties: base, then producer overrides, then forced values."""
    conf = dict(base)
    conf.setdefault("partitioner", DEFAULT_PARTITIONER)
    # One record in flight per key makes the relay round-trip bound, not batch bound: librdkafka's
    # 5 ms default linger would cap a key at ~100 records/s. 1 ms measured best (bench/).
    conf.setdefault("linger.ms", DEFAULT_LINGER_MS)
    conf.update(producer)
    conf.update(FORCED_PRODUCER)
    if not any(k in conf for k in DELIVERY_TIMEOUT_KEYS):
        conf["message.timeout.ms"] = int(row_timeout * 1000)
    # librdkafka holds a record of a topic it has no metadata for up to this long (30 s by
    # default); the preflight refuses missing topics earlier, but keep it inside the bound too.
    conf.setdefault("topic.metadata.propagation.max.ms", min(30000, int(row_timeout * 1000)))
    return conf


def check_with_librdkafka(
    base: Mapping[str, Any],
    producer: Mapping[str, Any],
    limits: Limits,
    election_consumer: Mapping[str, Any] | None,
) -> None:
    """Let librdkafka judge the Kafka properties now, so a misspelt name or a bad value is a
    :class:`ConfigError` naming the section before anything starts (instead of an error at the first
    leadership). Builds a producer and a consumer with no bootstrap servers: they connect nowhere.
    ``election_consumer``: the NELI election's consumer properties, when that is the election."""
    from confluent_kafka import Consumer, KafkaException, Producer

    quiet = {"bootstrap.servers": "", "log_level": 0}
    # In this order, so that an error is blamed on the section that holds the property: the producer
    # of base properties alone passing means the producer section's broke it (names may be aliases).
    base = without_token_provider(base)
    checks: tuple[tuple[str, Any, dict[str, Any]], ...] = (
        ("baseKafkaConfig", Consumer, {**base, "group.id": "harvest-config-check", **quiet}),
        ("baseKafkaConfig", Producer, {**producer_properties(base, {}, limits.row_timeout), **quiet}),
        ("producerKafkaConfig", Producer, {**producer_properties(base, producer, limits.row_timeout), **quiet}),
    )
    if election_consumer is not None:  # the election consumer adds settings derived from the limits
        checks += (("baseKafkaConfig", Consumer, {**without_token_provider(election_consumer), **quiet}),)
    for where, client, conf in checks:
        try:
            made = client(conf)
            if isinstance(made, Consumer):
                made.close()
        except (KafkaException, ValueError, TypeError) as exc:
            err = exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else str(exc)
            secrets = tuple(
                str(v) for conf_map in (base, producer) for k, v in conf_map.items() if is_secret_kafka_key(k)
            )
            text = redact_error(err, None, secrets)
            raise ConfigError(
                f"{where}: {text}; check the property name and value against librdkafka's "
                f"CONFIGURATION.md (https://github.com/confluentinc/librdkafka/blob/master/"
                f"CONFIGURATION.md)"
            ) from None
