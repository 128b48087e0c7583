"""Where a rotating secret comes from: a command that prints it, or a ``package.module:function`` that
returns it. The one owner of both for the relay (``dataSourcePasswordCommand`` / ``…Provider``,
``kafkaOAuthTokenCommand`` / ``…Provider``) and the readers (``oauth_cb``, ``kafka.oauth_cb``), which
must not import the relay: it lives here, beside :mod:`harvest_outbox.redact`.

Invariants (``tests/test_producer/db/test_credentials.py``, ``tests/test_security/test_kafka_token.py``):

- a spec that cannot be used (not ``module:function``, not importable, not callable; a command that
  cannot be split or is empty) is a :class:`SpecError` naming the key, the value (abridged; of a command
  only its program) and the fix, raised when the config is read, never at the first use;
- a command runs without a shell, stdin closed, at most ``timeout`` seconds; a failing command's error
  names its program and exit code (or timeout), never its output nor its arguments (either may hold
  the secret, a token tool's stderr the request it signed);
- an import's own error is not chained and only its type is shown: a module may fail on a value it read.
"""

from __future__ import annotations

import importlib
import shlex
import subprocess
from collections.abc import Callable
from typing import Any

from harvest_outbox.errors import HarvestOutboxError

__all__ = ["SpecError", "command_argv", "resolve_function", "run_command"]

#: The most characters of a user's value an error shows (as ``producer.errors.shown``).
_SHOWN = 80


class SpecError(HarvestOutboxError, ValueError):
    """A provider spec or command that cannot be used; the message names the key, the value and a fix."""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}…({len(text) - _SHOWN} more chars)"


def resolve_function(spec: str, key: str, returns: str) -> Callable[..., Any]:
    """The callable ``spec`` (``package.module:function``) names; ``key`` is the setting it came from and
    ``returns`` what the function must return, for the fix."""
    fix = f"give 'package.module:function', a function of no arguments that returns {returns}"
    if not isinstance(spec, str):
        raise SpecError(f"{key}: {_shown(spec)} must be a string; {fix}")
    module, _, name = spec.partition(":")
    if not module or not name:
        raise SpecError(f"{key}: {_shown(spec)} is not 'module:function'; {fix}")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise SpecError(f"{key}: {_shown(spec)} cannot be imported ({type(exc).__name__}); {fix}") from None
    if not callable(found):
        raise SpecError(f"{key}: {_shown(spec)} is not callable; {fix}")
    return found


def command_argv(command: str, key: str, prints: str) -> list[str]:
    """``command`` split as a POSIX shell would (it runs without one); ``prints``: what it must print."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        program = command.split()[0] if command.split() else ""
        # its program alone, as for a failing command: an argument may hold a secret of its own
        raise SpecError(
            f"{key}: the command (program {_shown(program)}) cannot be split into arguments ({exc}); quote it as "
            f"a POSIX shell would (it runs without a shell)"
        ) from None
    if not argv:
        raise SpecError(f"{key}: empty; give a command that prints {prints}")
    return argv


def run_command(argv: list[str], origin: str, timeout: float, error: type[Exception]) -> str:
    """``argv``'s stdout, decoded and stripped; ``error(message)`` when it cannot run, fails or hangs.
    ``origin`` names it in messages (its key and program, never its arguments)."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise error(f"{origin} did not finish within {timeout:g}s; check that it runs non-interactively") from None
    except OSError as exc:
        raise error(
            f"{origin} cannot run: {exc.strerror or type(exc).__name__}; give a program on PATH or its full path"
        ) from None
    if done.returncode != 0:  # not its stderr: a failing token tool may print the request it signed
        raise error(f"{origin} exited with code {done.returncode}; run it by hand as the relay's user to see why")
    return done.stdout.decode("utf-8", "replace").strip()
