"""One owner per concept (issue #32): each rule below is spelt in exactly one module of the package.

A second copy of a rule drifts from the first (a topic check that admits what another refuses, a
version string that differs between ``harvest --version`` and the package), so this greps the
package's sources for each rule's spelling and names the modules that hold it. The owners' users
import the rule; a new copy fails here with the module to import it from.
"""

from __future__ import annotations

import re

import pytest

from harvest_outbox.harvest_local.workdir import project_root

FOLDERS = ("harvest_outbox", "producer", "consumer", "sequencer", "spark_reader", "harvest_local", "bench")

#: concept -> (its owner, a pattern matching any spelling of the rule in source text)
OWNERS = {
    "Kafka topic-name rule": (
        "producer/_kafka_names.py",
        # the length limit, as a regex or in words (other sanitisers, e.g. of folder names, share the
        # character class but not the limit)
        re.compile(r"\{1,249\}|1-249"),
    ),
    "credential-name rule (also tests/test_producer/config/test_redact.py)": (
        "harvest_outbox/redact.py",
        re.compile(r"pas\+w"),
    ),
    # The Gazette UUID layout: its masks and shifts.
    "Gazette UUID layout": (
        "sequencer/uuid_layout.py, sequencer/_uuid_layout.pxd",
        re.compile(r"0x0FFF\b|0x3FF\b|>> ?58\b|>> ?96\b|<< ?96\b|>> ?48\) & ", re.I),
    ),
    # libpq's connect failures (TLS, a wrong password) and what fixes them: one table of their words.
    "libpq connect-failure explanations": (
        "producer/db/connect_errors.py",
        re.compile(r"password authentication failed|no pg_hba\.conf entry|does not match host name"),
    ),
    "__version__": (
        "harvest_outbox/__init__.py",
        re.compile(r"""^\s*__version__\s*=|version\(\s*["']harvest-outbox["']\s*\)""", re.M),
    ),
}


def _sources() -> dict[str, str]:
    root = project_root()
    if root is None:
        pytest.fail("this test reads the checkout's files: run it from an editable install (./dev test)")
    return {
        str(path.relative_to(root)): path.read_text(encoding="utf-8")
        for folder in FOLDERS
        for pattern in ("*.py", "*.pyx", "*.pxd")
        for path in sorted((root / folder).rglob(pattern))
        if "goharvest" not in path.parts
    }


@pytest.mark.parametrize("concept", list(OWNERS))
def test_the_rule_has_one_owner(concept: str) -> None:
    owner, spelling = OWNERS[concept]
    holders = sorted(path for path, text in _sources().items() if spelling.search(text))
    assert holders == sorted(owner.split(", ")), f"{concept}: defined in {holders}; import it from {owner} instead"


def test_the_owners_check_sees_a_copy() -> None:
    _, spelling = OWNERS["Kafka topic-name rule"]
    assert spelling.search('_TOPIC = re.compile(r"^[a-zA-Z0-9._\\-]{1,249}$")')
    assert spelling.search("use 1-249 characters from [A-Za-z0-9._-]")
    assert OWNERS["__version__"][1].search('    __version__ = version("harvest-outbox")')
    assert not OWNERS["__version__"][1].search("log.info('harvest %s', producer.__version__)")


def test_the_version_is_one_value() -> None:
    import harvest_outbox
    import harvest_outbox.producer as producer

    assert producer.__version__ == harvest_outbox.__version__
    assert isinstance(harvest_outbox.__version__, str) and harvest_outbox.__version__
