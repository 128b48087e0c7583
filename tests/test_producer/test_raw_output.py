"""Nothing reaches the operator's terminal raw (issue #38 items 11 and 15):
- a relay ``name`` holding control characters (a newline, ESC) is refused by the config with an error that
  shows it escaped, since the name goes into every log line; the default name is printable whatever the host;
- librdkafka's lines of the start-up leader-topic lookup go through logging (``harvest_outbox.librdkafka``),
  never as raw ``%3|...|FAIL|`` lines on stderr, and a down broker's repeated connection failures are
  logged once per window, not ~20 times a second."""

from __future__ import annotations

import logging
import socket
import time

import pytest

from harvest_outbox.producer.cli import main
from harvest_outbox.producer.config import HarvestConfig, default_name
from harvest_outbox.producer.errors import ConfigError, ElectionError

BAD_NAMES = [
    ("relay\nforged log line", "\\n"),
    ("relay\x1b[31mred", "\\x1b"),
    ("relay\rover", "\\r"),
    ("tab\there", "\\t"),
    ("nul\x00", "\\x00"),
    ("del\x7f", "\\x7f"),
    ("sep\u2028arator", "\\u2028"),
]


@pytest.mark.parametrize(("name", "escaped"), BAD_NAMES, ids=[repr(n) for n, _ in BAD_NAMES])
def test_a_name_with_control_characters_is_refused_and_shown_escaped(name: str, escaped: str) -> None:
    with pytest.raises(ConfigError) as info:
        HarvestConfig(name=name)
    message = str(info.value)
    assert message.startswith("name: ") and escaped in message and message.isprintable()
    assert "printable" in message  # the fix


def test_the_cli_refuses_such_a_name_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--name", "relay\n2026-01-01 INFO forged", "--bootstrap-servers", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "name: " in err and "\\n" in err


def test_default_name_is_printable_whatever_the_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "evil\nhost\x1b[2J")
    name = default_name()
    assert name.isprintable() and "\x1b" not in name
    assert HarvestConfig().name.isprintable()
