"""The Debezium side-by-side benchmark's pure logic: event ids that name their row, the duplicate and
loss count every read-back relies on, and its README rows.

The benchmark itself (``python -m bench debezium``, services, Debezium, minutes long) is not part of
the suite.
"""

from __future__ import annotations

import uuid

import pytest

from bench.__main__ import _debezium_rows
from bench.bench_debezium import event_id, row_of, tally


@pytest.mark.parametrize("i", [0, 1, 999_999, 2**40 - 1])
def test_an_event_id_is_a_uuid_that_names_its_burst_and_row(i: int) -> None:
    eid = event_id("ab12", i)
    assert str(uuid.UUID(eid)) == eid  # Postgres prints it back as it was written
    assert row_of(eid.encode(), b"ab12") == i
    assert row_of(eid.encode(), b"ab13") is None


def test_event_ids_do_not_come_in_index_order() -> None:
    ids = [event_id("ab12", i) for i in range(100)]
    assert len(set(ids)) == 100
    assert ids != sorted(ids)  # scattered over the primary key, as random ids are


@pytest.mark.parametrize(
    "rows_seen, expected",
    [
        ([0, 1, 2], {"records": 3, "duplicates": 0, "losses": 0}),
        ([0, 1, 1, 2, 2, 2], {"records": 6, "duplicates": 3, "losses": 0}),
        ([0, 2], {"records": 2, "duplicates": 0, "losses": 1}),
        ([], {"records": 0, "duplicates": 0, "losses": 3}),
        ([1] * 300, {"records": 300, "duplicates": 299, "losses": 2}),
    ],
)
def test_tally_counts_duplicates_and_losses(rows_seen: list[int], expected: dict[str, int]) -> None:
    ids = [event_id("ab12", i).encode() for i in rows_seen]
    assert tally(ids, "ab12", 3) == expected


def test_tally_ignores_other_bursts_and_rows_beyond_the_burst() -> None:
    ids = [event_id("ab12", 0).encode(), event_id("ffff", 1).encode(), event_id("ab12", 5).encode(), b"not-an-id"]
    assert tally(ids, "ab12", 2) == {"records": 1, "duplicates": 0, "losses": 1}


def test_readme_rows_render_with_figures_missing() -> None:
    rows = _debezium_rows({"setup": {"rows": 1_000_000}, "at_least_once": {"burst": {"rows_per_s": 100_000}}})
    assert rows and all(len(row) == 4 for row in rows)
    assert rows[0][0].startswith("Debezium side by side: 1M-row burst")
    assert rows[0][1] == "100,000 / n/a / n/a"
