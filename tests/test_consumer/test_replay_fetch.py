"""The replay consumer fetches small: a replay needs one span, not a partition's default 1 MB per fetch
(``ReaderConfig.replay_config``); the main consumer keeps the application's settings."""

from __future__ import annotations

import pytest

from harvest_outbox.consumer.config import REPLAY_FETCH_BYTES, ReaderConfig


@pytest.mark.parametrize("user_value", [None, 1024, 10 * 1024 * 1024])
def test_replay_fetches_small_main_consumer_keeps_the_users_setting(user_value: int | None) -> None:
    cfg = {"bootstrap.servers": "k:9092"}
    if user_value is not None:
        cfg["max.partition.fetch.bytes"] = user_value
    rc = ReaderConfig(cfg)
    assert rc.replay_config()["max.partition.fetch.bytes"] == REPLAY_FETCH_BYTES == 65536
    assert rc.main_config().get("max.partition.fetch.bytes") == user_value
