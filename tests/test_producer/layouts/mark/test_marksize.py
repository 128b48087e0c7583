"""MarkSize: the adaptive mark size (producer/layouts/mark/marksize.py invariants)."""

from __future__ import annotations

import pytest

from harvest_outbox.producer.layouts.mark.marksize import MarkSize


def test_one_full_mark_reaches_the_ceiling() -> None:
    size = MarkSize(100, 5000)
    assert size.observe(100, 100) == 5000
    assert size.observe(5000, 5000) == 5000  # never beyond the ceiling (the user's markQueryRecords)


def test_a_scenario_backlog_then_trickle_then_burst() -> None:
    size = MarkSize(100, 5000)
    seen = [size.observe(size.value, got) for got in (100, 5000, 5000, 3000, 40, 10, 0, 0, 0, 0, 0, 0, 100)]
    # backlog: ceiling at once; its end (3000 of 5000) keeps the size; the trickle halves it back to
    # the floor in log2 steps; a burst fills a small mark: the ceiling again
    assert seen == [5000, 5000, 5000, 5000, 2500, 1250, 625, 312, 156, 100, 100, 100, 5000]


def test_empty_marks_halve_back_to_the_floor() -> None:
    size = MarkSize(100, 6400)
    size.value = 6400
    seen = []
    while size.value > size.floor:
        seen.append(size.observe(size.value, 0))
    assert seen == [3200, 1600, 800, 400, 200, 100]
    assert size.observe(100, 0) == 100


@pytest.mark.parametrize(("got", "expected"), [(1000, 5000), (999, 1000), (250, 1000), (249, 500), (0, 500)])
def test_partly_full_marks(got: int, expected: int) -> None:
    size = MarkSize(100, 5000)
    size.value = 1000
    assert size.observe(1000, got) == expected


def test_a_stale_full_ask_still_means_a_backlog() -> None:
    # A mark asked for 200 while the size has meanwhile moved (a prefetch): full -> the ceiling.
    size = MarkSize(100, 5000)
    size.value = 800
    assert size.observe(200, 200) == 5000


@pytest.mark.parametrize(("floor", "ceiling"), [(0, 10), (10, 5), (-1, 1)])
def test_bad_bounds_are_refused(floor: int, ceiling: int) -> None:
    with pytest.raises(ValueError, match="floor <= ceiling"):
        MarkSize(floor, ceiling)


def test_a_configured_ceiling_below_the_floor_is_the_size() -> None:
    from harvest_outbox.producer.config import MARK_FLOOR, Limits

    lim = Limits(mark_query_records=10)
    size = MarkSize(min(MARK_FLOOR, lim.mark_ceiling), lim.mark_ceiling)
    assert size.value == 10 and size.observe(10, 10) == 10
