"""Move ``tests/test_producer/``'s flat test modules into folders that mirror ``producer/``'s packages
(issue #46, item 1: "tests/test_producer/ mirrors the new packages").

Run from the repository root: ``python scripts/test_rooms.py``. Like ``scripts/rooms.py`` it is the record
of the move and idempotent: a run on the moved tree changes nothing, and a run after more flat test
modules landed (a merge) moves those too, or stops, changing nothing, naming a module :data:`ROOMS` does not
place.

- ``git mv`` each ``tests/test_producer/test_*.py`` to ``tests/test_producer/<room>/``; the shared helpers
  (``relaylib.py``, ``seqcheck.py``, the fakes and models) stay at the top, where
  ``tests/test_producer/conftest.py`` puts them on ``sys.path`` for every folder below;
- every reference to a moved module's path (``tests/test_producer/test_x.py``, with or without a
  ``::test``) is rewritten in every tracked text file but CHANGELOG.md (its history names the paths as
  they were); a moved module's ``Path(__file__).resolve().parents[N]`` gets its room's depth added.

A room is a package of ``producer/`` (``layouts/cursor``, ``relay/sequenced``, ...), or ``cluster`` for the
replicated-cluster and fail-over scenarios, which belong to no one package.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path.cwd()
TESTS = ROOT / "tests" / "test_producer"

#: room -> the test modules that live there (module names without ``.py``).
ROOMS: dict[str, tuple[str, ...]] = {
    "config": ("test_config", "test_config_env", "test_registry_config", "test_redact", "test_dsn_leaks"),
    "stash": (
        "test_stasher",
        "test_stasher_async",
        "test_stash_sqlalchemy",
        "test_registry_stash",
        "test_optional_deps",
        "test_trace_context",
        "test_text_array",
    ),
    "schema": ("test_hygiene", "test_sql_ascii", "test_grants", "test_grants_pg"),
    "layouts": ("test_outbox_layouts",),
    "layouts/mark": ("test_mark", "test_marksize", "test_async_mark", "test_commit_rows"),
    "layouts/cursor": (
        "test_cursor_held",
        "test_cursor_id_source",
        "test_cursor_relay",
        "test_cursor_shards",
        "test_watermark",
        "test_watermark_model",
        "test_watermark_pg",
        "test_watermark_sequenced",
        "test_online_migration",
    ),
    "mapping": ("test_table_mapping", "test_java_regex", "test_debezium_cursor", "test_mapping_protocol"),
    "relay": (
        "test_relay",
        "test_relay_hotpath",
        "test_relay_modes",
        "test_harvest_logic",
        "test_lifecycle",
        "test_layout",
        "test_layout_session",
        "test_waker",
        "test_two_phase",
        "test_row_timeout",
        "test_halt_key",
        "test_attempts",
        "test_shards",
        "test_shard_null_key",
        "test_relay_spans",
        "test_relay_spans_e2e",
        "test_marked_row",
        "test_readable",
        "test_native_records",
    ),
    "relay/sequenced": (
        "test_protocol_model",
        "test_sequencing",
        "test_sequencing_commit_unknown",
        "test_sequencing_crash",
        "test_frozen_commit",
        "test_clock_step",
        "test_crash_hooks",
        "test_view_failure",
        "test_native_fill",
    ),
    "encode": (
        "test_avro_batch",
        "test_avro_compiled",
        "test_encode_after",
        "test_encode_worker",
        "test_json_schema_writer",
        "test_protobuf_fast",
        "test_registry_encode",
        "test_registry_outage",
        "test_registry_pinned",
        "test_registry_protobuf",
    ),
    "kafka": (
        "test_acls",
        "test_client_settings",
        "test_kafka_errors",
        "test_probe",
        "test_raw_output",
        "test_security_errors",
        "test_shared_admin",
        "test_shared_producer",
    ),
    "observe": (
        "test_dashboard",
        "test_health",
        "test_health_logic",
        "test_histograms",
        "test_http_endpoint",
        "test_http_security",
    ),
    "db": (
        "test_credentials",
        "test_password_rotation",
        "test_connect_errors",
        "test_listener",
        "test_shared_listener",
        "test_statement_pool",
        "test_rendered",
        "test_text_arrays",
    ),
    "ops": ("test_cli", "test_deadletter_admin", "test_preflight", "test_signals", "test_poison", "test_privileges"),
    "election": ("test_election_postgres", "test_failover", "test_sharded_failover", "test_shared_election"),
    "cluster": ("test_kafka_cluster", "test_pg_failover", "test_unclean_election"),
    "fleet": (
        "test_fleet_spec",
        "test_fleet_supervisor",
        "test_fleet_discovery",
        "test_fleet_endpoint",
        "test_fleet_balance",
        "test_fleet_failover",
        "test_fleet_pool",
        "test_fleet_workers",
    ),
}

#: Folders of tests/test_producer/ that mirror no package of producer/ (module doc).
EXTRA_ROOMS = ("cluster",)

SKIP = ("CHANGELOG.md",)

#: tests/test_producer/conftest.py, written when missing: what makes the helpers and the rooms importable.
CONFTEST = '''"""tests/test_producer/: the relay's tests, in folders that mirror producer/'s packages (scripts/test_rooms.py).

This folder holds the helpers the tests import by name (relaylib, seqcheck, the fakes and the models);
pytest puts a conftest's folder on ``sys.path``, which makes them importable from every folder below. The
folders themselves go on ``sys.path`` too, so a test module that reuses another's helpers
(``from test_table_mapping import _insert``) finds it in whichever room it lives: test module names stay
unique across tests/ (pytest's default import mode requires it), so a name means one file.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent

for _room in sorted(p for p in _HERE.rglob("*") if p.is_dir() and p.name != "__pycache__"):
    if str(_room) not in sys.path:
        sys.path.append(str(_room))
'''

PARENTS = re.compile(r"(Path\(__file__\)\.resolve\(\)\.parents\[)(\d+)\]")


def room_of() -> dict[str, str]:
    placed: dict[str, str] = {}
    for room, modules in ROOMS.items():
        for module in modules:
            if module in placed:
                raise SystemExit(f"{module} is placed twice: {placed[module]} and {room}")
            placed[module] = room
    return placed


def main() -> int:
    placed = room_of()
    flat = sorted(p.stem for p in TESTS.glob("test_*.py"))
    unplaced = [m for m in flat if m not in placed]
    if unplaced:
        print(f"not placed (add them to ROOMS): {', '.join(unplaced)}", file=sys.stderr)
        return 1
    moves = {f"tests/test_producer/{m}.py": f"tests/test_producer/{placed[m]}/{m}.py" for m in flat}
    for old, new in moves.items():
        (ROOT / new).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "mv", old, new], check=True)
    for old, new in moves.items():  # paths the module computes from its own file are deeper by its room's depth
        depth = new.count("/") - old.count("/")
        path = ROOT / new
        text = path.read_text()
        path.write_text(PARENTS.sub(lambda m, d=depth: f"{m.group(1)}{int(m.group(2)) + d}]", text))
    if moves:
        pattern = re.compile("|".join(re.escape(old) for old in sorted(moves, key=len, reverse=True)))
        tracked = subprocess.run(["git", "ls-files"], check=True, capture_output=True, text=True).stdout.split()
        for name in tracked:
            path = ROOT / name
            if name in SKIP or not path.is_file():
                continue
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            new_text = pattern.sub(lambda m: moves[m.group(0)], text)
            if new_text != text:
                path.write_text(new_text)
    conftest = TESTS / "conftest.py"
    if not conftest.exists():
        conftest.write_text(CONFTEST)
        subprocess.run(["git", "add", str(conftest)], check=True)
    print(f"moved {len(moves)} test modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
