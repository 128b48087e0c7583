"""Optional dependencies stay optional: producer imports and stashes without SQLAlchemy or
OpenTelemetry installed (simulated in a fresh interpreter whose import of them fails)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# Make ``import <name>`` (and its submodules) fail as if the distribution were not installed.
_BLOCK = textwrap.dedent("""
    import sys
    class _Block:
        def __init__(self, names): self.names = names
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in self.names:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None
    sys.meta_path.insert(0, _Block(BLOCKED))
""")


def _run(blocked: set[str], body: str) -> subprocess.CompletedProcess[str]:
    code = _BLOCK.replace("BLOCKED", repr(blocked)) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_producer_imports_without_sqlalchemy_and_names_the_extra() -> None:
    out = _run(
        {"sqlalchemy"},
        """
        from harvest_outbox import producer
        import harvest_outbox.producer.stash.stasher
        import harvest_outbox.producer.stash.async_stasher
        import harvest_outbox.producer.observe.health
        assert "sqlalchemy" not in sys.modules
        try:
            import harvest_outbox.producer.stash.sqlalchemy
            from harvest_outbox import producer
        except ImportError as exc:
            print("ERR", exc)
    """,
    )
    assert out.returncode == 0, out.stderr
    assert (
        "ERR harvest_outbox.producer.stash.sqlalchemy needs SQLAlchemy 2.x: pip install 'harvest-outbox[sqlalchemy]'"
        in out.stdout
    )


def test_producer_does_not_import_optional_packages_eagerly() -> None:
    out = _run(
        set(),
        """
        from harvest_outbox import producer
        import harvest_outbox.producer.stash.stasher
        from harvest_outbox import consumer
        from harvest_outbox.producer.stash.stasher import Stasher, OutboxRecord
        Stasher().plan.row(OutboxRecord("t", "k", "v"))  # no span: nothing recorded
        print(sorted(m for m in ("sqlalchemy", "greenlet") if m in sys.modules))
    """,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_without_opentelemetry_no_trace_header_and_no_error() -> None:
    out = _run(
        {"opentelemetry"},
        """
        from harvest_outbox.producer.observe import tracing
        from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher
        from harvest_outbox.producer.stash.async_stasher import AsyncStasher
        assert tracing.available() is False and tracing.current_trace_headers() == []
        row = Stasher().plan.row(OutboxRecord("t", "k", "v", [("a", "b")]))
        rows = AsyncStasher().plan.rows([OutboxRecord("t", "k", "v")])
        print(row[3], row[4], rows[0][3])
    """,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['a'] ['b'] {}"  # COPY rows carry the header arrays as literals
