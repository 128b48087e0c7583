"""Where embedded services keep their files: one git-ignored folder."""

from __future__ import annotations

import os
import socket
from pathlib import Path


def project_root() -> Path | None:
    """The checkout this package runs from (editable install), if any."""
    here = Path(__file__).resolve().parent.parent
    return here if (here / "pyproject.toml").is_file() else None


def work_dir() -> Path:
    """``$HARVEST_WORK_DIR``, else ``<checkout>/.work``, else ``~/.cache/harvest``."""
    configured = os.environ.get("HARVEST_WORK_DIR")
    if configured:
        path = Path(configured)
    else:
        root = project_root()
        path = root / ".work" if root else Path.home() / ".cache" / "harvest"
    path.mkdir(parents=True, exist_ok=True)
    return path


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now and that this process has not
    handed out before: a service asks for several (Kafka: client, controller, proxied listeners)
    before it binds any, and the kernel may offer a just-closed ephemeral port again."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise OSError("no free TCP port on 127.0.0.1 that this process has not handed out already")


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
