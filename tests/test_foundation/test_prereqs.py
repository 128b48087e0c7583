"""Missing prerequisites give one clear message: what is missing and how to fix it."""

from __future__ import annotations

import pytest

from harvest_outbox.harvest_local import PrerequisiteError, prereqs


@pytest.mark.parametrize(
    "check, missing, fix",
    [
        ("java", "Java (17 or newer)", "openjdk-17"),
        ("maven", "Maven", "apt-get install maven"),
    ],
)
def test_missing_tool_names_it_and_the_fix(monkeypatch, check, missing, fix) -> None:
    monkeypatch.setattr(prereqs.shutil, "which", lambda _name: None)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(PrerequisiteError) as info:
        getattr(prereqs, check)()
    assert missing in str(info.value) and fix in str(info.value)


def test_missing_postgres_without_root_says_how_to_get_it(monkeypatch) -> None:
    monkeypatch.delenv("HARVEST_PG_BINDIR", raising=False)
    monkeypatch.setattr(prereqs, "_find_postgres_bindir", lambda: None)
    monkeypatch.setattr(prereqs.os, "geteuid", lambda: 1000)
    with pytest.raises(PrerequisiteError) as info:
        prereqs.postgres_bindir()
    message = str(info.value)
    assert "initdb, pg_ctl" in message
    assert "apt-get install postgresql" in message and "HARVEST_PG_DSN" in message


def test_old_java_is_refused(monkeypatch, tmp_path) -> None:
    fake = tmp_path / "java"
    fake.write_text("#!/bin/sh\necho 'openjdk version \"11.0.2\"' >&2\n")
    fake.chmod(0o755)
    monkeypatch.setattr(prereqs.shutil, "which", lambda _name: str(fake))
    with pytest.raises(PrerequisiteError, match="Java 17\\+ \\(found 11"):
        prereqs.java()
