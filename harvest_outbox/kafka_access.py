"""A reader that cannot get into Kafka says why, at once: a wrong password, a token the broker refuses or a
broker certificate the CA does not verify is reported by librdkafka only to the client's ``error_cb``,
while the metadata request that the reader waits on times out 30 s later as "Broker transport failure".

:class:`AccessWatch` is that ``error_cb`` (it passes every error on to the application's own);
:func:`topic_metadata` asks for a topic's metadata in short steps, serving the callbacks between them, and
raises :class:`KafkaAccessError` once an authentication or TLS failure has lasted :data:`GRACE` seconds
with no answer. Shared by ``consumer`` and ``spark_reader`` (which do not import each other).

Invariants (``tests/test_security/test_readers_sasl.py``, ``tests/test_security/test_kafka_token.py``):

- the error quotes librdkafka's reason (``SASL authentication error: … invalid credentials …``,
  ``SSL handshake failed: … certificate verify failed …``) and names the settings to check; the values of
  the client's credential properties (:func:`harvest_outbox.redact.is_secret_kafka_key`) are removed from
  it, and nothing of the token or password is added;
- an authentication or TLS failure that clears within :data:`GRACE` (credentials created a moment ago)
  is no error; any other failure is left to the caller's own timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from harvest_outbox.errors import HarvestOutboxError
from harvest_outbox.redact import is_secret_kafka_key, redact_error

__all__ = ["GRACE", "AccessWatch", "KafkaAccessError", "topic_metadata"]

#: Seconds an authentication or TLS failure may last before it is the reader's error.
GRACE = 0.5
#: Seconds of each metadata request between two looks at the watch.
_STEP = 0.25
#: librdkafka's error codes of a refused login and of a failed TLS handshake (``KafkaError._AUTHENTICATION``,
#: ``KafkaError._SSL``; spelt here so this module imports confluent-kafka only when it asks).
_AUTHENTICATION, _SSL = -169, -181
_FIX = {
    _AUTHENTICATION: (
        "check sasl.mechanism, sasl.username and sasl.password (or the OAUTHBEARER token the oauth_cb gives) "
        "for the listener"
    ),
    _SSL: (
        "check ssl.ca.location (the CA that signed the broker's certificate) and that the broker's host "
        "name is in that certificate"
    ),
}


class KafkaAccessError(HarvestOutboxError, ConnectionError):
    """The broker refused the client's login or its TLS handshake failed; the message says why."""


class AccessWatch:
    """An ``error_cb`` that remembers an authentication or TLS failure and passes every error on to
    ``then`` (the application's ``error_cb``, if any)."""

    def __init__(self, then: Callable[[Any], Any] | None = None) -> None:
        self._then = then
        self._lock = threading.Lock()
        self._failure: tuple[int, str] | None = None
        self._since = 0.0

    def __call__(self, err: Any) -> None:
        code = err.code()
        with self._lock:
            if code in _FIX and self._failure is None:
                self._failure, self._since = (code, err.str()), time.monotonic()
        if self._then is not None:
            self._then(err)

    def cleared(self) -> None:
        """The client got an answer: an earlier failure has passed."""
        with self._lock:
            self._failure = None

    def failure(self, grace: float = GRACE) -> tuple[int, str] | None:
        """``(code, librdkafka's reason)`` of a failure that has lasted ``grace`` seconds, or None."""
        with self._lock:
            if self._failure is not None and time.monotonic() - self._since >= grace:
                return self._failure
            return None


def access_error(failure: tuple[int, str], config: Mapping[str, Any]) -> KafkaAccessError:
    """The error for ``failure``, without the values of ``config``'s credential properties."""
    code, reason = failure
    secrets = tuple(str(v) for k, v in config.items() if is_secret_kafka_key(str(k)) and v)
    kind = "refused the login" if code == _AUTHENTICATION else "failed the TLS handshake"
    return KafkaAccessError(f"Kafka {kind}: {redact_error(reason, None, secrets)}; {_FIX[code]}")


def topic_metadata(client: Any, topic: str, timeout: float, watch: AccessWatch, config: Mapping[str, Any]) -> Any:
    """``client.list_topics(topic, timeout)``, or :class:`KafkaAccessError` as soon as ``watch`` has seen
    an authentication or TLS failure last :data:`GRACE` seconds. ``client`` must have no assignment (its
    ``poll`` serves callbacks only); ``config``: its properties, whose secrets an error must not show."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            found = client.list_topics(topic, timeout=max(0.01, min(_STEP, left)))
        except KafkaException:
            if left <= _STEP:
                raise
            client.poll(0)  # serves error_cb
            failure = watch.failure()
            if failure is not None:
                raise access_error(failure, config) from None
            continue
        watch.cleared()
        return found
