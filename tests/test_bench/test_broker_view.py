"""The latency benchmark's view of the broker (bench/broker_view.py, issue #51): a request log read into
appends, fetches and queue phases, and a slow row placed in it. Pure: a request log written here in the
broker's format (``%d{UNIX_MILLIS} Completed request:{json}``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.broker_view import REQUEST_LOG, BrokerRequests, jvm_options


def _line(end_ms: int, kind: str, client: str, response: dict, **phases: float) -> str:
    times = {"requestQueueTimeMs": 0.0, "localTimeMs": 0.1, "responseQueueTimeMs": 0.0, "sendTimeMs": 0.0, **phases}
    body = {"requestHeader": {"requestApiKeyName": kind, "clientId": client}, "response": response, **times}
    return f"{end_ms} Completed request:{json.dumps(body)}"


def _produce(topic: str, partition: int, base: int) -> dict:
    return {
        "responses": [{"name": topic, "partitionResponses": [{"index": partition, "errorCode": 0, "baseOffset": base}]}]
    }


def _fetch(partition: int, hw: int, size: int) -> dict:
    parts = [{"partitionIndex": partition, "errorCode": 0, "highWatermark": hw, "recordsSizeInBytes": size}]
    return {"responses": [{"topicId": "x", "partitions": parts}]}


def test_a_row_is_placed_in_its_append_and_its_fetch(tmp_path: Path) -> None:
    log = tmp_path / "requests.log"
    t = 1_800_000_000_000
    log.write_text(
        "\n".join(
            [
                _line(t + 10, "PRODUCE", "relay", _produce("tp", 0, 0), responseQueueTimeMs=2.0, sendTimeMs=1.0),
                _line(t + 12, "FETCH", "lat-plain-tp", _fetch(0, 3, 300)),
                _line(t + 20, "PRODUCE", "relay", _produce("tp", 0, 3), requestQueueTimeMs=90.0),
                _line(t + 21, "FETCH", "lat-plain-tp", _fetch(1, 5, 0)),  # no records: moves nothing
                _line(t + 25, "FETCH", "lat-plain-tp", _fetch(0, 4, 100)),
                _line(t + 26, "FETCH", "lat-rc-tp", _fetch(0, 4, 400)),  # another consumer's own positions
                _line(t + 30, "METADATA", "relay", {}, requestQueueTimeMs=500.0),  # neither: not counted
                # produce v13+ (Connect's Java producer) names its topic by id: its queue phase counts, no append
                _line(
                    t + 31,
                    "PRODUCE",
                    "connect",
                    {
                        "responses": [
                            {"topicId": "x", "partitionResponses": [{"index": 1, "errorCode": 0, "baseOffset": 0}]}
                        ]
                    },
                ),
                "a line of something else",
            ]
        )
        + "\n"
    )
    requests = BrokerRequests(log)
    requests.take()
    assert log.read_text() == ""  # emptied: the next run's lines start afresh
    assert len(requests) == 7
    s = t / 1000
    # offsets 0..2 came in the first batch, appended before its response queued (2 ms) and was sent (1 ms)
    assert requests.appended_at("tp", 0, 2) == pytest.approx(s + 0.010 - 0.003)
    assert requests.appended_at("tp", 0, 3) == pytest.approx(s + 0.020)
    assert requests.appended_at("tp", 1, 0) is None
    assert requests.fetched_at("lat-plain-tp", 0, 2) == pytest.approx(s + 0.012)
    assert requests.fetched_at("lat-plain-tp", 0, 3) == pytest.approx(s + 0.025)
    assert requests.fetched_at("lat-plain-tp", 0, 4) is None  # not fetched yet
    assert requests.fetched_at("lat-rc-tp", 0, 3) == pytest.approx(s + 0.026)
    # the longest queue phase (request + response queue) among requests completed in a window
    assert requests.queue_ms(s, s + 0.015) == 2.0
    assert requests.queue_ms(s + 0.015, s + 0.1) == 90.0
    assert requests.queue_ms(s + 1, s + 2) is None
    summary = requests.summary(s, s + 1)
    assert summary["requests"] == 7 and summary["queue_max_ms"] == 90.0 and summary["queued_20ms_or_more"] == 1


def test_the_request_log_configuration_names_the_log_and_keeps_the_default(tmp_path: Path) -> None:
    option, log = jvm_options(tmp_path)
    conf = tmp_path / "log4j2-requests.properties"
    assert option.startswith("-Dlog4j2.configurationFile=") and option.endswith(f",{conf}")
    assert "log4j2.properties," in option  # the broker's own configuration first, ours merged into it
    assert f"fileName = {log}" in conf.read_text()
    assert "%d{UNIX_MILLIS}" in REQUEST_LOG.format(path=log)
