"""Stopping a service's child process (the broker's, the registry's JVM): one way for every service."""

from __future__ import annotations

import signal
import subprocess

__all__ = ["kill_child", "stop_child"]


def stop_child(proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds; a gone process is fine."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def kill_child(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL (a crash, for fault tests) and reap."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
