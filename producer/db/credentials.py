"""The Postgres password of each new connection, asked of a provider (rotating credentials: an IAM token,
a Vault lease, a file a sidecar rewrites) instead of written in the DSN.

A provider is a command (``dataSourcePasswordCommand``, run without a shell: ``shlex.split``, at most
:data:`COMMAND_TIMEOUT`, its stdout stripped) or a Python callable (``dataSourcePasswordProvider:
module:function``, for embedders); both are resolved and run by :mod:`harvest_outbox.secret_providers`,
shared with the Kafka token provider. Every connection the relay and the CLI open to the outbox's database
goes through :func:`open_connection`, which asks the provider registered for that DSN (:func:`provide`)
each time: a password changed on the server is picked up by the next connection, no restart.

Invariants:
- the password is a secret: never stored here, logged, or put in a repr or an error; a failing command's
  error names its program and exit code (or timeout), never its output;
- a provider failure is a :class:`PasswordProviderError`, a :class:`psycopg.OperationalError`, so every
  connection site treats it as the connection failure it is (retry, back-off, a clear error at start);
- the provider's password overrides one in the DSN (libpq's keyword arguments win over the string);
- a connection that fails for a reason :mod:`producer.db.connect_errors` knows (TLS, a wrong password) is
  raised explained, a :class:`~producer.db.connect_errors.PostgresConnectError` from libpq's error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg

from harvest_outbox.errors import HarvestOutboxError
from harvest_outbox.producer.db.connect_errors import connect_explained
from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.secret_providers import SpecError, command_argv, resolve_function, run_command

#: Seconds a password command may run (``aws rds generate-db-auth-token`` takes about one). The
#: connection that waits for it may be the relay thread's, which also renews the election's lease: a
#: hung command must give up well before a lease would lapse for it.
COMMAND_TIMEOUT = 10.0


class PasswordProviderError(psycopg.OperationalError, HarvestOutboxError):
    """The provider gave no password; the message names the provider, never a secret."""


class PasswordProvider:
    """A command or a ``module:function`` that returns the password; checked at construction, asked on
    each :meth:`password`."""

    def __init__(self, command: str = "", function: str = "") -> None:
        if bool(command) == bool(function):
            raise ValueError("give exactly one of command and function")
        self._argv: list[str] = []
        self._function: Callable[[], Any] | None = None
        try:
            if command:
                self._argv = command_argv(command, "dataSourcePasswordCommand", "the password")
                # the program alone: the arguments may hold a secret of their own (a token, a role id)
                self._origin = f"dataSourcePasswordCommand ({self._argv[0]})"
            else:
                self._function = resolve_function(function, "dataSourcePasswordProvider", "the password")
                self._origin = f"dataSourcePasswordProvider ({function})"
        except SpecError as exc:
            raise ConfigError(str(exc)) from None

    def password(self) -> str:
        """The password now; :class:`PasswordProviderError` when there is none."""
        value = self._run() if self._argv else self._call()
        if not value:
            raise PasswordProviderError(f"{self._origin} returned an empty password; it must print or return one")
        return value

    def _run(self) -> str:
        return run_command(self._argv, self._origin, COMMAND_TIMEOUT, PasswordProviderError)

    def _call(self) -> str:
        assert self._function is not None
        try:
            value = self._function()
        except Exception as exc:  # not chained, not its message: either may quote the secret
            raise PasswordProviderError(f"{self._origin} raised {type(exc).__name__}") from None
        if not isinstance(value, str):
            raise PasswordProviderError(f"{self._origin} returned a {type(value).__name__}; it must return a str")
        return value.strip()

    def __repr__(self) -> str:
        return f"PasswordProvider({self._origin})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PasswordProvider) and (self._argv, self._function) == (other._argv, other._function)

    def __hash__(self) -> int:
        return hash((tuple(self._argv), self._function))


_lock = threading.Lock()
#: DSN -> its provider. Keyed by the DSN so that every connection site, which is handed the DSN, finds it
#: without the provider threaded through each constructor; the latest relay or command started on a DSN
#: decides (a process runs one config's relays).
_providers: dict[str, PasswordProvider] = {}


def provide(dsn: str, provider: PasswordProvider | None) -> None:
    """Connections to ``dsn`` take their password from ``provider`` from now on (None: from the DSN)."""
    with _lock:
        if provider is None:
            _providers.pop(dsn, None)
        else:
            _providers[dsn] = provider


def open_connection(dsn: str, **kwargs: Any) -> psycopg.Connection:
    """``psycopg.connect(dsn, **kwargs)`` with the password of ``dsn``'s provider, asked now; a failure
    explained (:func:`~producer.db.connect_errors.connect_explained`)."""
    with _lock:
        provider = _providers.get(dsn)
    if provider is not None:
        kwargs = {**kwargs, "password": provider.password()}
    return connect_explained(dsn, **kwargs)
