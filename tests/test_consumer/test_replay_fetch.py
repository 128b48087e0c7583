"""The replay consumer fetches small: a replay needs one span, not a partition's default 1 MB per fetch
(``ReaderConfig.replay_config``); the main consumer keeps the application's settings."""

from __future__ import annotations

import pytest

from harvest_outbox.consumer.config import PREFETCH_DEFAULTS, REPLAY_FETCH_BYTES, ReaderConfig


@pytest.mark.parametrize("user_value", [None, 1024, 10 * 1024 * 1024])
def test_replay_fetches_small_main_consumer_keeps_the_users_setting(user_value: int | None) -> None:
    cfg = {"bootstrap.servers": "k:9092"}
    if user_value is not None:
        cfg["max.partition.fetch.bytes"] = user_value
    rc = ReaderConfig(cfg)
    assert rc.replay_config()["max.partition.fetch.bytes"] == REPLAY_FETCH_BYTES == 65536
    assert rc.main_config().get("max.partition.fetch.bytes") == user_value


@pytest.mark.parametrize("user_kbytes", [None, 65536], ids=["default", "users-64MiB"])
def test_prefetch_is_bounded_unless_the_application_sets_it(user_kbytes: int | None) -> None:
    """Both consumers' prefetch queues are small by default (the reader's RSS stays flat over a 10M-record
    topic instead of climbing with librdkafka's 64 MiB of compressed prefetch); an application's own
    value wins."""
    cfg: dict[str, object] = {"bootstrap.servers": "k:9092"}
    if user_kbytes is not None:
        cfg["queued.max.messages.kbytes"] = user_kbytes
    rc = ReaderConfig(cfg)
    want = user_kbytes if user_kbytes is not None else PREFETCH_DEFAULTS["queued.max.messages.kbytes"]
    for built in (rc.main_config(), rc.replay_config()):
        assert built["queued.max.messages.kbytes"] == want
        assert built["fetch.queue.backoff.ms"] == PREFETCH_DEFAULTS["fetch.queue.backoff.ms"] == 10
    assert PREFETCH_DEFAULTS["queued.max.messages.kbytes"] == 1024
