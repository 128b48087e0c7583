"""The relay's start-up check of its Kafka connection: a TLS or SASL setting that can never work fails the
start at once, naming what to fix, instead of a relay that runs and retries the handshake forever.

:func:`check_connection` connects an admin client with the relay's ``baseKafkaConfig`` and describes the
cluster (a request every principal may make). librdkafka reports a failed handshake through its error callback (and, for a plaintext
client on a TLS port, only through its log lines: the broker hangs up during the first request); the check
waits for the answer or the first such report. Where librdkafka's text is ambiguous ("certificate verify
failed" for an unknown CA, an expired certificate and a wrong host name alike; a hang-up that may be a TLS
listener) it makes a TLS handshake of its own with the broker's address (:func:`tls_finding`), and
:mod:`producer.kafka.security_errors` explains.

Invariants (``tests/test_security/test_relay_sasl.py``):
- a wrong CA, an expired broker certificate, a wrong SCRAM password, a plaintext client on a SASL_SSL port
  raise :class:`~producer.errors.KafkaSecurityError` within seconds, naming the fix, never a secret;
- a broker that is down or does not answer is not an error here (the relay starts and waits for it, as
  before): the check returns after ``timeout`` or at the first "all brokers down" without a security cause;
- a stop request ends the wait.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from typing import Any

from harvest_outbox.producer.errors import KafkaSecurityError
from harvest_outbox.producer.kafka.client_settings import for_admin
from harvest_outbox.producer.kafka.security_errors import TlsFinding, broker_of, explain

log = logging.getLogger(__name__)

#: Each metadata request's slice: a stop request and the error callback's reports are looked at between two.
_SLICE = 0.2
#: librdkafka's log line of a connection the broker closed during the first request: what a plaintext
#: client sees of a TLS listener.
_HUNG_UP = "in state APIVERSION_QUERY"


class _Lines(logging.Handler):
    """librdkafka's log lines of the probe's client: kept (a hang-up is only said there), not logged: the
    relay's own clients say the same a moment later, and a failure here is raised with its explanation."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def check_connection(
    settings: Mapping[str, Any], timeout: float = 5.0, stop: threading.Event | None = None, what: str = "the relay"
) -> bool:
    """Connect with ``settings`` (a ``baseKafkaConfig``) and raise :class:`KafkaSecurityError` if the TLS or
    SASL handshake fails for a reason a retry cannot fix (module doc). True when the cluster answered, False
    when it did not (yet: down, slow, a stop request, or no ``bootstrap.servers``)."""
    if not settings.get("bootstrap.servers"):
        return False
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    errors: list[Any] = []
    lines = _Lines()
    logger = logging.Logger("harvest_outbox.kafka_probe")  # not registered: one per check, dropped with it
    logger.addHandler(lines)
    conf: dict[str, Any] = for_admin(settings)
    conf.update(logger=logger, error_cb=errors.append)
    admin = AdminClient(conf)
    # DescribeCluster: the lightest request every principal may make (no ACL; not the whole topic list)
    answer = admin.describe_cluster(request_timeout=timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
        failed = False
        try:
            answer.result(_SLICE)
            return True
        except TimeoutError:
            pass
        except KafkaException:
            failed = True  # (no answer in time, or none possible): what the callbacks said decides
        admin.poll(0)  # serves the error callback and the log lines
        failure = _failure(errors, lines.lines, settings)
        if failure is not None:
            raise KafkaSecurityError(f"{what} cannot use Kafka: {failure}")
        down = any(e.name() == "_ALL_BROKERS_DOWN" for e in errors) and not any(_HUNG_UP in x for x in lines.lines)
        if failed or down:
            log.warning("Kafka at %r does not answer yet; starting anyway", settings.get("bootstrap.servers"))
            return False
    return False


def _failure(errors: list[Any], lines: list[str], settings: Mapping[str, Any]) -> str | None:
    """The explanation of the first security error among the reports, or None."""
    for err in errors:
        name, text = err.name(), err.str()
        if name in ("_SSL", "_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED") or "SSL" in text:
            tls = tls_finding(text, settings) if "certificate verify failed" in text else None
            explained = explain(name, text, settings, tls)
            if explained is not None:
                return explained
    protocol = str(settings.get("security.protocol", "PLAINTEXT")).upper()
    hung_up = next((x for x in lines if _HUNG_UP in x), None)
    if hung_up is not None and "SSL" not in protocol:
        address = _address(hung_up, settings)
        if address is not None and _speaks_tls(*address):
            return explain("_TRANSPORT", hung_up.split("]: ", 1)[-1], settings, TlsFinding(speaks_tls=True))
    return None


def _address(text: str, settings: Mapping[str, Any]) -> tuple[str, int] | None:
    """The host and port a librdkafka text is about (else the first bootstrap server)."""
    where = broker_of(text.split("]: ", 1)[-1], settings).split(",")[0].strip()
    host, _, port = where.rpartition(":")
    if "://" in host:
        host = host.split("://", 1)[1]
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return None


def _speaks_tls(host: str, port: int) -> bool:
    """Does ``host:port`` complete a TLS handshake (certificate unchecked: only the protocol is asked)?"""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), 3.0) as sock, ctx.wrap_socket(sock, server_hostname=host):
            return True
    except (OSError, ssl.SSLError):
        return False


def tls_finding(text: str, settings: Mapping[str, Any]) -> TlsFinding | None:
    """A verifying TLS handshake of our own with the broker ``text`` is about, as librdkafka's settings ask
    (``ssl.ca.location``, ``ssl.endpoint.identification.algorithm``): OpenSSL's verify code tells an unknown
    CA, an expired certificate and a host name mismatch apart. None if the broker cannot be reached."""
    address = _address(text, settings)
    if address is None:
        return None
    host, port = address
    ca = settings.get("ssl.ca.location")
    ctx = ssl.create_default_context(cafile=str(ca) if ca and ca != "probe" else None)  # "probe": the system's
    ctx.check_hostname = str(settings.get("ssl.endpoint.identification.algorithm", "https")).lower() == "https"
    try:
        with socket.create_connection((host, port), 3.0) as sock, ctx.wrap_socket(sock, server_hostname=host):
            return TlsFinding(speaks_tls=True)
    except ssl.SSLCertVerificationError as exc:
        return TlsFinding(True, exc.verify_code, exc.verify_message)
    except ssl.SSLError:
        return TlsFinding(speaks_tls=False)
    except OSError:
        return None
