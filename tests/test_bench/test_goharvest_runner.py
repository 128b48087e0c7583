"""The goharvest comparison's Python side, without Go: argument checks, the DSN lib/pq gets, and the
one-line skip when no Go toolchain is on PATH (the comparison is never a CI requirement).

The Go build and run themselves are exercised by ``python -m bench.bench_goharvest`` (a benchmark,
minutes long, needing the Go module proxy): not part of the suite.
"""

from __future__ import annotations

import logging

import pytest
from psycopg.conninfo import conninfo_to_dict

from bench.bench_goharvest import GoharvestBenchError, _limit_args, lib_pq_dsn, run_goharvest


@pytest.mark.parametrize(
    "dsn, sslmode",
    [
        ("host=127.0.0.1 port=5432 user=u password=p dbname=d", "disable"),
        ("host=127.0.0.1 user=u sslmode=prefer", "disable"),
        ("host=127.0.0.1 user=u sslmode=allow", "disable"),
        ("host=db user=u sslmode=verify-full", "verify-full"),
        ("postgresql://u:p@127.0.0.1:5432/d?sslmode=require", "require"),
    ],
)
def test_lib_pq_dsn_keeps_everything_but_a_libpq_only_sslmode(dsn: str, sslmode: str) -> None:
    converted = conninfo_to_dict(lib_pq_dsn(dsn))
    original = conninfo_to_dict(dsn)
    assert converted.pop("sslmode") == sslmode
    original.pop("sslmode", None)
    assert converted == original


def test_lib_pq_dsn_quotes_awkward_passwords() -> None:
    converted = lib_pq_dsn(r"host=h user=u password='it\'s a secret' dbname=d")
    assert conninfo_to_dict(converted)["password"] == "it's a secret"


def test_limit_args_map_goharvest_names_to_flags() -> None:
    assert _limit_args(None) == []
    assert _limit_args({"markQueryRecords": 5000, "maxInFlightRecords": 4000}) == [
        "-mark-query-records",
        "5000",
        "-max-in-flight-records",
        "4000",
    ]


@pytest.mark.parametrize(
    "limits, message",
    [
        ({"markQueryRecord": 5}, "'markQueryRecord' is not a goharvest limit"),
        ({"markQueryRecords": 0}, r"limits.markQueryRecords: 0 must be a positive integer"),
        ({"maxInFlightRecords": "5000"}, r"limits.maxInFlightRecords: '5000' must be a positive integer"),
        ({"sendConcurrency": True}, r"limits.sendConcurrency: True must be a positive integer"),
    ],
)
def test_limit_args_name_the_bad_limit(limits: dict, message: str) -> None:
    with pytest.raises(GoharvestBenchError, match=message):
        _limit_args(limits)


def test_without_go_the_run_is_skipped_with_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no `go`
    with caplog.at_level(logging.INFO, logger="harvest.bench.goharvest"):
        assert run_goharvest("host=unused", "unused:9092", "s.outbox", 10) is None
    assert [r.getMessage() for r in caplog.records] == [
        "goharvest side by side skipped: no Go toolchain ('go' is not on PATH)"
    ]
