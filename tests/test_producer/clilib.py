"""The ``harvest`` command run by its ``main`` in the test's own process: what a subprocess would return
(exit code, stdout, stderr) without a Python start per call (~0.3-1 s, more on a loaded machine). Tests that
call it keep one call of theirs as a subprocess, which shows the process behaves the same."""

from __future__ import annotations

import contextlib
import io
import signal
import subprocess

from harvest_outbox.producer.ops import cli
from harvest_outbox.producer.relay.signals import STOP_SIGNALS


def harvest_in_process(*args: str) -> subprocess.CompletedProcess[str]:
    """What ``python -m harvest_outbox.producer *args`` returns as a subprocess, from the command's ``main``
    called here. ``main`` installs the relay's
    stop-signal handlers before it parses anything, and a ``run`` refused by its config leaves them to the
    process's exit: they are put back."""
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    return subprocess.CompletedProcess(["harvest", *args], code, out.getvalue(), err.getvalue())
