"""Kafka OAUTHBEARER tokens from a command or a function: the ``oauth_cb`` of every Kafka client of the
relay (``kafkaOAuthTokenCommand`` / ``kafkaOAuthTokenProvider``) and of the readers (``oauth_cb`` /
``kafka.oauth_cb`` given as ``module:function``).

librdkafka asks for a token when a client starts and again at 80 % of the current token's life (on
its background thread, confluent-kafka >= 2.13), and re-authenticates its broker connections with the
new one, so a token that expires never ends a session as long as the provider keeps answering.

A command prints either a JWT (its expiry is the ``exp`` claim of its payload; the signature is not
checked here, the broker does that) or a JSON object ``{"token": "...", "expires_at": <epoch
seconds>}`` (for opaque tokens). A function of no arguments returns ``(token, expires_at)``.

Invariants (``tests/test_security/test_kafka_token.py``):

- a token is a secret: never logged, never in a repr or an error; a failing provider's error names the
  provider (its key and program, or its ``module:function``) and how it failed, never its output, its
  arguments, nor a function's exception message (not chained either);
- what a provider gives is checked before librdkafka sees it: a non-empty token without whitespace and
  an expiry in the future given in seconds (a value in milliseconds is refused, naming the mistake);
- a failure is logged as an error and raised as :class:`KafkaTokenError` to confluent-kafka, which
  makes librdkafka ask again 10 s later: the client keeps its connections while the old token lasts;
- a token only means something with ``sasl.mechanism=OAUTHBEARER`` over ``SASL_SSL`` (or
  ``SASL_PLAINTEXT``) and librdkafka's own OIDC method off: :func:`oauth_config_problem` says what is
  missing (a client with a token callback and another mechanism waits 10 s at start, then fails
  with a message that does not say why).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from harvest_outbox.errors import HarvestOutboxError
from harvest_outbox.secret_providers import SpecError, command_argv, resolve_function, run_command

__all__ = [
    "COMMAND_TIMEOUT",
    "KafkaTokenError",
    "KafkaTokenProvider",
    "oauth_config_problem",
    "parse_token_output",
    "reader_token_callback",
    "with_reader_token_callback",
]

log = logging.getLogger(__name__)

#: Seconds a token command may run. librdkafka waits 10 s for a client's first token, so a slower one
#: fails the client's start anyway.
COMMAND_TIMEOUT = 8.0
#: An expiry above this is taken for milliseconds (epoch seconds reach it in the year 5138).
_MILLISECONDS = 1e11
#: What a command prints, for messages.
_FORMATS = 'a JWT with an "exp" claim, or JSON {"token": "...", "expires_at": <epoch seconds>}'


class KafkaTokenError(HarvestOutboxError, RuntimeError):
    """The provider gave no usable token; the message names the provider, never the token."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse_token_output(text: str, origin: str) -> tuple[str, float]:
    """``(token, expires_at)`` from what a token command printed (see the module doc for the formats)."""
    text = text.strip()
    if not text:
        raise KafkaTokenError(f"{origin} printed nothing; it must print {_FORMATS}")
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError:
            raise KafkaTokenError(
                f"{origin} printed a '{{' that does not start JSON; it must print {_FORMATS}"
            ) from None
        if not isinstance(obj, dict) or not isinstance(obj.get("token"), str) or not _number(obj.get("expires_at")):
            raise KafkaTokenError(
                f'{origin} printed JSON without a string "token" and a number "expires_at"; it must print {_FORMATS}'
            )
        return obj["token"], float(obj["expires_at"])
    parts = text.split(".")
    claims: Any = None
    if len(parts) == 3 and parts[0] and parts[1]:
        try:
            claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        except (ValueError, binascii.Error):
            claims = None
    if not isinstance(claims, dict):
        raise KafkaTokenError(f"{origin} printed neither a JWT nor JSON; it must print {_FORMATS}")
    if not _number(claims.get("exp")):
        raise KafkaTokenError(
            f'{origin} printed a JWT without a numeric "exp" claim; print JSON {{"token": ..., "expires_at": ...}} '
            f"to give its expiry"
        )
    return text, float(claims["exp"])


def _checked(token: Any, expires_at: Any, origin: str, now: float) -> tuple[str, float]:
    if not isinstance(token, str) or not token or any(c.isspace() for c in token):
        raise KafkaTokenError(f"{origin} gave an empty token or one holding whitespace; a token is one word")
    if not _number(expires_at):
        raise KafkaTokenError(f"{origin} gave an expiry that is not a number; give epoch seconds")
    if expires_at > _MILLISECONDS:
        raise KafkaTokenError(f"{origin} gave an expiry in milliseconds ({expires_at:.0f}); give epoch seconds")
    if expires_at <= now:
        raise KafkaTokenError(
            f"{origin} gave a token that expired {now - expires_at:.0f} s ago; it must return a fresh one"
        )
    return token, float(expires_at)


class KafkaTokenProvider:
    """A token command or function, used as confluent-kafka's ``oauth_cb``: ``provider(config) ->
    (token, expires_at)``. Checked (split, imported) at construction; asked at each call.

    ``command_key`` / ``function_key``: the settings it came from, for messages.
    """

    def __init__(
        self,
        command: str = "",
        function: str = "",
        *,
        command_key: str = "kafkaOAuthTokenCommand",
        function_key: str = "kafkaOAuthTokenProvider",
    ) -> None:
        if bool(command) == bool(function):
            raise ValueError("give exactly one of command and function")
        self._argv: list[str] = []
        self._function: Callable[[], Any] | None = None
        self._lock = threading.Lock()
        #: Tokens given so far (each start of a client and each refresh asks once).
        self.tokens_given = 0
        if command:
            self._argv = command_argv(command, command_key, "a token")
            # the program alone: the arguments may hold a secret of their own (a client secret)
            self._origin = f"{command_key} ({self._argv[0]})"
        else:
            self._function = resolve_function(function, function_key, "(token, expires_at epoch seconds)")
            self._origin = f"{function_key} ({function})"

    @property
    def origin(self) -> str:
        """The provider as messages name it: its key and program, or its ``module:function``."""
        return self._origin

    def token(self) -> tuple[str, float]:
        """``(token, expires_at)`` now; :class:`KafkaTokenError` when there is none."""
        if self._argv:
            token, expires_at = parse_token_output(
                run_command(self._argv, self._origin, COMMAND_TIMEOUT, KafkaTokenError), self._origin
            )
        else:
            assert self._function is not None
            try:
                value = self._function()
            except Exception as exc:  # not chained, not its message: either may quote the token
                raise KafkaTokenError(f"{self._origin} raised {type(exc).__name__}") from None
            if not isinstance(value, tuple) or len(value) != 2:
                raise KafkaTokenError(
                    f"{self._origin} returned a {type(value).__name__}; it must return a tuple (token, expires_at)"
                )
            token, expires_at = value
        return _checked(token, expires_at, self._origin, time.time())

    def __call__(self, _oauthbearer_config: str | None = None) -> tuple[str, float]:
        """confluent-kafka's ``oauth_cb`` (its argument, ``sasl.oauthbearer.config``, is not used)."""
        try:
            token, expires_at = self.token()
        except KafkaTokenError as exc:
            # confluent-kafka reports a failing callback only as "OAuth token not set" at a client's start
            log.error("Kafka OAUTHBEARER token: %s; librdkafka asks again in 10 s", exc)
            raise
        with self._lock:
            self.tokens_given += 1
        log.debug("Kafka OAUTHBEARER token from %s, valid for %.0f s", self._origin, expires_at - time.time())
        return token, expires_at

    def __repr__(self) -> str:
        return f"KafkaTokenProvider({self._origin})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KafkaTokenProvider) and (self._argv, self._function) == (
            other._argv,
            other._function,
        )

    def __hash__(self) -> int:
        return hash((tuple(self._argv), self._function))


def reader_token_callback(value: Any, key: str) -> Callable[..., Any]:
    """A reader's ``oauth_cb``: a callable as confluent-kafka takes it (``cb(config) -> (token,
    expires_at)``), or ``package.module:function`` (a function of no arguments, as the relay's
    ``kafkaOAuthTokenProvider``) resolved here; :class:`~harvest_outbox.secret_providers.SpecError`
    otherwise. ``key``: the option it came from, for messages."""
    if isinstance(value, str):
        return KafkaTokenProvider(function=value, function_key=key)
    if not callable(value):
        raise SpecError(
            f"{key}: a {type(value).__name__} is not a token callback; give a callable (config) -> (token, "
            f"expires_at) or 'package.module:function', a function of no arguments returning (token, expires_at)"
        )
    return value


def with_reader_token_callback(config: dict[str, Any], key: str, hint: str = "") -> None:
    """Put a reader's checked token callback in ``config`` (librdkafka properties, changed in place) when it has
    an ``oauth_cb``: :func:`reader_token_callback` of it, with the settings a callback needs
    (:func:`oauth_config_problem`). :class:`~harvest_outbox.secret_providers.SpecError` naming ``key`` (and
    ``hint``, how the reader spells the settings) otherwise. The one check both readers' configs run."""
    if config.get("oauth_cb") is None:
        return
    config["oauth_cb"] = reader_token_callback(config["oauth_cb"], key)
    problem = oauth_config_problem(config)
    if problem is not None:
        raise SpecError(f"{key} gives OAUTHBEARER tokens, but {problem}{hint}")


def oauth_config_problem(config: Mapping[str, Any]) -> str | None:
    """What ``config`` (librdkafka properties) lacks for a token callback to be used, or None."""
    mechanism = config.get("sasl.mechanism", config.get("sasl.mechanisms"))
    if mechanism != "OAUTHBEARER":
        given = "unset" if mechanism is None else repr(mechanism)
        return (
            f"sasl.mechanism is {given}, not 'OAUTHBEARER' (no other mechanism uses a token); "
            f"set sasl.mechanism: OAUTHBEARER"
        )
    protocol = str(config.get("security.protocol", "plaintext")).lower()
    if protocol not in ("sasl_ssl", "sasl_plaintext"):
        return (
            f"security.protocol is {config.get('security.protocol', 'plaintext')!r}, which does no SASL; "
            f"set security.protocol: SASL_SSL"
        )
    method = str(config.get("sasl.oauthbearer.method", "default")).lower()
    if method != "default":
        return (
            f"sasl.oauthbearer.method is {config.get('sasl.oauthbearer.method')!r}: librdkafka then fetches "
            f"tokens itself and ignores the provider; remove sasl.oauthbearer.method (or the provider)"
        )
    return None
